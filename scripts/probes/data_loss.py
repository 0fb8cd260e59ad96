"""Issue 18.2.1-2.2, 2.5, 2.7: nothing a user owns is lost or changed. --overwrite replaces
only packtool's own output; no file packtool creates is opened through a symlink; resume
never keeps tokens of an input edited in place; two writers never share an output.

Every probe's folder is snapshot before the command: a file that was there and changed or
vanished is ``wrong data`` whatever the exit code."""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import Ctx, Probe, run_cmd


def _site(index: str = "{}"):
    def setup(case):
        case.write("site/index.json", index)
        case.write("site/page.html", "keep")
        case.write("site/sub/x.txt", "keep")
    return setup


def _marker(case) -> Path:
    for name in (".packtool-export.json", "_packtool-export.json"):
        if (case.dir / "x" / name).exists():
            return case.dir / "x" / name
    raise FileNotFoundError("no export marker")


def overwrite_probes(ctx: Ctx) -> list[Probe]:
    pack = ["pack", "c", "-L", "64", "-q", "--overwrite", "-o"]
    llmc = ["export", "c", "--format", "llmc", "--eos-id", "0", "-o", "x", "-q"]
    export_first = [llmc]
    return [
        Probe("pack --overwrite: a folder whose index.json is {}", "2.1", pack + ["site"],
              _site(), needs=("corpus",), want="page.html"),
        Probe("pack --overwrite: index.json of another format", "2.1", pack + ["site"],
              _site('{"format": "other", "version": 1}'), needs=("corpus",)),
        Probe("pack --overwrite: our dataset plus a user's file", "2.1", pack + ["p"],
              lambda c: c.write("p/notes.txt", "mine"), needs=("ds",), want="notes.txt"),
        Probe("pack --overwrite: our index edited (stale digest)", "2.1", pack + ["p"],
              needs=("ds",), prepare=lambda c: _stale(c.dir / "p" / "index.json")),
        Probe("pack --overwrite: a user's regular file", "2.1", pack + ["out.txt"],
              lambda c: c.write("out.txt", "keep"), needs=("corpus",)),
        Probe("pack --overwrite: the folder holding the source", "2.1",
              ["pack", "data/c", "-L", "64", "-o", "data", "--overwrite", "-q"],
              _into("data"), needs=("corpus",)),
        Probe("pack --overwrite: the current folder", "2.1", pack + ["."], needs=("corpus",)),
        Probe("pack --tasks 2 --task 0 --overwrite: a user's index.json", "2.1",
              ["pack", "c", "-L", "64", "-o", "site", "--tasks", "2", "--task", "0",
               "--overwrite", "-q"], _site('{"mine": true}'), needs=("corpus",),
              expect="safe"),
        Probe("pack --finalize --overwrite: a user's folder", "2.1",
              ["pack", "c", "-L", "64", "-o", "site", "--finalize", "--overwrite", "-q"],
              _site('{"mine": true}'), needs=("corpus",)),
        Probe("export --overwrite: an old-name marker that is {}", "2.1", llmc + ["--overwrite"],
              lambda c: (c.write("x/_packtool-export.json", "{}"), c.write("x/page.html", "k")),
              needs=("corpus",)),
        Probe("export --overwrite: a hidden marker that is {}", "2.1", llmc + ["--overwrite"],
              lambda c: (c.write("x/.packtool-export.json", "{}"), c.write("x/page.html", "k")),
              needs=("corpus",)),
        Probe("export --overwrite: marker edited to list a user's file", "2.1",
              llmc + ["--overwrite"], before=export_first, needs=("corpus",),
              prepare=_list_user_file),
        Probe("export --overwrite: our export plus a user's file", "2.1",
              llmc + ["--overwrite"], before=export_first, needs=("corpus",),
              prepare=lambda c: c.write("x/notes.txt", "mine"), want="notes.txt"),
        Probe("export --overwrite: onto its own source", "2.1",
              ["export", "c", "--format", "megatron", "-o", "c", "--overwrite", "-q"],
              needs=("corpus",)),
        Probe("export megatron --overwrite: a user's OUT.bin", "2.1",
              ["export", "c", "--format", "megatron", "-o", "m", "--overwrite", "-q"],
              lambda c: (c.write("m.bin", "mine"), c.write("m.idx", "mine")),
              needs=("corpus",)),
        Probe("export parquet --overwrite: a user's .parquet file", "2.1",
              ["export", "p", "--format", "parquet", "-o", "x.parquet", "--overwrite", "-q"],
              lambda c: c.write("x.parquet", "mine"), needs=("ds",)),
        Probe("tokenize --overwrite: a user's c.bin, no manifest", "2.1",
              ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "u/c", "--overwrite", "-q"],
              lambda c: c.write("u/c.bin", "mine"), needs=("corpus",)),
        Probe("tokenize --overwrite: a user's c.json", "2.1",
              ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "u/c", "--overwrite", "-q"],
              lambda c: c.write("u/c.json", '{"format": "other"}'), needs=("corpus",)),
        Probe("pack --overwrite replaces our own dataset", "2.1",
              ["pack", "c", "-L", "128", "-o", "p", "--overwrite", "-q"], needs=("ds",),
              expect="ok", mutable=("p", "p/*"),
              check=lambda c, o, e: None if c.json("p/index.json")["seq_len"] == 128
              else "index.json not replaced"),
        Probe("export --overwrite replaces our own export", "2.1", llmc + ["--overwrite"],
              before=export_first, needs=("corpus",), expect="ok", mutable=("x", "x/*")),
        Probe("tokenize --overwrite replaces our own corpus", "2.1",
              ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "c", "--eos", "<|eos|>",
               "--overwrite", "-q"], needs=("corpus",), expect="ok",
              mutable=("c.*", ".c*"), check=lambda c, o, e: None if c.json("c.json").get(
                  "eos_id") is not None else "c.json not replaced"),
    ]


