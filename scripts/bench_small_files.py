"""Many small input files (issue 18, item 5): ``tokenize`` of N one-line files against the
same records in one file, as ratios measured in this run (target: within 3x).

The same JSONL records are written once as ``--files`` one-line files and once as one file;
each is tokenized by the CLI in a fresh process (start-up included, as a user runs it):

- ``one file``: the reference;
- ``grouped``: the N files with the default ``--part-bytes`` (256 MiB: small files grouped
  into one part);
- ``one part per file``: ``--part-bytes 1``, N parts: what each part costs on its own
  (tokenizer and engine set-up once per run, its commit, its part manifest).

    PYTHONPATH=$PWD python scripts/bench_small_files.py [--files 2000] [--repeat 3]
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


def tokenize(inputs: Path, out: Path, *extra) -> float:
    for p in out.parent.glob(f"*{out.name}*"):
        p.unlink()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "packtool", "tokenize", str(inputs), "-t",
                    str(TOKENIZER), "-o", str(out), "-q", *extra], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs each")
    ap.add_argument("--skip-per-file", action="store_true",
                    help="leave out the --part-bytes 1 run (N parts)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import make_documents

    work = Path(tempfile.mkdtemp(prefix="packtool-small-"))
    try:
        docs = make_documents(a.files, seed=1, median_words=20, max_words=60)
        lines = [json.dumps({"text": d}) + "\n" for d in docs]
        (work / "many").mkdir()
        for i, line in enumerate(lines):
            (work / "many" / f"f{i:05d}.jsonl").write_text(line)
        (work / "one").mkdir()
        (work / "one" / "all.jsonl").write_text("".join(lines))
        (work / "out").mkdir()
        runs = {"one file": (work / "one", ()), "grouped": (work / "many", ())}
        if not a.skip_per_file:
            runs["one part per file"] = (work / "many", ("--part-bytes", "1"))
        times = {name: min(tokenize(src, work / "out" / "c", *extra) for _ in range(a.repeat))
                 for name, (src, extra) in runs.items()}
        ref = times["one file"]
        print(f"{a.files:,} one-line JSONL files ({sum(map(len, lines)) / 1e3:,.0f} kB) vs the "
              f"same records in one file; best of {a.repeat}, CLI start-up included")
        for name, t in times.items():
            print(f"{name:20} {t:8.2f} s  {t / ref:6.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
