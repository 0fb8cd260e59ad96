"""Padding-free attention for packed rows: ``attn_implementation="packtool"``.

A packed row is ``[1, N]`` tokens cut into segments by ``cu_seq_lens_q`` (what
``model_inputs(batch)`` passes); attention must stay inside each segment, causal::

    row        a0 a1 a2 | b0 b1 b2 b3 | P P      cu_seq_lens_q [0, 3, 7, 9]
    a2 sees    a0 a1 a2                          b3 sees b0 b1 b2 b3, never a*

:func:`packtool_attention` is registered with transformers' ``AttentionInterface`` and runs
the first kernel of :data:`ORDER` that is installed for the tensors' device, chosen once per
process and device and logged (:func:`attention_kernel` returns it). Measured on an H200
(0.62B Llama, 16,384-token steps, docs/BENCHMARKS.md): torch's varlen_attn 86,600 real
tokens/s on ~84-token documents, FlexAttention 80,000, sorted padding 55,000, and transformers'
default path for packed position ids (a dense [N, N] mask) 17,000-27,000 and +8 GB.

    kernel        what runs                                     GQA     window softcap sinks drop
    flash_attn    flash_attn_varlen_func (pip install flash-attn) native  yes    yes     -     yes
    torch_varlen  torch.nn.attention.varlen.varlen_attn (>= 2.9)  native* yes*   -       -     -
    flex          flex_attention, a document-causal BlockMask     native  yes    yes     yes   -
    reference     plain torch, a dense [N, N] mask (CPU only)     repeat  yes    yes     yes   -

    * torch 2.9-2.10's varlen_attn takes ``is_causal`` (no window) and no ``enable_gqa``: its
      signature is probed, and a layer with a window goes to the next kernel.
    The two varlen kernels take fp16 / bf16 alone (train under ``torch.autocast``); float32
    queries go to FlexAttention.

A layer that needs what the chosen kernel lacks runs on the next kernel of the order that has
it; where none does, the call is refused naming the feature and the kernel. A layer called
without ``cu_seq_lens_q`` is refused too: whole-row attention would be a silent leak. A
FlexAttention ``BlockMask`` passed as ``attention_mask`` (``block_mask(batch)``: shared-prompt
rows, ``pack --share-prompt``) runs through FlexAttention with that mask.

A layer that attends both ways (``is_causal=False``: the vision encoder of Qwen-VL models,
which calls attention once per image) runs torch's sdpa over the call as given: the kernels
above are causal, and the causal one made the encoder's output 0.35 off (``packtool
conformance --arch qwen2_vl``, before this rule).

No host syncs: nothing here reads a device value (no ``.item()``, no ``.tolist()``, no
shape from data), and the varlen kernels take ``max_length_q/k`` as the Python ints
``collate_tensors`` gives. :func:`varlen_attention` (``"packtool_varlen"``) is the same
reference with whole-row attention where a layer passes no boundaries: ``packtool
conformance`` uses it to find models that drop the kwargs on the way to a layer.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import weakref
from typing import NamedTuple

from ..errors import PacktoolError

NAME = "packtool"
VARLEN = "packtool_varlen"
CALLS: list[bool] = []  # per attention call since the last clear: did it get cu_seq_lens_q?
ORDER = ("flash_attn", "torch_varlen", "flex", "reference")
FEATURES = ("window", "softcap", "sinks", "dropout", "scale", "float32")
log = logging.getLogger("packtool")


# -- the kernels: (q, k, v [T, H, D]; cu_q, cu_k int32 [S + 1]; max_q, max_k int) -> [T, H, D]

def reference(q, k, v, cu_q, cu_k, max_q=None, max_k=None, *, scale, window=None, softcap=None,
              sinks=None, dropout=0.0):
    """Causal attention within each segment of ``cu_q`` (keys: ``cu_k``), a query seeing
    itself and the ``window - 1`` tokens before it, scores soft-capped, a sink logit per head
    taking part in the softmax: the definition, as a dense masked softmax (O(T^2) memory)."""
    import torch

    tq, tk = q.shape[0], k.shape[0]
    doc_q, pos_q = _segment_of(cu_q, tq)
    doc_k, pos_k = _segment_of(cu_k, tk)
    allowed = (doc_q[:, None] == doc_k[None, :]) & (pos_q[:, None] >= pos_k[None, :])
    if window is not None:
        allowed &= pos_q[:, None] - pos_k[None, :] < window
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:  # the sink's logit takes part in the softmax, then is dropped
        sink = sinks.reshape(-1, 1, 1).expand(-1, tq, 1).to(s.dtype)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.einsum("hqk,khd->qhd", p.to(v.dtype), v)


def _segment_of(cu, n):
    """(segment of each of the ``n`` tokens, its position in the segment), from ``cu`` on its
    device: empty segments (``--max-docs``' repeated offsets) hold no token."""
    import torch

    t = torch.arange(n, device=cu.device, dtype=cu.dtype)
    seg = torch.searchsorted(cu, t, right=True) - 1
    return seg, t - cu[seg]


def _flash_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window=None, softcap=None,
                sinks=None, dropout=0.0):
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=dropout,
                                  softmax_scale=scale, causal=True,
                                  window_size=(-1, -1) if window is None else (window - 1, 0),
                                  softcap=0.0 if softcap is None else softcap)


