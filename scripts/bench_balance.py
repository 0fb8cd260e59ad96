"""How even is attention work across data-parallel ranks: shuffled vs balance="attention"?

    python scripts/bench_balance.py [--docs 1000000] [--world-size 8] [--batch-sizes 1,2,4]
                                    [--cost-ratio 1.1] [--hidden 4096]

Lognormal document lengths (median 300, sigma 1, clipped to [1, 4096]; the lengths of
scripts/bench_pack.py), packed with bfd at L=4096 (packtool.packers.assign_packs). A pack's cost
is the sum of its squared document lengths (what packtool.train.sampler.attention_costs reads from a
packed dataset's cu_seqlens). For each per-rank batch size (packs per rank per step) it prints
the mean and 99th percentile over the epoch's steps of max-rank cost / mean-rank cost, for:

    shuffled        PackSampler(balance=None): the epoch's order cut into steps
    dealt only      each shuffled step's packs dealt to ranks by cost (the sampler before steps
                    of like cost; cost_ratio=1e300 puts every pack in one class)
    balanced        PackSampler(balance=costs): steps of like cost, then dealt
    even packs      an ideal packing objective, shuffled, and dealt only: every document over
                    L/2 alone in its pack (two cannot share one), every other pack at exactly
                    the mean of the rest; no real packer's packs can be more even than this

and the packs each uses against plain bfd, the seconds one epoch's balanced schedule takes, and
the shuffled figure with the whole block's cost (``--hidden d``: + 12 d x tokens, see
attention_costs). Prints measurements only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this work tree

from packtool.packers import assign_packs
from packtool.train.sampler import PackSampler

SEQ_LEN = 4096


def imbalance(sampler: PackSampler, costs: np.ndarray) -> np.ndarray:
    """Per step: the costliest rank's cost over the mean rank's cost."""
    per_rank = costs[sampler.global_schedule()].sum(axis=2)  # [steps, world_size]
    return per_rank.max(axis=1) / per_rank.mean(axis=1)


def even_packs(lengths: np.ndarray, n_packs: int) -> np.ndarray:
    """The most even costs any packing into ``n_packs`` packs can have (see the docstring)."""
    sq = lengths.astype(np.float64) ** 2
    alone = sq[lengths > SEQ_LEN // 2]
    rest = (sq.sum() - alone.sum()) / (n_packs - len(alone))
    return np.concatenate([alone, np.full(n_packs - len(alone), rest)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--batch-sizes", default="1,2,4")
    ap.add_argument("--cost-ratio", type=float, default=1.1)
    ap.add_argument("--hidden", type=int, default=4096)
    args = ap.parse_args()
    w = args.world_size
    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(300), 1.0, args.docs),
                      1, SEQ_LEN).astype(np.int64)
    t0 = time.perf_counter()
    packs = assign_packs(lengths, SEQ_LEN, "bfd")
    n_packs = int(packs.max()) + 1
    costs = np.bincount(packs, weights=lengths.astype(np.float64) ** 2, minlength=n_packs)
    tokens = np.bincount(packs, weights=lengths, minlength=n_packs)
    ideal = even_packs(lengths, n_packs)
    classes = PackSampler(n_packs, rank=0, world_size=w, balance=costs,
                          cost_ratio=args.cost_ratio).n_classes
    print(f"{args.docs:,} lognormal lengths -> {n_packs:,} bfd packs of {SEQ_LEN} in "
          f"{time.perf_counter() - t0:.1f} s; pack cost = sum of squared document lengths: "
          f"mean {costs.mean() / 1e6:.2f}M, max {costs.max() / 1e6:.2f}M; {classes} cost "
          f"classes at ratio {args.cost_ratio}")
    print(f"world size {w}; mean (p99) over steps of max-rank / mean-rank cost")
    rows = [("shuffled", costs, dict()), ("dealt only", costs, dict(cost_ratio=1e300)),
            ("balanced", costs, dict(cost_ratio=args.cost_ratio)),
            ("even packs, shuffled", ideal, None),
            ("even packs, dealt only", ideal, dict(cost_ratio=1e300))]
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    print(f"{'packs per rank per step':<24}" + "".join(f"{b:>17}" for b in sizes)
          + f"{'packs vs bfd':>14}")
    secs = {}
    for name, c, kw in rows:
        cells = []
        for b in sizes:
            s = PackSampler(n_packs, rank=0, world_size=w, batch_size=b,
                            balance=None if kw is None or name == "shuffled" else c,
                            **(kw if kw and name != "shuffled" else {}))
            t0 = time.perf_counter()
            s.global_schedule()
            secs[(name, b)] = time.perf_counter() - t0
            r = imbalance(s, c)
            cells.append(f"{r.mean():.3f} ({np.percentile(r, 99):.3f})")
        extra = "+0 (same)" if not name.startswith("even") else "+0 (ideal)"
        print(f"{name:<24}" + "".join(f"{x:>17}" for x in cells) + f"{extra:>14}", flush=True)
    print("seconds for one epoch's balanced schedule: "
          + ", ".join(f"{secs[('balanced', b)]:.2f} (batch {b})" for b in sizes))
    block = costs + 12 * args.hidden * tokens
    s = PackSampler(n_packs, rank=0, world_size=w, batch_size=1)
    print(f"whole block (attention + 12 x {args.hidden} x tokens), shuffled, 1 pack per rank: "
          f"{imbalance(s, block).mean():.3f}")


if __name__ == "__main__":
    main()