def _stale(index: Path) -> None:
    body = json.loads(index.read_text())
    body["n_packs"] = body.get("n_packs", 0) + 1  # the digest is not recomputed
    index.write_text(json.dumps(body))


def _list_user_file(case) -> None:
    m = _marker(case)
    body = json.loads(m.read_text())
    body["files"].append("page.html")  # the digest is not recomputed
    m.write_text(json.dumps(body))
    case.write("x/page.html", "mine")


def _into(folder: str):
    def setup(case):
        (case.dir / folder).mkdir()
        for p in list(case.dir.glob("c.*")) + list(case.dir.glob(".c*")):
            p.rename(case.dir / folder / p.name)
    return setup


def _link(name: str, target: str):
    def setup(case):
        case.write("victim.txt", "keep")
        (case.dir / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, case.dir / name)
    return setup


def _not_created(name: str):
    return lambda c, o, e: f"{name} was created through a dangling symlink" \
        if (c.dir / name).exists() else None


def symlink_probes(ctx: Ctx) -> list[Probe]:
    tok = ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "out/c", "-q"]
    pack = ["pack", "c", "-L", "64", "-o", "out/p", "-q"]
    llmc = ["export", "c", "--format", "llmc", "--eos-id", "0", "-o", "out/x", "-q"]
    s = "safe"
    return [
        Probe("tokenize: its lock is a symlink to a user's file", "2.2", tok,
              _link("out/.c.lock", "../victim.txt"), needs=("corpus",), expect=s),
        Probe("tokenize: its lock is a dangling symlink", "2.2", tok,
              _link("out/.c.lock", "../created.txt"), needs=("corpus",), expect=s,
              check=_not_created("created.txt")),
        Probe("pack: its lock is a symlink to a user's file", "2.2", pack,
              _link("out/.p.lock", "../victim.txt"), needs=("corpus",), expect=s),
        Probe("pack: its lock is a dangling symlink", "2.2", pack,
              _link("out/.p.lock", "../created.txt"), needs=("corpus",), expect=s,
              check=_not_created("created.txt")),
        Probe("export: its lock is a symlink to a user's file", "2.2", llmc,
              _link("out/.x.lock", "../victim.txt"), needs=("corpus",), expect=s),
        Probe("tokenize: c.bin is a symlink to a user's file", "2.2", tok,
              _link("out/c.bin", "../victim.txt"), needs=("corpus",)),
        Probe("tokenize --overwrite: c.bin is a symlink to a user's file", "2.2",
              tok + ["--overwrite"], _link("out/c.bin", "../victim.txt"),
              needs=("corpus",), expect=s),
        Probe("pack --overwrite: the output is a symlink to a user's folder", "2.2",
              ["pack", "c", "-L", "64", "-o", "link", "--overwrite", "-q"],
              lambda c: (_site()(c), os.symlink("site", c.dir / "link")), needs=("corpus",),
              expect=s),
        Probe("pack: a user's file (with content) at the lock's name", "2.2", pack,
              lambda c: c.write("out/.p.lock", "mine"), needs=("corpus",), expect=s),
        Probe("tokenize: a user's file (with content) at the lock's name", "2.2", tok,
              lambda c: c.write("out/.c.lock", "mine"), needs=("corpus",), expect=s),
        Probe("export --overwrite: a shard of ours replaced by a symlink to a user's file",
              "2.2", ["export", "c", "--format", "llmc", "--eos-id", "0", "-o", "x",
                      "--overwrite", "-q"],
              before=[["export", "c", "--format", "llmc", "--eos-id", "0", "-o", "x", "-q"]],
              prepare=_shard_link, needs=("corpus",), expect=s, mutable=("x", "x/*")),
    ]