def _torch_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window=None, softcap=None,
                  sinks=None, dropout=0.0):
    from torch.nn.attention.varlen import varlen_attn

    params = _varlen_params()
    kw = {} if scale is None or "scale" not in params else {"scale": scale}
    if "window_size" in params:  # torch >= 2.11: (left, right); (-1, 0) is causal
        kw["window_size"] = (-1, 0) if window is None else (window - 1, 0)
    else:  # torch 2.9-2.10
        kw["is_causal"] = True
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def _flex(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window=None, softcap=None, sinks=None,
          dropout=0.0, mask=None):
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if mask is None:
        mask = _document_mask(cu_q, q.shape[0], window)
    score_mod = None
    if softcap is not None:
        def score_mod(s, b, h, qi, ki):
            return softcap * torch.tanh(s / softcap)

    lse = {}
    if sinks is not None:  # return_aux since torch 2.9, return_lse before
        try:
            from torch.nn.attention.flex_attention import AuxRequest
            lse = {"return_aux": AuxRequest(lse=True)}
        except ImportError:
            lse = {"return_lse": True}
    out = flex_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), score_mod=score_mod,
                         block_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1],
                         **lse)
    if sinks is not None:  # softmax over (scores, sink) = softmax(scores) * sigmoid(lse - sink)
        out, aux = out
        lse = getattr(aux, "lse", aux)
        out = out * torch.sigmoid(lse - sinks.reshape(1, -1, 1).to(lse.dtype))[..., None]
    return out[0].transpose(0, 1).to(q.dtype)


class Kernel(NamedTuple):
    run: object
    features: tuple  # what it does beyond causal segments (FEATURES)
    devices: tuple
    installed: object  # () -> bool


def _varlen_params() -> tuple:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return ()
    return tuple(inspect.signature(varlen_attn).parameters)


def _varlen_features() -> tuple:
    params = _varlen_params()
    return tuple(f for f, p in (("window", "window_size"), ("scale", "scale")) if p in params)


def _flex_installed() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


KERNELS = {
    "flash_attn": Kernel(_flash_attn, ("window", "softcap", "dropout", "scale"), ("cuda",),
                         lambda: importlib.util.find_spec("flash_attn") is not None),
    "torch_varlen": Kernel(_torch_varlen, None, ("cuda",), lambda: bool(_varlen_params())),
    "flex": Kernel(_flex, ("window", "softcap", "sinks", "scale", "float32"), ("cuda",),
                   _flex_installed),
    "reference": Kernel(reference, ("window", "softcap", "sinks", "scale", "float32"), ("cpu",),
                        lambda: True),
}
_chosen: dict = {}  # (device type, needs) -> kernel name
_only: tuple = ()  # attention_kernel(only=...): the kernels to choose among


def _features(name: str) -> tuple:
    f = KERNELS[name].features
    return _varlen_features() if f is None else f


def kernel_for(device_type: str, needs: tuple = ()) -> str:
    """The kernel that runs a layer needing ``needs`` (of :data:`FEATURES`) on
    ``device_type``: the first of :data:`ORDER` installed there, or the next one that has
    ``needs``; a refusal naming the feature and the kernel where none does. Decided once per
    process for each (device type, needs) and logged."""
    key = (device_type, needs)
    if key in _chosen:
        return _chosen[key]
    here = [n for n in _only or ORDER
            if device_type in KERNELS[n].devices and KERNELS[n].installed()]
    if not here:
        raise PacktoolError(
            f"packtool attention has no kernel for {device_type!r} tensors (it runs "
            f"{', '.join(f'{n} on {KERNELS[n].devices[0]}' for n in ORDER)}): move the model "
            "to a GPU, or to the CPU for a check")
    fit = next((n for n in here if set(needs) <= set(_features(n))), None)
    if fit is None:
        lacking = sorted(set(needs) - set(_features(here[0])))
        raise PacktoolError(
            f"a layer needs {', '.join(lacking)}, which {here[0]} (the kernel packtool "
            f"attention runs on {device_type}) lacks, and so do the other kernels here "
            f"({', '.join(here[1:]) or 'none'}); " + _ADVICE.get(lacking[0], "")
            + "or use the model's own attn_implementation")
    _chosen[key] = fit
    if fit != here[0] or not needs:
        log.info("packtool attention on %s: %s%s", device_type, fit,
                 f" (for layers with {', '.join(needs)})" if needs else "")
    return fit


