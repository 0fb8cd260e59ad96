"""Issue 18.5: scale edges. Many parts under a low open-file limit, many small files in
bounded time, an unreachable Ray address within bounded time, and nothing left over by
array tasks, --finalize or dead runs."""

from __future__ import annotations

import json

from . import Ctx, Probe

N_FILES = 600
LIMIT = "ulimit -n 256;"


def _stale_shards(case, out, err):
    idx = json.loads((case.dir / "out" / "p" / "index.json").read_text())
    listed = {f["name"] for sh in idx["shards"] for f in sh["files"].values()}
    extra = sorted(p.name for p in (case.dir / "out" / "p").iterdir()
                   if p.name not in listed | {"index.json"})
    return f"stale files from the run before: {extra[:4]}" if extra else None


def _reclaimed(name: str):
    return lambda c, o, e: f"{name} of a dead run is still there" \
        if (c.dir / name).exists() else None


SMALL_FILES = """
import json, os, subprocess, sys, time
os.makedirs("many", exist_ok=True)
lines = [json.dumps({{"text": f"record {{k}} " * 8}}) + "\\n" for k in range({n})]
for k, line in enumerate(lines):
    open(f"many/f{{k:04d}}.jsonl", "w").write(line)
open("one.jsonl", "w").write("".join(lines))
base = [sys.executable, "-m", {module!r}, "tokenize", "-t", {tok!r}, "-q"]
def timed(inp, out):
    t0 = time.perf_counter()
    subprocess.run(base + [inp, "-o", out], check=True)
    return time.perf_counter() - t0
one, many = timed("one.jsonl", "o1"), timed("many", "o2")
print(many / one)
"""


def _ratio(limit: float):
    def check(case, out, err):
        r = float(out.strip().splitlines()[-1])
        return None if r <= limit else f"{r:.1f}x the time of the same records in one file"
    return check


def probes(ctx: Ctx) -> list[Probe]:
    def limited(name, cmd, **kw):
        return Probe(f"{N_FILES} one-file parts under ulimit -n 256: {name}", "5", cmd,
                     shell=LIMIT, expect="ok", timeout=300, needs=("many",), **kw)

    pack = ["pack", "c", "-L", "64", "-q", "-o", "out/p"]
    return [
        limited("tokenize", ["tokenize", "in", "-t", ctx.tok, "-o", "out/c", "--part-bytes",
                             "1", "-q"]),
        limited("pack", pack),
        limited("verify the corpus", ["verify", "c"]),
        limited("stats", ["stats", "c", "-L", "64"]),
        limited("export llmc", ["export", "c", "--format", "llmc", "--eos-id", "0", "-o",
                                "out/l", "-q"]),
        limited("verify the packed dataset", ["verify", "out/p"], before=[pack]),
        limited("read every pack", ["python", "import packtool\nds = packtool.open_packed("
                                              "'out/p')\n[ds[i] for i in range(len(ds))]"],
                before=[pack]),
        Probe("2,000 one-line files within 3x one file of the same records", "5",
              ["python", SMALL_FILES.format(n=2000, module=ctx.module, tok=str(ctx.tok))],
              expect="ok", check=_ratio(3.0), check_kind="hang", timeout=420),
        Probe("--executor ray --ray-address 127.0.0.1:1", "5",
              ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "out/c", "--executor", "ray",
               "--ray-address", "127.0.0.1:1", "-q"], needs=("corpus",), timeout=120,
              want="127.0.0.1:1"),
        Probe("pack --finalize with no task run", "5",
              ["pack", "c", "-L", "64", "-o", "new/p", "--finalize", "-q"],
              needs=("corpus",)),
        Probe("tokenize --finalize with no task run", "5",
              ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "new/c", "--finalize", "-q"],
              needs=("corpus",)),
        Probe("pack tasks --overwrite with fewer shards leave no stale shard", "5",
              ["pack", "c", "-L", "64", "-o", "out/p", "--finalize", "--overwrite", "-q"],
              needs=("corpus",),
              before=[["pack", "c", "-L", "64", "-o", "out/p", "--shard-size", "300",
                       "--tasks", "2", "--task", str(k), "-q"] for k in (0, 1)] + [
                  ["pack", "c", "-L", "64", "-o", "out/p", "--shard-size", "300",
                   "--finalize", "-q"]] + [
                  ["pack", "c", "-L", "64", "-o", "out/p", "--tasks", "2", "--task", str(k),
                   "--overwrite", "-q"] for k in (0, 1)],
              expect="ok", check=_stale_shards, check_kind="files left", mutable=("out/*",)),
        Probe("a dead run's temporary beside the output is reclaimed", "5",
              ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "out/c", "-q"],
              lambda c: c.write("out/.c.bin.tmp-999999-0a1b2c3d", "junk"), needs=("corpus",),
              expect="ok", mutable=("out/.c.bin.tmp-*",),
              check=_reclaimed("out/.c.bin.tmp-999999-0a1b2c3d"), check_kind="files left"),
        Probe("a dead run's pack temporary is reclaimed", "5",
              ["pack", "c", "-L", "64", "-o", "out/p", "-q"],
              lambda c: c.write("out/.p.tmp-999999-0a1b2c3d/shard-00000.seg_doc.npy", "junk"),
              needs=("corpus",), expect="ok", mutable=("out/.p.tmp-*",),
              check=_reclaimed("out/.p.tmp-999999-0a1b2c3d"), check_kind="files left"),
    ]
