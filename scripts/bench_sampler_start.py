"""How long a rank waits for its first step, and what that costs in memory, at 10^6, 10^8 and
2.5 x 10^8 packs, plain and balanced:

    python scripts/bench_sampler_start.py [--sizes 1e6,1e8,2.5e8] [--world-size 8]
                                          [--batch-size 4] [--shard-packs 32768]

Each case runs in a fresh process (packtool imported first, not timed): build
``PackSampler(n, rank=3, world_size=8, batch_size=4, seed=1)`` and take ``next(steps())``;
printed are the seconds that took, the peak of what Python allocated meanwhile (tracemalloc)
and the growth of the resident set (/proc/self/statm).

Balanced: the real path of a packed dataset whose index stores its cost classes
(``PackedReader.cost_classes`` -> ``StoredClasses``): index.json's shard entries (each with
its packs per cost cell and costs digest, as ``pack`` writes them) are parsed from JSON text in
the timed part (``index s``: that parse alone, which ``open_packed`` does once), and a step's
packs are found in their shards' segment tables, computed by the real ``attention_costs`` over
a synthetic table of ``--shard-packs`` packs of ~20 segments each (2^27 tokens a shard at
L=4096, the default shard size) held in memory: a real run reads those tables from disk.
Prints measurements only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys, time, tracemalloc
import numpy as np
sys.path.insert(0, {root!r})
from packtool.formats.packed.costs import shard_entry
from packtool.formats.packed.layout import attention_costs
from packtool.formats.packed.reader import PackedReader
from packtool.train.sampler import PackSampler

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

n, world, batch, balanced, S = {n}, {world}, {batch}, {balanced}, {shard_packs}
packs, text = n, None
if balanced:
    rng = np.random.default_rng(0)
    docs = np.clip(rng.lognormal(np.log(300), 1.0, S * 20), 1, 4096).astype(np.int64)
    cuts = np.sort(rng.choice(np.arange(1, docs.size), S - 1, replace=False))
    table = (docs.astype(np.uint16), np.concatenate([[0], cuts, [docs.size]]).astype(np.int64))
    n_shards = -(-n // S)
    last = n - (n_shards - 1) * S

    def costs_of_shard(m):
        return attention_costs(table[0][:table[1][m]], table[1][:m + 1])

    full, tail = shard_entry(costs_of_shard(S)), shard_entry(costs_of_shard(last))
    text = json.dumps({{"cost_ratio": 1.1, "shards": [
        {{"n_packs": S, **full}}] * (n_shards - 1) + [{{"n_packs": last, **tail}}]}})

    class Reader:  # a PackedReader's index, shard lookup and cost path; tables in memory
        cost_classes = PackedReader.cost_classes

        def __init__(self, index):
            self.index = index
            self.pack_starts = np.minimum(np.arange(n_shards + 1, dtype=np.int64) * S, n)

        def __len__(self):
            return n

        def locate(self, i):
            return i // S, i % S

        def shard_costs(self, s):
            return costs_of_shard(S if s < n_shards - 1 else last)

        def attention_costs(self, linear=0.0):
            raise RuntimeError("not read: the classes are stored")

before = rss()
tracemalloc.start()
t = time.perf_counter()
if balanced:
    packs = Reader(json.loads(text))
parsed = time.perf_counter() - t
s = PackSampler(packs, rank=3, world_size=world, batch_size=batch, seed=1,
                balance="attention" if balanced else None)
first = next(s.steps())
seconds = time.perf_counter() - t
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({{"seconds": seconds, "index": parsed, "traced": peak,
                  "rss": rss() - before, "steps": s.n_steps, "classes": s.n_classes,
                  "index_mb": len(text or "") / 2**20}}))
"""


def run(n: int, world: int, batch: int, balanced: bool, shard_packs: int) -> dict:
    code = CHILD.format(root=str(ROOT), n=n, world=world, batch=batch, balanced=balanced,
                        shard_packs=shard_packs)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e6,1e8,2.5e8")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--shard-packs", type=int, default=32768)
    args = ap.parse_args()
    print(f"first step of rank 3, world size {args.world_size} x batch {args.batch_size}, "
          "seed 1 (fresh process each)")
    print(f"{'packs':>12} {'balance':>9} {'seconds':>8} {'index s':>8} {'traced MB':>10} "
          f"{'RSS MB':>8} {'steps':>10} {'classes':>8} {'index MB':>9}")
    for n in (int(float(x)) for x in args.sizes.split(",")):
        for kind in ("none", "attention"):
            r = run(n, args.world_size, args.batch_size, kind == "attention", args.shard_packs)
            print(f"{n:>12,} {kind:>9} {r['seconds']:>8.3f} {r['index']:>8.3f} "
                  f"{r['traced'] / 2**20:>10.1f} {r['rss'] / 2**20:>8.1f} {r['steps']:>10,} "
                  f"{r['classes']:>8} {r['index_mb']:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
