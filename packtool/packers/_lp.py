"""The cutting-stock LP of :mod:`.optimal`, solved by column generation (Gilmore-Gomory):
HiGHS for the master (warm starts: a new column costs milliseconds), a bounded-knapsack
pricing kernel for new columns, a work budget that makes a stop reproducible, and
``lp_bound``, the ceiling of the LP, a lower bound on packs."""

from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

from .._numba import njit
from ..errors import PacktoolError

DEFAULT_WORK_LIMIT = 4_000_000_000  # pricing DP cells: the same stop on any machine
MAX_COLUMNS = 20_000
MAX_DP_CELLS = 400_000_000


class Budget:
    """Pricing work (DP cells) and, only when asked for, wall-clock time. Work makes a stop
    reproducible: the same input stops at the same column on any machine."""

    def __init__(self, work_limit: int, deadline: float | None = None):
        self.limit, self.deadline, self.spent = work_limit, deadline, 0

    def spend(self, bounds: np.ndarray, capacity: int) -> None:
        pieces = sum(int(b).bit_length() for b in bounds[bounds > 0])  # binary splitting
        self.spent += pieces * (capacity + 1)

    def exhausted(self) -> bool:
        return self.spent >= self.limit or (
            self.deadline is not None and time.perf_counter() > self.deadline)


@njit
def price(weights, values, bounds, capacity):
    """Bounded knapsack: maximise sum values*a s.t. sum weights*a <= capacity, a <= bounds.

    Binary splitting turns item i into copies of 1, 2, 4, ... units; a 0/1 DP over
    capacity keeps a take-bit per (copy, capacity) to rebuild the pattern.
    """
    m = weights.shape[0]
    n_items = 0
    for i in range(m):
        b = bounds[i]
        k = 1
        while b > 0:
            n_items += 1
            b -= min(k, b)
            k *= 2
    item_of = np.empty(n_items, np.int64)
    mult = np.empty(n_items, np.int64)
    t = 0
    for i in range(m):
        b = bounds[i]
        k = 1
        while b > 0:
            c = min(k, b)
            item_of[t] = i
            mult[t] = c
            t += 1
            b -= c
            k *= 2
    dp = np.zeros(capacity + 1)
    take = np.zeros((n_items, capacity + 1), np.bool_)
    for t in range(n_items):
        w = weights[item_of[t]] * mult[t]
        v = values[item_of[t]] * mult[t]
        if w > capacity:
            continue
        for c in range(capacity, w - 1, -1):
            cand = dp[c - w] + v
            if cand > dp[c] + 1e-12:
                dp[c] = cand
                take[t, c] = True
    pattern = np.zeros(m, np.int64)
    c = capacity
    for t in range(n_items - 1, -1, -1):
        if take[t, c]:
            pattern[item_of[t]] += mult[t]
            c -= weights[item_of[t]] * mult[t]
    return dp[capacity], pattern


def quiet_highs():
    """A ``highspy.Highs`` that prints nothing. HiGHS writes its banner ("Running HiGHS
    1.16.0 ...: Copyright ...") from C straight to file descriptor 1 while the first instance
    of a process is made, before any option can be set, so ``output_flag`` alone left it in
    the stdout of ``pack --json``; file descriptor 1 points at /dev/null for that call only,
    and ``output_flag`` silences every later solve."""
    import highspy

    with _stdout_to_devnull():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


@contextlib.contextmanager
def _stdout_to_devnull():
    """File descriptor 1 (what C code writes to) on /dev/null meanwhile; Python's own
    buffered output is flushed first, so none of it is lost or misplaced."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all: nothing to protect
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


class Master:
    """The restricted master LP in HiGHS, columns added as pricing finds them; ``tick(1)``
    is called for each (a progress bar's step)."""

    def __init__(self, demand: np.ndarray, tick=None):
        import highspy

        self.inf = highspy.kHighsInf
        self.h = quiet_highs()
        self.h.setOptionValue("threads", 1)
        m = demand.size
        self.h.addRows(m, demand.astype(np.float64), np.full(m, self.inf), 0,
                       np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0))
        self.columns: list[np.ndarray] = []
        self.seen: set[bytes] = set()
        self.tick = tick

    def add(self, pattern: np.ndarray) -> bool:
        key = pattern.tobytes()
        if key in self.seen:
            return False
        self.seen.add(key)
        idx = np.flatnonzero(pattern).astype(np.int32)
        self.h.addCol(1.0, 0.0, self.inf, idx.size, idx, pattern[idx].astype(np.float64))
        self.columns.append(pattern)
        if self.tick is not None:
            self.tick(1)
        return True

    def set_demand(self, demand: np.ndarray) -> None:
        for i, d in enumerate(demand):
            self.h.changeRowBounds(i, float(d), self.inf)

    def solve(self):
        self.h.run()
        sol = self.h.getSolution()
        return (self.h.getInfo().objective_function_value, np.asarray(sol.col_value),
                np.asarray(sol.row_dual))


