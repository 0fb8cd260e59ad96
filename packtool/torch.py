"""``packtool.torch``: the torch adapters (dataset, samplers, collators), under their short
public name; they live in :mod:`packtool.train.torch`. ``prepare_model(model)`` sets and proves
``attn_implementation="packtool"`` (:mod:`packtool.train.attention`); ``register_attention()``
registers it without the check, for ``from_pretrained(..., attn_implementation="packtool")``
(not on import: transformers' attention registry costs ~3 s to import, in every DataLoader
worker too)."""

from .train.attention import attention_kernel  # noqa: F401
from .train.attention import register as register_attention  # noqa: F401
from .train.prepare import prepare_model  # noqa: F401
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