_ADVICE = {"float32": "train in bf16 / fp16 (torch.autocast), or FlexAttention has it; ",
           "dropout": "set the model's attention_dropout to 0 or pip install flash-attn; ",
           "sinks": "FlexAttention (torch >= 2.5) has them; ",
           "softcap": "pip install flash-attn, or FlexAttention (torch >= 2.5) has it; ",
           "window": "pip install flash-attn, or torch >= 2.11's varlen_attn has it; "}


def attention_kernel(device="cuda", only=None) -> str:
    """The kernel ``attn_implementation="packtool"`` runs on ``device`` (a layer with no
    window, soft-cap, sinks or dropout). ``only`` (names of :data:`ORDER`, in the order to try
    them): from now on, in this process, choose among these alone (a benchmark's comparison;
    ``only=ORDER`` undoes it)."""
    import torch

    global _only
    if only is not None:
        unknown = [n for n in only if n not in KERNELS]
        if unknown or not only:
            raise PacktoolError(f"attention kernels {unknown or only!r}: choose among "
                                f"{', '.join(ORDER)}")
        _only = tuple(only)
        _chosen.clear()
    return kernel_for(torch.device(device).type)


def packtool_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                       sliding_window=None, softcap=None, s_aux=None, cu_seq_lens_q=None,
                       cu_seq_lens_k=None, max_length_q=None, max_length_k=None, **kwargs):
    """A transformers attention function: ``query`` [B, H, T, D], key/value [B, H_kv, T, D]
    -> ([B, T, H, D], None), attention within each segment of ``cu_seq_lens_q`` over the
    flattened row, through :func:`kernel_for`'s kernel."""
    import torch

    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:  # torch < 2.5: no FlexAttention, so no BlockMask to be given
        BlockMask = ()
    if cu_seq_lens_q is None and _bidirectional(module, kwargs):
        return _both_ways(module, query, key, value, attention_mask, scaling, dropout)
    b, h, t, d = query.shape
    flex_mask = attention_mask if isinstance(attention_mask, BlockMask) else None
    if attention_mask is not None and flex_mask is None:
        raise PacktoolError(
            f"{type(module).__name__} got an attention_mask {tuple(attention_mask.shape)}: "
            "attn_implementation='packtool' takes the row's boundaries (model_inputs(batch)), "
            "or a FlexAttention block_mask(batch); use eager or sdpa for model_inputs(batch, "
            "mask='4d')")
    if cu_seq_lens_q is None and flex_mask is None:
        raise PacktoolError(
            f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}) called "
            "attention without cu_seq_lens_q: it would attend across the whole row, every "
            "document to the ones before it. Pass model_inputs(batch) to the model; if you "
            "did, this model does not hand its kwargs to every layer: run packtool.torch."
            "prepare_model(model) for its verdict")
    if not torch.compiler.is_compiling():
        CALLS.append(True)
    needs = tuple(f for f, on in (("window", sliding_window is not None),
                                  ("softcap", softcap is not None),
                                  ("sinks", s_aux is not None), ("dropout", dropout > 0),
                                  ("scale", scaling is not None and scaling != d ** -0.5),
                                  ("float32", query.dtype == torch.float32)) if on)
    scale = d ** -0.5 if scaling is None else scaling
    q, k, v = (x.transpose(1, 2).reshape(b * t, x.shape[1], d) for x in (query, key, value))
    opts = {"scale": scale, "window": sliding_window, "softcap": softcap, "sinks": s_aux,
            "dropout": dropout}
    if flex_mask is not None:
        if sliding_window is not None:
            raise PacktoolError(
                f"{type(module).__name__} has a sliding window of {sliding_window} tokens and "
                "got a block_mask(batch), which has none: a shared-prompt row (pack "
                "--share-prompt) on a sliding-window model is not supported; pack without "
                "--share-prompt")
        out = _flex(q, k, v, None, None, None, None, mask=flex_mask, **opts)
    else:
        name = kernel_for(query.device.type, needs)
        if name in ("flash_attn", "torch_varlen") and (max_length_q is None
                                                       or max_length_k is None):
            raise PacktoolError(f"{name} needs max_length_q/k (ints) beside cu_seq_lens_q: "
                                "pass model_inputs(batch) of a collate_tensors batch")
        cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
        out = KERNELS[name].run(q, k, v, cu_seq_lens_q, cu_k, max_length_q, max_length_k,
                                **opts)
    return out.reshape(b, t, h, d), None


