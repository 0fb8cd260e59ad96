"""Issue 18.2.3-2.4 and 3: corrupted or tampered data is never exported, packed or
verified as good, and no path read from a manifest leads outside its folder.

Corruptions leave the recorded checksums as they were (a disk error); tampers recompute
every checksum and digest (scripts/tamper_probe.py's edits, by someone who read
docs/FORMAT.md). Acceptance of either is ``wrong data``."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from . import Ctx, Probe, edit_json, flip

LOAD_PACKED = "import packtool\nds = packtool.open_packed({!r})\n[ds[i] for i in range(len(ds))]"
LOAD_TOKENS = ("import numpy as np, packtool\nc = packtool.open_tokens({!r})\n"
               "[np.asarray(c[i]) for i in range(len(c))]")


def _flip(name: str, at: float = 0.5):
    return lambda case: flip(case.dir / name, at)


def _cut(name: str):
    def setup(case):
        p = case.dir / name
        p.write_bytes(p.read_bytes()[:-2])
    return setup


def export_probes(ctx: Ctx) -> list[Probe]:
    out = []
    corpus = {"megatron": ["--format", "megatron", "-o", "out/m"],
              "megatron --copy": ["--format", "megatron", "--copy", "-o", "out/m"],
              "llmc": ["--format", "llmc", "--eos-id", "0", "-o", "out/l"]}
    for label, args in corpus.items():
        out.append(Probe(f"export {label}: corpus .bin byte flipped", "2.3",
                         ["export", "c", *args, "-q"], _flip("c.bin"), needs=("corpus",),
                         on_accept="wrong data"))
    out += [Probe("export llmc: corpus .bin truncated", "2.3",
                  ["export", "c", *corpus["llmc"], "-q"], _cut("c.bin"), needs=("corpus",),
                  on_accept="wrong data"),
            Probe("export megatron: corpus .boundaries byte flipped", "2.3",
                  ["export", "c", *corpus["megatron"], "-q"], _flip("c.boundaries", 0.3),
                  needs=("corpus",), on_accept="wrong data")]
    packed = {"parquet": "out/x.parquet", "mds": "out/mds", "parquet-packed": "out/pp",
              "megatron": "out/m"}
    for fmt, dst in packed.items():
        out.append(Probe(f"export {fmt}: the packed dataset's source .bin flipped", "2.3",
                         ["export", "p", "--format", fmt, "-o", dst, "-q"], _flip("c.bin"),
                         needs=("ds",), on_accept="wrong data", timeout=240))
    for fmt in ("parquet", "megatron"):
        out.append(Probe(f"export {fmt}: a tokens-layout shard's tokens flipped", "2.3",
                         ["export", "p", "--format", fmt, "-o", packed[fmt], "-q"],
                         _flip_role("tokens"), needs=("dst",), on_accept="wrong data"))
    out.append(Probe("export parquet: a shard's seg_length flipped", "2.3",
                     ["export", "p", "--format", "parquet", "-o", "out/x.parquet", "-q"],
                     _flip_role("seg_length"), needs=("ds",), on_accept="wrong data"))
    return out


def _flip_role(role: str):
    def setup(case):
        names = sorted((case.dir / "p").glob(f"shard-00000.{role}.npy")) or sorted(
            (case.dir / "p").glob("shard-00000.*.npy"))
        flip(names[0], 0.9)
    return setup


def _tamper(name: str, hidden: str):
    def setup(case):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        import tamper_probe as tp

        c, b = tp.Corpus(case.dir / "a"), tp.Corpus(case.dir / "b")
        part = c.hidden(c.parts[0]["name"])
        original = json.loads(part.read_text()) if part.exists() else {}
        tp.TOKEN_TAMPERS[name](c, b)
        c.save(False, hidden, original)
    return setup


def _tamper_packed(name: str):
    def setup(case):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        import tamper_probe as tp

        d = next(p for p in sorted((case.dir / "a").glob("p-*")))
        tp.PACKED_TAMPERS[name](d, {"b": case.dir / "b"})
        for other in (case.dir / "a").glob("p-*"):
            if other != d:
                shutil.rmtree(other)
        d.rename(case.dir / "a" / "p")
    return setup


def tamper_probes(ctx: Ctx) -> list[Probe]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import tamper_probe as tp

    out = []
    for name in tp.TOKEN_TAMPERS:
        for hidden in ("left", "edited"):
            out.append(Probe(f"tamper {name} (part manifests {hidden}): verify", "2.4",
                             ["verify", "a/c"], _tamper(name, hidden), needs=("tamper",),
                             on_accept="wrong data"))
        out.append(Probe(f"tamper {name}: pack then verify --source", "2.4",
                         ["verify", "out/p", "--source", "a/c"], _tamper(name, "edited"),
                         before=[["pack", "a/c", "-L", "128", "-o", "out/p", "-q"]],
                         needs=("tamper",), on_accept="wrong data"))
    for name in tp.PACKED_TAMPERS:
        out.append(Probe(f"tamper packed {name}: verify --source", "2.4",
                         ["verify", "a/p", "--source", "a/c"], _tamper_packed(name),
                         needs=("tamper",), on_accept="wrong data"))
    return out


def _held_out(path_of):
    def setup(case):
        if path_of == "../x":
            shutil.copytree(case.dir / "p" / "valid", case.dir / "x")
        value = path_of if path_of != "abs" else str(case.dir / "p" / "valid")
        edit_json(case.dir / "p" / "index.json",
                  lambda idx: idx["held_out"].__setitem__("path", value))
    return setup


def _part_out(case) -> None:
    """The corpus's .bin moved out of its folder, a symlink left in its place."""
    (case.dir / "sub").mkdir()
    (case.dir / "elsewhere").mkdir()
    for p in list(case.dir.glob("c.*")) + list(case.dir.glob(".c*")):
        p.rename(case.dir / "sub" / p.name)
    (case.dir / "sub" / "c.bin").rename(case.dir / "elsewhere" / "c.bin")
    os.symlink("../elsewhere/c.bin", case.dir / "sub" / "c.bin")


