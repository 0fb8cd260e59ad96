"""Packers: one signature, one registry.

A packer is ``(lengths: int64[n], capacity: int, *, seed: int, ...) -> int64[n]``: the pack
id of every document (0..P-1, dense, in the algorithm's order of creation; -1 only for
zero-length documents, which occupy no pack). The CLI's ``--algo`` choices are the keys of
:data:`PACKERS`. :func:`assign_packs` is the checked public entry point.
"""

from __future__ import annotations

import inspect

import numpy as np

from ..errors import PacktoolError
from . import bfd, ffd, nnlshp, optimal, simple, spfhp

PACKERS = {
    "bfd": bfd.pack,
    "optimal": optimal.pack,
    "ffd": ffd.pack,
    "spfhp": spfhp.pack,
    "nnlshp": nnlshp.pack,
    "sorted": simple.sorted_,
    "random": simple.random,
    "sequential": simple.sequential,
}


def packer_options(algo: str) -> set[str]:
    """Keyword options (beyond ``seed``) that ``algo`` accepts, e.g. {'max_depth'}."""
    params = inspect.signature(PACKERS[algo]).parameters
    return {k for k, p in params.items() if p.kind == p.KEYWORD_ONLY} - {"seed"}


def check_lengths(lengths, capacity: int) -> np.ndarray:
    if isinstance(capacity, bool) or int(capacity) != capacity or capacity < 1:
        raise PacktoolError(f"seq_len must be a positive integer, got {capacity!r}")
    if capacity >= 2**31:
        raise PacktoolError(f"seq_len {capacity:,} is too large: cu_seqlens are int32, so "
                            "packs hold at most 2,147,483,647 tokens")
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise PacktoolError(f"lengths must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise PacktoolError(f"lengths must be integers, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0:
            i = int(np.argmin(arr))
            raise PacktoolError(f"document {i} has negative length {lo}")
        if hi > capacity:
            i = int(np.argmax(arr))
            raise PacktoolError(
                f"document {i:,} has {hi:,} tokens > seq_len {capacity:,}; split, truncate or "
                "drop over-long documents first (packtool pack --overflow split|truncate|drop) "
                "or raise seq_len"
            )
    return arr


def assign_packs(lengths, seq_len: int, algo: str = "bfd", seed: int = 0, **options) -> np.ndarray:
    """Pack id of every document for documents of ``lengths`` in packs of ``seq_len`` tokens.

    >>> assign_packs([3, 5, 2, 6], 8, algo="bfd").tolist()
    [1, 1, 0, 0]
    """
    if algo not in PACKERS:
        raise PacktoolError(f"unknown packer {algo!r}; choose one of {', '.join(PACKERS)}")
    arr = check_lengths(lengths, seq_len)
    unknown = set(options) - packer_options(algo)
    if unknown:
        raise PacktoolError(f"packer {algo!r} takes no option {', '.join(sorted(unknown))}")
    options = {k: v for k, v in options.items() if v is not None}
    if arr.size == 0:
        return np.empty(0, np.int64)
    return np.asarray(PACKERS[algo](arr, int(seq_len), seed=int(seed), **options), dtype=np.int64)
