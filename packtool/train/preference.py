"""Pairs, groups and prefix trees in a packed batch: each sequence's summed completion
log-probability and the losses on top (DPO, a GRPO-style clipped policy loss, SFT), exact
however deep the row's shared prefixes go.

Which logit predicts which token, and which tokens a sequence sums, is the row's tree
(:mod:`.trees`): a segment's first token is predicted from its parent's last position, never
from the row's previous token (a sibling's), which is why the batch's ``labels`` hide each
segment's first token (-100) and these functions gather their own predecessors::

    row        P0 P1 P2 | C0 C1 | R0 R1 R2
    predicted      from:   P2 C0 |  P2 R0 R1     (C0 and R0 both from P2)

A token in a segment shared by n sequences is computed once and counts n times: in each of
their log-probabilities, in each of their policy-loss terms (with each one's advantage), and
n times in the SFT loss, which is then the loss of the n records trained flat.
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError
from ..sources.groups import role_name
from .trees import (
    ROLE_RECORD,
    as_numpy,
    on_path,
    path_of,
    predecessors,
    row_tree,
    sequence_leaves,
)


def _check_logits(logits, ids):
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
    return lg


def token_logps(logits, batch: dict):
    """(log-probability of every trained token, float32, gradients kept; the row positions
    of those tokens; the row's :class:`~.trees.Tree`). A token is trained where it has a
    predecessor (:func:`~.trees.predecessors`) and, in a batch of pairs or groups, its
    ``completion_mask`` is 1; in a plain batch, where its label is not -100."""
    import torch

    ids = batch["input_ids"].reshape(-1)
    lg = _check_logits(logits, ids)
    tree = row_tree(batch)
    pred = predecessors(batch, tree)
    if "completion_mask" in batch:
        keep = as_numpy(batch["completion_mask"]).reshape(-1) > 0
    else:
        keep = as_numpy(batch["labels"]).reshape(-1) != -100
        first = tree.cu[:-1][np.diff(tree.cu) > 0]  # a child's first token: -100 by rule,
        keep[first] = tree.parent[tree.seg[first]] >= 0  # predicted from its parent's last
    at = np.flatnonzero(keep & (pred >= 0))
    src = torch.as_tensor(pred[at], device=lg.device)
    logp = torch.log_softmax(lg[src].float(), dim=-1)
    tok = logp.gather(1, ids[torch.as_tensor(at)].to(lg.device)[:, None].long()).squeeze(1)
    return tok, at, tree


def _paths(batch: dict, tree, at: np.ndarray):
    """(sequence, index into ``at``) of every trained token on every sequence's path: a
    token shared by n sequences appears n times."""
    leaves = sequence_leaves(batch, tree)
    member = on_path(tree, leaves)[:, tree.seg[at]]
    return np.nonzero(member)


def sequence_keys(batch: dict, tree=None) -> list:
    """Each sequence's key, in the row's order: ``(group, role)`` with role "chosen",
    "rejected" or a completion's index; a plain record's leaf (``--share-prefix`` across
    records) ``(group, path)``, its index among its siblings at each depth."""
    tree = row_tree(batch) if tree is None else tree
    groups, roles = as_numpy(batch["seq_group"]).ravel(), as_numpy(batch["seq_role"]).ravel()
    leaves = sequence_leaves(batch, tree)
    keys = [(int(g), path_of(tree, int(leaf)) if int(r) == ROLE_RECORD else role_name(r))
            for g, r, leaf in zip(groups, roles, leaves, strict=True)]
    if len(set(keys)) != len(keys):
        k = next(k for k in keys if keys.count(k) > 1)
        raise PacktoolError(f"two sequences of the batch have the key {k}: collate each pack "
                            "once")
    return keys


def _need_sequences(batch: dict, what: str) -> None:
    if "seq_ids" not in batch:
        raise PacktoolError(f"{what} needs a batch of pairs or groups (keys seq_ids, "
                            "completion_mask, seq_group, seq_role): pack a corpus tokenized "
                            "with --chosen-field/--rejected-field or --completions-field")


def sequence_logps(logits, batch: dict) -> dict:
    """The summed log-probability of each sequence's completion tokens in a packed batch
    (``collate_tensors`` of grouped packs, trees of any depth), as ``{key: tensor}`` in the
    order of the row's sequences (keys: :func:`sequence_keys`). ``logits``: [1, T, V] or
    [T, V] (the model's, float32 preferred), gradients kept. A token of a segment shared by
    n sequences counts in each of their sums (:mod:`.trees`)."""
    import torch

    _need_sequences(batch, "sequence_logps")
    tok, at, tree = token_logps(logits, batch)
    keys = sequence_keys(batch, tree)
    seq, j = _paths(batch, tree, at)
    sums = torch.zeros(len(keys), dtype=tok.dtype, device=tok.device)
    sums = sums.index_add(0, torch.as_tensor(seq, device=tok.device),
                          tok[torch.as_tensor(j, device=tok.device)])
    return {k: sums[i] for i, k in enumerate(keys)}


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


def _advantages(advantages, keys: list, device):
    import torch

    if isinstance(advantages, dict):
        missing = [k for k in keys if k not in advantages]
        if missing:
            raise PacktoolError(f"advantages has no entry for {len(missing)} of the row's "
                                f"sequences, e.g. {missing[0]}: key them as sequence_logps "
                                "does, or pass one value per sequence in the row's order")
        vals = [advantages[k] for k in keys]
        return torch.stack([torch.as_tensor(v, dtype=torch.float32) for v in vals]).to(device)
    a = torch.as_tensor(as_numpy(advantages), dtype=torch.float32).reshape(-1).to(device)
    if a.numel() != len(keys):
        raise PacktoolError(f"advantages has {a.numel()} values for the row's {len(keys)} "
                            "sequences: one per sequence, in the order of seq_group/seq_role")
    return a


def grpo_loss(logits, batch: dict, advantages, old_logps=None, clip: float = 0.2,
              clip_high: float | None = None, mean: str = "token"):
    """The clipped policy-gradient loss of GRPO (DAPO's token mean, or GRPO's sequence mean)
    over a packed row of groups, trees of any depth: for every sequence i and each of its
    completion tokens t (a token shared by n sequences counts n times, once with each one's
    advantage), ``-min(r A_i, clip(r, 1 - clip, 1 + clip_high) A_i)`` with ``r = exp(logp -
    old)``. ``advantages``: one per sequence, ``{key: value}`` as :func:`sequence_logps` keys
    them, or in the row's order. ``old_logps``: the rollout policy's ``token_logps(old_logits,
    batch)[0]`` (None: this policy's, detached, so r = 1, the on-policy step).

    ``mean="token"``: the sum over (sequence, token) / their count, which is what
    ``StepPlan.valid`` counts (each sequence's completion targets, as flat); ``"sequence"``:
    the mean over sequences of each one's token mean. So ``grpo_loss(...) *
    plan.weights(mean)[rank, m]``, summed over a step's rows (x world_size under DDP/FSDP),
    is the step's loss whatever the packing (:mod:`.step`). A row with no target gives 0."""
    import torch

    _need_sequences(batch, "grpo_loss")
    if mean not in ("token", "sequence"):
        raise PacktoolError(f'mean must be "token" or "sequence", got {mean!r}')
    for name, v in (("clip", clip), ("clip_high", clip if clip_high is None else clip_high)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e6:
            raise PacktoolError(f"grpo_loss: {name} must be a number >= 0 (GRPO's 0.2; DAPO's "
                                f"clip_high 0.28), got {v!r}")
    high = clip if clip_high is None else clip_high
    tok, at, tree = token_logps(logits, batch)
    keys = sequence_keys(batch, tree)
    adv = _advantages(advantages, keys, tok.device)
    old = tok.detach() if old_logps is None else torch.as_tensor(old_logps).to(tok)
    if old.shape != tok.shape:
        raise PacktoolError(f"old_logps has shape {tuple(old.shape)}, the row has "
                            f"{tok.numel()} trained tokens: pass token_logps(old_logits, "
                            "batch)[0] of the same batch")
    seq, j = (torch.as_tensor(x, device=tok.device) for x in _paths(batch, tree, at))
    ratio = torch.exp(tok[j] - old[j])
    a = adv[seq]
    term = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip, 1 + high) * a)
    if term.numel() == 0:
        return tok.sum() * 0.0
    if mean == "token":
        return term.sum() / term.numel()
    n = torch.zeros(len(keys), device=tok.device).index_add(0, seq, torch.ones_like(term))
    per = torch.zeros(len(keys), device=tok.device, dtype=term.dtype).index_add(0, seq, term)
    has = n > 0
    return (per[has] / n[has]).mean()


def sft_loss(logits, batch: dict, reduction: str = "mean"):
    """The next-token loss of a packed row as the records trained flat: each trained token's
    negative log-likelihood weighted by the number of sequences whose path holds it (a
    shared system prompt or history trained by n records weighs n), divided by that weight's
    sum (``reduction="mean"``, the flat token mean) or not (``"sum"``). Trained tokens:
    :func:`token_logps`'. A plain row (no sequences) weighs every token 1."""
    import torch

    if reduction not in ("mean", "sum"):
        raise PacktoolError(f'reduction must be "mean" or "sum", got {reduction!r}')
    tok, at, tree = token_logps(logits, batch)
    if "seq_ids" in batch:
        w = on_path(tree, sequence_leaves(batch, tree))[:, tree.seg[at]].sum(axis=0)
    else:
        w = np.ones(at.size)
    w = torch.as_tensor(w, dtype=tok.dtype, device=tok.device)
    total = -(w * tok).sum()
    if reduction == "sum":
        return total
    return total / w.sum().clamp(min=1)


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
