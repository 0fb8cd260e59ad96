"""One training step's sequences into ranks x micro-batches, from their lengths alone.

An RL step (GRPO, PPO, online DPO) generates its sequences inside the step, so their packing
is planned there, every step, in milliseconds. ``plan_lengths`` deals ``units`` (a sequence,
or a group that must stay whole: a GRPO group, a DPO pair) into ``W x M`` micro-batches of at
most ``max_tokens`` tokens (after aligning each sequence to a multiple of ``align``), with the
same ``M`` on every rank (what a run would otherwise all-reduce: a rank with fewer
micro-batches hangs the collective)::

    units by cost, largest first      9 7 6 5 4 3 3 2 2 1            W = 2 ranks, M = 2
    1. to ranks: LPT, each to the     rank 0: 9 5 4 3 1 (22)   rank 1: 7 6 3 2 2 (20)
       cheapest rank with room for    (then moves and swaps between the costliest and the
       it (M x max_tokens tokens)     cheapest rank while they lower the costlier)
    2. a rank's units into its M      rank 0: a = 9 3 (12), b = 5 4 1 (10); rank 1: c = 7 3
       micro-batches the same way     (10), d = 6 2 2 (10); first fit by tokens where the
       (max_tokens each)              cost-led deal finds no room; then moves and swaps
    3. slots: the costliest first     slot 0 = a, c; slot 1 = b, d (or, ``pipeline_order``,
                                      verl's: the cheapest at both ends)

so micro-batch ``m`` of every rank is its ``m``-th costliest, and micro-batches that run at
the same time (each a forward/backward whose collectives wait for the slowest rank) cost
alike. ``M`` starts at the bound ``ceil(aligned tokens / (W x max_tokens))`` (and the
documents over ``W x max_docs``, and the units of more than half a micro-batch, each of which
needs its own), rounded up to ``multiple_of``; when the units do not fit, the smallest ``M``
that fits is searched. A cost is ``linear x L + L^2`` per sequence ("attention": ``2 d L^2``
attention FLOPs against ``24 d^2 L`` in the projections, so ``linear = 12 d`` weighs the
whole block, verl's ``24576 L + L^2`` is ``d = 2048``; 0, the default, balances attention
alone), ``L`` ("tokens") or any function of the aligned lengths. Ties are broken by a
permutation drawn from ``seed``: the same inputs and seed give the same plan on every rank.

Measured (``python scripts/bench_plan_step.py``; CPU ms a call on a shared 2-core machine;
max/mean rank attention cost at M micro-batches per rank, verl 0.9.1's in brackets):

    lognormal, 8,192 x 64 ranks      2.5 ms   1.0000 at M 13  (verl 1.0445 at M 14, 5.9 s)
    lognormal, 65,536 x 512 ranks   25 ms     1.0000 at M 13  (verl 1.0283 at M 14, 46 s)
    squad11-384, 65,536 x 512       31 ms     1.0001 at M 6   (verl 1.0012 at M 6)
    GRPO x16 groups, 65,536 x 512    8.6 ms   1.0053 at M 5   (verl 1.1763 at M 5)

Tokens are balanced less (1.015-1.086 max/mean against verl's 1.000-1.05): the cost is what
is balanced, and attention, not tokens, is what differs between ranks of equal tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._numba import njit
from ..errors import PacktoolError

COSTS = ("attention", "tokens")


@njit
def _sift_down(heap, pos, key, i):
    """Restore the min-heap of bins (keyed by (cost, bin)) from heap position ``i``."""
    n = heap.shape[0]
    while True:
        j, left = i, 2 * i + 1
        for c in (left, left + 1):
            if c < n:
                a, b = heap[c], heap[j]
                if key[a] < key[b] or (key[a] == key[b] and a < b):
                    j = c
        if j == i:
            return
        heap[i], heap[j] = heap[j], heap[i]
        pos[heap[i]], pos[heap[j]] = i, j
        i = j


@njit
def _deal(units, tokens, costs, docs, n_bins, max_tokens, max_docs, bin_of, cost,
          first_fit=False):
    """Each unit of ``units`` into the cheapest bin with room for its tokens and documents
    (the heap's root, else a scan); False when one has no room anywhere. ``cost``: the bins'
    costs, filled in. ``first_fit``: first fit decreasing by tokens instead, where the
    cost-led deal finds no room (tighter)."""
    heap = np.arange(n_bins)
    pos = np.arange(n_bins)
    cost[:] = 0.0
    fill = np.zeros(n_bins, np.int64)
    count = np.zeros(n_bins, np.int64)
    if first_fit:
        units = units[np.argsort(-tokens[units], kind="mergesort")]
    for u in units:
        b = -1 if first_fit else heap[0]
        if b < 0 or fill[b] + tokens[u] > max_tokens or count[b] + docs[u] > max_docs:
            b = -1
            for c in range(n_bins):
                room = fill[c] + tokens[u] <= max_tokens and count[c] + docs[u] <= max_docs
                if room and (b < 0 or not first_fit and (
                        cost[c] < cost[b] or (cost[c] == cost[b] and c < b))):
                    b = c
            if b < 0:
                return False
        bin_of[u] = b
        fill[b] += tokens[u]
        count[b] += docs[u]
        cost[b] += costs[u]
        _sift_down(heap, pos, cost, pos[b])
    return True


@njit
def _improve(units, tokens, costs, docs, n_bins, max_tokens, max_docs, bin_of, cost, rounds,
             wide):
    """Up to ``rounds`` times (until the costliest bin is within 0.1% of the mean), the move
    of a unit from the costliest bin to another, or the swap of one of each, that lowers the
    costlier of the two most, within both bins' room. The other bin: any (``wide``:
    O(units x the costliest bin's) a round, for a rank's few micro-batches), or the cheapest
    (O(units) a round, for many ranks)."""
    fill = np.zeros(n_bins, np.int64)
    count = np.zeros(n_bins, np.int64)
    for u in units:
        fill[bin_of[u]] += tokens[u]
        count[bin_of[u]] += docs[u]
    mean = cost.sum() / n_bins
    hi, lo = np.empty(units.shape[0], np.int64), np.empty(units.shape[0], np.int64)
    for _ in range(rounds):
        h, low = np.argmax(cost), np.argmin(cost)
        if cost[h] <= mean * (1 + 1e-3):  # even to 0.1%: what is left is not worth a scan
            return
        nh = nl = 0
        for u in units:
            if bin_of[u] == h:
                hi[nh] = u
                nh += 1
            elif wide or bin_of[u] == low:
                lo[nl] = u
                nl += 1
        best, bu, bv, bb = 0.0, -1, -1, -1
        for i in range(nh):
            u = hi[i]
            for b in range(n_bins) if wide else range(low, low + 1):  # u moved to b
                if (b != h and fill[b] + tokens[u] <= max_tokens
                        and count[b] + docs[u] <= max_docs):
                    gain = cost[h] - max(cost[h] - costs[u], cost[b] + costs[u])
                    if gain > best:
                        best, bu, bv, bb = gain, u, -1, b
            for j in range(nl):  # u and v swapped
                v = lo[j]
                b = bin_of[v]
                d = costs[u] - costs[v]
                if (d <= 0 or fill[b] + tokens[u] - tokens[v] > max_tokens
                        or fill[h] - tokens[u] + tokens[v] > max_tokens
                        or count[b] + docs[u] - docs[v] > max_docs
                        or count[h] - docs[u] + docs[v] > max_docs):
                    continue
                gain = cost[h] - max(cost[h] - d, cost[b] + d)
                if gain > best:
                    best, bu, bv, bb = gain, u, v, b
        if best <= 1e-12 * cost[h]:
            return
        for w, src, dst in ((bu, h, bb), (bv, bb, h)):
            if w >= 0:
                bin_of[w] = dst
                fill[src] -= tokens[w]
                fill[dst] += tokens[w]
                count[src] -= docs[w]
                count[dst] += docs[w]
                cost[src] -= costs[w]
                cost[dst] += costs[w]


@njit
def _plan(order, tokens, costs, docs, world_size, m, max_tokens, max_docs, slot_order,
          mb_of):
    """Units to ranks (cost-led deal under the rank's m x max_tokens), then each rank's
    units into its m micro-batches, the costliest in slot ``slot_order[0]``; ``mb_of[u]`` =
    rank x m + slot. False when a rank's units do not fit its m micro-batches."""
    n = order.shape[0]
    rank_of = np.empty(n, np.int64)
    rank_cost = np.empty(world_size)
    if not _deal(order, tokens, costs, docs, world_size, m * max_tokens, m * max_docs,
                 rank_of, rank_cost):
        return False
    if n <= 64 * world_size:  # few units a rank (GRPO groups): LPT's last ones leave gaps
        _improve(order, tokens, costs, docs, world_size, m * max_tokens, m * max_docs,
                 rank_of, rank_cost, world_size, False)
    sizes = np.zeros(world_size + 1, np.int64)
    for u in order:
        sizes[rank_of[u] + 1] += 1
    starts = np.cumsum(sizes)
    by_rank = np.empty(n, np.int64)
    at = starts[:-1].copy()
    for u in order:  # each rank's units, still in order of cost
        by_rank[at[rank_of[u]]] = u
        at[rank_of[u]] += 1
    bin_of = np.empty(n, np.int64)
    cost = np.empty(m)
    for r in range(world_size):
        units = by_rank[starts[r]:starts[r + 1]]
        if not (_deal(units, tokens, costs, docs, m, max_tokens, max_docs, bin_of, cost)
                or _deal(units, tokens, costs, docs, m, max_tokens, max_docs, bin_of, cost,
                         True)):
            return False
        _improve(units, tokens, costs, docs, m, max_tokens, max_docs, bin_of, cost, 2 * m, True)
        slot = np.empty(m, np.int64)
        slot[np.argsort(-cost, kind="mergesort")] = slot_order
        for u in units:
            mb_of[u] = r * m + slot[bin_of[u]]
    return True


@dataclass
class StepLayout:
    """What :func:`plan_lengths` returns: plain arrays, no training-side object.

    ``micro_batch``: every sequence's micro-batch, ``rank * m + slot``; ``m``: micro-batches
    per rank; ``tokens`` (aligned), ``costs``, ``docs``: [world_size, m] per micro-batch."""

    micro_batch: np.ndarray
    m: int
    tokens: np.ndarray
    costs: np.ndarray
    docs: np.ndarray

    def imbalance(self, values: np.ndarray) -> float:
        """max / mean over ranks of a [world_size, m] array summed per rank (1.0 if all 0)."""
        per_rank = values.sum(axis=1)
        mean = per_rank.mean()
        return float(per_rank.max() / mean) if mean > 0 else 1.0

    def step_imbalance(self) -> float:
        """sum over slots of the costliest rank's micro-batch / mean rank cost: the step's
        time when every micro-batch waits for the slowest rank, against perfect balance."""
        mean = self.costs.sum(axis=1).mean()
        return float(self.costs.max(axis=0).sum() / mean) if mean > 0 else 1.0


def _int(name: str, v, lo: int, fix: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise PacktoolError(f"{name} must be an integer >= {lo}, got {v!r}; {fix}")
    return int(v)


def check_lengths(lengths, name: str = "lengths") -> np.ndarray:
    """``lengths`` as int64 [n], each >= 1 (a sequence of 0 tokens trains nothing)."""
    a = np.asarray(lengths)
    if a.ndim != 1 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
        raise PacktoolError(f"{name} must be a 1-D array of integers (one per sequence), got "
                            f"shape {a.shape} of {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a.size and a.min() < 1:
        i = int(np.argmin(a))
        raise PacktoolError(f"sequence {i} has length {int(a[i])} < 1: drop empty sequences "
                            "before planning")
    return a


def unit_of(groups, n: int) -> tuple[np.ndarray, int]:
    """The unit (dense id, in order of first appearance) of every sequence, and their count."""
    if groups is None:
        return np.arange(n, dtype=np.int64), n
    g = np.asarray(groups)
    if g.shape != (n,):
        raise PacktoolError(f"groups must give one label per sequence ({n:,}), got shape "
                            f"{g.shape}")
    _, first, inv = np.unique(g, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inv.reshape(-1)], int(first.size)


def sequence_costs(aligned: np.ndarray, cost, linear: float = 0.0) -> np.ndarray:
    """float64 cost of every sequence from its aligned length (see the module docstring)."""
    if callable(cost):
        c = np.asarray(cost(aligned.copy()), dtype=np.float64)
        if c.shape != aligned.shape or not np.isfinite(c).all() or (c < 0).any():
            raise PacktoolError(f"cost function must return one finite number >= 0 per "
                                f"sequence ({aligned.size:,}), got shape {c.shape}")
        return c
    if cost not in COSTS:
        raise PacktoolError(f"cost must be one of {', '.join(COSTS)} or a function of the "
                            f"aligned lengths, got {cost!r}")
    a = aligned.astype(np.float64)
    return a * a + linear * a if cost == "attention" else a


def _check_units(utok, udocs, unit, n_units, max_tokens, max_docs, grouped):
    over = np.flatnonzero(utok > max_tokens)
    if over.size:
        u = int(over[np.argmax(utok[over])])
        what = (f"group of sequences {np.flatnonzero(unit == u)[:8].tolist()}" if grouped
                else f"sequence {u}")
        raise PacktoolError(
            f"{what} holds {int(utok[u]):,} tokens (after alignment) > max_tokens "
            f"{max_tokens:,}: raise max_tokens to at least {int(utok[u]):,}, or cut the "
            f"sequence (a group is never split across micro-batches)")
    if max_docs is not None and udocs.max(initial=0) > max_docs:
        u = int(np.argmax(udocs))
        raise PacktoolError(f"group of sequences {np.flatnonzero(unit == u)[:8].tolist()} has "
                            f"{int(udocs[u])} sequences > max_docs {max_docs}: raise max_docs "
                            "or make the groups smaller")


def plan_lengths(lengths, *, max_tokens: int, world_size: int, groups=None, align: int = 1,
                 max_docs: int | None = None, cost="attention", linear: float = 0.0,
                 micro_batches="auto", multiple_of: int = 1, pipeline_order: bool = False,
                 seed: int = 0) -> StepLayout:
    """The checked entry point: see the module docstring, and ``packtool.plan_step``."""
    lengths = check_lengths(lengths)
    max_tokens = _int("max_tokens", max_tokens, 1, "pass the token budget of one micro-batch")
    world_size = _int("world_size", world_size, 1, "pass the data-parallel world size")
    align = _int("align", align, 1, "pass 2 x cp_size for context parallelism, else 1")
    multiple_of = _int("multiple_of", multiple_of, 1, "pass the virtual pipeline size, or 1")
    if max_docs is not None:
        max_docs = _int("max_docs", max_docs, 1, "or None for no limit")
    if max_tokens % align:
        raise PacktoolError(f"max_tokens {max_tokens:,} is not a multiple of align {align}: "
                            f"use {max_tokens // align * align:,}")
    n = lengths.size
    aligned = (lengths + (align - 1)) // align * align
    costs = sequence_costs(aligned, cost, linear)
    unit, n_units = unit_of(groups, n)
    utok = np.bincount(unit, aligned, n_units).astype(np.int64)
    udocs = np.bincount(unit, minlength=n_units).astype(np.int64)
    ucost = np.bincount(unit, costs, n_units)
    _check_units(utok, udocs, unit, n_units, max_tokens, max_docs, groups is not None)
    perm = np.random.default_rng(seed).permutation(n_units)
    order = perm[np.argsort(-ucost[perm], kind="stable")]
    cap = max_docs if max_docs is not None else n + 1
    mb_of = np.empty(n_units, np.int64)
    m = _micro_batch_count(micro_batches, order, utok, ucost, udocs, world_size, max_tokens,
                           cap, multiple_of, pipeline_order, mb_of)
    mb = mb_of[unit]
    shape, n_mb = (world_size, m), world_size * m
    return StepLayout(mb, m, np.bincount(mb, aligned, n_mb).astype(np.int64).reshape(shape),
                      np.bincount(mb, costs, n_mb).reshape(shape),
                      np.bincount(mb, minlength=n_mb).reshape(shape))


def slot_order(m: int, pipeline_order: bool) -> np.ndarray:
    """Slot of the k-th costliest micro-batch: k, or (``pipeline_order``, verl's) the
    cheapest ones at both ends, for the pipeline's warm-up and cool-down bubbles."""
    ranked = np.arange(m)
    if pipeline_order:
        ranked = np.concatenate([ranked[::2][::-1], ranked[1::2]])
    out = np.empty(m, np.int64)
    out[ranked] = np.arange(m)
    return out


def _micro_batch_count(micro_batches, order, utok, ucost, udocs, world_size, max_tokens, cap,
                       multiple_of, pipeline_order, mb_of) -> int:
    """Deal at the given count, or (``"auto"``) at the smallest multiple of ``multiple_of``
    that fits, from the bound up: +1 step twice, then doubling steps, then a bisection."""
    def fits(m):
        so = slot_order(m, pipeline_order)
        return _plan(order, utok, ucost, udocs, world_size, m, max_tokens, cap, so, mb_of)

    if micro_batches != "auto":
        m = _int("micro_batches", micro_batches, 1, 'or "auto"')
        if m % multiple_of:
            raise PacktoolError(f"micro_batches {m} is not a multiple of multiple_of "
                                f"{multiple_of}: use {-(-m // multiple_of) * multiple_of}")
        if not fits(m):
            raise PacktoolError(
                f"the step's {order.size:,} units ({int(utok.sum()):,} tokens) do not fit "
                f"{world_size} ranks x {m} micro-batches of {max_tokens:,} tokens"
                + (f" and {cap} sequences" if cap <= udocs.sum() else "")
                + ': raise micro_batches or max_tokens, or pass micro_batches="auto"')
        return m
    need = max(1, -(-int(utok.sum()) // (world_size * max_tokens)),
               -(-int(udocs.sum()) // (world_size * cap)),
               -(-int((2 * utok > max_tokens).sum()) // world_size))
    step = multiple_of
    m = -(-need // step) * step
    lo = m - step  # every count up to lo fails (the bound)
    tries = 0
    while not fits(m):
        lo, tries = m, tries + 1
        m += step * (1 if tries <= 2 else 2 ** (tries - 2))
    hi, ok = m, True
    while hi - lo > step:  # the smallest count that fits between the last failure and hi
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        ok = fits(mid)
        hi, lo = (mid, lo) if ok else (hi, mid)
    if not ok:
        fits(hi)  # mb_of from the count kept
    return hi
