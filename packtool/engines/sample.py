"""The sample check's picks: which documents the reference re-encodes during a run
(``--engine-check sample``, :mod:`.select`), as a pure function of the corpus in input order.

Measured (scripts/bench_corpora.py's 50 MB corpora, the whole corpus as one part): prose
(24,168 documents) checks 78 documents, 145 kB (0.29% of its bytes; before the budget 232,
0.8%); Python source (2,711 files) checks 39, 128 kB (0.27%; before, 204 documents, 7.6%+).
On Python source the old sample cost the reference more CPU than the rest of the run: the
whole run took 4.0 s of CPU, 1.9 s with the budget (gigatoken, 2 shared cores at load 9.5).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

FIRST_DOCS = 200         # documents checked at the start of the corpus
RANDOM_RATE = 1 / 1000   # then this fraction of documents, seeded
GROWTH = 1.25            # and each document this much longer than the last so checked
BUDGET_BYTES = 64 << 10  # all of them within a budget: this many bytes at any point,
BUDGET_SHARE = 500       # plus one byte in this many of the corpus read so far
SEED = 0


def _unit(index: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) number per global document index (splitmix64 of ``index`` and ``SEED``):
    the random sample depends on where a document is in the corpus, nothing else."""
    with np.errstate(over="ignore"):
        z = index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(SEED)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


class Sampled(NamedTuple):
    """Where the sample check stands after the documents seen so far, in input order: the
    bytes of the last document checked for its length, the bytes seen, the bytes checked."""

    longest: int = 0
    seen: int = 0
    checked: int = 0


def sample_picks(start: int, sizes: np.ndarray, state: Sampled | None = None
                 ) -> tuple[np.ndarray, Sampled]:
    """Which documents of a batch the sample check re-encodes, and the check's new state.

    ``start``: the global index of the batch's first document; ``sizes``: its documents'
    UTF-8 bytes; ``state``: what the batches before it left (None at the start).
    Candidates: global index < ``FIRST_DOCS``; ``_unit(index) < RANDOM_RATE``; and, in input
    order, every document more than ``GROWTH`` times as long as the last one checked for its
    length: the longest documents, where rare paths hide, at most log(largest) /
    log(``GROWTH``) of them (~80 for 64 MiB), even when a corpus is sorted by length
    (checking every new maximum would then re-encode everything). A candidate is checked
    only while the bytes checked stay within ``BUDGET_BYTES`` plus one in ``BUDGET_SHARE`` of
    the bytes seen up to it: the reference is 50-90x slower than the fast engines on 2
    cores, so checking a fraction f of the bytes costs about 6-9 f of a run (the first 200
    files of Python source were 7% of a 50 MB corpus and doubled the run's CPU time). A
    document over the budget waits until enough of the corpus has been read (one of 1 MB
    needs 490 MB before it), so the corpus's longest is within ``GROWTH`` of one checked
    only if the budget reached it; ``--engine-check full`` checks everything. A pure
    function of the corpus, called in input order: the same corpus checks the same documents
    whatever ``--workers`` and ``--batch-size``."""
    n, state = len(sizes), state or Sampled()
    if not n:
        return np.zeros(0, np.int64), state
    index = np.arange(start, start + n, dtype=np.int64)
    drawn = (index < FIRST_DOCS) | (_unit(index) < RANDOM_RATE)
    seen = state.seen + np.cumsum(sizes, dtype=np.int64)
    longest, checked = state.longest, state.checked
    chosen = np.zeros(n, bool)
    # the candidates in order (longest only grows, so this is a superset of them)
    for i in np.flatnonzero(drawn | (sizes > longest * GROWTH)).tolist():
        size = int(sizes[i])
        grows = size > longest * GROWTH
        budget = BUDGET_BYTES + int(seen[i]) // BUDGET_SHARE
        if not (grows or drawn[i]) or checked + size > budget:
            continue
        chosen[i] = True
        checked += size
        if grows:
            longest = size
    return np.flatnonzero(chosen), Sampled(longest, int(seen[-1]), checked)
