"""How even is attention work across data-parallel ranks, random vs balance="attention"?

    python scripts/bench_balance.py [--docs 10000000] [--world-size 8] [--batch-sizes 1,2,4,8]

10M lognormal document lengths (median 300, sigma 1, clipped to [1, 4096]; the lengths of
scripts/bench_pack.py), packed with bfd at L=4096 (packtool.packers.assign_packs). A pack's cost
is the sum of its squared document lengths (what packtool.sampler.attention_costs reads from a
packed dataset's cu_seqlens). For each per-rank batch size (packs per rank per step) it prints
the mean and the 99th percentile over the epoch's steps of max-rank cost / mean-rank cost, for
the plain shuffled sampler and for balance="attention", and the seconds one epoch's balanced
schedule takes, and the mean of a per-step lower bound (the rank with the costliest pack also
holds the batch_size - 1 cheapest). Goal: mean <= 1.05 balanced. Prints measurements only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this work tree

from packtool.packers import assign_packs
from packtool.sampler import PackSampler

SEQ_LEN = 4096


def imbalance(sampler: PackSampler, costs: np.ndarray) -> np.ndarray:
    """Per step: the costliest rank's cost over the mean rank's cost."""
    per_rank = costs[sampler.global_schedule()].sum(axis=2)  # [steps, world_size]
    return per_rank.max(axis=1) / per_rank.mean(axis=1)


def bound(sampler: PackSampler, costs: np.ndarray) -> np.ndarray:
    """Per step, a lower bound on max/mean for any assignment with batch_size packs per rank:
    the rank holding the costliest pack also holds batch_size - 1 others, at least the cheapest."""
    c = np.sort(costs[sampler.global_schedule()].reshape(sampler.n_steps, -1), axis=1)
    floor = c[:, -1] + c[:, : sampler.batch_size - 1].sum(axis=1)
    mean = c.sum(axis=1) / sampler.world_size
    return np.maximum(floor, mean) / mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    args = ap.parse_args()
    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(300), 1.0, args.docs),
                      1, SEQ_LEN).astype(np.int64)
    t0 = time.perf_counter()
    packs = assign_packs(lengths, SEQ_LEN, "bfd")
    n_packs = int(packs.max()) + 1
    costs = np.bincount(packs, weights=lengths.astype(np.float64) ** 2, minlength=n_packs)
    print(f"{args.docs:,} lognormal lengths -> {n_packs:,} bfd packs of {SEQ_LEN} in "
          f"{time.perf_counter() - t0:.1f} s; pack cost = sum of squared document lengths: "
          f"median {np.median(costs):.3g}, max/median {costs.max() / np.median(costs):.1f}")
    print(f"world size {args.world_size}; mean (p99) over steps of max-rank / mean-rank cost")
    print(f"{'batch/rank':>10} {'steps':>8} {'random':>16} {'balanced':>16} {'bound':>8} "
          f"{'balance s':>10}")
    for b in (int(x) for x in args.batch_sizes.split(",")):
        plain = PackSampler(n_packs, rank=0, world_size=args.world_size, batch_size=b)
        bal = PackSampler(n_packs, rank=0, world_size=args.world_size, batch_size=b,
                          balance=costs)
        r = imbalance(plain, costs)
        t0 = time.perf_counter()
        bal.global_schedule()
        secs = time.perf_counter() - t0
        q = imbalance(bal, costs)
        print(f"{b:>10} {len(r):>8,} {r.mean():>8.3f} ({np.percentile(r, 99):.3f})"
              f" {q.mean():>8.3f} ({np.percentile(q, 99):.3f})"
              f" {bound(bal, costs).mean():>8.3f} {secs:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
