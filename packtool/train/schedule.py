"""Mixture schedules: which source each row of a step comes from, so that from every schedule
point on each source's count of rows stays within one row of its weight times the rows taken.

A schedule is a list of points ``(step, {source: weight})``, steps strictly increasing from 0;
a point's weights hold from its step until the next point's. Weights are non-negative, sum to
more than 0 and are normalised (``{"web": 7, "code": 3}`` is 0.7 / 0.3); a source a point does
not name has weight 0 there. A weight is taken exactly as the decimal it prints as (0.7 is
7/10, not the binary float nearest it), so the arithmetic below is in integers and exact.

**The rule (deadline order over the rows).** Within a segment (from one point to the next),
number the rows taken 1, 2, 3, ... (rows of a step in their slot order; a step holds
``G = world_size * batch_size`` rows). Source i with weight w_i has taken c_i of the first T
rows. Its row k may come at slot T only once it is *due*, ``k - 1 < w_i T`` (release
``r_k = floor((k - 1) / w_i) + 1``) and must come by slot ``d_k = ceil(k / w_i)`` (deadline).
Slot T goes to the due source whose next row has the earliest deadline (ties: the source
first in name order). Counted on cumulative targets, this is largest remainder made monotone:
every source's count is its target w_i T rounded down or up, and no count ever goes back
(Hamilton's method re-run on each total can take a row back: the Alabama paradox).

**The bound, proved.** For every source i and every T: ``floor(w_i T) <= c_i(T) <=
ceil(w_i T)``, so ``|c_i(T) - w_i T| < 1``.

- *A slot always has a due source*: sum c_i(T - 1) = T - 1 < T = sum w_i T, so some source
  has c_i < w_i T, i.e. its next row is due.
- *Upper*: source i's k-th row comes at a slot T >= r_k > (k - 1) / w_i, so c_i(T) = k <
  w_i T + 1 from then on, and c_i(T) <= ceil(w_i T).
- *Lower*: suppose row k of source j is not taken by its deadline D = d_k. Let a - 1 be the
  last slot before D given to a row of deadline > D (a = 1 if none). At slot a - 1 no row of
  deadline <= D was due (it would have won), so every row taken in [a, D], and row k of j,
  has release >= a and deadline <= D: D - a + 2 rows. But a source's rows with release >= a
  and deadline <= D are its k with ``w_i (a - 1) + 1 <= k <= w_i D``: at most ``w_i (D - a +
  1)`` of them, and over all sources at most D - a + 1 (the weights sum to 1). A
  contradiction: every row k comes by ceil(k / w_i), so c_i(T) >= k for every k <= w_i T,
  that is ``c_i(T) >= floor(w_i T)``.

A new segment (a schedule point, or a resume under another schedule) starts counting at 0,
so the bound holds from each point on, whatever came before. Measured by
``python scripts/bench_mixture.py``: see docs/TRAINING.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import PacktoolError


@dataclass(frozen=True)
class Segment:
    """A schedule point as integers: from ``start`` (a step) on, source i's weight is
    ``shares[i] / total`` (sources in the sampler's name order)."""

    start: int
    shares: tuple[int, ...]
    total: int


def exact(value) -> Fraction:
    """A weight as the exact decimal it prints as (0.7 -> 7/10)."""
    if isinstance(value, (int, np.integer, Fraction)):
        return Fraction(int(value) if isinstance(value, np.integer) else value)
    return Fraction(repr(float(value)))


def check_schedule(schedule, names: list[str]) -> list[Segment]:
    """The schedule's points as :class:`Segment` s over ``names``, or a PacktoolError naming
    the point, the value and what it must be."""
    if isinstance(schedule, Mapping):  # one set of weights for the whole run
        schedule = [(0, schedule)]
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise PacktoolError(f"schedule must be a non-empty list of (step, {{source: weight}}) "
                            f"points, got {schedule!r}")
    out, last = [], -1
    for k, point in enumerate(schedule):
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            raise PacktoolError(f"schedule point {k} is {point!r}: it must be a pair (step, "
                                "{source: weight})")
        step, weights = point
        if isinstance(step, bool) or not isinstance(step, int) or step <= last \
                or (k == 0 and step != 0):
            want = "0 (the schedule starts at step 0)" if k == 0 else \
                f"an integer above the previous point's step {last:,}"
            raise PacktoolError(f"schedule point {k} has step {step!r}: it must be {want}")
        out.append(_segment(int(step), weights, names, k))
        last = int(step)
    return out


def _segment(step: int, weights, names: list[str], k: int) -> Segment:
    where = f"schedule point {k} (step {step:,})"
    if not isinstance(weights, Mapping) or not weights:
        raise PacktoolError(f"{where} has weights {weights!r}: they must be a non-empty dict "
                            "{source: weight}")
    unknown = sorted(str(n) for n in weights if n not in names)
    if unknown:
        raise PacktoolError(f"{where} names source(s) {', '.join(unknown)} that the sampler "
                            f"does not have (its sources: {', '.join(names)}); add them to "
                            "the sampler's datasets or drop them from the schedule")
    fr = {}
    for name, w in weights.items():
        ok = not isinstance(w, (bool, np.bool_)) and isinstance(
            w, (int, float, Fraction, np.integer, np.floating))
        if not ok or not math.isfinite(float(w)) or w < 0:
            raise PacktoolError(f"{where} gives {name} weight {w!r}: a weight must be a "
                                "finite number >= 0 (weights are normalised to sum to 1)")
        fr[name] = exact(w)
    if sum(fr.values()) <= 0:
        raise PacktoolError(f"{where} has weights summing to 0: at least one source needs a "
                            "weight above 0")
    scale = math.lcm(*(f.denominator for f in fr.values()))
    shares = tuple(int(fr.get(n, 0) * scale) for n in names)
    return Segment(step, shares, sum(shares))


def deal(seg: Segment, taken: int, counts: list[int], rows: int) -> list[int]:
    """The source (index into ``seg.shares``) of each of the next ``rows`` rows of segment
    ``seg``, after ``taken`` rows of which source i had ``counts[i]``; ``counts`` is updated.
    Deadline order (see the module docstring): ~0.3 us per row and source."""
    a, s = seg.shares, seg.total
    live = [i for i, x in enumerate(a) if x]
    due = {i: counts[i] * s // a[i] + 1 for i in live}        # release of the next row
    deadline = {i: -(-(counts[i] + 1) * s // a[i]) for i in live}
    out = []
    for slot in range(taken + 1, taken + rows + 1):
        best = -1
        for i in live:
            if due[i] <= slot and (best < 0 or deadline[i] < deadline[best]):
                best = i
        out.append(best)
        c = counts[best] = counts[best] + 1
        due[best] = c * s // a[best] + 1
        deadline[best] = -(-(c + 1) * s // a[best])
    return out


PERIOD_MARK = 4096  # rows between remembered counts inside a period: a lookup deals < 4,096
_marks: dict = {}   # (shares, total) -> counts at every PERIOD_MARK rows of the period so far


def counts_after(seg: Segment, rows: int) -> tuple[int, ...]:
    """Per source, how many of segment ``seg``'s first ``rows`` rows it gave, without dealing
    them: the deadline order repeats every ``seg.total`` rows (after ``total`` rows every count
    is its share exactly, and each source's next release and deadline are those of row 0 plus
    ``total``), so whole periods are counted and the rest dealt from the nearest remembered
    mark. Step 10^6 of 0.7 / 0.3 (a period of 10 rows) costs what step 1 does; a period of
    10^6 rows (weights of six decimals) costs ~1 s once for 3 sources, then < 4,096 rows."""
    q, r = divmod(int(rows), seg.total)
    key = (seg.shares, seg.total)
    marks = _marks.setdefault(key, [(0,) * len(seg.shares)])
    if len(_marks) > 64:
        del _marks[next(iter(_marks))]
    k = min(r // PERIOD_MARK, len(marks) - 1)
    counts = list(marks[k])
    at = k * PERIOD_MARK
    while at < r:
        step = min(PERIOD_MARK - at % PERIOD_MARK, r - at)
        deal(seg, at, counts, step)
        at += step
        if at % PERIOD_MARK == 0 and at // PERIOD_MARK == len(marks):
            marks.append(tuple(counts))
    return tuple(q * a + c for a, c in zip(seg.shares, counts, strict=True))


def least_step(lo: int, pred, hi: int | None = None) -> int:
    """The least step >= ``lo`` where ``pred`` (False, then True from some step on) holds:
    doubling (unless ``pred(hi)`` is known to hold), then halving, O(log step) calls."""
    if hi is None:
        hi, width = lo, 1
        while not pred(hi):
            lo, hi, width = hi + 1, hi + width, width * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
