"""The figures every report shares (``pack``, ``stats``, the benchmarks): efficiency, the
lower bounds and the gaps to them, the packing factor. One function, so a number printed by
``stats`` and the same number printed by ``pack`` are computed the same way.

The packing factor is **sequences per pack**: a sequence is what a trainer takes as one
example, a document (or a piece of one) or a completion of a pair or group with its prompt. A
segment is a run of a row's tokens with its own positions; a shared prompt
(``--share-prompt``) is a segment but no sequence, so for 12.35 pairs a row stored with their
prompts shared a row holds 37.05 segments, 24.7 sequences (the packing factor) and 12.35
groups (``stats``' ``groups_per_pack``).

Bounds (see :mod:`packtool.bounds`): L1 = ceil(tokens / L); Martello-Toth L2 >= L1; the LP
bound when the optimal packer ran. An LP stopped before convergence still gives a valid bound
(Farley's), which can be *weaker* than L1: it is reported with ``lp_converged: false`` and the
best bound is the maximum of the valid ones, never less than L1.
"""

from __future__ import annotations

import numpy as np


def pack_metrics(seg_lengths: np.ndarray, seq_len: int, n_packs: int,
                 lp_bound: int | None = None, lp_converged: bool | None = None) -> dict:
    """Efficiency, bounds and gaps for segments of ``seg_lengths`` in ``n_packs`` packs."""
    seg_lengths = np.asarray(seg_lengths)
    hist = (np.bincount(seg_lengths, minlength=seq_len + 1) if seg_lengths.size
            else np.zeros(seq_len + 1, np.int64))
    return histogram_metrics(hist, seq_len, n_packs, lp_bound, lp_converged)


def histogram_metrics(hist: np.ndarray, seq_len: int, n_packs: int,
                      lp_bound: int | None = None, lp_converged: bool | None = None,
                      n_sequences: int | None = None) -> dict:
    """:func:`pack_metrics` from the histogram of segment lengths (``hist[v]`` segments of v
    tokens): what a plan made group by group adds up, in O(seq_len) memory. ``n_sequences``:
    where not every segment is a sequence (shared prompts)."""
    from .bounds import l2_bound_hist

    hist = np.asarray(hist, np.int64)
    n_tokens = int((hist * np.arange(hist.size)).sum())
    n_segments = int(hist[1:].sum())
    l1 = -(-n_tokens // seq_len)
    l2 = l2_bound_hist(hist, seq_len)
    best = max(l1, l2, lp_bound or 0)
    return {
        "efficiency": n_tokens / (n_packs * seq_len) if n_packs else 1.0,
        "lower_bound_packs": l1,
        "gap_percent": _gap(n_packs, l1),
        "l2_bound_packs": l2,
        "lp_bound_packs": lp_bound,
        "lp_converged": lp_converged,
        "best_bound_packs": best,
        "gap_to_best_bound_percent": _gap(n_packs, best),
        "packing_factor": packing_factor(
            n_segments if n_sequences is None else n_sequences, n_packs),
    }


def packing_factor(n_sequences: int, n_packs: int) -> float:
    """Sequences per pack (module docstring), 0 for no pack."""
    return n_sequences / n_packs if n_packs else 0.0


def _gap(n_packs: int, bound: int) -> float:
    return 100.0 * (n_packs - bound) / bound if bound else 0.0


def bounds_text(m: dict) -> str:
    """``lower bound 12 packs (gap 0.1%), L2 bound 12, LP bound 12 (gap to best 0.1%)``."""
    lp = ""
    if m.get("lp_bound_packs") is not None:
        lp = f", LP bound {m['lp_bound_packs']:,}" + (
            "" if m.get("lp_converged") else " (LP not converged: Farley's bound)")
    return (f"lower bound {m['lower_bound_packs']:,} packs (gap {m['gap_percent']:.3f}%), "
            f"L2 bound {m['l2_bound_packs']:,}{lp} (gap to best "
            f"{m['gap_to_best_bound_percent']:.3f}%)")
