"""The checks every sampler makes of its shape: counts that are integers in range, and a rank
inside the world."""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError


def check_shape(rank, world_size, *counts: tuple[str, object, int]) -> None:
    """Each of ``counts`` ((name, value, minimum), checked first, in order), ``world_size``
    >= 1, then ``rank`` in 0..world_size - 1, each refused by name."""
    for name, v, lo in (*counts, ("world_size", world_size, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise PacktoolError(f"{name} must be an integer >= {lo}, got {v!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
            or not 0 <= rank < world_size:
        raise PacktoolError(f"rank must be in 0..{world_size - 1} (world_size {world_size}), "
                            f"got {rank!r}")
