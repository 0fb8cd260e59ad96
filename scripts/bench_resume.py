"""What trusting a finished part costs on a resume (issue 18.5), as ratios to the first run.

A resume (the same command after a run was killed before its manifest, or ``--overwrite``
over an unchanged corpus) skips every part that is finished: its part manifest of the same
digest, its data files of the recorded size and sha256, and every input of the recorded
content hash (crc32, ``inputs[].content``). This script times, on the same inputs and in
this process:

1. the first run (tokenize every part; each input is hashed once read);
2. a resume of the unchanged corpus (``PREFIX.json`` removed, as a run killed before its
   commit leaves it): every part checked and skipped;
3. the same resume with the inputs' check left out, to separate its cost;
4. the two passes apart: crc32 of every input, sha256 of every part's files.

Each run is the CLI in a fresh process (a resume re-hashes what a reader process already
checked: packtool checks a file once per process).

    PYTHONPATH=$PWD python scripts/bench_resume.py [--files 8] [--mb 8]
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
sys.path.insert(0, str(ROOT))
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"


def write_inputs(folder: Path, files: int, mb: float) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import make_documents

    folder.mkdir()
    docs = make_documents(2000, seed=1)
    total = 0
    for k in range(files):
        with open(folder / f"f{k:03d}.jsonl", "w") as f:
            size, i = 0, k
            while size < mb * 1e6:
                line = json.dumps({"text": docs[i % len(docs)]}) + "\n"
                f.write(line)
                size += len(line)
                i += 7
        total += size
    return total


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# the CLI, optionally with the resume's check of the inputs left out (to separate its cost)
_RUN = """
import sys
if sys.argv[1] == "no-inputs":
    import packtool.tokenize.part as part
    real = part.check_part
    part.check_part = lambda plan, k, inputs=True: real(plan, k, False)
sys.argv = ["packtool"] + sys.argv[2:]
from packtool.cli import main
main()
"""


def tokenize(work: Path, variant: str = "plain") -> None:
    subprocess.run([sys.executable, "-c", _RUN, variant, "tokenize", str(work / "in"), "-t",
                    str(TOKENIZER), "-o", str(work / "c"), "--part-bytes", "1", "-q"],
                   check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--mb", type=float, default=8.0, help="MB of JSONL per file")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs each")
    a = ap.parse_args()

    from packtool import _io

    work = Path(tempfile.mkdtemp(prefix="packtool-resume-"))
    try:
        nbytes = write_inputs(work / "in", a.files, a.mb)

        def first():
            for p in work.glob("c*"):
                p.unlink()
            for p in work.glob(".c*"):
                p.unlink()
            tokenize(work)

        def resume(variant="plain"):
            def go():
                Path(work / "c.json").unlink()  # as a run killed before its commit leaves it
                tokenize(work, variant)
            return go

        t_first = min(timed(first) for _ in range(a.repeat))
        corpus = json.loads((work / "c.json").read_text())
        before = {q["name"]: q["checksums"] for q in corpus["parts"]}
        t_resume = min(timed(resume()) for _ in range(a.repeat))
        t_no_inputs = min(timed(resume("no-inputs")) for _ in range(a.repeat))
        after = json.loads((work / "c.json").read_text())
        assert {q["name"]: q["checksums"] for q in after["parts"]} == before
        inputs = sorted((work / "in").iterdir())
        t_crc = min(timed(lambda: [_io.crc32_file(p) for p in inputs]) for _ in range(a.repeat))
        parts = [work / f"{q['name']}{s}" for q in corpus["parts"]
                 for s in (".bin", ".boundaries")]
        t_sha = min(timed(lambda: [_io.sha256_file(p) for p in parts])
                    for _ in range(a.repeat))
        part_bytes = sum(p.stat().st_size for p in parts)
        print(f"{a.files} input files, {nbytes / 1e6:,.1f} MB of JSONL, "
              f"{corpus['n_tokens']:,} tokens in {len(corpus['parts'])} parts "
              f"({part_bytes / 1e6:,.1f} MB); the CLI in a fresh process, best of {a.repeat}, "
              f"{os.cpu_count()} cores")
        print(f"first run                         {t_first:7.3f} s  1.000")
        print(f"resume, unchanged corpus          {t_resume:7.3f} s  {t_resume / t_first:.3f}")
        print(f"resume without the inputs' check  {t_no_inputs:7.3f} s  "
              f"{t_no_inputs / t_first:.3f}")
        print(f"  crc32 of every input            {t_crc:7.3f} s  {t_crc / t_first:.3f} "
              f"({nbytes / t_crc / 1e9:.2f} GB/s, page cache)")
        print(f"  sha256 of every part's files    {t_sha:7.3f} s  {t_sha / t_first:.3f} "
              f"({part_bytes / t_sha / 1e9:.2f} GB/s, page cache)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
