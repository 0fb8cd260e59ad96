"""The output order of a plan's packs: a seeded shuffle (its own random stream), rearranged
with ``--balance attention`` into blocks of like attention cost."""

from __future__ import annotations

import numpy as np

from .. import seeds
from ..options import Order


def balanced_rank(rank: np.ndarray, packs: np.ndarray, rounds: list, g: int) -> np.ndarray:
    """The output order rearranged into blocks of ``g`` packs of like attention cost
    (:func:`packtool.formats.packed.balance.like_cost_order`), the shuffled order kept
    within a class."""
    from ..formats.packed.balance import like_cost_order
    from ..formats.packed.layout import ancestor_terms

    lengths = np.concatenate([r.table_length for r in rounds]).astype(np.float64)
    terms = lengths ** 2
    if len(rounds) == 1 and getattr(rounds[0], "up", None) is not None:  # trees
        terms += ancestor_terms(lengths, rounds[0].up)
    ok = packs >= 0
    costs = np.bincount(packs[ok], weights=terms[ok], minlength=rank.size)
    by_position = np.argsort(rank)
    out = np.empty_like(rank)
    out[like_cost_order(by_position, costs, g)] = np.arange(rank.size)
    return out


def shuffle_rank(n_packs: int, order: Order, key: tuple = ()) -> np.ndarray:
    """Each pack's output position: a seeded permutation (its own random stream, the
    ``pack.shuffle`` domain of :mod:`packtool.seeds`), or the packer's order."""
    if not order.shuffle:
        return np.arange(n_packs, dtype=np.int64)
    return seeds.rng(order.seed, "pack.shuffle", *key).permutation(n_packs).astype(np.int64)
