"""How even is causal-attention work across context-parallel ranks: cp_shard "balanced" against a
contiguous split, and zigzag on the same rows aligned to 2 x CP?

    python scripts/bench_cp.py [--docs 200000] [--cp 4] [--median 300] [--sigma 1.0]

Lognormal document lengths (``--median``, ``--sigma``, clipped to [1, 8192]), packed with bfd
at seq_len 8192 (packtool.packers.assign_packs). A rank's work is the sum over its queries of
the keys before them in their segment (in-segment position + 1). Per row, the costliest rank's
work over the mean rank's; printed: mean and worst over the rows, and the spread of token counts
(max - min over the ranks of a row, worst row). Rows:

    contiguous   the row cut into cp equal token runs (what plain sequence sharding does)
    balanced     cp_shard(row, cp, r, "balanced")
    zigzag       every document padded to a multiple of 2 x cp (its pads count as queries),
                 cp_shard(..., "zigzag"); the rows may then overflow 8192, as they do when
                 padding comes after planning

Prints measurements only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this work tree

from packtool.packers import assign_packs
from packtool.train.cp import cp_shard

SEQ_LEN = 8192


def rank_work(cu: np.ndarray, positions: np.ndarray) -> int:
    seg_start = cu[np.searchsorted(cu, positions, side="right") - 1]
    return int((positions - seg_start + 1).sum())


def contiguous(cu: np.ndarray, cp: int) -> list[np.ndarray]:
    return np.array_split(np.arange(int(cu[-1])), cp)


def measure(rows: list[np.ndarray], cp: int, split) -> tuple[np.ndarray, int]:
    ratios, spread = [], 0
    for cu in rows:
        parts = split(cu)
        work = np.array([rank_work(cu, p) for p in parts], np.float64)
        ratios.append(work.max() / work.mean())
        sizes = [len(p) for p in parts]
        spread = max(spread, max(sizes) - min(sizes))
    return np.array(ratios), spread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--cp", type=int, default=4)
    ap.add_argument("--median", type=float, default=300)
    ap.add_argument("--sigma", type=float, default=1.0)
    args = ap.parse_args()
    cp = args.cp
    lengths = np.clip(np.round(np.random.default_rng(0).lognormal(
        np.log(args.median), args.sigma, args.docs)), 1, SEQ_LEN).astype(np.int64)
    packs = assign_packs(lengths, SEQ_LEN, "bfd")
    order = np.argsort(packs, kind="stable")
    bounds = np.searchsorted(packs[order], np.arange(int(packs.max()) + 2))
    rows = [np.concatenate([[0], np.cumsum(lengths[order[a:b]])])
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    print(f"{args.docs:,} lognormal lengths (median {args.median:g}, sigma {args.sigma:g}, "
          f"clipped at {SEQ_LEN}) -> {len(rows):,} bfd rows of {SEQ_LEN}; CP = {cp}")

    def shard(cu, mode):
        ex = {"input_ids": np.zeros(int(cu[-1]), np.int64), "cu_seqlens": cu}
        return [cp_shard(ex, cp, r, mode)["positions"] for r in range(cp)]

    def aligned(cu):
        lens = np.diff(cu)
        return np.concatenate([[0], np.cumsum(-(-lens // (2 * cp)) * (2 * cp))])

    print(f"{'split':<12}{'mean max/mean':>15}{'worst':>9}{'token spread':>14}{'s':>7}")
    for name, rs, split in [
        ("contiguous", rows, lambda cu: contiguous(cu, cp)),
        ("balanced", rows, lambda cu: shard(cu, "balanced")),
        ("zigzag", [aligned(cu) for cu in rows], lambda cu: shard(cu, "zigzag")),
    ]:
        t0 = time.perf_counter()
        r, spread = measure(rs, cp, split)
        print(f"{name:<12}{r.mean():>15.4f}{r.max():>9.4f}{spread:>14,}"
              f"{time.perf_counter() - t0:>7.1f}")


if __name__ == "__main__":
    main()
