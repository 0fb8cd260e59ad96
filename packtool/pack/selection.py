"""Which documents a mixture holds out and gives an extra copy, for ``pack --group-docs``: the
draws of the global plan (:func:`packtool.pack.mixture.mixture_plan`), kept as bitmaps (1 bit a
document) and made in memory that never holds 8 bytes a document.

numpy's ``Generator.choice(n, size, replace=False)`` takes one of two paths: Floyd's algorithm
over a hash set of the sample (size <= n // 50, or n <= 10,000), or a partial Fisher-Yates
shuffle of ``arange(n)``: 8 bytes a document, 0.8 GB at 10^8 documents, for any held-out
fraction of 2% or more and any fractional factor. :func:`choice_bits` makes the second path's
set without the array::

    draws    v_i = rng.integers(0, i, endpoint=True) for i = n-1 down to n-size: the calls
             the shuffle makes, in its order (a chunk of highs per call: the same stream)
    the set  the shuffle keeps what Floyd's rule keeps from the same draws taken in
             ascending i: step i takes v_i, or i itself when v_i is taken already. So the
             chunks of draws are made once to note the generator's state before each, then
             again from those states, last chunk first, each reversed into Floyd's order,
             and Floyd's rule marks the bitmap (a numba loop).

Memory: n bits and one chunk of draws (8 MB); time: the draws twice (~0.1 s per million
selected here). A group job receives its documents' bits only (G / 8 bytes each way).
tests/test_groups.py checks the sets equal to ``choice``'s on both paths and the selection
equal to the global plan's.
"""

from __future__ import annotations

import numpy as np

from .._numba import njit
from ..options import PackOptions
from ..seeds import rng as seeded
from .mixture import holdout_counts, refuse_idle

CHUNK = 1 << 20


@njit
def _floyd(bits, draws, first):
    """Floyd's rule over ascending steps first, first+1, ...: step t takes draws[t-first],
    or t itself when that one is taken already."""
    for u in range(draws.shape[0]):
        v = draws[u]
        if (bits[v >> 3] >> (v & 7)) & 1:
            v = first + u
        bits[v >> 3] |= np.uint8(1 << (v & 7))


def choice_bits(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """The set of ``rng.choice(n, size, replace=False)`` as a bitmap (``np.packbits``,
    bitorder little, ceil(n / 8) bytes), in memory of n bits and one chunk."""
    bits = np.zeros(-(-n // 8), np.uint8)
    if size <= 0:
        return bits
    if n <= 10_000 or size <= n // 50:  # numpy's own Floyd path: O(size) already
        set_bits(bits, rng.choice(n, size=size, replace=False))
        return bits
    if size >= n:
        return np.packbits(np.ones(n, bool), bitorder="little")
    a = n - size
    starts = []
    for hi in range(n - 1, a - 1, -CHUNK):  # the shuffle's order: i = n-1, n-2, ..., a
        starts.append((hi, rng.bit_generator.state))
        _draws(rng, hi, a)
    for hi, state in reversed(starts):  # lowest steps first: Floyd's order
        rng.bit_generator.state = state
        lo = max(hi - CHUNK + 1, a)
        _floyd(bits, _draws(rng, hi, a)[::-1].copy(), lo)
    return bits


def _draws(rng, hi: int, a: int) -> np.ndarray:
    """The shuffle's draws for steps hi, hi-1, ..., down to max(hi - CHUNK + 1, a)."""
    return rng.integers(0, np.arange(hi, max(hi - CHUNK + 1, a) - 1, -1), endpoint=True)


def set_bits(bits: np.ndarray, index: np.ndarray) -> None:
    index = np.asarray(index, np.int64)
    np.bitwise_or.at(bits, index >> 3, (1 << (index & 7)).astype(np.uint8))


def get_bits(bits: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Bits lo..hi-1 of a bitmap, as booleans."""
    raw = np.unpackbits(bits[lo >> 3:-(-hi // 8)], bitorder="little")
    return raw[lo & 7:(lo & 7) + hi - lo].astype(bool)


def selection_bits(chunks, sizes: list[int], factors: list[float], options: PackOptions,
                   names: list[str] | None = None
                   ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(held out, given one copy more than floor(factor)): bitmaps over every document of
    the sources (global indices), the global plan's draws (ranks among each source's
    candidates) mapped to documents by streaming passes; ``chunks(k)`` yields source k's
    lengths a chunk at a time. (None, None) when there is nothing to draw (no held-out split,
    whole factors): no byte per document at all. An empty training set, or a source that
    adds nothing to it, is refused (:func:`packtool.pack.mixture.refuse_idle`), as the global
    plan refuses it."""
    valid_docs, valid_fraction = options.valid_docs, options.valid_fraction
    nonempty = [sum(int(np.count_nonzero(c)) for c in chunks(k)) for k in range(len(sizes))]
    if valid_docs is None and valid_fraction is None and all(f == int(f) for f in factors):
        refuse_idle([m if f >= 1 else 0 for m, f in zip(nonempty, factors, strict=True)],
                    nonempty, factors, names)
        return None, None
    wants = holdout_counts(nonempty, valid_docs, valid_fraction)  # the global plan's rule
    total = int(sum(sizes))
    held, extra = (np.zeros(-(-total // 8), np.uint8) for _ in range(2))
    base = 0
    for k, (n, factor) in enumerate(zip(sizes, factors, strict=True)):
        m, n_held = nonempty[k], wants[k]
        if n_held:
            ranks = choice_bits(seeded(options.seed, "mixture.held_out", k), m, n_held)
            _mark(chunks(k), base, ranks, held, lambda c, a: np.asarray(c) > 0)
        n_extra = round((factor - int(factor)) * (n - n_held))
        if n_extra:
            ranks = choice_bits(seeded(options.seed, "mixture.repeats", k), n - n_held,
                                n_extra)
            _mark(chunks(k), base, ranks, extra,
                  lambda c, a: ~get_bits(held, a, a + len(c)))
        base += n
    refuse_idle(_trained(chunks, sizes, factors, nonempty, wants, extra), nonempty, factors,
                names)
    return held, extra


def _trained(chunks, sizes, factors, nonempty, wants, extra) -> list[int]:
    """Per source, its non-empty documents with a copy in the training packs: all but the
    held-out ones from a factor of 1 or more; else those given the extra copy."""
    out, base = [], 0
    for k, (n, f) in enumerate(zip(sizes, factors, strict=True)):
        if f >= 1:
            out.append(nonempty[k] - wants[k])
        else:
            got, at = 0, base
            for c in chunks(k):
                got += int(np.count_nonzero((np.asarray(c) > 0) & get_bits(extra, at,
                                                                         at + len(c))))
                at += len(c)
            out.append(got)
        base += n
    return out


def _mark(chunks, base: int, ranks: np.ndarray, out: np.ndarray, candidate) -> None:
    """Set in ``out`` the documents whose rank among the candidates is set in ``ranks``
    (``candidate(chunk, first document)``: which of a chunk's documents are candidates)."""
    seen, at = 0, base
    for c in chunks:
        pos = np.flatnonzero(candidate(c, at))
        chosen = pos[get_bits(ranks, seen, seen + pos.size)]
        set_bits(out, at + chosen)
        seen, at = seen + pos.size, at + len(c)
