"""Rows grouped by slot length without a list of them: the ``i``-th row of length ``L`` and a
row's place among the rows of its length, from the lengths array and a table of counts.

A token-budget step takes rows of one length in a keyed permutation of that length's rows
(:mod:`packtool.train.budget`), so it needs ``select(L, i)``, the row id of the ``i``-th row
of length ``L``. Sorting the rows by length would hold them all: 2.5 x 10^8 rows are 2 GB
of int64 (1 GB as uint32) and a sort of ~20 s. Instead one pass counts every length per
block of ``BLOCK`` rows::

    lengths   512 512 4096 512 | 1024 512 4096 4096 | ...       BLOCK rows a block
    before    block 0: {512: 0, 1024: 0, 4096: 0}               rows of each length before
              block 1: {512: 3, 1024: 0, 4096: 1}               the block (int64, K columns)

``select(L, i)`` finds the block by bisection in L's column, then scans that block alone
(``BLOCK`` compares); ``locate(row)`` is the block's count plus the same scan. At
``BLOCK = 4096`` and K lengths the table is ``8K / 4096`` bytes a row: 2.5 x 10^8 rows, 8
lengths, 3.9 MB (measured with the rest: ``scripts/bench_budget_start.py``). One length
(a fixed-length dataset) needs no table: row = position.
"""

from __future__ import annotations

import numpy as np

from .._numba import njit
from ..errors import PacktoolError

BLOCK = 4096
MAX_LENGTHS = 64  # distinct slot lengths: a --vsl dataset has a dozen at most


@njit
def _count_blocks(lengths, block, most):  # pragma: no cover - compiled
    """(distinct values in order of first appearance, counts [blocks, most] int32, n_values);
    n_values = most + 1 when there are more than ``most`` distinct values."""
    n = lengths.shape[0]
    blocks = (n + block - 1) // block
    values = np.zeros(most, np.int64)
    counts = np.zeros((blocks, most), np.int32)
    k = 0
    last, code = -1, -1
    for b in range(blocks):  # block by block: no division per row
        for i in range(b * block, min(n, (b + 1) * block)):
            v = lengths[i]
            if v != last:  # runs of one length are common: skip the table lookup
                code = -1
                for j in range(k):
                    if values[j] == v:
                        code = j
                        break
                if code < 0:
                    if k == most:
                        return values, counts, most + 1
                    values[k] = v
                    code = k
                    k += 1
                last = v
            counts[b, code] += 1
    return values, counts, k


@njit
def _select(lengths, value, block, before, pos):  # pragma: no cover - compiled
    """Row ids of positions ``pos`` among the rows equal to ``value``; ``before[b]`` counts
    them in blocks < b (length blocks + 1)."""
    n = lengths.shape[0]
    out = np.empty(pos.shape[0], np.int64)
    for t in range(pos.shape[0]):
        p = pos[t]
        lo, hi = 0, before.shape[0] - 1
        while lo + 1 < hi:  # the last block b with before[b] <= p
            mid = (lo + hi) // 2
            if before[mid] <= p:
                lo = mid
            else:
                hi = mid
        need = p - before[lo]
        i = lo * block
        end = min(n, i + block)
        while i < end:
            if lengths[i] == value:
                if need == 0:
                    break
                need -= 1
            i += 1
        out[t] = i
    return out


class RowsByLength:
    """``values``: the distinct slot lengths, ascending; ``sizes``: rows of each;
    ``select(k, pos)``: row ids of positions ``pos`` among the rows of ``values[k]`` (in row
    order); ``locate(row)``: (k, position)."""

    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths
        if len(lengths) == 0:
            raise PacktoolError("the dataset has no rows: a token-budget step needs rows")
        first, counts, k = _count_blocks(lengths, BLOCK, MAX_LENGTHS)
        if k > MAX_LENGTHS:
            raise PacktoolError(
                f"the rows have more than {MAX_LENGTHS} distinct slot lengths: a token-budget "
                "step takes rows of one length, so its dataset holds a few lengths (pack "
                "--vsl: powers of two); pack with --vsl, or drop tokens_per_step")
        order = np.argsort(first[:k])
        self.values = first[:k][order]
        counts = counts[:, :k][:, order]
        self.sizes = counts.sum(axis=0, dtype=np.int64)
        if self.values[0] < 1:
            bad = int(np.flatnonzero(np.asarray(lengths) == self.values[0])[0])
            raise PacktoolError(f"row {bad:,} has slot length {int(self.values[0])}: every "
                                "row's length must be >= 1 (the dataset's row_lengths() is "
                                "corrupt)")
        self.before = None
        if k > 1:  # [blocks + 1, K]: rows of each length before every block
            self.before = np.zeros((len(counts) + 1, k), np.int64)
            np.cumsum(counts, axis=0, out=self.before[1:])

    @classmethod
    def constant(cls, n: int, length: int) -> RowsByLength:
        """``n`` rows of one ``length`` (a fixed-length dataset): nothing per row."""
        self = cls.__new__(cls)
        self.lengths, self.before = None, None
        self.values, self.sizes = np.array([length], np.int64), np.array([n], np.int64)
        return self

    def select(self, k: int, pos: np.ndarray) -> np.ndarray:
        pos = np.asarray(pos, np.int64)
        if self.before is None:
            return pos
        col = np.ascontiguousarray(self.before[:, k])
        return _select(self.lengths, np.int64(self.values[k]), BLOCK, col, pos)

    def locate(self, row: int) -> tuple[int, int]:
        if self.before is None:
            return 0, int(row)
        value = int(self.lengths[row])
        k = int(np.searchsorted(self.values, value))
        b = row // BLOCK
        head = np.asarray(self.lengths[b * BLOCK:row])
        return k, int(self.before[b, k]) + int(np.count_nonzero(head == value))