def _shard_link(case) -> None:
    case.write("victim.txt", "keep")
    shard = sorted((case.dir / "x").glob("shard_*.bin"))[0]
    shard.unlink()
    os.symlink("../victim.txt", shard)


def _edit_in_place(name: str, unfinish: bool = False):
    """prepare(case): one character of ``name`` changed, its size and mtime kept; with
    ``unfinish`` the corpus manifest removed, as a run killed before its commit leaves it."""
    def prepare(case):
        p = case.dir / name
        st = p.stat()
        p.write_bytes(p.read_bytes().replace(b"doc 1 ", b"dog 1 ", 1))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        if unfinish:
            (case.dir / "c.json").unlink()
    return prepare


def _fresh_equal(case, out, err):
    inp = "in" if (case.dir / "in").is_dir() else "good.jsonl"
    rc, _, e, _ = run_cmd(case.ctx, ["tokenize", inp, "-t", case.ctx.tok, "-o", "fresh",
                                     "--part-bytes", "1", "-q"], case.dir, 300)
    if rc != 0:
        return f"could not tokenize the edited input afresh: {e[-200:]}"
    mine = b"".join(p.read_bytes() for p in sorted(case.dir.glob("c*.bin")))
    new = b"".join(p.read_bytes() for p in sorted(case.dir.glob("fresh*.bin")))
    return None if mine == new else "the re-run kept the tokens of the input before its edit"


def _old_manifest_over_new_parts(case, out, err):
    m = case.dir / "c.json"
    if m.exists() and json.loads(m.read_text()).get("eos_id") is None:
        rc, _, _, _ = run_cmd(case.ctx, ["verify", "c"], case.dir, 300)
        if rc == 0:
            return "verify passes the old PREFIX.json over parts rewritten with --eos"
    return None


