"""Attention-cost classes, stored with the index so a balanced sampler starts at once.

A pack's attention cost is the sum of its squared segment lengths, plus 2 a c for each
segment of c tokens that attends to ancestors of a tokens (a prefix tree, ``pack
--share-prompt``/``--share-prefix``: :func:`packtool.formats.packed.layout.ancestor_terms`),
i.e. 2 x the
(query, key) pairs its mask attends - its tokens; where the sources hold images, plus the
vision encoder's sum over the pack's images of t (h w)^2 patches (index.json's
``cost_vision``: 1.0, :mod:`packtool.formats.packed.images`). A balanced sampler
(``PackSampler(balance="attention")``, :mod:`packtool.formats.packed.balance`) takes a step's packs
from one *cost class*, costs within ``ratio`` of each other. Classes are cells of one fixed
grid, ``[ratio^k, ratio^(k+1))`` for every integer k, so a shard's classes follow from its own
packs: every pack job counts its shard's packs per cell and the index carries the counts
(``cost_classes`` in a shard's entry, with ``costs_sha256``, and ``cost_ratio`` at the top).

What the sampler needs at start is then in index.json: class sizes, and where the packs of a
class lie, shard by shard. A step's packs are found in their shards' segment tables when the
step is dealt (:class:`StoredClasses`): nothing per pack is read at start. The grid's edges
are products of ``ratio`` from 1.0 (no logarithm), so every machine puts a cost in the same
cell bit for bit: a dataset's stored counts equal what a reader computes from its segments.
"""

from __future__ import annotations

import hashlib

import numpy as np

COST_RATIO = 1.1   # the widest cost ratio inside one class (the sampler's default)
ZERO_CELL = -(2 ** 31)  # the cell of a cost of 0 (a user's array may hold zeros)


def _edges(lo: float, hi: float, ratio: float) -> tuple[np.ndarray, int]:
    """ratio^k for k from k0 (the cell of ``lo``) up past ``hi``, each a product (or
    quotient) of ``ratio`` from 1.0 in order: the same floats on every machine."""
    up, down = [1.0], [1.0]
    while up[-1] <= hi:
        up.append(up[-1] * ratio)
    while down[-1] > lo:
        down.append(down[-1] / ratio)
    return np.array(down[:0:-1] + up), -(len(down) - 1)


def cost_cells(costs: np.ndarray, ratio: float = COST_RATIO) -> np.ndarray:
    """The grid cell k of every cost (ratio^k <= cost < ratio^(k+1); 0 -> ZERO_CELL)."""
    costs = np.asarray(costs, np.float64)
    out = np.full(costs.shape, ZERO_CELL, np.int64)
    pos = costs > 0
    if pos.any():
        edges, k0 = _edges(float(costs[pos].min()), float(costs[pos].max()), ratio)
        out[pos] = np.searchsorted(edges, costs[pos], side="right") - 1 + k0
    return out


def digest(costs: np.ndarray) -> str:
    """First 16 hex digits of the sha256 of the costs (float64, little-endian)."""
    return hashlib.sha256(np.ascontiguousarray(costs, dtype="<f8").tobytes()).hexdigest()[:16]


def dataset_digest(shard_digests: list[str]) -> str:
    """A dataset's costs fingerprint from its shards' (what a sampler state records)."""
    return hashlib.sha256("".join(shard_digests).encode()).hexdigest()[:16]


def shard_entry(costs: np.ndarray, ratio: float = COST_RATIO) -> dict:
    """What a shard's index entry records of its packs' costs: ``[k0, n0, n1, ...]``, its
    lowest occupied cell k0 and the packs in each cell from there on (a flat list of ints:
    index.json of 2.5 x 10^8 packs in 7,600 shards parses in ~1 s with it, ~3 s with a
    [cell, count] pair per occupied cell), and the costs' digest."""
    cells = cost_cells(costs, ratio)
    if not cells.size:
        return {"cost_classes": [], "costs_sha256": digest(costs)}
    lo = int(cells.min())
    if lo == ZERO_CELL:  # zero-cost packs (none in a packed dataset: no pack is empty)
        raise ValueError("a pack of no cost")
    counts = np.bincount(cells - lo)
    return {"cost_classes": [lo, *counts.tolist()], "costs_sha256": digest(costs)}


