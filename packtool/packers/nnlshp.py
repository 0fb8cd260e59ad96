"""Non-negative least-squares histogram packing (NNLSHP), Krell et al. (Graphcore), 2021.

Enumerates every *strategy*: a multiset of at most ``max_depth`` lengths that sums exactly
to the capacity (a strategy slot with no document of its length left becomes padding). With
``A[l, s]`` = how often length l appears in strategy s and ``h`` the length histogram, it
solves ``min ||w (A x - h)||, x >= 0`` (scipy's NNLS; short lengths get weight 0.09 as in the
paper), rounds x, and adds a two-slot strategy ``[l, L - l]`` for every document left over.

Tractability. The strategy space grows like L^(depth-1) (22,102 strategies at L=512, depth
3; 1.4M at L=4096) and NNLS time grows faster than linearly in it (~30 s at 22k columns here,
~24 s in the paper). packtool therefore caps the columns (``max_strategies``, 25,000): when the
exact grid would exceed it, lengths are rounded *up* to a grid step ``s`` (the smallest that
fits the cap) and strategies are built in units of s over floor(L / s) units, so every pack
still fits in L. The price is at most ``depth * (s - 1)`` tokens of padding per pack (L=4096,
depth 3: s = 8, <0.5%). If the grid that fits the cap could waste more than 5% of a pack
(depth * (s - 1) > 0.05 L), it refuses and
names the alternatives (``bfd``, ``spfhp`` or a lower ``--max-depth``).

Trade-off (scripts/bench_pack.py): wikipedia-512 at depth 3: 99.746% in 22 s (paper: 99.75%,
~24 s); squad11-384 97.39% in 7 s; 10M lognormal at L=4096: 21% in 16 s, since 3 documents
of median 300 tokens cannot fill 4096. Slow and not better than ``bfd`` on most data; kept
to compare with the paper and for its bounded pack depth.
"""

from __future__ import annotations

import numpy as np

from .._progress import activity
from ..errors import PacktoolError
from . import PackerOptions, Packing, depth_warning, report
from ._common import expand_patterns

DEFAULT_MAX_DEPTH = 3
MAX_STRATEGIES = 25_000
MAX_ROUNDING = 0.05  # refuse a grid whose rounding could waste > 5% of a pack
SHORT_WEIGHT, SHORT_CUTOFF = 0.09, 8  # the paper's down-weighting of lengths <= 8


def count_strategies(units: int, depth: int) -> int:
    """Partitions of ``units`` into at most ``depth`` parts (= strategies that fill a pack)."""
    ways = np.zeros(units + 1, dtype=object)  # exact big ints
    ways[0] = 1
    for part in range(1, depth + 1):  # conjugate: partitions with parts <= depth
        for v in range(part, units + 1):
            ways[v] += ways[v - part]
    return int(ways[units])


def choose_step(capacity: int, depth: int, max_strategies: int = MAX_STRATEGIES) -> int:
    step = 1
    while count_strategies(capacity // step, depth) > max_strategies:
        step += 1
        if depth * (step - 1) > MAX_ROUNDING * capacity:
            raise PacktoolError(
                f"nnlshp: too many strategies for --seq-len {capacity} at --max-depth {depth} "
                f"(over {max_strategies:,} even with lengths rounded up to multiples of "
                f"{step}, which would waste up to {depth * (step - 1):,} tokens per pack); "
                "lower --max-depth (the paper uses 3) or use --algo bfd or spfhp"
            )
    return step


def strategies(units: int, depth: int) -> list[tuple[int, ...]]:
    """All non-decreasing tuples of <= depth positive parts summing to ``units``."""
    out: list[tuple[int, ...]] = []

    def rec(prefix: tuple[int, ...], lo: int, left: int, d: int) -> None:
        if left == 0:
            out.append(prefix)
            return
        if d == 1:
            if left >= lo:
                out.append(prefix + (left,))
            return
        for part in range(lo, left // 2 + 1 if d >= 2 else left + 1):
            rec(prefix + (part,), part, left - part, d - 1)
        if left >= lo:
            out.append(prefix + (left,))

    rec((), 1, units, depth)
    return out


def _solve(A: np.ndarray, w: np.ndarray, hist: np.ndarray, capacity: int) -> np.ndarray:
    """min ||w (A x - hist)||, x >= 0: scipy's NNLS, which holds the GIL for its 7-30 s (so
    its progress line shows before it starts, not as it goes)."""
    from scipy.optimize import nnls

    n = A.shape[1]
    if not hist.any():
        return np.zeros(n)
    with activity(f"nnlshp: NNLS over {n:,} strategies for packs of {capacity:,} tokens "
                  "(~30 s at 22,000)",
                  delay=0):
        return nnls(w[:, None] * A, w * hist, maxiter=max(50 * n, 1000))[0]


def pack(lengths: np.ndarray, capacity: int, options: PackerOptions) -> Packing:
    """NNLSHP with at most ``options.max_depth`` documents per pack (default 3);
    deterministic. Warns when the depth cap, not the lengths, limits how full packs get."""
    depth = DEFAULT_MAX_DEPTH if options.max_depth is None else int(options.max_depth)
    if depth < 1:
        raise PacktoolError(f"--max-depth must be >= 1, got {depth}")
    max_strategies = options.max_strategies or MAX_STRATEGIES
    step = choose_step(capacity, depth, max_strategies)
    units = capacity // step
    # ceil: a document never outgrows its slot; the few longer than units * step fill a
    # whole pack alone (a one-slot strategy), so they are clamped to `units`
    doc_units = np.minimum(-(-lengths // step), units)
    hist = np.bincount(doc_units, minlength=units + 1)[1:].astype(np.float64)
    strats = strategies(units, depth)
    index = {s: j for j, s in enumerate(strats)}
    rows, cols = [], []
    for j, s in enumerate(strats):
        rows.extend(u - 1 for u in s)
        cols.extend([j] * len(s))
    A = np.zeros((units, len(strats)))
    np.add.at(A, (np.array(rows), np.array(cols)), 1.0)
    w = np.ones(units)
    w[: max(1, SHORT_CUTOFF // step)] = SHORT_WEIGHT
    repeat = np.rint(_solve(A, w, hist, capacity)).astype(np.int64)
    residual = hist.astype(np.int64) - (A @ repeat).astype(np.int64)
    repeat = list(repeat)
    for u in np.flatnonzero(residual > 0) + 1:
        # leftovers: one document and the rest of the pack empty ([u, L - u], or [u] alone
        # when depth 1 leaves no pair in the strategy set)
        pair = (int(u),) if u == units or depth == 1 else tuple(sorted((int(u), units - int(u))))
        if pair not in index:
            index[pair] = len(strats)
            strats.append(pair)
            repeat.append(0)
        repeat[index[pair]] += int(residual[u - 1])
    repeat = np.array(repeat, dtype=np.int64)
    used = np.flatnonzero(repeat > 0)
    packs, _ = expand_patterns(doc_units.astype(np.int64), units, [strats[j] for j in used],
                               repeat[used])
    rep = report("nnlshp", packs, options, grid_step=step)
    rep.options.update(max_depth=depth, max_strategies=max_strategies)
    rep.warnings = depth_warning("nnlshp", lengths, capacity, depth, rep.n_packs)
    return Packing(packs, rep)
