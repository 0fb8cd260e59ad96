"""How long a rank of a token-budget sampler waits for its first step, and what that costs in
memory, at 10^6, 10^8 and 2.5 x 10^8 rows:

    python scripts/bench_budget_start.py [--sizes 1e6,1e8,2.5e8] [--world-size 8]
                                         [--tokens-per-step 1048576] [--tmp DIR]

The rows' slot lengths (256, 512, 1024, 2048, 4096 drawn at random, as ``pack --vsl`` could
give them) are written once per size as an int64 ``.npy`` under ``--tmp`` (2 GB at 2.5 x 10^8)
and read as a memory map, as a dataset's stored lengths would be. Each case runs in a fresh
process (packtool and its numba kernels loaded and compiled first, not timed): build
``PackSampler(lengths, rank=3, world_size=8, tokens_per_step=T, curriculum=...)`` and take
``next(steps())``; printed are the seconds, the peak of what Python allocated meanwhile
(tracemalloc: the count table, a step's rows) and the growth of the resident set (which also
counts the pages of the memory map read: page cache, not memory the process allocated; the
count pass reads every row's length once). Prints measurements only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SLOTS = np.array([256, 512, 1024, 2048, 4096], np.int64)

CHILD = r"""
import json, os, sys, time, tracemalloc
import numpy as np
sys.path.insert(0, {root!r})
from packtool.train.sampler import PackSampler
from packtool.train import by_length

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

warm = np.array([256, 512, 256], np.int64)  # compile (or load) the kernels, not timed
list(PackSampler(warm, rank=0, world_size=1, tokens_per_step=1024).steps())
lengths = np.load({path!r}, mmap_mode="r")
before = rss()
tracemalloc.start()
t = time.perf_counter()
s = PackSampler(lengths, rank=3, world_size={world}, tokens_per_step={t}, seed=1,
                curriculum={curriculum!r})
first = next(s.steps())
seconds = time.perf_counter() - t
peak = tracemalloc.get_traced_memory()[1]
t = time.perf_counter()
for _, step in zip(range(100), s.steps()):
    pass
per_step = (time.perf_counter() - t) / 100
print(json.dumps({{"seconds": seconds, "traced": peak, "rss": rss() - before,
                  "steps": s.n_steps, "rows": len(first), "per_step": per_step}}))
"""


def write_lengths(path: Path, n: int) -> None:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(n,))
    rng = np.random.default_rng(0)
    for a in range(0, n, 1 << 24):
        b = min(a + (1 << 24), n)
        out[a:b] = SLOTS[rng.integers(0, len(SLOTS), b - a)]
    out.flush()
    del out


def run(path: Path, world: int, t: int, curriculum: str) -> dict:
    code = CHILD.format(root=str(ROOT), path=str(path), world=world, t=t, curriculum=curriculum)
    env = dict(os.environ, PACKTOOL_QUIET_COMPILE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=env)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e6,1e8,2.5e8")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--tokens-per-step", type=int, default=1 << 20)
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    print(f"first step of rank 3, world size {args.world_size}, {args.tokens_per_step:,} tokens "
          "a step, seed 1 (fresh process each)")
    print(f"{'rows':>12} {'curriculum':>10} {'seconds':>8} {'traced MB':>10} {'RSS MB':>8} "
          f"{'steps':>8} {'ms/step':>8}")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for n in (int(float(x)) for x in args.sizes.split(",")):
            path = Path(tmp) / f"lengths-{n}.npy"
            write_lengths(path, n)
            for curriculum in ("uniform", "grow-p2"):
                r = run(path, args.world_size, args.tokens_per_step, curriculum)
                print(f"{n:>12,} {curriculum:>10} {r['seconds']:>8.3f} "
                      f"{r['traced'] / 2**20:>10.1f} {r['rss'] / 2**20:>8.1f} {r['steps']:>8,} "
                      f"{r['per_step'] * 1e3:>8.2f}", flush=True)
            os.remove(path)


if __name__ == "__main__":
    main()
