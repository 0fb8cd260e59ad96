"""How long ``packtool which`` takes to name a step's documents (and where a record went) on a
packed dataset of many documents, without reading a token.

    python scripts/bench_which.py [--docs 10000000] [--median 30] [--seq-len 4096]
                                  [--workdir bench-out/which] [--repeat 7]

A synthetic corpus of ``--docs`` lognormal lengths (tests/synth.py: one input of that many
records), packed with bfd (index layout). For each sampler setting it times, in one process,
the first lookup (the dataset's index and segment tables opened, the epoch's schedule made)
and the median of ``--repeat`` more; then the whole CLI process (``python -m packtool which``,
Python's start included). Prints measurements only.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this work tree


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--median", type=float, default=30)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--workdir", default="bench-out/which")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the corpus and dataset")
    args = ap.parse_args()

    from packtool.options import PackOptions
    from packtool.pack import pack
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import lognormal_lengths, write_token_corpus

    from packtool.train.which import which_record, which_step

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lengths = lognormal_lengths(args.docs, median=args.median, cap=args.seq_len)
    t0 = time.perf_counter()
    write_token_corpus(work / "c", lengths)
    res = pack([str(work / "c")], work / "packed", PackOptions(seq_len=args.seq_len))
    print(f"{args.docs:,} documents, {int(lengths.sum()):,} tokens -> {res.n_packs:,} packs "
          f"(corpus and pack: {time.perf_counter() - t0:.1f} s)")
    print("| lookup | first (opens the dataset) | then, median |")
    print("| --- | --- | --- |")
    settings = [("step 10, world size 1, batch 1", dict(world_size=1, batch_size=1)),
                ("step 10, world size 8, batch 4", dict(world_size=8, batch_size=4)),
                ("step 10, rank 3 of 8, batch 4", dict(world_size=8, batch_size=4, rank=3)),
                ("step 10, 8 x 4, balance attention",
                 dict(world_size=8, batch_size=4, balance="attention"))]
    for label, kw in settings:
        rank = kw.pop("rank", None)
        times = [timed(lambda kw=kw, rank=rank: which_step(work / "packed", 0, 10, rank, **kw))
                 for _ in range(args.repeat + 1)]
        print(f"| {label} | {times[0] * 1e3:.0f} ms | {statistics.median(times[1:]) * 1e3:.0f} "
              "ms |")
    rec = f"synthetic:{args.docs // 2}"
    times = [timed(lambda: which_record(work / "packed", rec)) for _ in range(args.repeat + 1)]
    print(f"| record {rec} -> its packs, steps, ranks | {times[0] * 1e3:.0f} ms | "
          f"{statistics.median(times[1:]) * 1e3:.0f} ms |")
    cmd = [sys.executable, "-m", "packtool", "which", str(work / "packed"), "--epoch", "0",
           "--step", "10", "--world-size", "8", "--batch-size", "4"]
    for label, extra in (("8 x 4", []), ("8 x 4, balance attention", ["--balance", "attention"])):
        walls = [timed(lambda extra=extra: subprocess.run(cmd + extra, cwd=ROOT, check=True,
                                                          capture_output=True))
                 for _ in range(3)]
        print(f"| whole CLI process, {label} (Python's start included) | | "
              f"{statistics.median(walls) * 1e3:.0f} ms |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
