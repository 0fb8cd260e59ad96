"""Flip random bytes in a token corpus and a packed dataset; count what catches each flip.

    python scripts/flip_probe.py [--flips 300] [--seed 0] [--workdir bench-out/flips]

For every flip (one byte XOR a random non-zero mask, in a random file of the output, at a
random offset), on a fresh copy: does loading and reading everything (``open_tokens`` +
every document, ``open_packed`` + every pack) raise a packtool error ("caught at load"), return
the pristine data (a flip in a byte nobody reads, e.g. JSON whitespace), or return different
data silently; and does ``packtool verify`` exit 1. Prints one table. Runs on whatever
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


def build(work: Path) -> tuple[Path, Path]:
    corpus, packed = work / "c", work / "p"
    if not (work / "done").exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        run("tokenize", str(ROOT / "fixtures" / "corpus" / "part-0.jsonl"), "-t",
            str(ROOT / "fixtures" / "tokenizer"), "--eos", "<|eos|>", "-o", str(corpus), "-q")
        run("pack", str(corpus), "-L", "256", "--shard-size", "20000", "-o", str(packed), "-q")
        (work / "done").touch()
    return corpus, packed


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


def probe(kind: str, original: Path, files: list[Path], reader, flips: int, rng, work: Path):
    pristine = reader(original)
    counts = {"caught at load": 0, "unchanged data": 0, "silently different": 0,
              "crashed": 0, "caught by verify": 0}
    for _ in range(flips):
        trial = work / f"trial-{kind}"
        shutil.rmtree(trial, ignore_errors=True)
        if original.is_dir():
            shutil.copytree(original, trial)
            target = trial / rng.choice(files).name
            path = trial
        else:
            trial.mkdir()
            for f in files:
                shutil.copy(f, trial / f.name)
            target = trial / rng.choice(files).name
            path = trial / original.name
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
    corpus, packed = build(a.workdir)
    token_files = [Path(str(corpus) + s) for s in (".bin", ".boundaries", ".json")]
    packed_files = sorted(packed.iterdir())
    print(f"{'dataset':<14} {'flips':>6} {'at load':>8} {'unchanged':>10} {'silent':>7} "
          f"{'crashed':>8} {'verify':>7}")
    for kind, original, files, reader in (
            ("token corpus", corpus, token_files, read_corpus),
            ("packed", packed, packed_files, read_packed)):
        c = probe(kind.split()[0], original, files, reader, a.flips, rng, a.workdir)
        print(f"{kind:<14} {a.flips:>6} {c['caught at load']:>8} {c['unchanged data']:>10} "
              f"{c['silently different']:>7} {c['crashed']:>8} {c['caught by verify']:>7}",
              flush=True)


if __name__ == "__main__":
    main()
