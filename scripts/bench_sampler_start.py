"""How long a rank waits for its first step, and what that costs in memory, at 10^6, 10^8 and
2.5 x 10^8 packs, plain and balanced:

    python scripts/bench_sampler_start.py [--sizes 1e6,1e8,2.5e8] [--world-size 8]
                                          [--batch-size 4] [--classes 57] [--tmp DIR]

Each case runs in a fresh process (packtool imported first, not timed): build
``PackSampler(n, rank=3, world_size=8, batch_size=4, seed=1)`` and take ``next(steps())``;
printed are the seconds that took, the peak of what Python allocated meanwhile (tracemalloc)
and the growth of the resident set (/proc/self/statm, which also counts the pages of a memory
map that were read: page cache the kernel can drop, not memory the process allocated).

Balanced: the cost classes as a packed index would carry them (``CostClasses``: per class its
size, and the packs grouped by class in one uint32 file read as a memory map, 4 bytes a pack;
written once under ``--tmp`` and removed after), ``--classes`` classes of bell-shaped sizes
(57: what 1M lognormal lengths give at L=4096, cost ratio 1.1, scripts/bench_balance.py), a
pack's cost drawn from its class. Prints measurements only.
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

CHILD = r"""
import json, mmap, os, sys, time, tracemalloc
import numpy as np
sys.path.insert(0, {root!r})
from packtool.train.balance import CostClasses
from packtool.train.sampler import PackSampler

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

n, world, batch, members = {n}, {world}, {batch}, {members!r}
packs = n
if members:
    sizes = np.load(members + ".sizes.npy")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])

    class Stored:  # what a packed dataset with stored classes gives the sampler
        def __len__(self):
            return n

        def attention_costs(self, linear=0.0):
            raise RuntimeError("not read: the classes are stored")

        def cost_classes(self, ratio):
            of = lambda p: np.searchsorted(starts, p, "right") - 1
            cost = lambda p: 1.1 ** of(p) * (1 + (np.asarray(p) % 97) / 1000)
            table = np.load(members, mmap_mode="r")
            table._mmap.madvise(mmap.MADV_RANDOM)  # a step reads G scattered entries
            return CostClasses(ratio, sizes, table, of, cost, "synthetic")

    packs = Stored()
before = rss()
tracemalloc.start()
t = time.perf_counter()
s = PackSampler(packs, rank=3, world_size=world, batch_size=batch, seed=1,
                balance="attention" if members else None)
first = next(s.steps())
seconds = time.perf_counter() - t
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({{"seconds": seconds, "traced": peak, "rss": rss() - before,
                  "steps": s.n_steps, "classes": s.n_classes}}))
"""


def class_sizes(n: int, k: int) -> np.ndarray:
    w = np.exp(-((np.arange(k) - k / 3) / (k / 5)) ** 2) + 1e-4
    sizes = np.floor(n * w / w.sum()).astype(np.int64)
    sizes[int(np.argmax(sizes))] += n - int(sizes.sum())
    return sizes


def write_members(path: Path, n: int, k: int) -> None:
    """Packs grouped by class, ascending within one: class c holds packs starts[c].. here."""
    np.save(str(path) + ".sizes.npy", class_sizes(n, k))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint32, shape=(n,))
    step = 1 << 24
    for a in range(0, n, step):
        out[a:a + step] = np.arange(a, min(a + step, n), dtype=np.uint32)
    out.flush()
    del out


def run(n: int, world: int, batch: int, members: str | None) -> dict:
    code = CHILD.format(root=str(ROOT), n=n, world=world, batch=batch, members=members)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e6,1e8,2.5e8")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--classes", type=int, default=57)
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    print(f"first step of rank 3, world size {args.world_size} x batch {args.batch_size}, "
          "seed 1 (fresh process each)")
    print(f"{'packs':>12} {'balance':>9} {'seconds':>8} {'traced MB':>10} {'RSS MB':>8} "
          f"{'steps':>10} {'classes':>8}")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for n in (int(float(x)) for x in args.sizes.split(",")):
            members = Path(tmp) / f"members-{n}.npy"
            write_members(members, n, args.classes)
            for kind, m in (("none", None), ("attention", str(members))):
                r = run(n, args.world_size, args.batch_size, m)
                print(f"{n:>12,} {kind:>9} {r['seconds']:>8.3f} {r['traced'] / 2**20:>10.1f} "
                      f"{r['rss'] / 2**20:>8.1f} {r['steps']:>10,} {r['classes']:>8}",
                      flush=True)
            os.remove(members)


if __name__ == "__main__":
    main()
