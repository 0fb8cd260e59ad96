"""Shortest-pack-first histogram packing (SPFHP), Krell et al. (Graphcore), 2021.

Works on the length histogram, not on documents: lengths are taken longest first, and all
documents of one length are placed at once into the open *group* of identical packs with the
most room left (the shortest pack first, i.e. worst fit), splitting a group when it holds more
packs than there are documents to place. A pack is closed when it is full or holds
``max_depth`` documents.

One deviation from the paper's code, on by default: documents that fit in no open pack open
new packs of k = min(max_depth, L // l) of them. The paper's code opens one pack per document,
so 1,000 documents of 100 tokens at L=4096 take 1,000 packs (here 84 at depth 12, 25 with a
higher depth). ``strict=True`` restores the paper's rule and reproduces its published results
exactly (wikipedia-512: 99.604%; squad11-384: 40,711 packs); the default reaches 99.813% and
40,631 packs on the same histograms (the paper's LPFHP figure on wikipedia). Cost:
O(L log L + groups) for the packing, independent of n; then one O(n + L) pass hands documents
to packs.

Trade-off (scripts/bench_pack.py): wikipedia-512 99.813% in 0.5 s (0.03 s of packing, the
rest handing out 16M documents); 10M lognormal lengths at L=4096 in 0.3 s but only 84.6%
efficient, because depth 12 caps a pack at 12 documents of median 300 tokens (depth 64 gives
99%). Its use: a hard bound on documents per pack, which some attention kernels and loss
normalisations care about; otherwise ``bfd`` packs tighter.
"""

from __future__ import annotations

import numpy as np

from .._numba import njit
from ..errors import PacktoolError
from . import PackerOptions, Packing, depth_warning, report
from ._common import expand_groups, tree_last, tree_set, tree_size

DEFAULT_MAX_DEPTH = 12  # the paper's setting for wikipedia


@njit
def _spfhp(hist, capacity, max_depth, strict):
    """Returns (group_count, group_parent, group_len) describing the packs."""
    cap_groups = 1024
    g_count = np.zeros(cap_groups, np.int64)
    g_parent = np.full(cap_groups, -1, np.int64)
    g_len = np.zeros(cap_groups, np.int64)
    g_depth = np.zeros(cap_groups, np.int64)
    g_next = np.full(cap_groups, -1, np.int64)   # stack link within a room bucket
    head = np.full(capacity + 1, -1, np.int64)     # open groups by room left
    size = tree_size(capacity + 1)
    tree = np.zeros(2 * size, np.int64)
    n_groups = 0
    open_count = np.zeros(cap_groups, np.int64)  # packs still open in group g
    for length in range(capacity, 0, -1):
        todo = hist[length]
        while todo > 0:
            room = tree_last(tree, size)
            # documents per new pack (see below)
            k = 1 if strict else min(max_depth, capacity // length, todo)
            while n_groups + k + 2 > cap_groups:  # grow the arrays
                cap_groups *= 2
                g_count, g_parent, g_len, g_depth, g_next, open_count = _grown(
                    g_count, g_parent, g_len, g_depth, g_next, open_count, cap_groups)
            if room >= length:
                g = head[room]
                take = min(open_count[g], todo)
                # the new group: `take` packs of g's contents plus one document of this length
                new = n_groups
                n_groups += 1
                g_parent[new] = g
                g_len[new] = length
                g_depth[new] = g_depth[g] + 1
                open_count[g] -= take
                todo -= take
                if open_count[g] == 0:
                    head[room] = g_next[g]
                    if head[room] < 0:
                        tree_set(tree, size, room, 0)
                left = room - length
            else:
                # fits nowhere: open packs of k documents of this length (a chain of k nodes)
                new = _chain(g_parent, g_len, g_depth, n_groups, k, length)
                n_groups = new + 1
                take = todo // k
                todo -= take * k
                left = capacity - k * length
            if left == 0 or g_depth[new] >= max_depth:
                g_count[new] = take          # closed: final
            else:
                open_count[new] = take
                g_next[new] = head[left]
                head[left] = new
                tree_set(tree, size, left, 1)
    # packs still open are final as they are
    return g_count[:n_groups] + open_count[:n_groups], g_parent[:n_groups], g_len[:n_groups]


@njit
def _chain(g_parent, g_len, g_depth, n_groups, k, length):
    """k new groups, each the parent of the next (packs of k documents of ``length``); the
    last one's index."""
    parent = -1
    for d in range(k):
        new = n_groups + d
        g_parent[new] = parent
        g_len[new] = length
        g_depth[new] = d + 1
        parent = new
    return parent


@njit
def _grown(g_count, g_parent, g_len, g_depth, g_next, open_count, n):
    return (_grow(g_count, n, 0), _grow(g_parent, n, -1), _grow(g_len, n, 0),
            _grow(g_depth, n, 0), _grow(g_next, n, -1), _grow(open_count, n, 0))


@njit
def _grow(a, n, fill):
    out = np.full(n, fill, a.dtype)
    out[: a.shape[0]] = a
    return out


def pack(lengths: np.ndarray, capacity: int, options: PackerOptions) -> Packing:
    """SPFHP with at most ``options.max_depth`` documents per pack (default 12);
    deterministic. ``options.strict``: the paper's exact rule for new packs (one document each).
    Warns when the depth cap, not the lengths, limits how full packs get."""
    depth = DEFAULT_MAX_DEPTH if options.max_depth is None else int(options.max_depth)
    if depth < 1:
        raise PacktoolError(f"--max-depth must be >= 1, got {depth}")
    hist = np.bincount(lengths, minlength=capacity + 1).astype(np.int64)
    counts, parents, lens = _spfhp(hist, capacity, depth, bool(options.strict))
    packs, n_packs = expand_groups(lengths, capacity, counts, parents, lens)
    rep = report("spfhp", packs, options)
    rep.options["max_depth"] = depth
    rep.warnings = depth_warning("spfhp", lengths, capacity, depth, rep.n_packs)
    return Packing(packs, rep)