def column_generation(master, weights, demand, capacity, budget, max_columns):
    """Solve the LP for ``demand``; returns (z, x, converged, pricing value)."""
    bounds = np.minimum(demand, capacity // weights)
    while True:
        z, x, y = master.solve()
        y = np.maximum(y, 0.0)
        active = (y > 1e-9) & (bounds > 0)
        vals = np.where(active, y, 0.0)
        item_bounds = np.where(active, bounds, 0)
        budget.spend(item_bounds, capacity)
        value, pattern = price(weights, vals, item_bounds, capacity)
        if value <= 1.0 + 1e-9:
            return z, x, True, value
        if budget.exhausted() or len(master.columns) >= max_columns:
            return z, x, False, value
        if not master.add(pattern):
            return z, x, True, value  # numerical tie: nothing new to add


@njit
def greedy_patterns(weights, demand, capacity, max_patterns):
    """First-fit-decreasing patterns over the histogram (weights sorted descending by the
    caller's order), each used as often as the demand allows: a feasible warm start."""
    m = weights.shape[0]
    left = demand.copy()
    pats = np.zeros((max_patterns, m), np.int32)
    n = 0
    while n < max_patterns:
        room = capacity
        any_left = False
        for i in range(m):
            if left[i] > 0:
                any_left = True
                k = min(left[i], room // weights[i])
                pats[n, i] = k
                room -= k * weights[i]
        if not any_left:
            break
        times = left.max()
        for i in range(m):
            if pats[n, i] > 0:
                times = min(times, left[i] // pats[n, i])
        times = max(times, 1)
        for i in range(m):
            left[i] = max(left[i] - pats[n, i] * times, 0)
        n += 1
    return pats[:n]


def initial_patterns(weights, demand, capacity, max_patterns: int = 1000):
    order = np.argsort(-weights, kind="stable")
    greedy = greedy_patterns(weights[order], demand[order], capacity, max_patterns)
    pats = []
    for row in greedy:
        p = np.zeros_like(demand)
        p[order] = row
        pats.append(p)
    for i in range(weights.size):  # one single-length pattern per length: always feasible
        p = np.zeros_like(demand)
        p[i] = min(demand[i], capacity // weights[i])
        pats.append(p)
    return pats


def histogram_problem(lengths, capacity, max_dp_cells):
    """Round lengths up to a grid step (1 unless the pricing DP would be too big)."""
    step = 1
    while True:
        units_cap = capacity // step
        u = np.minimum(-(-lengths // step), units_cap)
        hist = np.bincount(u, minlength=units_cap + 1)
        present = np.flatnonzero(hist[1:]) + 1
        splits = np.log2(np.maximum(np.minimum(hist[present], units_cap // present), 1)) + 1
        if units_cap * splits.sum() <= max_dp_cells or units_cap <= 64:
            return step, units_cap, u, present.astype(np.int64), hist[present].astype(np.int64)
        step *= 2


def lp_bound(lengths, capacity: int, work_limit: int = 10 * DEFAULT_WORK_LIMIT) -> tuple[int, bool]:
    """ceil of the cutting-stock LP optimum (a lower bound on packs) and whether it converged
    (if not, Farley's bound is returned, still valid)."""
    lengths = np.asarray(lengths, np.int64)
    lengths = lengths[lengths > 0]
    if lengths.size == 0:
        return 0, True
    step, cap, _, weights, demand = histogram_problem(lengths, capacity, MAX_DP_CELLS)
    if step != 1:
        raise PacktoolError(f"lp_bound needs the exact length grid; at seq_len {capacity:,} "
                            "the pricing problem is too large for it")
    master = Master(demand)
    for p in initial_patterns(weights, demand, cap):
        master.add(p)
    z, _, converged, value = column_generation(master, weights, demand, cap,
                                                Budget(work_limit), MAX_COLUMNS)
    lp = z if converged else z / max(value, 1.0)
    return int(np.ceil(lp - 1e-6)), converged
