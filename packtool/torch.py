"""``packtool.torch``: the torch adapters (dataset, samplers, collators), under their short
public name; they live in :mod:`packtool.train.torch`. ``prepare_model(model)`` sets and proves
``attn_implementation="packtool"`` (:mod:`packtool.train.attention`), registered on import
when transformers is installed."""

from .train.attention import attention_kernel  # noqa: F401
from .train.prepare import prepare_model  # noqa: F401
from .train.torch import (  # noqa: F401
    MODEL_KEYS,
    PackBatchSampler,
    PackSampler,
    TorchPackedDataset,
    block_mask,
    collate_mds,
    collate_tensors,
    model_inputs,
    sampler_state,
)

try:
    import transformers  # noqa: F401
except ImportError:  # pragma: no cover - registered when transformers is there
    pass
else:
    from .train.attention import register as _register

    _register()
