"""``packtool.torch``: the torch adapters (dataset, samplers, collators), under their short
public name; they live in :mod:`packtool.train.torch`."""

from .train.sampler import PackSampler  # noqa: F401  (one class: a DataLoader takes it as it is)
from .train.torch import (  # noqa: F401
    MODEL_KEYS,
    PackBatchSampler,
    TorchPackedDataset,
    block_mask,
    collate_mds,
    collate_tensors,
    model_inputs,
    sampler_state,
)
