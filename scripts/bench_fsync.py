"""What durable commits cost (issue 18, item 5): ``tokenize`` and ``pack`` with fsync (the
default) and with ``PACKTOOL_FSYNC=0``, as ratios measured in this run.

A commit fsyncs each data file and its folder before the commit point (the manifest's rename,
or the dataset folder's swap) and the folder after it (``packtool.storage.atomic.FSYNC``). Each run
is the CLI in a fresh process, best of ``--repeat``:

- tokenize: ``--files`` JSONL files of ``--mb`` MB grouped into one part (the default), and
  the same files one part each (``--part-bytes 1``: a commit per part);
- tokenize of ``--small`` one-line files, one part each (many tiny commits);
- pack of the corpus, both layouts (``--layout index``: the segment tables; ``tokens``: the
  tokens too), ``--shard-size`` tokens a shard.

    PYTHONPATH=$PWD python scripts/bench_fsync.py [--files 8] [--mb 8] [--small 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"


def run(args: list, fsync: bool) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKTOOL_FSYNC": "1" if fsync else "0"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "packtool", *map(str, args), "-q"], check=True,
                   cwd=ROOT, env=env)
    return time.perf_counter() - t0


def clean(out: Path) -> None:
    for p in out.parent.iterdir():
        if p.name.startswith((out.name, f".{out.name}")):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--small", type=int, default=200, help="one-line files, one part each")
    ap.add_argument("--shard-size", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import make_documents

    work = Path(tempfile.mkdtemp(prefix="packtool-fsync-"))
    try:
        docs = make_documents(2000, seed=1)
        (work / "in").mkdir()
        for k in range(a.files):
            with open(work / "in" / f"f{k:03d}.jsonl", "w") as f:
                size, i = 0, k
                while size < a.mb * 1e6:
                    line = json.dumps({"text": docs[i % len(docs)]}) + "\n"
                    f.write(line)
                    size += len(line)
                    i += 7
        (work / "small").mkdir()
        for i, d in enumerate(make_documents(a.small, seed=2, median_words=20, max_words=60)):
            (work / "small" / f"s{i:05d}.jsonl").write_text(json.dumps({"text": d}) + "\n")
        (work / "out").mkdir()
        src = work / "out" / "src"
        run(["tokenize", work / "in", "-t", TOKENIZER, "-o", src], True)
        out = work / "out" / "x"
        cases = {
            "tokenize, 1 part": ["tokenize", work / "in", "-t", TOKENIZER, "-o", out],
            f"tokenize, {a.files} parts": ["tokenize", work / "in", "-t", TOKENIZER, "-o", out,
                                           "--part-bytes", 1],
            f"tokenize, {a.small} tiny parts": ["tokenize", work / "small", "-t", TOKENIZER,
                                                "-o", out, "--part-bytes", 1],
            "pack --layout index": ["pack", src, "-L", 2048, "--shard-size", a.shard_size,
                                    "-o", out, "--layout", "index"],
            "pack --layout tokens": ["pack", src, "-L", 2048, "--shard-size", a.shard_size,
                                     "-o", out, "--layout", "tokens"],
        }
        print(f"{a.files} x {a.mb:g} MB of JSONL; best of {a.repeat}; the CLI in a fresh "
              "process (start-up included)")
        print(f"{'':28} {'fsync':>8} {'no fsync':>9} {'ratio':>7}")
        for name, args in cases.items():
            t = {}
            for fsync in (False, True):
                best = None
                for _ in range(a.repeat):
                    clean(out)
                    s = run(args, fsync)
                    best = s if best is None else min(best, s)
                t[fsync] = best
            print(f"{name:28} {t[True]:7.2f}s {t[False]:8.2f}s {t[True] / t[False]:6.2f}x",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
