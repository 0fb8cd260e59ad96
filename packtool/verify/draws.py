"""What a mixture and a held-out split must have chosen, recomputed from the index's seed,
factors and held-out request by the rules docs/FORMAT.md states, with verify's own plain code
(never :mod:`packtool.pack.mixture` nor the planner's): per source k of n documents,

    held out   :func:`.rules.expected_holdout` of its m non-empty documents, drawn without
               replacement by default_rng([seed, 1, k]).choice(m, ...) as ranks among them
    repeated   floor(factor) copies of every other document, one more for
               round(frac(factor) * e) of the e eligible ones: default_rng([seed, 2, k])

``choice`` is numpy's: below n/50 (or n <= 10,000) it runs Floyd's algorithm in memory of the
sample, and verify calls it; above, it shuffles ``arange(n)`` (8 bytes a candidate), and
verify makes the same set from the same draws (the shuffle's ``integers`` calls, i = n-1 down
to n-size) by Floyd's rule taken in ascending i, a plain loop over a byte per candidate.

Memory: the results as bitmaps (1 bit a document each, only for what is drawn); while a
sample above n/50 is drawn, 1 byte a candidate and 4 bytes a draw (8 past 2**32
candidates); with neither a fractional factor nor a held-out split, nothing. Time: ~0.3 us
a draw in the plain loop.
"""

from __future__ import annotations

import numpy as np

from .rules import expected_holdout

CHUNK = 1 << 18  # documents read at a time: ~30 MB of temporaries in all


def choice_marks(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """``rng.choice(n, size, replace=False)`` as one uint8 mark per candidate."""
    marks = np.zeros(n, np.uint8)
    if size <= 0:
        return marks
    if n <= 10_000 or size <= n // 50:
        marks[rng.choice(n, size=size, replace=False)] = 1
        return marks
    if size >= n:
        marks[:] = 1
        return marks
    first = n - size
    draws = np.empty(size, np.uint32 if n <= 2**32 else np.int64)
    for hi in range(n - 1, first - 1, -CHUNK):  # the shuffle's steps: i = n-1 down to first
        lo = max(hi - CHUNK + 1, first)
        draws[lo - first:hi - first + 1] = rng.integers(
            0, np.arange(hi, lo - 1, -1), endpoint=True)[::-1]
    taken = bytearray(n)
    step = first
    for a in range(0, size, CHUNK):  # Floyd: step i takes its draw, or i if that is taken
        for v in draws[a:a + CHUNK].tolist():
            if taken[v]:
                taken[step] = 1
            else:
                taken[v] = 1
            step += 1
    del draws
    return np.frombuffer(taken, np.uint8).copy()


def source_lengths(corpus, chunk: int = CHUNK):
    """A source's document lengths, a chunk at a time (int32 where they fit)."""
    for a in range(0, len(corpus), chunk):
        d = lengths_of(corpus, a, min(a + chunk, len(corpus)))
        yield d.astype(np.int32) if d.size and int(d.max()) < 2**31 else d


def lengths_of(corpus, a: int, b: int) -> np.ndarray:
    """Lengths of a source's documents a..b-1 (int64), from its parts' boundaries."""
    out, base = [], 0
    for q in corpus.parts:
        x, y = max(a - base, 0), min(b - base, len(q))
        if y > x:
            e = np.asarray(q.ends[max(x - 1, 0):y], np.int64)
            out.append(np.diff(e) if x else np.diff(e, prepend=np.int64(0)))
        base += len(q)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


class Selection:
    """Per source, bitmaps of its documents: held out, and given one more copy."""

    def __init__(self, index: dict, corpora: list):
        self.seed = int(index["seed"])
        self.whole = [int(float(s.get("factor", 1.0))) for s in index["sources"]]
        self.held, self.extra = [], []
        req = index.get("held_out") or {}
        nonempty = [sum(int(np.count_nonzero(x)) for x in source_lengths(c)) if req else 0
                    for c in corpora]
        wants = (expected_holdout(req, nonempty, sum(len(c) for c in corpora)) if req
                 else [0] * len(corpora))
        for k, c in enumerate(corpora):
            n = len(c)
            held = extra = None  # nothing drawn: no bitmap
            m, n_held = nonempty[k], wants[k]
            if n_held:
                ranks = choice_marks(np.random.default_rng([self.seed, 1, k]), m, n_held)
                held = self._place(c, ranks, lambda x, a: x > 0)
            factor = float(index["sources"][k].get("factor", 1.0))
            n_extra = round((factor - int(factor)) * (n - n_held))
            if n_extra:
                ranks = choice_marks(np.random.default_rng([self.seed, 2, k]), n - n_held,
                                     n_extra)
                extra = self._place(c, ranks, lambda x, a, h=held: ~_bits(h, a, a + x.size))
            self.held.append(held)
            self.extra.append(extra)

    @staticmethod
    def _place(corpus, ranks: np.ndarray, candidate) -> np.ndarray:
        """The documents whose rank among the candidates is marked, as a bitmap."""
        out = np.zeros(-(-len(corpus) // 8), np.uint8)
        seen, at = 0, 0
        for x in source_lengths(corpus):
            pos = np.flatnonzero(candidate(x, at))
            docs = at + pos[ranks[seen:seen + pos.size].astype(bool)]
            np.bitwise_or.at(out, docs >> 3, (1 << (docs & 7)).astype(np.uint8))
            seen, at = seen + pos.size, at + x.size
        return out

    def copies(self, k: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(training copies, held-out copies) of source k's documents a..b-1 (uint32)."""
        held = _bits(self.held[k], a, b)
        train = np.full(b - a, self.whole[k], np.uint32)
        train += _bits(self.extra[k], a, b)
        train[held] = 0
        return train, held.astype(np.uint32)


def _bits(bitmap: np.ndarray | None, a: int, b: int) -> np.ndarray:
    """Bits a..b-1 of a bitmap (bitorder little) as booleans (None: all false)."""
    if bitmap is None:
        return np.zeros(b - a, bool)
    raw = np.unpackbits(bitmap[a >> 3:-(-b // 8)], bitorder="little")
    return raw[a & 7:(a & 7) + b - a].astype(bool)
