"""Pairs and groups in a packed batch: what a preference (DPO) or group (GRPO) loss needs,
each sequence's summed completion log-probability, and the attention that keeps the
sequences of a row apart.

Which logit predicts which token. A model's logits at row position t predict the token at
t + 1. In the plain layout every sequence is one segment, so a completion token at t is
predicted from t - 1, in its own segment. With ``--share-prompt`` a completion's first
token follows its prompt, not what precedes it in the row (a sibling's last token): it is
predicted from the prompt's last position, the one position every completion of the group
shares. A shifted-labels loss cannot say that, which is why the batch's ``labels`` hide
each segment's first token (-100) and :func:`sequence_logps` gathers its own predecessors::

    row        P0 P1 P2 | C0 C1 | R0 R1 R2
    predicted      from:   P2 C0 |  P2 R0 R1     (C0 and R0 both from P2)

Attention (:func:`allowed`): a token sees the tokens of its own segment up to itself and,
in a completion, its group's prompt; never a sibling. ``cu_seqlens`` (flash-attention
varlen) can only say "own segment", so a shared-prompt batch is refused there by name.
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError
from ..sources.groups import role_name


def is_shared(batch: dict) -> bool:
    """Whether a batch holds shared prompts (a completion attending to another segment)."""
    sp = batch.get("seg_prompt")
    if sp is None:
        return False
    return bool((np.asarray(sp.cpu() if hasattr(sp, "cpu") else sp) >= 0).any())


def _np(v):
    return np.asarray(v.detach().cpu() if hasattr(v, "detach") else v)


def _boundaries(batch: dict) -> np.ndarray:
    """Where each segment starts in the row: an aligned row's padded boundaries (a segment's
    pads after its tokens, in it), else ``cu_seq_lens_q`` or a pack's ``cu_seqlens``."""
    key = next(k for k in ("cu_seq_lens_q_padded", "cu_seqlens_padded", "cu_seq_lens_q",
                           "cu_seqlens") if k in batch)
    return _np(batch[key]).astype(np.int64).ravel()


