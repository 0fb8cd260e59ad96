"""The one invariant checker every packer is tested with."""

import numpy as np


def check_assignment(lengths, packs, capacity):
    lengths = np.asarray(lengths, dtype=np.int64)
    packs = np.asarray(packs)
    assert packs.shape == lengths.shape and packs.dtype == np.int64
    nonempty = lengths > 0
    # every non-empty document in exactly one pack; empty ones in none
    assert (packs[nonempty] >= 0).all(), "a document was not placed"
    assert (packs[~nonempty] == -1).all(), "an empty document was placed"
    if not nonempty.any():
        return 0
    n_packs = int(packs.max()) + 1
    used = np.bincount(packs[nonempty], weights=lengths[nonempty], minlength=n_packs)
    assert used.max() <= capacity, "a pack is over capacity"
    assert (used > 0).all(), "pack ids are not dense (an empty pack)"
    assert used.sum() == lengths.sum(), "tokens lost"
    return n_packs