def _two_at_once(ctx: Ctx, first: list, second: list, committed: str) -> str:
    """Code running two packtool commands at once, then verify of the output (if its
    manifest, ``committed``, exists: an unfinished array task's share is no output)."""
    return f"""
import json, os, subprocess, sys, time
base = [sys.executable, "-m", {ctx.module!r}]
a = subprocess.Popen(base + {first!r}, stderr=subprocess.PIPE, text=True)
time.sleep(1.0)
b = subprocess.Popen(base + {second!r}, stderr=subprocess.PIPE, text=True)
ea, eb = a.communicate()[1], b.communicate()[1]
v = subprocess.run(base + ["verify", {first[first.index('-o') + 1]!r}], capture_output=True)
print(json.dumps({{"rc": [a.returncode, b.returncode], "tb": "Traceback" in ea + eb,
                   "verify": v.returncode if os.path.exists({committed!r}) else 0}}))
"""


def _concurrent_ok(case, out, err):
    r = json.loads(out.strip().splitlines()[-1])
    if r["tb"]:
        return f"a traceback from one of the two runs (exit codes {r['rc']})"
    if r["verify"] != 0:
        return f"the output fails verify after two runs at once (exit codes {r['rc']})"
    return None


def resume_probes(ctx: Ctx) -> list[Probe]:
    big = "".join(json.dumps({"text": f"record {i} " * 400}) + "\n" for i in range(6000))
    tok = ["tokenize", "big.jsonl", "-t", str(ctx.tok), "-o", "out/c", "-q"]
    pack = ["pack", "big", "-L", "64", "-o", "out/p", "-q"]
    big_corpus = ["python", "import numpy as np\nfrom synth import write_token_corpus"
                  "\nwrite_token_corpus('big', np.random.default_rng(0).integers(1, 64, "
                  "2_000_000), vocab_size=1000)"]
    return [
        Probe("resume: an input edited in place (same size and mtime)", "2.5",
              ["tokenize", "in", "-t", ctx.tok, "-o", "c", "--part-bytes", "1", "-q"],
              _two_inputs, before=[["tokenize", "in", "-t", ctx.tok, "-o", "c",
                                    "--part-bytes", "1", "-q"]],
              prepare=_edit_in_place("in/a.jsonl", unfinish=True), expect="ok",
              mutable=("c.*", ".c*", "in/a.jsonl"), check=_fresh_equal),
        Probe("--overwrite: an input edited in place (same size and mtime)", "2.5",
              ["tokenize", "in", "-t", ctx.tok, "-o", "c", "--part-bytes", "1", "--overwrite",
               "-q"], _two_inputs, before=[["tokenize", "in", "-t", ctx.tok, "-o", "c",
                                            "--part-bytes", "1", "-q"]],
              prepare=_edit_in_place("in/a.jsonl"), expect="ok",
              mutable=("c.*", ".c*", "in/a.jsonl"), check=_fresh_equal),
        Probe("two tokenize runs to one output at once", "2.7",
              ["python", _two_at_once(ctx, tok, tok, "out/c.json")],
              lambda c: c.write("big.jsonl", big),
              expect="ok", check=_concurrent_ok, timeout=300),
        Probe("a local pack and an array task at once", "2.7",
              ["python", _two_at_once(ctx, pack, pack + ["--tasks", "2", "--task", "0"],
                                      "out/p/index.json")],
              before=[big_corpus], expect="ok", check=_concurrent_ok, timeout=300),
        Probe("array task --overwrite over a finished corpus", "2.7",
              ["tokenize", "in", "-t", ctx.tok, "-o", "c", "--part-bytes", "1", "--eos",
               "<|eos|>", "--tasks", "2", "--task", "0", "--overwrite", "-q"],
              _two_inputs, before=[["tokenize", "in", "-t", ctx.tok, "-o", "c",
                                    "--part-bytes", "1", "-q"]], expect="safe",
              mutable=("c.*", ".c*"), check=_old_manifest_over_new_parts),
    ]


def _two_inputs(case) -> None:
    lines = (case.ctx.fixtures / "corpus" / "good.jsonl").read_text().splitlines(True)
    case.write("in/a.jsonl", "".join(lines[:25]))
    case.write("in/b.jsonl", "".join(lines[25:]))


def probes(ctx: Ctx) -> list[Probe]:
    return overwrite_probes(ctx) + symlink_probes(ctx) + resume_probes(ctx)

