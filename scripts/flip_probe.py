"""Flip random bytes in a token corpus and packed datasets; count what catches each flip.

    python scripts/flip_probe.py [--flips 300] [--seed 0] [--workdir bench-out/flips]

For every flip (one byte XOR a random non-zero mask, in a random file, at a random offset),
on a fresh copy: does loading and reading everything (``open_tokens`` + every document,
``open_packed`` + every pack) raise a packtool error ("caught at load"), return the pristine
data (a flip in a byte nobody reads, e.g. JSON whitespace), or return different data
silently; and does ``packtool verify`` exit 1. Datasets:

- ``token corpus``: PREFIX.bin, .boundaries, .json;
- ``packed index``: a packed dataset of ``--layout index`` (segment tables only: the tokens
  are read from the corpus), a flip in its own files;
- ``index source``: the same dataset, the flip in the corpus it reads its tokens from;
- ``packed tokens``: a packed dataset of ``--layout tokens`` (the tokens stored too).

A checkout without ``--layout`` (one packed layout) probes ``packed`` alone. Runs on whatever
``packtool`` is importable (put a checkout first on PYTHONPATH to measure another version).
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def build(work: Path) -> dict:
    """The corpus ``c`` and its packed datasets, built once per workdir."""
    corpus = work / "c"
    layouts = ("index", "tokens") if "--layout" in run("pack", "--help").stdout else (None,)
    datasets = {layout: work / (f"p-{layout}" if layout else "p") for layout in layouts}
    if not (work / "done").exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        run("tokenize", str(ROOT / "fixtures" / "corpus" / "part-0.jsonl"), "-t",
            str(ROOT / "fixtures" / "tokenizer"), "--eos", "<|eos|>", "-o", str(corpus), "-q")
        for layout, out in datasets.items():
            run("pack", str(corpus), "-L", "256", "--shard-size", "20000", "-o", str(out), "-q",
                *(["--layout", layout] if layout else []))
        (work / "done").touch()
    return {"corpus": corpus, "datasets": datasets}


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packtool", *args], capture_output=True,
                          text=True, cwd=str(Path.cwd()))


def read_corpus(prefix: Path):
    import packtool

    c = packtool.open_tokens(prefix)
    return [np.array(c[i]) for i in range(len(c))]


def read_packed(directory: Path):
    import packtool

    ds = packtool.open_packed(directory)
    return [{k: np.array(v) for k, v in ds[i].items()} for i in range(len(ds))]


def same(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            if x.keys() != y.keys() or any(not np.array_equal(x[k], y[k]) for k in x):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def corpus_files(corpus: Path) -> list[Path]:
    return [Path(str(corpus) + s) for s in (".bin", ".boundaries", ".json")]


def copy_corpus(corpus: Path, folder: Path) -> Path:
    """The files flips land in, and the part's own hidden manifest a corpus requires."""
    for f in corpus_files(corpus) + [corpus.with_name(f".{corpus.name}.part.json")]:
        shutil.copy(f, folder / f.name)
    return folder / corpus.name


def probe(kind: str, built: dict, flips: int, rng, work: Path) -> dict:
    """``kind``: "token corpus", "packed <layout>" or "index source"."""
    corpus = built["corpus"]
    layout = {"packed index": "index", "index source": "index", "packed tokens": "tokens"}
    dataset = built["datasets"].get(layout.get(kind))
    reader = read_corpus if kind == "token corpus" else read_packed
    pristine = reader(corpus if kind == "token corpus" else dataset)
    counts = {"caught at load": 0, "unchanged data": 0, "silently different": 0,
              "crashed": 0, "caught by verify": 0}
    for _ in range(flips):
        trial = work / f"trial-{kind.replace(' ', '-')}"
        shutil.rmtree(trial, ignore_errors=True)
        trial.mkdir()
        # the dataset and its corpus side by side, as built (index layout: ../c)
        copied = copy_corpus(corpus, trial)
        if kind == "token corpus":
            path, target = copied, trial / rng.choice(corpus_files(corpus)).name
        else:
            path = trial / dataset.name
            shutil.copytree(dataset, path)
            if kind == "index source":
                target = trial / rng.choice(corpus_files(corpus)).name
            else:
                target = path / rng.choice(sorted(p.name for p in dataset.iterdir()))
        data = bytearray(target.read_bytes())
        if not data:
            continue
        data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        target.write_bytes(bytes(data))
        code = ("import sys; sys.path.insert(0, sys.argv[3]); "
                "from flip_probe import *; import pickle; "
                f"r = {reader.__name__}(Path(sys.argv[1])); "
                "pickle.dump(r, open(sys.argv[2], 'wb'))")
        out = work / "read.pkl"
        proc = subprocess.run([sys.executable, "-c", code, str(path), str(out),
                               str(Path(__file__).parent)], capture_output=True, text=True)
        if proc.returncode == 0:
            import pickle

            with open(out, "rb") as f:
                got = pickle.load(f)
            counts["unchanged data" if same(got, pristine) else "silently different"] += 1
        elif "Traceback" in proc.stderr and "packtool" in proc.stderr and (
                "FormatError" in proc.stderr or "PacktoolError" in proc.stderr
                or "ValidationError" in proc.stderr):
            counts["caught at load"] += 1
        else:
            counts["crashed"] += 1
        if run("verify", str(path)).returncode == 1:
            counts["caught by verify"] += 1
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flips", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out" / "flips")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    built = build(a.workdir.resolve())
    kinds = ["token corpus"]
    if None in built["datasets"]:
        kinds.append("packed")
    else:
        kinds += ["packed index", "index source", "packed tokens"]
    print(f"{'dataset':<14} {'flips':>6} {'at load':>8} {'unchanged':>10} {'silent':>7} "
          f"{'crashed':>8} {'verify':>7}")
    for kind in kinds:
        c = probe(kind, built, a.flips, rng, a.workdir.resolve())
        print(f"{kind:<14} {a.flips:>6} {c['caught at load']:>8} {c['unchanged data']:>10} "
              f"{c['silently different']:>7} {c['crashed']:>8} {c['caught by verify']:>7}",
              flush=True)


if __name__ == "__main__":
    main()
