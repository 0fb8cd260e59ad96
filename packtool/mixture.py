"""Mixtures and held-out splits, from lengths alone: which copies of which documents the
training packs use (``PREFIX:FACTOR``: 2.0 = every document twice, 0.5 = a seeded half) and
which whole documents are held out for validation. Pure functions of the inputs and the
options, so ``verify`` recomputes them (with its own code) to check a dataset.
"""

from __future__ import annotations

import numpy as np

from .errors import PacktoolError
from .plan import PackOptions


def parse_source(spec: str) -> tuple[str, float]:
    """``PREFIX`` or ``PREFIX:FACTOR`` (``web:2.0``, ``books:0.5``) -> (prefix, factor)."""
    head, sep, tail = str(spec).rpartition(":")
    if sep and head:
        try:
            factor = float(tail)
        except ValueError:
            return str(spec), 1.0
        if not (0 <= factor < 1e6) or factor != factor:
            raise PacktoolError(f"{spec}: repeat factor {tail} must be a number from 0 to "
                                "999,999 (2.0 = every document twice, 0.5 = a seeded half)")
        return head, factor
    return str(spec), 1.0


def _sub_seed(seed: int, domain: int, k: int) -> np.random.Generator:
    """The held-out (1) or extra-copy (2) stream of source k (packtool.seeds)."""
    from . import seeds

    return seeds.rng(seed, {1: "mixture.held_out", 2: "mixture.repeats"}[domain], k)


def held_out(lengths: np.ndarray, sizes: list[int], seed: int, valid_docs: int | None = None,
             valid_fraction: float | None = None) -> np.ndarray:
    """Boolean mask of the documents held out for validation: whole non-empty documents, a
    seeded sample of each source in proportion to its size (``valid_docs`` in all, or
    ``valid_fraction`` of each source), at least one from every source that has any."""
    mask = np.zeros(lengths.size, bool)
    if valid_docs is None and valid_fraction is None:
        return mask
    if valid_docs is not None and valid_fraction is not None:
        raise PacktoolError("give --valid-docs or --valid-fraction, not both")
    total = int(sum(sizes))
    nonempty = lengths > 0
    if valid_docs is not None and not 1 <= valid_docs < int(nonempty.sum()):
        raise PacktoolError(f"--valid-docs {valid_docs}: must be from 1 to "
                            f"{int(nonempty.sum()) - 1:,}"
                            " (the non-empty documents, less one for training)")
    if valid_fraction is not None and not 0 < valid_fraction < 1:
        raise PacktoolError(f"--valid-fraction {valid_fraction}: must be above 0 and below 1")
    base = 0
    for k, n in enumerate(sizes):
        docs = base + np.flatnonzero(nonempty[base:base + n])
        share = valid_fraction if valid_fraction is not None else valid_docs / total
        want = min(max(1, round(share * docs.size)), docs.size) if docs.size else 0
        pick = _sub_seed(seed, 1, k).choice(docs, size=want, replace=False) if want else docs[:0]
        mask[pick] = True
        base += n
    return mask


def doc_repeats(sizes: list[int], factors: list[float], seed: int,
                exclude: np.ndarray | None = None) -> np.ndarray:
    """How many copies of each document a mixture uses: floor(factor) of every document, plus
    one more for a seeded sample of round(frac(factor) * n) of them (``exclude``d documents,
    e.g. held-out ones, get none and are not sampled)."""
    reps = np.zeros(int(sum(sizes)), np.int64)
    base = 0
    for k, (n, factor) in enumerate(zip(sizes, factors, strict=True)):
        whole, frac = int(factor), factor - int(factor)
        eligible = np.arange(base, base + n)
        if exclude is not None:
            eligible = eligible[~exclude[base:base + n]]
        reps[eligible] = whole
        extra = round(frac * eligible.size)
        if extra:
            reps[_sub_seed(seed, 2, k).choice(eligible, size=extra, replace=False)] += 1
        base += n
    return reps


def mixture_plan(lengths: np.ndarray, sizes: list[int], factors: list[float],
                 options: PackOptions) -> tuple[np.ndarray | None, np.ndarray]:
    """(copies per document for the training packs, or None for "each once"; held-out mask).
    A pure function of the inputs and options: ``verify`` recomputes it to check a pack."""
    valid = held_out(lengths, sizes, options.seed, options.valid_docs, options.valid_fraction)
    if all(f == 1 for f in factors) and not valid.any():
        return None, valid
    return doc_repeats(sizes, factors, options.seed, exclude=valid), valid


def sparse_selection(chunks, sizes: list[int], factors: list[float], options: PackOptions
                     ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The documents :func:`mixture_plan` holds out and gives an extra copy, per source, as
    sorted local document indices, in memory that grows with the selection, not the corpus:
    the same seeded draws (a draw of ranks among the source's candidates), mapped to
    documents by a streaming pass. ``chunks(k)`` yields source k's lengths a chunk at a time.
    Everything else gets ``floor(factor)`` copies; held-out documents none."""
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
            ranks = np.sort(_sub_seed(options.seed, 1, k).choice(m, size=want, replace=False))
            held = _nonempty_docs(chunks(k), ranks)
        frac = factor - int(factor)
        extra = round(frac * (n - held.size))
        picks = np.empty(0, np.int64)
        if extra:
            ranks = np.sort(_sub_seed(options.seed, 2, k).choice(n - held.size, size=extra,
                                                                 replace=False))
            skip = held - np.arange(held.size)  # eligible rank r is document r + #held <= it
            picks = ranks + np.searchsorted(skip, ranks, side="right")
        held_all.append(held)
        extra_all.append(picks.astype(np.int64))
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
