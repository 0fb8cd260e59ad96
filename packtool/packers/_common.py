"""Kernels shared by the packers: counting sort, bucket search trees, next-fit, expansion.

A *bucket tree* is a flat binary tree over the capacities 0..C that marks which buckets are
non-empty, so "smallest non-empty bucket >= l" (best fit) or "largest non-empty bucket"
(worst fit) is found in O(log C) instead of a scan over C.
"""

from __future__ import annotations

import numpy as np

from .._numba import njit


@njit
def counting_order(lengths, capacity, descending, idx):
    """Stable order of documents by length (O(n + C)): ties keep input order; indices of type
    ``idx`` (np.int32 halves its memory)."""
    n = lengths.shape[0]
    counts = np.zeros(capacity + 2, np.int64)
    for i in range(n):
        counts[lengths[i] + 1] += 1
    start = np.zeros(capacity + 1, np.int64)  # each length's run, in the order asked for
    acc = 0
    for j in range(capacity + 1):
        v = capacity - j if descending else j
        start[v] = acc
        acc += counts[v + 1]
    order = np.empty(n, idx)
    for i in range(n):
        v = lengths[i]
        order[start[v]] = i
        start[v] += 1
    return order


@njit
def tree_size(n_leaves):
    size = 1
    while size < n_leaves:
        size *= 2
    return size


@njit
def tree_set(tree, size, leaf, flag):
    """Mark bucket ``leaf`` as non-empty (flag=1) or empty (0) and update counts upward."""
    i = leaf + size
    delta = flag - tree[i]
    if delta == 0:
        return
    while i >= 1:
        tree[i] += delta
        i //= 2


@njit
def tree_first_at_least(tree, size, lo):
    """Smallest non-empty leaf >= lo, or -1."""
    if lo >= size:
        return -1
    i = lo + size
    if tree[i] > 0:
        return lo
    while i > 1:
        if i % 2 == 0 and tree[i + 1] > 0:  # left child whose right sibling holds something
            i += 1
            while i < size:
                i = 2 * i if tree[2 * i] > 0 else 2 * i + 1
            return i - size
        i //= 2
    return -1


@njit
def tree_last(tree, size):
    """Largest non-empty leaf, or -1."""
    if tree[1] == 0:
        return -1
    i = 1
    while i < size:
        i = 2 * i + 1 if tree[2 * i + 1] > 0 else 2 * i
    return i - size


@njit
def next_fit(lengths, order, capacity, cap=0):
    """Fill packs in ``order``, opening a new pack when the next document does not fit (or,
    ``cap`` > 0, when the pack holds ``cap`` documents)."""
    n = order.shape[0]
    packs = np.full(lengths.shape[0], -1, np.int64)
    pack, used, held = -1, capacity, 0
    for k in range(n):
        i = order[k]
        length = lengths[i]
        if length == 0:
            continue
        if used + length > capacity or (cap > 0 and held >= cap):
            pack += 1
            used = 0
            held = 0
        packs[i] = pack
        used += length
        held += 1
    return packs


@njit
def expand_groups(lengths, capacity, group_count, group_parent, group_len):
    """Give each document the pack of a histogram *group*; returns (packs, n_packs).

    A group is ``group_count[g]`` identical packs whose contents are the lengths on the chain
    ``g, group_parent[g], ...`` (``group_len`` of each node). Groups with ``group_count > 0``
    are final; packs are numbered group by group. Documents of each length are handed out in
    input order. A slot for which no document of its length is left stays empty, and packs
    left entirely empty get no id (NNLS strategies may over-provision).
    """
    n = lengths.shape[0]
    order = counting_order(lengths, capacity, False, np.int64)
    nxt = np.zeros(capacity + 2, np.int64)
    for i in range(n):
        nxt[lengths[i] + 1] += 1
    for v in range(1, capacity + 2):
        nxt[v] += nxt[v - 1]
    # documents of length v are order[nxt[v]:nxt[v + 1]]
    end = nxt[1:].copy()
    total = group_count[group_count > 0].sum()
    packs = np.full(n, -1, np.int64)
    used = np.zeros(total, np.int64)
    base = 0
    for g in range(group_count.shape[0]):
        c = group_count[g]
        if c <= 0:
            continue
        node = g
        while node >= 0:
            v = group_len[node]
            for k in range(c):
                if nxt[v] >= end[v]:
                    break
                packs[order[nxt[v]]] = base + k
                nxt[v] += 1
                used[base + k] = 1
            node = group_parent[node]
        base += c
    # dense ids: drop packs that received no document
    n_packs = 0
    for p in range(total):
        if used[p]:
            used[p] = n_packs
            n_packs += 1
        else:
            used[p] = -1
    for i in range(n):
        if packs[i] >= 0:
            packs[i] = used[packs[i]]
    return packs, n_packs


def expand_patterns(lengths, capacity, patterns: list, copies) -> tuple[np.ndarray, int]:
    """:func:`expand_groups` of ``copies[j]`` packs of each pattern ``patterns[j]`` (its
    lengths, each a node of one chain)."""
    g_count, g_parent, g_len = [], [], []
    for pattern, c in zip(patterns, copies, strict=True):
        parent = -1
        for v in pattern:
            g_count.append(0)
            g_parent.append(parent)
            g_len.append(int(v))
            parent = len(g_len) - 1
        g_count[-1] = int(c)
    return expand_groups(lengths, capacity, np.array(g_count, np.int64),
                         np.array(g_parent, np.int64), np.array(g_len, np.int64))
