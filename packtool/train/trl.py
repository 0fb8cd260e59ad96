"""TRL's ``DPOTrainer`` on packed, shared rows, with no patched trainer: ``PackedDPOTrainer``.

TRL (1.16) runs a DPO batch as ``[2B, L]`` padded rows, chosen then rejected, each pair's
prompt forwarded twice, and pads to the longest. ``PackedDPOTrainer`` is ``DPOTrainer`` with
one method changed: the model it calls. Each batch TRL's own collator made is forwarded as
one padding-free row, a tree per pair: the pair's common beginning (the prompt, and the first
completion tokens where chosen and rejected begin alike) stored once, then each tail::

    TRL's batch   P P P C C C . .      one row   P P P | C C C | R R      3 + 3 + 2 tokens
                  P P P R R . . .                 tree: P the root, C and R its children

and the per-token log-probabilities come back in TRL's ``[2B, L - 1]`` layout (each token's
from its own prefix: :mod:`.trees`), so TRL's loss, every ``loss_type``, ``ld_alpha``, WPO
weights and its metrics run unchanged on them::

    from packtool.train.trl import PackedDPOTrainer
    trainer = PackedDPOTrainer(model=model, ref_model=ref, args=DPOConfig(...),
                               train_dataset=ds, processing_class=tokenizer)  # as DPOTrainer
    trainer.train()

The attention follows the model's ``attn_implementation``: ``"flex_attention"`` gets
``block_mask(row)``, ``"eager"`` / ``"sdpa"`` the 4-D ancestor mask (O(T^2): for checks and
short rows); varlen kernels (flash-attention, ``"packtool"``) cannot express a shared prefix
and are refused by name. tests/test_trl.py holds the loss, and each parameter's gradient,
equal to TRL's unpacked ones within 1e-5 (float32, CPU). What changes is the work: a pair's
prompt is forwarded once and no pad is forwarded. What it costs: the row's logits ``[T, V]``
in float32 (TRL's fused LM head scores one label per position, and a branch point's
position predicts one token per child), and one host copy of the batch's masks per step.

Not covered (the unpacked path runs, exact but not packed): a PEFT model with no reference
model (TRL then calls ``self.model`` with adapters disabled), and vision batches.

GRPO: TRL's ``GRPOTrainer`` (1.16) scores completions through ``_get_per_token_logps_and_
entropies(model, input_ids, attention_mask, logits_to_keep, ...)``, one padded row per
completion, and generates the completions itself; its loss needs those per-token
log-probabilities in the ``[B, logits_to_keep]`` layout. The same forward (``packed_logps``
over a tree of a prompt and its G completions) returns them: see
:func:`packed_token_logps`, which a subclass overriding that method calls. Its rollouts,
rewards, advantages and loss stay TRL's.
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError
from .trees import as_numpy

try:
    from trl import DPOTrainer, GRPOTrainer
    from trl.trainer.utils import FusedCausalLMOutput
except ImportError as e:  # pragma: no cover - exercised only without trl
    raise ImportError("packtool.train.trl needs TRL: pip install 'trl==1.16.0'") from e


def pack_rows(input_ids, attention_mask, completion_mask, groups="pairs"):
    """TRL's padded ``[R, L]`` rows (any padding: DPO's right, GRPO's left prompt and right
    completion) as one tree row (``collate_numpy``'s keys and the tree's, numpy), and for
    every slot of TRL's shifted layout ``[R, L - 1]`` the row position whose logits predict
    the token after it (-1 where that is a pad). ``groups``: "pairs" (DPO: row i and row
    B + i), "runs" (GRPO: consecutive rows with the same prompt, the tokens before the
    completion mask's first 1) or lists of rows. A group's common beginning (tokens and mask
    alike, leaving each row one token of its own) is its root, each row's rest a child."""
    from ..formats.packed.batching import collate_numpy

    ids, att, comp = (as_numpy(x) for x in (input_ids, attention_mask, completion_mask))
    n_rows, width = ids.shape
    real = [np.flatnonzero(att[r]) for r in range(n_rows)]
    seqs = [ids[r, real[r]] for r in range(n_rows)]
    masks = [comp[r, real[r]] for r in range(n_rows)]
    pairs = isinstance(groups, str) and groups == "pairs"
    if pairs:
        if n_rows % 2:
            raise PacktoolError(f"a DPO batch has chosen rows then rejected rows, got {n_rows} "
                                "rows")
        groups = [[i, n_rows // 2 + i] for i in range(n_rows // 2)]
    elif isinstance(groups, str) and groups == "runs":
        groups = _runs(seqs, masks)
    segs = []  # (row, start, end, parent, group, role): pre-order, a group's root first
    for g, rows in enumerate(groups):
        common = _common(seqs, masks, rows)
        root = -1
        if common:
            root = len(segs)
            segs.append((rows[0], 0, common, -1, g, 0))
        for k, r in enumerate(rows):
            segs.append((r, common, len(seqs[r]), root, g, 1 + k if pairs else 3 + k))
    r_, a_, b_, parent, group, role = (np.array(c, np.int64).reshape(-1)
                                       for c in zip(*segs, strict=True))
    lengths = b_ - a_
    starts = np.cumsum(lengths) - lengths
    src = np.full((n_rows, max(width - 1, 0)), -1, np.int64)
    for j in np.flatnonzero(role > 0):  # each row: its root's tokens, then its own
        r = r_[j]
        at = np.concatenate([starts[s] + np.arange(lengths[s])
                             for s in ([parent[j], j] if parent[j] >= 0 else [j])])
        src[r, real[r][1:] - 1] = at[:-1]  # slot t predicts token t + 1 from its predecessor
    leaf = np.flatnonzero(role > 0)
    seq_of = np.full(len(segs), -1)
    seq_of[leaf] = np.arange(leaf.size)
    tok = np.concatenate([seqs[r][a:b] for r, a, b, *_ in segs]).astype(np.int64)
    ex = {"input_ids": tok, "labels": tok.copy(),
          "position_ids": np.concatenate([np.arange(a, b) for _, a, b, *_ in segs]),
          "cu_seqlens": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
          "seg_parent": parent.astype(np.int32),
          "group_ids": np.repeat(group, lengths), "seq_ids": np.repeat(seq_of, lengths),
          "completion_mask": np.concatenate([masks[r][a:b] for r, a, b, *_ in segs]
                                            ).astype(np.uint8),
          "seq_group": group[leaf], "seq_role": role[leaf].astype(np.int32),
          "seq_leaf": leaf.astype(np.int32)}
    ex["labels"][starts[lengths > 0]] = -100
    return collate_numpy([ex]), src


def _runs(seqs, masks) -> list:
    """Consecutive rows whose prompts (the tokens before the mask's first 1) are equal."""
    def prompt(r):
        on = np.flatnonzero(masks[r])
        return seqs[r][:on[0] if on.size else len(seqs[r])].tobytes()

    out = []
    for r in range(len(seqs)):
        if out and prompt(out[-1][0]) == prompt(r):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def _common(seqs, masks, rows) -> int:
    """The length of the rows' common beginning, tokens and masks alike, leaving each row at
    least one token of its own."""
    n = min(len(seqs[r]) for r in rows) - 1
    if n <= 0 or len(rows) < 2:
        return 0
    first = rows[0]
    same = np.ones(n, bool)
    for r in rows[1:]:
        same &= (seqs[r][:n] == seqs[first][:n]) & (masks[r][:n] == masks[first][:n])
    return n if same.all() else int(np.argmin(same))


def attention_inputs(model, row: dict) -> dict:
    """input_ids, position_ids and the attention the model's ``attn_implementation`` takes
    for a tree row (tensors on the model's device)."""
    import torch

    from .torch import block_mask, model_inputs

    device = next(model.parameters()).device
    batch = {k: torch.from_numpy(v).to(device) if isinstance(v, np.ndarray) else v
             for k, v in row.items()}
    impl = getattr(_config(model), "_attn_implementation", None) or "eager"
    if impl == "flex_attention":
        return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                "attention_mask": block_mask(batch)}
    if impl not in ("eager", "sdpa"):
        from .. import conflicts

        conflicts.check({"shared_rows", "varlen"}, f"attn_implementation={impl!r}")
    dtype = next(model.parameters()).dtype if impl == "eager" else None
    out = model_inputs(batch, mask="4d", dtype=dtype)
    out.pop("labels")
    return out


def _config(model):
    while not hasattr(model, "config") and hasattr(model, "module"):  # DDP and friends
        model = model.module
    return model.config


def packed_logits(model, row: dict, **kwargs):
    """The model's output over one tree row (``pack_rows``' first value)."""
    kwargs = {k: v for k, v in kwargs.items()
              if k not in ("input_ids", "attention_mask", "position_ids", "labels",
                           "shift_labels", "fused_lm_head", "use_cache", "num_items_in_batch")}
    return model(**attention_inputs(model, row), use_cache=False, **kwargs)


class PackedForward:
    """Stands in for a model inside TRL's loss: called as TRL calls it (its padded batch,
    ``labels``, ``fused_lm_head=True``), it runs the tree row instead and answers what
    TRL's fused LM head answers (``FusedCausalLMOutput``), in TRL's layout."""

    def __init__(self, model, row: dict, src: np.ndarray):
        self.model, self.row, self.src = model, row, src

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, labels=None, **kwargs):
        import torch

        out = packed_logits(self.model, self.row, **kwargs)
        logits = out.logits[0]
        lsm = torch.log_softmax(logits.float(), dim=-1)
        lab = labels[:, 1:]
        mask = lab != -100
        src = torch.as_tensor(self.src, device=logits.device)
        mask = mask & (src >= 0)
        src = src.clamp(min=0)
        log_probs = lsm[src, lab.clamp(min=0)].masked_fill(~mask, 0)
        with torch.no_grad():
            p = lsm.exp()
            per = {"entropy": -(p * lsm).sum(-1), "mean_logits": logits.float().mean(-1),
                   "log_sum_sq_probs": torch.logsumexp(2 * lsm, dim=-1)}
            top = logits.argmax(-1)[src] == lab
        fields = {k: v[src].masked_fill(~mask, 0) for k, v in per.items()}
        loss = -log_probs.sum() / mask.sum().clamp(min=1)
        return FusedCausalLMOutput(loss=loss, log_probs=log_probs, is_top1=top & mask,
                                   label_mask=mask, aux_loss=getattr(out, "aux_loss", None),
                                   **fields)


class PackedDPOTrainer(DPOTrainer):
    """``trl.DPOTrainer`` whose policy and reference forwards run each batch as one packed
    tree row (module docstring); arguments, losses and metrics are DPOTrainer's."""

    def _compute_loss(self, model, inputs, return_outputs):
        row, src = pack_rows(inputs["input_ids"], inputs["attention_mask"],
                             inputs["completion_mask"])
        ref = self.ref_model
        if ref is not None:
            self.ref_model = PackedForward(ref, row, src)
        try:
            return super()._compute_loss(PackedForward(model, row, src), inputs,
                                         return_outputs)
        finally:
            self.ref_model = ref

    def compute_ref_log_probs(self, model, inputs):
        row, src = pack_rows(inputs["input_ids"], inputs["attention_mask"],
                             inputs["completion_mask"])
        return super().compute_ref_log_probs(PackedForward(model, row, src), inputs)


class PackedGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose scoring forwards (policy, old policy, reference) run each
    batch as one tree row: consecutive completions of one prompt share it (``pack_rows``'
    "runs"). Generation, rewards, advantages and the loss are GRPOTrainer's; batches with
    images go through GRPOTrainer's own forward."""

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask,
                                           logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False,
                                           **multimodal):
        if any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                compute_aux_loss, **multimodal)
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[:, :-logits_to_keep] = -100
        row, src = pack_rows(input_ids, attention_mask, labels != -100, groups="runs")
        kw = {"output_router_logits": True} if compute_aux_loss else {}
        with self.accelerator.autocast():
            out = PackedForward(model, row, src)(labels=labels, **kw)
        return (out.log_probs[:, -logits_to_keep:],
                out.entropy[:, -logits_to_keep:] if compute_entropy else None,
                out.aux_loss if compute_aux_loss else None)
