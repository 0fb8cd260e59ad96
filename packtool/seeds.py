"""Random streams: one seed, one domain per use, so no two stages draw the same numbers.

``np.random.default_rng(seed)`` and ``np.random.default_rng([seed, 0])`` are the same stream,
so before this module ``pack``'s shuffle of the packs (seed 0) and the sampler's epoch-0
permutation (``[seed, epoch]`` = ``[0, 0]``) were one permutation: epoch 0 replayed the
packer's own order. Every stream is now ``SeedSequence([seed, DOMAIN, *keys])`` with a domain
key of its own::

    pack.shuffle      [seed, 0x5041434b]             order of the packs written by ``pack``
    packer.random     [seed, 0x52414e44]             the ``random`` packer's document order
    sampler.epoch     [seed, 0x53414d50, epoch]      PackSampler's permutation of an epoch
    mixture.epoch     [seed, 0x4d495845, src, epoch] MixtureSampler: a source's epoch order
    budget.order      [seed, 0x424f5244, epoch, L]   token-budget steps: length L's row order
    budget.length     [seed, 0x424c454e, epoch]      token-budget steps: each step's length
    stats.batches     [seed, 0x53544154]             ``stats``' random-batch padding figure
    stats.imbalance   [seed, 0x494d4241]             ``stats``' attention-imbalance epoch
    mixture.held_out  [seed, 1, source]              kept as they were (packtool.pack.plan)
    mixture.repeats   [seed, 2, source]

The keys are fixed constants (ASCII of PACK, RAND, SAMP, STAT, MIXE,
BORD, BLEN, IMBA), never derived at run time, so
a seed gives the same numbers in every version that keeps this table.
"""

from __future__ import annotations

import numpy as np

DOMAINS = {
    "pack.shuffle": 0x5041434B,
    "packer.random": 0x52414E44,
    "sampler.epoch": 0x53414D50,
    "mixture.epoch": 0x4D495845,
    "budget.order": 0x424F5244,
    "budget.length": 0x424C454E,
    "stats.batches": 0x53544154,
    "stats.imbalance": 0x494D4241,
    "mixture.held_out": 1,
    "mixture.repeats": 2,
}


def rng(seed: int, domain: str, *keys: int) -> np.random.Generator:
    """The generator of ``domain`` for ``seed`` (and ``keys``, e.g. the epoch)."""
    return np.random.default_rng(np.random.SeedSequence(
        [int(seed), DOMAINS[domain], *(int(k) for k in keys)]))