def _table(shards: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(occupied cells ascending, [shards, cells] packs per shard and cell) from the index's
    shard entries."""
    lows = np.array([sh["cost_classes"][0] if sh["cost_classes"] else 0 for sh in shards],
                    np.int64)
    rows = [np.asarray(sh["cost_classes"][1:], np.int64) for sh in shards]
    widths = np.array([r.size for r in rows], np.int64)
    if not widths.any():
        return np.zeros(0, np.int64), np.zeros((len(shards), 0), np.int64)
    top = int((lows + widths)[widths > 0].max())
    base = int(lows[widths > 0].min())
    dense = np.zeros((len(shards), top - base), np.int64)
    for s, (lo, r) in enumerate(zip(lows.tolist(), rows, strict=True)):
        dense[s, lo - base:lo - base + r.size] = r
    used = np.flatnonzero(dense.sum(axis=0))
    return used + base, dense[:, used]


class StoredClasses:
    """A packed dataset's cost classes from its index: ``sizes`` per class (class 0 the
    cheapest occupied cell), and the packs of each class, ascending, found shard by shard:
    ``members[i]`` for positions of the grouped order (what a step deals), ``position(pack,
    k)`` the inverse (``which``). Memory: a [shards + 1, classes] table of counts (7,600 x
    60 x 8 bytes at 2.5 x 10^8 packs)."""

    def __init__(self, reader, ratio: float):
        shards = reader.index["shards"]
        self.cells, counts = _table(shards)
        self.cum = np.vstack([np.zeros((1, len(self.cells)), np.int64), np.cumsum(counts, axis=0)])
        self.sizes = self.cum[-1].copy()
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.reader, self.ratio = reader, float(ratio)
        self.fingerprint = dataset_digest([sh["costs_sha256"] for sh in shards])
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def shard(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(costs, class) of shard ``s``'s packs, from its segment table (the last few kept)."""
        if s not in self._cache:
            costs = self.reader.shard_costs(s)
            cls = np.searchsorted(self.cells, cost_cells(costs, self.ratio))
            if len(self._cache) >= 16:  # ~1 MB a shard of 2^27 tokens at L=4096
                self._cache.pop(next(iter(self._cache)))
            self._cache[s] = (costs, cls)
        return self._cache[s]

    def __getitem__(self, idx) -> np.ndarray:
        """The packs at positions ``idx`` of the grouped order: each position's class and
        rank in it, its shard from the counts, then one scan of that shard per (shard,
        class) asked."""
        idx = np.asarray(idx, np.int64)
        flat = idx.ravel()
        c = np.searchsorted(self.starts, flat, side="right") - 1
        j = flat - self.starts[c]
        s = np.empty(flat.size, np.int64)
        for k in np.unique(c).tolist():
            at = c == k
            s[at] = np.searchsorted(self.cum[:, k], j[at], side="right") - 1
        out = np.empty(flat.size, np.int64)
        key = s * len(self.cells) + c
        for g in np.unique(key).tolist():
            at = key == g
            sh, k = divmod(g, len(self.cells))
            local = np.flatnonzero(self.shard(sh)[1] == k)[j[at] - self.cum[sh, k]]
            out[at] = self.reader.pack_starts[sh] + local
        return out.reshape(idx.shape)

    def position(self, pack: int, k: int) -> int:
        """Where ``pack`` (of class ``k``) is among its class's packs."""
        s, local = self.reader.locate(int(pack))
        return int(self.cum[s, k]) + int(np.count_nonzero(self.shard(s)[1][:local] == k))

    def class_of(self, packs) -> np.ndarray:
        return np.array([self.shard(s)[1][j] for s, j in map(self.reader.locate,
                                                               np.ravel(packs).tolist())],
                        np.int64)

    def costs_of(self, packs) -> np.ndarray:
        return np.array([self.shard(s)[0][j] for s, j in map(self.reader.locate,
                                                               np.ravel(packs).tolist())],
                        np.float64)
