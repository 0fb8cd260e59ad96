"""Near-optimal packing: the cutting-stock LP (Gilmore-Gomory) solved by column generation,
rounded, with the residue packed by best fit; provably close to the best possible.

Packing documents by length is cutting stock over the histogram: m distinct lengths w_i
(m <= L, however many documents) with demands d_i, and *patterns* a (a_i copies of length i,
sum a_i w_i <= L). The LP ``min sum x_p  s.t.  sum_p a_ip x_p >= d_i, x >= 0`` is solved with
HiGHS (``highspy``: a maintained, exact simplex with warm starts, so adding a column and
re-solving costs milliseconds; scipy's ``linprog`` would restart from scratch every time).
Columns come from a bounded-knapsack pricing step (numba): with duals y, the pattern that
maximises sum y_i a_i; if its value is <= 1 the LP is optimal and ``ceil(LP)`` is a lower
bound on packs. Pricing is a 0/1 knapsack over binary-split copies of the lengths with a
positive dual: O(L * sum_i log2(min(d_i, L / w_i))) per column, about 1 M steps at L=512 and
50 M at L=4096; beyond ``max_dp_cells`` (4e8) lengths are rounded up to a grid (safe: packs
still fit) so that L=131,072 stays tractable. Columns are capped at ``max_columns``.

Rounding: take floor(x) of every pattern, re-solve the LP on what is left, and when every x is
below 1 take one copy of the largest; stop when little is left or time runs out, then pack
the rest with best-fit decreasing. If the result is not better than plain BFD on all
documents, BFD's answer is kept: never worse than ``bfd``. Deterministic (HiGHS on one
thread, kernels loaded before the clock starts) whenever the solve finishes within
``--time-limit`` (default 5 s, covering the whole call); a solve cut short by the limit
depends on how far it got, like any time-limited solver.

If the LP did not converge in time, the reported bound is Farley's: LP >= z_master / max
pricing value, still a valid lower bound.

Measured (scripts/bench_pack.py, 2 cores, default 5 s limit): wikipedia-512 8,135,728 packs
(LP bound 8,135,727 = the L2 bound: at most one pack from optimal; BFD 8,138,483) in 3.4 s;
squad11-384 40,195 packs = ceil(LP), proven optimal (BFD 40,631) in 0.2 s; 10M lognormal
lengths at L=4096: the LP does not converge in time, BFD's 1,186,029 packs (L1 + 0.003%) are
kept, 9.3 s in all (the LP attempt plus BFD's per-document pass).
"""

from __future__ import annotations

import time

import numpy as np

from .._numba import njit
from ..errors import PacktoolError
from . import PackerOptions, Packing, bfd, report
from ._common import expand_groups

DEFAULT_WORK_LIMIT = 4_000_000_000  # pricing DP cells: ~4 s at L=4096 here; same result anywhere
MAX_COLUMNS = 20_000
MAX_DP_CELLS = 400_000_000


class _Budget:
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
def _price(weights, values, bounds, capacity):
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


class _Master:
    """The restricted master LP in HiGHS, columns added as pricing finds them."""

    def __init__(self, demand: np.ndarray):
        import highspy

        self.inf = highspy.kHighsInf
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("threads", 1)
        m = demand.size
        self.h.addRows(m, demand.astype(np.float64), np.full(m, self.inf), 0,
                       np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0))
        self.columns: list[np.ndarray] = []
        self.seen: set[bytes] = set()

    def add(self, pattern: np.ndarray) -> bool:
        key = pattern.tobytes()
        if key in self.seen:
            return False
        self.seen.add(key)
        idx = np.flatnonzero(pattern).astype(np.int32)
        self.h.addCol(1.0, 0.0, self.inf, idx.size, idx, pattern[idx].astype(np.float64))
        self.columns.append(pattern)
        return True

    def set_demand(self, demand: np.ndarray) -> None:
        for i, d in enumerate(demand):
            self.h.changeRowBounds(i, float(d), self.inf)

    def solve(self):
        self.h.run()
        sol = self.h.getSolution()
        return (self.h.getInfo().objective_function_value, np.asarray(sol.col_value),
                np.asarray(sol.row_dual))


