"""Reference attention for packed rows on CPU: what ``flash_attn_varlen_func`` and a
document-causal FlexAttention mask compute, for checking a model without a GPU
(``packtool conformance``, :mod:`packtool.train.conformance`).

:func:`varlen_attention` is plain causal attention cut at ``cu_seq_lens_q``, registered with
transformers' ``AttentionInterface`` as ``attn_implementation="packtool_varlen"``. A layer that
passes no ``cu_seq_lens_q`` gets the whole row as one sequence, which is what makes a model that
drops the kwargs on the way to some layer show up as a leak: :data:`CALLS` records, per call,
whether the boundaries arrived. It is a reference (a loop over segments), not a kernel.
"""

from __future__ import annotations

VARLEN = "packtool_varlen"
CALLS: list[bool] = []  # per attention call since the last clear: did it get cu_seq_lens_q?

def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     sliding_window=None, softcap=None, s_aux=None, cu_seq_lens_q=None,
                     **kwargs):
    """What ``flash_attn_varlen_func`` computes, in plain torch: causal attention within each
    segment of ``cu_seq_lens_q`` (the whole row when a layer passes none), with the layer's
    sliding window (a query sees itself and the ``sliding_window - 1`` tokens before it, as
    transformers' masks and flash's ``window_size`` have it), soft-cap and attention sinks.
    ``query`` is [1, H, T, D], key/value [1, H_kv, T, D]; returns ([1, T, H, D], None), the
    contract of a transformers attention function."""
    import torch

    CALLS.append(cu_seq_lens_q is not None)
    t = query.shape[2]
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    cu = [0, t] if cu_seq_lens_q is None else [int(c) for c in cu_seq_lens_q]
    out = torch.zeros_like(query)
    for a, z in zip(cu[:-1], cu[1:], strict=True):
        s = query[:, :, a:z] @ key[:, :, a:z].transpose(-1, -2) * scaling
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(z - a)
        allowed = i[:, None] >= i[None, :]
        if sliding_window is not None:
            allowed &= i[:, None] - i[None, :] < sliding_window
        s = s.masked_fill(~allowed, float("-inf"))
        if s_aux is not None:  # a sink logit per head takes part in the softmax, then is dropped
            sink = s_aux.reshape(1, -1, 1, 1).expand(s.shape[0], -1, z - a, 1).to(s.dtype)
            p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
        else:
            p = torch.softmax(s, dim=-1)
        out[:, :, a:z] = p @ value[:, :, a:z]
    return out.transpose(1, 2).contiguous(), None


def register_varlen() -> str:
    """Register :func:`varlen_attention` as ``attn_implementation="packtool_varlen"``."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    return VARLEN


def document_block_mask(cu_seqlens, n: int, window: int | None = None):
    """The FlexAttention BlockMask of document-causal attention over a row of ``n`` tokens cut
    at ``cu_seqlens`` (and a sliding window, for the layers that have one). To become
    ``packtool.torch.block_mask(batch)`` once that lands (it takes no window yet)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1),
                                  torch.diff(cu_seqlens.long()))

    def mask_mod(b, h, q, kv):
        m = (doc[q] == doc[kv]) & (q >= kv)
        return m & (q - kv < window) if window else m

    return create_block_mask(mask_mod, 1, None, n, n, device="cpu")