_last_mask: list = []  # [(weakref to cu, its version, n, window, BlockMask)]


def _document_mask(cu, n: int, window=None):
    """The document-causal (and windowed) FlexAttention BlockMask of a row cut at ``cu``,
    built on ``cu``'s device and kept for the next layer that passes the same tensor (every
    layer of a step does): the first layer of a step pays for it."""

    if _last_mask:
        ref, version, n0, w0, mask = _last_mask[0]
        if ref() is cu and cu._version == version and n0 == n and w0 == window:
            return mask
    mask = document_block_mask(cu, n, window)
    _last_mask[:] = [(weakref.ref(cu), cu._version, n, window, mask)]
    return mask


def document_block_mask(cu, n: int, window=None):
    """The FlexAttention BlockMask of document-causal attention over a row of ``n`` tokens cut
    at ``cu`` (a tensor; and a sliding window, for the layers that have one), on its device."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc, pos = _segment_of(cu, n)

    def mask_mod(b, h, q, kv):
        m = (doc[q] == doc[kv]) & (q >= kv)
        return m & (pos[q] - pos[kv] < window) if window else m

    return create_block_mask(mask_mod, 1, None, n, n, device=cu.device)


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     sliding_window=None, softcap=None, s_aux=None, cu_seq_lens_q=None,
                     **kwargs):
    """``"packtool_varlen"``: :func:`reference` over the segments of ``cu_seq_lens_q``, the
    whole row as one sequence when a layer passes none (recorded in :data:`CALLS`), which is
    what makes a model that drops the kwargs on the way to some layer show up as a leak."""
    import torch

    if cu_seq_lens_q is None and _bidirectional(module, kwargs):
        return _both_ways(module, query, key, value, attention_mask, scaling, dropout)
    CALLS.append(cu_seq_lens_q is not None)
    b, h, t, d = query.shape
    cu = (torch.tensor([0, t], dtype=torch.int32, device=query.device) if cu_seq_lens_q is None
          else cu_seq_lens_q)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    out = reference(q, k, v, cu, cu, scale=d ** -0.5 if scaling is None else scaling,
                    window=sliding_window, softcap=softcap, sinks=s_aux)
    return out[None].contiguous(), None


def _bidirectional(module, kwargs: dict) -> bool:
    return kwargs.get("is_causal", getattr(module, "is_causal", True)) is False


def _both_ways(module, query, key, value, attention_mask, scaling, dropout):
    """A bidirectional layer's call (a vision encoder's, one image a call): torch's sdpa
    through transformers' own function, the mask it was given, no causality."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=False)


def register() -> str:
    """Register :func:`packtool_attention` as ``attn_implementation="packtool"`` (and
    :func:`varlen_attention` as ``"packtool_varlen"``). transformers builds no mask for it:
    versions that skip mask creation for a name missing from ``AttentionMaskInterface`` (5.x)
    are left that way, since a registered mask function would first have transformers infer
    packed sequences from the position ids (a host sync per forward); older ones get a mask
    function that returns None."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packtool_attention)
    AttentionInterface.register(VARLEN, varlen_attention)
    if not _mask_skipped():
        from transformers import AttentionMaskInterface

        AttentionMaskInterface.register(NAME, _no_mask)
        AttentionMaskInterface.register(VARLEN, _no_mask)
    return NAME


def _no_mask(*args, **kwargs):
    return None


def _mask_skipped() -> bool:
    """Whether this transformers builds no mask for an implementation it has no mask function
    for (probed once, on a one-token input)."""
    import types

    import torch

    try:
        from transformers.masking_utils import _preprocess_mask_arguments

        cfg = types.SimpleNamespace(_attn_implementation=NAME)
        return _preprocess_mask_arguments(cfg, torch.zeros(1, 1, 1), None, None, None, 0)[0]
    except Exception:  # another signature: register the mask function
        return False