def _shard_out(case) -> None:
    (case.dir / "elsewhere").mkdir()
    f = sorted((case.dir / "p").glob("shard-00000.*.npy"))[0]
    f.rename(case.dir / "elsewhere" / f.name)
    os.symlink(f"../elsewhere/{f.name}", f)


def _part_name(kind: str):
    def setup(case):
        (case.dir / "sub").mkdir()
        (case.dir / "c.json").rename(case.dir / "sub" / "c.json")
        name = "../c" if kind == "relative" else str(case.dir / "c")

        def edit(m):
            for q in m.get("parts", []):
                q["name"] = name
        edit_json(case.dir / "sub" / "c.json", edit)
    return setup


def _shard_name(case) -> None:
    shutil.copytree(case.dir / "p", case.dir / "p2")

    def edit(idx):
        f = next(iter(idx["shards"][0]["files"].values()))
        f["name"] = "../p2/" + f["name"]
    edit_json(case.dir / "p" / "index.json", edit)


def _marker_escape(case) -> None:
    case.write("victim.txt", "keep")
    for name in (".packtool-export.json", "_packtool-export.json"):
        m = case.dir / "x" / name
        if m.exists():
            edit_json(m, lambda body: body["files"].append("../victim.txt"))


def security_probes(ctx: Ctx) -> list[Probe]:
    out = []
    for label, value in (("an absolute path", "abs"), ("../x", "../x"),
                         ("valid/../../x", "valid/../../x"), ("'.'", ".")):
        setup = _held_out(value)
        out += [Probe(f"held_out.path {label}: verify", "3", ["verify", "p"], setup,
                      needs=("dsv",)),
                Probe(f"held_out.path {label}: verify --source", "3",
                      ["verify", "p", "--source", "c"], setup, needs=("dsv",))]
    out += [
        Probe("a part's .bin is a symlink out of its folder: verify", "3",
              ["verify", "sub/c"], _part_out, needs=("corpus",)),
        Probe("a part's .bin is a symlink out of its folder: pack", "3",
              ["pack", "sub/c", "-L", "64", "-o", "out/p", "-q"], _part_out,
              needs=("corpus",)),
        Probe("a part's .bin is a symlink out of its folder: load", "3",
              ["python", LOAD_TOKENS.format("sub/c")], _part_out, needs=("corpus",)),
        Probe("a shard file is a symlink out of its folder: verify", "3", ["verify", "p"],
              _shard_out, needs=("ds",)),
        Probe("a shard file is a symlink out of its folder: load", "3",
              ["python", LOAD_PACKED.format("p")], _shard_out, needs=("ds",)),
        Probe("a part named ../c (digest recomputed): verify", "3", ["verify", "sub/c"],
              _part_name("relative"), needs=("corpus",)),
        Probe("a part named by an absolute path (digest recomputed): verify", "3",
              ["verify", "sub/c"], _part_name("absolute"), needs=("corpus",)),
        Probe("a shard file named ../p2/... (digest recomputed): verify", "3",
              ["verify", "p"], _shard_name, needs=("ds",)),
        Probe("a shard file named ../p2/... (digest recomputed): load", "3",
              ["python", LOAD_PACKED.format("p")], _shard_name, needs=("ds",)),
        Probe("export marker listing ../victim.txt (digest recomputed): --overwrite", "3",
              ["export", "c", "--format", "llmc", "--eos-id", "0", "-o", "x", "--overwrite",
               "-q"], before=[["export", "c", "--format", "llmc", "--eos-id", "0", "-o", "x",
                               "-q"]], prepare=_marker_escape, needs=("corpus",)),
    ]
    return out


def probes(ctx: Ctx) -> list[Probe]:
    return export_probes(ctx) + tamper_probes(ctx) + security_probes(ctx)

