"""Lower bounds on the number of packs: no packing of these lengths can use fewer.

- **L1** ``ceil(sum(l) / L)``: the tokens must fit somewhere. Tight when documents are small.
- **L2** (Martello & Toth, 1990): for a threshold K in [0, L/2], documents longer than L - K
  (N1) can share a pack with nothing of size >= K; documents in (L/2, L - K] (N2) need a pack
  each; documents in [K, L/2] (N3) fill the room N2 leaves, and the rest needs new packs::

      L2(K) = |N1| + |N2| + max(0, ceil((sum(N3) - (|N2| L - sum(N2))) / L))
      L2    = max over K of L2(K)  >=  L1

  Tight when many documents exceed half a pack (e.g. squad11-384: L1 39,713, L2 39,775).
- **LP** (Gilmore & Gomory): the optimum of the cutting-stock LP relaxation over pack
  *patterns*, rounded up; ``packers.optimal`` computes it by column generation. Usually the
  strongest: integer optima rarely exceed it by more than one pack (the IRUP property).

All three are computed from the length histogram in O(n + L).
"""

from __future__ import annotations

import numpy as np


def l1_bound(lengths: np.ndarray, capacity: int) -> int:
    return int(-(-int(np.asarray(lengths, np.int64).sum()) // capacity))


def l2_bound(lengths: np.ndarray, capacity: int) -> int:
    """Martello-Toth L2 for lengths <= capacity (O(n + L) through the length histogram)."""
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        return 0
    return l2_bound_hist(np.bincount(lengths, minlength=int(capacity) + 1), capacity)


def l2_bound_hist(hist: np.ndarray, capacity: int) -> int:
    """L2 from the histogram of lengths (``hist[v]`` documents of length v, 0..capacity):
    O(L) memory whatever the number of documents."""
    L = int(capacity)
    hist = np.asarray(hist, np.int64)[:L + 1].copy()
    hist[0] = 0
    if not hist.any():
        return 0
    w = np.arange(L + 1, dtype=np.int64)
    cnt = np.concatenate([[0], np.cumsum(hist)])        # cnt[v] = #docs with length < v
    tok = np.concatenate([[0], np.cumsum(hist * w)])    # tok[v] = tokens of docs with length < v

    def count(lo, hi):  # lengths in [lo, hi)
        return cnt[hi] - cnt[lo]

    def tokens(lo, hi):
        return tok[hi] - tok[lo]

    half = L // 2
    best = -(-int(tok[-1]) // L)  # L1
    for K in np.concatenate([[0], np.flatnonzero(hist[1:half + 1]) + 1]):
        K = int(K)
        n1 = count(L - K + 1, L + 1)                     # l > L - K
        n2 = count(half + 1, L - K + 1)                  # L/2 < l <= L - K
        s2 = tokens(half + 1, L - K + 1)
        s3 = tokens(max(K, 1), half + 1)                 # K <= l <= L/2
        extra = s3 - (n2 * L - s2)
        b = n1 + n2 + (max(0, -(-extra // L)))
        best = max(best, int(b))
    return best