def row_segments(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """(segment of every token, segment each segment also attends to or -1) of a collated
    one-row batch (``cu_seq_lens_q``, or a pack's ``cu_seqlens``; padded ones first)."""
    cu = _boundaries(batch)
    doc = np.repeat(np.arange(cu.size - 1), np.diff(cu))
    sp = batch.get("seg_prompt")
    pre = np.full(cu.size - 1, -1, np.int64) if sp is None else _np(sp).astype(np.int64)
    if pre.size != cu.size - 1:
        raise PacktoolError(f"seg_prompt has {pre.size} entries for {cu.size - 1} segments: "
                            "collate grouped packs with collate_numpy/collate_tensors")
    return doc, pre


def allowed(batch: dict) -> np.ndarray:
    """The boolean [T, T] attention of a one-row batch: query q sees key k when k <= q and k
    is in q's segment or in the prompt q's segment shares."""
    doc, pre = row_segments(batch)
    q, k = doc[:, None], doc[None, :]
    t = np.arange(doc.size)
    return ((q == k) | (pre[doc][:, None] == k)) & (t[:, None] >= t[None, :])


def predecessors(batch: dict) -> np.ndarray:
    """For every token, the row position whose logits predict it (-1: none, a segment's
    first token with no prompt before it)."""
    doc, pre = row_segments(batch)
    cu = _boundaries(batch)
    t = np.arange(doc.size)
    first = t == cu[doc]
    out = t - 1
    p = pre[doc]
    out[first] = np.where(p[first] >= 0, cu[np.maximum(p[first], 0) + 1] - 1, -1)
    return out


def sequence_logps(logits, batch: dict) -> dict:
    """The summed log-probability of each sequence's completion tokens in a packed batch
    (``collate_tensors`` of grouped packs), as ``{(group_id, role): tensor}`` in the order of
    the row's sequences; role is "chosen", "rejected" or a completion's index. ``logits``:
    [1, T, V] or [T, V] (the model's, float32 preferred), gradients kept."""
    import torch

    if "seq_ids" not in batch:
        raise PacktoolError("sequence_logps needs a batch of pairs or groups (keys seq_ids, "
                            "completion_mask, seq_group, seq_role): pack a corpus tokenized "
                            "with --chosen-field/--rejected-field or --completions-field")
    ids = batch["input_ids"].reshape(-1)
    shape = tuple(getattr(logits, "shape", ()))
    if not (len(shape) == 2 or (len(shape) == 3 and shape[0] == 1)) \
            or shape[-2] != ids.numel() or not hasattr(logits, "dim"):
        raise PacktoolError(f"logits must be a tensor [1, {ids.numel()}, V] or "
                            f"[{ids.numel()}, V] (one row per token of the batch's input_ids), "
                            f"got shape {list(shape)}: pass the model's output for this batch")
    lg = logits[0] if logits.dim() == 3 else logits
    if ids.numel() and int(ids.max()) >= lg.shape[-1]:
        raise PacktoolError(f"token id {int(ids.max())} >= the logits' vocabulary "
                            f"{lg.shape[-1]}: these logits are not of this batch's tokenizer")
    seq = torch.as_tensor(_np(batch["seq_ids"]).reshape(-1), dtype=torch.long)
    keep = (seq >= 0) & torch.as_tensor(_np(batch["completion_mask"]).reshape(-1) > 0)
    pred = torch.as_tensor(predecessors(batch))
    keep &= pred >= 0
    at = torch.nonzero(keep).squeeze(1)
    logp = torch.log_softmax(lg[pred[at]].float(), dim=-1)
    tok = logp.gather(1, ids[at].to(lg.device)[:, None].long()).squeeze(1)
    groups, roles = _np(batch["seq_group"]).ravel(), _np(batch["seq_role"]).ravel()
    sums = torch.zeros(groups.size, dtype=tok.dtype, device=tok.device)
    sums = sums.index_add(0, seq[at].to(tok.device), tok)
    return {(int(g), role_name(r)): sums[i] for i, (g, r) in enumerate(zip(groups, roles,
                                                                          strict=True))}


def dpo_loss(logps: dict, ref_logps: dict, beta: float = 0.1):
    """The DPO loss (Rafailov et al. 2023), mean over the pairs of ``logps`` (policy) and
    ``ref_logps`` (reference), both from :func:`sequence_logps`:
    -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))."""
    import math

    import torch

    if isinstance(beta, bool) or not isinstance(beta, (int, float)) \
            or not math.isfinite(beta) or beta <= 0:
        raise PacktoolError(f"dpo_loss: beta must be a finite number > 0 (DPO's usual 0.1 to "
                            f"0.5), got {beta!r}")
    groups = [g for (g, role) in logps if role == "chosen"]
    if not groups:
        raise PacktoolError("dpo_loss: no chosen sequence in the batch (a batch of pairs?)")
    if set(logps) != set(ref_logps):
        odd = sorted(set(logps) ^ set(ref_logps), key=str)
        raise PacktoolError(f"dpo_loss: the reference's sequences are not the policy's "
                            f"({len(odd)} (group, role) in one only, e.g. {odd[0]}): compute "
                            "both with sequence_logps on the same batch")
    margin = torch.stack([(logps[g, "chosen"] - ref_logps[g, "chosen"])
                          - (logps[g, "rejected"] - ref_logps[g, "rejected"]) for g in groups])
    return -torch.nn.functional.logsigmoid(beta * margin).mean()


def sequence_rewards(ds, i: int, ex: dict | None = None) -> np.ndarray:
    """The reward of each sequence of packed row ``i`` (``ex``: ``ds[i]`` if already read),
    float32 in the order of its ``seq_group``/``seq_role``, from the token corpora it was
    packed from (``tokenize --rewards-field``): a packed dataset stores no rewards (they
    are a property of a record, not of a token), so each sequence's segment names its
    document (``source_docs``) and the sources' ``.rewards`` hold its value. The sources are
    opened through ``ds.sources()`` (those the index layout reads its tokens from; the tokens
    layout opens them here), and each sequence's role is checked against theirs."""
    ex = ds[i] if ex is None else ex
    if "seq_role" not in ex:
        raise PacktoolError("sequence_rewards needs a packed dataset of groups (tokenize "
                            "--completions-field F --rewards-field R, then pack)")
    corpora = ds.sources()
    got = [c.per_doc("rewards") for c in corpora]
    missing = [str(c.prefix) for c, g in zip(corpora, got, strict=True) if g is None]
    if missing:
        raise PacktoolError(f"{', '.join(missing)}: no rewards (tokenized without "
                            "--rewards-field); tokenize again with --rewards-field R")
    cu = np.asarray(ex["cu_seqlens"], np.int64)
    is_seq = np.asarray(ex["seq_ids"])[cu[:-1]] >= 0  # a shared prompt's segment is no sequence
    docs = np.asarray(ex["source_docs"], np.int64)[is_seq]
    roles = np.concatenate([np.asarray(c.per_doc("roles")) for c in corpora])[docs]
    if not np.array_equal(roles.astype(np.int64), np.asarray(ex["seq_role"], np.int64)):
        raise PacktoolError(f"{ds.directory}: row {i}'s sequences do not have the roles of "
                            "their source documents: the sources changed since pack; pack "
                            "again")
    return np.concatenate([np.asarray(g, np.float32) for g in got])[docs]
