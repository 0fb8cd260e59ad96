"""``prepare_model(model)``: choose packtool's attention for a model and prove it exact on a
packed row before training, in one call (``packtool.torch.prepare_model``).

``packtool conformance`` asks which input path keeps an *architecture*'s packed documents
apart, on tiny random models; this asks it of *this* model, with its own weights, device and
dtype, on the path training will take (``attn_implementation="packtool"`` fed by
``model_inputs(batch)``), and judges it the same way (:class:`.conformance.ConformanceResult`).
A check of four documents (68 tokens) costs a few forward passes: ~0.3 s for a 2-layer model on
a CPU core.
"""

from __future__ import annotations

from ..errors import PacktoolError
from .conformance import (
    CONTROL,
    TOL,
    ConformanceResult,
    alone,
    documents,
    logit_diff,
    path_row,
    recurrent_layers,
)

PROBE_LENGTHS = (23, 9, 31, 5)  # a few dozen tokens: four documents, one row
HALF_TOL = 1e-2  # in 16-bit floats: of the largest |logit| of the documents alone


def prepare_model(model, tol: float | None = None):
    """Set ``attn_implementation="packtool"`` (:mod:`packtool.train.attention`) on ``model``,
    prove it on a tiny packed row, and return the model::

        model = packtool.torch.prepare_model(model)
        loss = model(**model_inputs(batch), use_cache=False).loss

    The proof: four random documents of 23, 9, 31 and 5 tokens packed into one row, run through
    the model's own layers (``torch.no_grad``, eval mode for the check, on the model's device
    and dtype) with ``model_inputs(batch)``, against each document alone (eager attention), and
    the control (the row with no boundaries, eager) which must leak. It passes as ``packtool
    conformance`` judges a path (:class:`ConformanceResult`): max |logit difference| <= ``tol``
    (default :data:`TOL` in float32, :data:`HALF_TOL` x the largest |logit| in 16-bit floats and
    for float32 weights on a GPU, under bf16 autocast), every call got the boundaries, and the
    control leaks. Anything else is refused with the difference and what to do: a model that
    leaks, a hybrid whose recurrent layers need ``seq_idx``, a layer the kwargs never reach."""
    import logging

    import torch

    from .attention import NAME, attention_kernel, register
    from .torch import model_inputs

    register()
    param = next(model.parameters())
    arch = type(model).__name__
    recurrent = recurrent_layers(model)
    docs, batch = documents(model.get_input_embeddings().num_embeddings, PROBE_LENGTHS)
    inputs = {k: (v.to(param.device) if isinstance(v, torch.Tensor) else v)
              for k, v in model_inputs(batch).items() if k != "labels"}
    if recurrent:
        inputs["seq_idx"] = batch["seq_idx"].to(param.device)
    diff, control, calls, tol = _probe(model, docs, inputs, tol)
    rows = [path_row(arch, NAME, diff, tol=tol, verdict=None if calls else "unsupported",
                     note=None if calls else "no layer called the attention interface"),
            path_row(arch, CONTROL, control, tol=tol)]
    if ConformanceResult(rows).ok:
        logging.getLogger("packtool").info(
            "prepare_model: %s exact through attn_implementation=%r (%s, %d attention calls, max "
            "|logit diff| %.1e <= %.1e; control %.1e)", arch, NAME, attention_kernel(param.device),
            calls, diff, tol, control)
        return model
    if calls and diff <= tol:  # exact, but the control did not leak either: proof of nothing
        raise PacktoolError(
            f"{arch}: the packed row's logits equal the documents alone ({diff:.2e}), but so do "
            f"those of the row without boundaries ({control:.2e} <= {tol:.1e}), so the check "
            "proves nothing for this model (does it read its input?); check it with packtool "
            "conformance --config config.json")
    what = ("no layer called transformers' attention interface (its attention ignores "
            "attn_implementation)" if not calls else
            f"its recurrent layers ({', '.join(recurrent)}) carry state across documents even "
            "with seq_idx on this machine (their GPU kernels may keep them apart)" if recurrent
            else "every attention call got the boundaries, so the leak is outside attention")
    raise PacktoolError(
        f"{arch} does not see a packed row as its documents alone through "
        f"attn_implementation={NAME!r}: max |logit diff| {diff:.2e} > {tol:.1e} (the control "
        f"without boundaries: {control:.2e}); {what}. Train it on unpacked rows (padding), or "
        "find a path that keeps its documents apart with packtool conformance --config "
        "config.json")


def _probe(model, docs, inputs, tol):
    """(max |logit diff| of the packed row, of the control, attention calls, tolerance), the
    model in eval mode meanwhile; float32 weights on a GPU under bf16 autocast, as they train,
    so the check runs the kernel training will."""
    import torch

    from .attention import CALLS, NAME

    param = next(model.parameters())
    auto = param.device.type == "cuda" and param.dtype == torch.float32
    half = auto or param.dtype in (torch.float16, torch.bfloat16)
    training = model.training
    model.eval()
    try:
        with torch.autocast(param.device.type, torch.bfloat16, enabled=auto):
            ref = alone(model, docs)
            if tol is None:
                tol = HALF_TOL * max(1.0, ref.float().abs().max().item()) if half else TOL
            control = logit_diff(model, ref, input_ids=inputs["input_ids"])
            model.set_attn_implementation(NAME)
            CALLS.clear()
            try:
                diff = logit_diff(model, ref, **inputs)
            except PacktoolError as e:  # a layer without the boundaries, a kernel refusing
                raise PacktoolError(f"prepare_model({type(model).__name__}): {e}") from None
    finally:
        model.train(training)
    return diff, control, len(CALLS), tol
