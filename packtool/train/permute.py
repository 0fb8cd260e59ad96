"""A keyed permutation of ``[0, n)`` that is computed per index, forward and backward: the
sampler's epoch order without the epoch in memory.

``rng.permutation(n)`` holds the whole order: 2.5 x 10^8 packs are 2 GB of int64 per rank, and
drawing it took most of the 135 s the sampler needed for its first step there. A Feistel
network on the smallest even number of bits ``2h`` with ``4^h >= n`` is a bijection of
``[0, 4^h)`` for any round function; *cycle walking* (apply it again while the result is
``>= n``) makes it a bijection of ``[0, n)``: each walk leaves the range at most ~3 times in 4
(``4^h < 4n``), 1.33 rounds of walking on average, a few dozen at worst over 10^8 indices::

    x = L|R (h bits each) -> 6 rounds of  L, R = R, L ^ f(R, key_i)  -> L|R   (again if >= n)
    inverse: the rounds backwards,        L, R = R ^ f(L, key_i), L    (again if >= n)

``f`` is splitmix64's finaliser of ``R + key_i`` (its top ``h`` bits), the keys drawn from the
seed's stream (``packtool.seeds``), so every rank computes the same order from the seed and
the epoch alone. Vectorised in numpy over the indices a step needs (a few dozen: microseconds)
or a whole small epoch (10^6 indices in ~0.15 s). Six rounds: Luby-Rackoff needs four for a
pseudorandom permutation; two more cost nothing at these sizes.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


class Feistel:
    """A permutation of ``[0, n)`` keyed by ``keys`` (``ROUNDS`` unsigned 64-bit integers):
    ``perm(i)`` is position i's element, ``inverse(x)`` the position of element x."""

    def __init__(self, n: int, keys):
        self.n = int(n)
        self.half = max(1, (max(self.n - 1, 1).bit_length() + 1) // 2)  # 4^half >= n
        self.mask = np.uint64((1 << self.half) - 1)
        self.shift = np.uint64(64 - self.half)
        self.keys = [np.uint64(k) for k in keys]

    def _f(self, r: np.ndarray, key: np.uint64) -> np.ndarray:
        z = r + key
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return (z ^ (z >> np.uint64(31))) >> self.shift

    def _rounds(self, x: np.ndarray, forward: bool) -> np.ndarray:
        h = np.uint64(self.half)
        left, right = x >> h, x & self.mask
        for k in (self.keys if forward else self.keys[::-1]):
            if forward:
                left, right = right, left ^ self._f(right, k)
            else:
                left, right = right ^ self._f(left, k), left
        return (left << h) | right

    def _walk(self, idx, forward: bool) -> np.ndarray:
        x = np.asarray(idx, dtype=np.uint64).copy()
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"index {int(x.max())} outside 0..{self.n - 1}")
        with np.errstate(over="ignore"):
            x = self._rounds(x, forward)
            out = x >= self.n
            while out.any():  # cycle walking: each index stays on its own cycle, back into range
                x[out] = self._rounds(x[out], forward)
                out = x >= self.n
        return x.astype(np.int64)

    def perm(self, idx) -> np.ndarray:
        """The elements at positions ``idx`` (int64 array)."""
        return self._walk(idx, True)

    def inverse(self, elems) -> np.ndarray:
        """The positions of elements ``elems``: ``inverse(perm(i)) == i``."""
        return self._walk(elems, False)
