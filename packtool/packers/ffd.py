"""First-fit decreasing: longest documents first, each into the first pack it fits.

Global over the whole corpus in O(n log P): a counting sort by length (O(n + L)) and a max
segment tree over the packs' remaining capacities that finds the first pack with room in
O(log P) (P <= min(n, 2 * ceil(tokens / L) + 1): a fit algorithm never leaves two packs at
most half full). Not the O(n * P) scan.

Trade-off (scripts/bench_pack.py, 2-core machine): 10M lognormal lengths at L=4096 in ~3.0 s
(the tree over 1.2M packs is deep and cache-unfriendly), 1,186,029 packs = L1 bound + 0.003%;
wikipedia-512 99.949% in 4.7 s; squad11-384 40,631 packs, 1.1% above the LP bound. ``bfd``
gives the same packs on all three, faster: prefer it.
"""

from __future__ import annotations

import numpy as np

from .._numba import njit
from . import PackerOptions, Packing, report
from ._common import counting_order, tree_size


@njit
def _ffd(lengths, capacity, max_packs, cap):
    """``cap`` > 0: at most that many documents a pack (a full one's room is set to 0)."""
    n = lengths.shape[0]
    order = counting_order(lengths, capacity, True, np.int64)
    size = tree_size(max(max_packs, 1))
    # tree[i] = max remaining capacity in the subtree; unopened packs have full capacity
    # int32 halves the memory traffic of the descent (capacities are < 2**31)
    tree = np.full(2 * size, capacity, np.int32)
    packs = np.full(n, -1, np.int64)
    count = np.zeros(max_packs if cap > 0 else 0, np.int32)
    n_packs = 0
    for k in range(n):
        i = order[k]
        length = lengths[i]
        if length == 0:
            break  # sorted decreasing: only empty documents remain
        node = 1
        while node < size:
            node = 2 * node if tree[2 * node] >= length else 2 * node + 1
        p = node - size
        packs[i] = p
        if p >= n_packs:
            n_packs = p + 1
        tree[node] -= np.int32(length)
        if cap > 0:
            count[p] += 1
            if count[p] >= cap:
                tree[node] = 0  # full in documents: no length >= 1 fits any more
        node //= 2
        while node >= 1:
            a, b = tree[2 * node], tree[2 * node + 1]
            tree[node] = a if a > b else b
            node //= 2
    return packs


def pack(lengths: np.ndarray, capacity: int, options: PackerOptions) -> Packing:
    """First-fit decreasing; deterministic (``seed`` unused)."""
    total = int(lengths.sum())
    max_packs = 2 * (-(-total // capacity)) + 1
    if options.max_docs:  # packs full in documents come on top of those open
        max_packs += len(lengths) // options.max_docs
    max_packs = min(len(lengths), max_packs)
    packs = _ffd(lengths, capacity, max_packs, options.max_docs or 0)
    return Packing(packs, report("ffd", packs, options))