def _column_generation(master, weights, demand, capacity, budget, max_columns):
    """Solve the LP for ``demand``; returns (z, x, converged, pricing value)."""
    bounds = np.minimum(demand, capacity // weights)
    while True:
        z, x, y = master.solve()
        y = np.maximum(y, 0.0)
        active = (y > 1e-9) & (bounds > 0)
        vals = np.where(active, y, 0.0)
        item_bounds = np.where(active, bounds, 0)
        budget.spend(item_bounds, capacity)
        value, pattern = _price(weights, vals, item_bounds, capacity)
        if value <= 1.0 + 1e-9:
            return z, x, True, value
        if budget.exhausted() or len(master.columns) >= max_columns:
            return z, x, False, value
        if not master.add(pattern):
            return z, x, True, value  # numerical tie: nothing new to add


@njit
def _greedy_patterns(weights, demand, capacity, max_patterns):
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


def _initial_patterns(weights, demand, capacity, max_patterns: int = 1000):
    order = np.argsort(-weights, kind="stable")
    greedy = _greedy_patterns(weights[order], demand[order], capacity, max_patterns)
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


_WARM = []


def _warm_up() -> None:
    """Load every kernel once per process (from numba's cache) outside the timed region."""
    if _WARM:
        return
    tiny = np.array([1, 2, 3], np.int64)
    bfd.bfd_ids(tiny, 4)
    bfd.bfd_count(np.array([0, 1, 1, 1, 0], np.int64), 4)
    _price(tiny, np.ones(3), np.ones(3, np.int64), 4)
    _greedy_patterns(tiny, np.ones(3, np.int64), 4, 4)
    expand_groups(tiny, 4, np.array([1], np.int64), np.array([-1], np.int64),
                  np.array([1], np.int64))
    _by_pack(np.zeros(3, np.int64), tiny, 1)
    _dense(np.zeros(3, np.int64), 1)
    _WARM.append(True)


def _histogram_problem(lengths, capacity, max_dp_cells):
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
    step, cap, _, weights, demand = _histogram_problem(lengths, capacity, MAX_DP_CELLS)
    if step != 1:
        raise PacktoolError(f"lp_bound needs the exact length grid; at seq_len {capacity:,} "
                            "the pricing problem is too large for it")
    master = _Master(demand)
    for p in _initial_patterns(weights, demand, cap):
        master.add(p)
    z, _, converged, value = _column_generation(master, weights, demand, cap,
                                                _Budget(work_limit), MAX_COLUMNS)
    lp = z if converged else z / max(value, 1.0)
    return int(np.ceil(lp - 1e-6)), converged


def solve(lengths: np.ndarray, capacity: int, work_limit: int = DEFAULT_WORK_LIMIT,
          time_limit: float | None = None, max_columns: int = MAX_COLUMNS,
          max_dp_cells: int = MAX_DP_CELLS) -> tuple[np.ndarray, dict]:
    """Pack ids plus a report: ``lp_value``, ``lp_bound``, ``converged``, ``bfd_packs``,
    ``used``, ``grid_step``, ``columns``, ``work``. Bounded by ``work_limit`` pricing cells
    (reproducible); ``time_limit`` adds a wall-clock limit (then the result may vary)."""
    from ..bounds import l1_bound, l2_bound

    if time_limit is not None:
        _warm_up()  # compiling or loading kernels must not count against a time limit
    t0 = time.perf_counter()
    lengths = np.asarray(lengths, np.int64)
    # BFD's pack count depends only on the lengths' multiset: count it on the histogram
    # (no per-document pass) to know the bar the LP must beat
    hist = np.bincount(lengths, minlength=capacity + 1).astype(np.int64)
    bfd_packs = int(bfd.bfd_count(hist, capacity))
    deadline = None
    if time_limit is not None:  # keep back what the per-document passes will cost
        reserve = 2 * (time.perf_counter() - t0)
        deadline = t0 + max(time_limit - reserve, 0.1 * time_limit)
    budget = _Budget(work_limit, deadline)
    info = {"bfd_packs": bfd_packs, "lp_value": None, "lp_bound": None, "converged": None,
            "grid_step": 1, "columns": 0, "work": 0, "used": "bfd"}
    info["l2_bound"] = l2_bound(lengths, capacity)
    if bfd_packs <= max(l1_bound(lengths, capacity), info["l2_bound"]):
        return bfd.bfd_ids(lengths, capacity), info  # BFD meets a lower bound: it is optimal
    step, units_cap, u, weights, demand = _histogram_problem(lengths, capacity, max_dp_cells)
    info["grid_step"] = step
    master = _Master(demand)
    for p in _initial_patterns(weights, demand, units_cap):
        master.add(p)
    z, x, converged, value = _column_generation(master, weights, demand, units_cap, budget,
                                                max_columns)
    lp = z if converged else z / max(value, 1.0)   # Farley's bound when not converged
    info.update(lp_value=float(z), converged=bool(converged),
                lp_bound=int(np.ceil(lp - 1e-6)) if step == 1 else None)

    # rounding: floors of the LP, re-solved on what is left
    chosen: dict[int, int] = {}
    left = demand.copy()
    while left.sum() > 0 and not budget.exhausted():
        fl = np.floor(x + 1e-9).astype(np.int64)
        if fl.sum() == 0:
            j = int(np.argmax(x))
            if x[j] <= 1e-9:
                break
            fl[j] = 1
        for j in np.flatnonzero(fl):
            chosen[j] = chosen.get(j, 0) + int(fl[j])
            left -= master.columns[j] * fl[j]
        left = np.maximum(left, 0)
        if left.sum() == 0:
            break
        master.set_demand(left)
        z, x, _, _ = _column_generation(master, weights, left, units_cap, budget, max_columns)
    info["columns"] = len(master.columns)
    info["work"] = budget.spent

    # patterns -> groups -> documents; the rest by best fit
    g_count, g_parent, g_len = [], [], []
    for j in sorted(chosen):
        parent = -1
        for i in np.flatnonzero(master.columns[j]):
            for _ in range(int(master.columns[j][i])):
                g_count.append(0)
                g_parent.append(parent)
                g_len.append(int(weights[i]))
                parent = len(g_len) - 1
        g_count[-1] = chosen[j]
    packs, n_packs = expand_groups(u, units_cap, np.array(g_count, np.int64),
                                   np.array(g_parent, np.int64), np.array(g_len, np.int64))
    rest = np.flatnonzero((packs < 0) & (lengths > 0))
    if rest.size:
        sub = bfd.bfd_ids(lengths[rest], capacity)
        packs[rest] = sub + n_packs
        n_packs += int(sub.max()) + 1
    packs, n_packs = _repack_emptiest(lengths, packs, n_packs, capacity)
    info["packs"] = n_packs
    if n_packs >= bfd_packs:
        return bfd.bfd_ids(lengths, capacity), info
    info["used"] = "lp"
    return packs, info


@njit
def _by_pack(packs, lengths, n_packs):
    """Documents grouped by pack (counting sort) and each pack's fill, in O(n)."""
    start = np.zeros(n_packs + 1, np.int64)
    fill = np.zeros(n_packs, np.int64)
    for i in range(packs.shape[0]):
        if packs[i] >= 0:
            start[packs[i] + 1] += 1
            fill[packs[i]] += lengths[i]
    for p in range(n_packs):
        start[p + 1] += start[p]
    pos = start[:-1].copy()
    docs = np.empty(start[n_packs], np.int64)
    for i in range(packs.shape[0]):
        if packs[i] >= 0:
            docs[pos[packs[i]]] = i
            pos[packs[i]] += 1
    return docs, start, fill


@njit
def _dense(packs, n_packs):
    """Renumber pack ids densely (dissolved packs leave holes), keeping their order."""
    used = np.zeros(n_packs, np.int64)
    for i in range(packs.shape[0]):
        if packs[i] >= 0:
            used[packs[i]] = 1
    new_id = np.cumsum(used) - 1
    for i in range(packs.shape[0]):
        if packs[i] >= 0:
            packs[i] = new_id[packs[i]]
    return int(used.sum())


def _repack_emptiest(lengths, packs, n_packs, capacity, rounds: int = 8):
    """Rounding leaves a few half-empty packs: pool the k emptiest and best-fit them again
    (k = 16, 64, ... up to 4,096; at most ``rounds`` passes), keeping any improvement.
    Each pass costs O(packs) plus the pooled documents, not O(documents)."""
    if n_packs < 2:
        return packs, n_packs
    packs = packs.copy()
    docs, start, fill = _by_pack(packs, lengths, n_packs)
    members = {}  # pack id -> its documents, for packs rebuilt by a pass
    fill = fill.astype(np.float64)
    k = 16
    for _ in range(rounds):
        live = int(np.isfinite(fill).sum())
        kk = min(k, live)
        if kk < 2 or k > min(4096, 4 * live):
            break
        worst = np.argpartition(fill, kk - 1)[:kk]
        pool = np.concatenate([members[p] if p in members else docs[start[p]:start[p + 1]]
                               for p in worst])
        sub = bfd.bfd_ids(lengths[pool], capacity)
        n_sub = int(sub.max()) + 1
        if n_sub >= kk:
            k *= 4
            continue
        ids = np.sort(worst)  # reuse the emptiest ids; the ones left over die
        for j in range(kk):
            p = ids[j]
            if j < n_sub:
                members[p] = pool[sub == j]
                fill[p] = lengths[members[p]].sum()
                packs[members[p]] = p
            else:
                members[p] = np.empty(0, np.int64)
                fill[p] = np.inf
    return packs, _dense(packs, n_packs)


def pack(lengths: np.ndarray, capacity: int, options: PackerOptions) -> Packing:
    """Near-optimal packing (LP + rounding + BFD), never worse than ``bfd``; deterministic
    unless ``options.time_limit`` is given (then the report says it is not reproducible)."""
    work = DEFAULT_WORK_LIMIT if options.work_limit is None else int(options.work_limit)
    if work < 0 or (options.time_limit is not None and options.time_limit < 0):
        raise PacktoolError("--work-limit and --time-limit must be >= 0")
    packs, info = solve(lengths, capacity, work, options.time_limit)
    rep = report("optimal", packs, options, grid_step=info["grid_step"],
                 lp_value=info["lp_value"], lp_bound=info["lp_bound"],
                 lp_converged=info["converged"], columns=info["columns"], work=info["work"],
                 baseline_packs=info["bfd_packs"], used=info["used"],
                 reproducible=options.time_limit is None)
    rep.options["work_limit"] = work
    return Packing(packs, rep)
