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
from .._progress import activity
from ..errors import PacktoolError
from . import PackerOptions, Packing, bfd, report
from ._common import expand_groups, expand_patterns
from ._lp import (
    DEFAULT_WORK_LIMIT,
    MAX_COLUMNS,
    MAX_DP_CELLS,
    Budget,
    Master,
    column_generation,
    greedy_patterns,
    histogram_problem,
    initial_patterns,
    lp_bound,
    price,
)

__all__ = ["DEFAULT_WORK_LIMIT", "MAX_COLUMNS", "MAX_DP_CELLS", "lp_bound", "pack", "solve"]


_WARM = []


def _warm_up() -> None:
    """Load every kernel once per process (from numba's cache) outside the timed region."""
    if _WARM:
        return
    tiny = np.array([1, 2, 3], np.int64)
    bfd.bfd_ids(tiny, 4)
    bfd.bfd_count(np.array([0, 1, 1, 1, 0], np.int64), 4)
    price(tiny, np.ones(3), np.ones(3, np.int64), 4)
    greedy_patterns(tiny, np.ones(3, np.int64), 4, 4)
    expand_groups(tiny, 4, np.array([1], np.int64), np.array([-1], np.int64),
                  np.array([1], np.int64))
    _by_pack(np.zeros(3, np.int64), tiny, 1)
    _dense(np.zeros(3, np.int64), 1)
    _WARM.append(True)


def solve(lengths: np.ndarray, capacity: int, work_limit: int = DEFAULT_WORK_LIMIT,
          time_limit: float | None = None, max_columns: int = MAX_COLUMNS,
          max_dp_cells: int = MAX_DP_CELLS, tick=None) -> tuple[np.ndarray, dict]:
    """Pack ids plus a report: ``lp_value``, ``lp_bound``, ``converged``, ``bfd_packs``,
    ``used``, ``grid_step``, ``columns``, ``work``. Bounded by ``work_limit`` pricing cells
    (reproducible); ``time_limit`` adds a wall-clock limit (then the result may vary).
    ``tick(1)`` is called for every LP column (progress)."""
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
    budget = Budget(work_limit, deadline)
    info = {"bfd_packs": bfd_packs, "lp_value": None, "lp_bound": None, "converged": None,
            "grid_step": 1, "columns": 0, "work": 0, "used": "bfd"}
    info["l2_bound"] = l2_bound(lengths, capacity)
    if bfd_packs <= max(l1_bound(lengths, capacity), info["l2_bound"]):
        return bfd.bfd_ids(lengths, capacity), info  # BFD meets a lower bound: it is optimal
    step, units_cap, u, weights, demand = histogram_problem(lengths, capacity, max_dp_cells)
    info["grid_step"] = step
    master = Master(demand, tick)
    for p in initial_patterns(weights, demand, units_cap):
        master.add(p)
    z, x, converged, value = column_generation(master, weights, demand, units_cap, budget,
                                                max_columns)
    lp = z if converged else z / max(value, 1.0)   # Farley's bound when not converged
    info.update(lp_value=float(z), converged=bool(converged),
                lp_bound=int(np.ceil(lp - 1e-6)) if step == 1 else None)

    chosen = _round(master, x, weights, demand, units_cap, budget, max_columns)
    info["columns"] = len(master.columns)
    info["work"] = budget.spent
    packs, n_packs = _documents(chosen, master, weights, u, units_cap, lengths, capacity)
    info["packs"] = n_packs
    if n_packs >= bfd_packs:
        return bfd.bfd_ids(lengths, capacity), info
    info["used"] = "lp"
    return packs, info


def _round(master, x, weights, demand, units_cap, budget, max_columns) -> dict[int, int]:
    """Copies of each pattern: floors of the LP, re-solved on what is left, until nothing is
    left or the budget is spent."""
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
        _, x, _, _ = column_generation(master, weights, left, units_cap, budget, max_columns)
    return chosen


def _documents(chosen, master, weights, u, units_cap, lengths, capacity):
    """Patterns -> groups -> documents; what no pattern took, by best fit; then the emptiest
    packs re-packed. (pack ids, pack count)."""
    packs, n_packs = expand_patterns(
        u, units_cap, [np.repeat(weights, master.columns[j]) for j in sorted(chosen)],
        [chosen[j] for j in sorted(chosen)])
    rest = np.flatnonzero((packs < 0) & (lengths > 0))
    if rest.size:
        sub = bfd.bfd_ids(lengths[rest], capacity)
        packs[rest] = sub + n_packs
        n_packs += int(sub.max()) + 1
    return _repack_emptiest(lengths, packs, n_packs, capacity)


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
    with activity(f"optimal: cutting-stock LP, {len(lengths):,} documents into packs of "
                  f"{capacity:,} tokens", unit="column") as tick:
        packs, info = solve(lengths, capacity, work, options.time_limit, tick=tick)
    rep = report("optimal", packs, options, grid_step=info["grid_step"],
                 lp_value=info["lp_value"], lp_bound=info["lp_bound"],
                 lp_converged=info["converged"], columns=info["columns"], work=info["work"],
                 baseline_packs=info["bfd_packs"], used=info["used"],
                 reproducible=options.time_limit is None)
    rep.options["work_limit"] = work
    return Packing(packs, rep)
