"""MixtureSampler over a 10^5-step schedule with two changes: the ledger's largest deviation
from the schedule (rows of a source since the point in effect minus weight x rows since it),
and the time per step.

    python scripts/bench_mixture.py [--steps 100000] [--world 8] [--batch 4]

Sources (row counts): web 10^6, code 2 x 10^5, books 5 x 10^4 (books runs through several
epochs); schedule: web/code 0.7/0.3 from step 0, 0.5/0.3/0.2 (books) from 30% of the steps,
1/3 each from 70%.
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

from packtool.train import MixtureSampler

SIZES = {"web": 1_000_000, "code": 200_000, "books": 50_000}


def schedule(steps: int) -> list:
    third = 1 / 3
    return [(0, {"web": 0.7, "code": 0.3}),
            (int(0.3 * steps), {"web": 0.5, "code": 0.3, "books": 0.2}),
            (int(0.7 * steps), {"web": third, "code": third, "books": third})]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    sched = schedule(a.steps)
    g = a.world * a.batch
    s = MixtureSampler(SIZES, sched, rank=0, world_size=a.world, batch_size=a.batch, seed=1)
    t0 = time.perf_counter()
    n = sum(1 for _ in s.steps(until=a.steps))
    per_step = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    rows = [{k: v["rows"] for k, v in s.ledger(step).items()} for step in range(a.steps + 1)]
    ledger_s = (time.perf_counter() - t0) / (a.steps + 1)
    worst, at = 0.0, None
    for k, (start, weights) in enumerate(sched):
        end = sched[k + 1][0] if k + 1 < len(sched) else a.steps
        total = sum(Fraction(repr(w)) for w in weights.values())
        for name in SIZES:
            w = Fraction(repr(weights.get(name, 0.0))) / total
            for step in range(start + 1, end + 1):
                dev = abs(rows[step][name] - rows[start][name] - w * (step - start) * g)
                if dev > worst:
                    worst, at = float(dev), (step, name)
    last = s.ledger(a.steps)
    print(f"{a.steps:,} steps of {g} rows (world {a.world} x batch {a.batch}), 3 sources, "
          f"2 schedule changes")
    print(f"largest ledger deviation: {worst:.4f} rows (step {at[0]:,}, {at[1]}); bound < 1")
    print(f"time per step (rank 0's steps()): {1e6 * per_step:.1f} us; "
          f"ledger(step) in order: {1e6 * ledger_s:.1f} us")
    print("at the end: " + ", ".join(f"{k} {v['rows']:,} rows, {v['epochs']} epoch(s)"
                                     for k, v in last.items()))


if __name__ == "__main__":
    main()
