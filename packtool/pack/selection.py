"""Which documents a mixture holds out and gives an extra copy, for ``pack --group-docs``: the
draws of the global plan (:func:`packtool.mixture.mixture_plan`), made in memory that grows
with the sample, never with the corpus.

numpy's ``Generator.choice(n, size, replace=False)`` takes one of two paths: Floyd's algorithm
over a hash set of the sample (size <= n // 50, or n <= 10,000), or a partial Fisher-Yates
shuffle of ``arange(n)``, 8 bytes a document: 0.8 GB for 10^8 documents, for a 2% held-out
split or any fractional factor. :func:`choice_set` gives the second path's set without the
array::

    draws    v_i = rng.integers(0, i, endpoint=True) for i = n-1 down to n-size: the calls
             the shuffle makes, in its order (a chunk of highs per call: the same stream)
    the set  the shuffle keeps what Floyd's rule keeps from the same draws taken in
             ascending i (step i takes v_i, or i itself when v_i is taken already), which
             unrolls to  S = {every v_i} | C,  C = {i : v_i repeats an earlier draw, or
             n-size <= v_i < i and v_i is in C}: C by pointer doubling, vectorised.

Memory: about 40 bytes per selected document while it runs (draws, their sort order, the
chain pointers) and 8 in the sorted result; nothing per document of the corpus (a 2%
held-out split: ~0.8 bytes a document instead of 8). tests/test_groups.py checks the set
equal to ``choice``'s on both paths.
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError
from ..options import PackOptions
from ..seeds import rng as seeded

CHUNK = 1 << 20


def choice_set(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """``np.sort(rng.choice(n, size, replace=False))``, in memory of ``size`` (int64)."""
    if size <= 0:
        return np.empty(0, np.int64)
    if n <= 10_000 or size <= n // 50:  # numpy's own Floyd path: O(size) already
        return np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)
    if size >= n:
        return np.arange(n, dtype=np.int64)
    a = n - size
    draws = np.empty(size, np.int64)  # draws[u]: the draw of step a + u
    for hi in range(n - 1, a - 1, -CHUNK):  # the shuffle's order: i = n-1, n-2, ..., a
        lo = max(hi - CHUNK + 1, a)
        draws[lo - a:hi - a + 1][::-1] = rng.integers(0, np.arange(hi, lo - 1, -1),
                                                      endpoint=True)
    return np.union1d(draws, _collisions(draws, a) + a)


def _collisions(draws: np.ndarray, a: int) -> np.ndarray:
    """The steps (as u = i - a) that take themselves: their draw repeats an earlier draw, or
    is an earlier step that took itself."""
    size = draws.size
    idx = np.int32 if size < 2**31 else np.int64
    order = np.argsort(draws, kind="stable")
    repeat = np.empty(size, bool)
    repeat[order] = np.concatenate([[False], draws[order][1:] == draws[order][:-1]])
    del order
    u = np.arange(size, dtype=idx)
    ptr = np.where((draws >= a) & (draws - a < u), draws - a, u).astype(idx)
    taken = repeat
    while True:  # pointer doubling along step -> the earlier step it drew
        taken |= taken[ptr]
        nxt = ptr[ptr]
        if np.array_equal(nxt, ptr):
            return np.flatnonzero(taken).astype(np.int64)
        ptr = nxt


def sparse_selection(chunks, sizes: list[int], factors: list[float], options: PackOptions
                     ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per source, the sorted local indices of the documents the global plan holds out and
    of those it gives one copy more than floor(factor): the same seeded draws (ranks among
    the source's candidates) mapped to documents by a streaming pass; ``chunks(k)`` yields
    source k's lengths a chunk at a time."""
    held_all, extra_all = [], []
    valid_docs, valid_fraction = options.valid_docs, options.valid_fraction
    nonempty = [sum(int(np.count_nonzero(c)) for c in chunks(k)) for k in range(len(sizes))]
    if valid_docs is not None and not 1 <= valid_docs < sum(nonempty):
        raise PacktoolError(f"--valid-docs {valid_docs}: must be from 1 to "
                            f"{sum(nonempty) - 1:,} (the non-empty documents, less one for "
                            "training)")
    total = int(sum(sizes))
    for k, (n, factor) in enumerate(zip(sizes, factors, strict=True)):
        held = np.empty(0, np.int64)
        m = nonempty[k]
        if (valid_docs is not None or valid_fraction is not None) and m:
            share = valid_fraction if valid_fraction is not None else valid_docs / total
            want = min(max(1, round(share * m)), m)
            held = _nonempty_docs(chunks(k), choice_set(
                seeded(options.seed, "mixture.held_out", k), m, want))
        extra = round((factor - int(factor)) * (n - held.size))
        ranks = choice_set(seeded(options.seed, "mixture.repeats", k), n - held.size, extra)
        skip = held - np.arange(held.size)  # eligible rank r is document r + #held <= it
        held_all.append(held)
        extra_all.append(ranks + np.searchsorted(skip, ranks, side="right"))
    return held_all, extra_all


def _nonempty_docs(chunks, ranks: np.ndarray) -> np.ndarray:
    """Local indices of the non-empty documents of these ranks (sorted) among them."""
    out = np.empty(ranks.size, np.int64)
    seen, base, j = 0, 0, 0
    for c in chunks:
        pos = np.flatnonzero(np.asarray(c) > 0)
        hi = np.searchsorted(ranks, seen + pos.size, side="left")
        out[j:hi] = base + pos[ranks[j:hi] - seen]
        j, seen, base = hi, seen + pos.size, base + len(c)
    return out
