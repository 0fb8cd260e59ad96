"""Packing inside the training step: ``plan_step`` plans a step's micro-batches from lengths.

An RL trainer (GRPO, PPO, online DPO) generates its sequences during the step; the plan is
made there, every step, from their lengths alone (no token crosses the head node to be
planned) in milliseconds (:mod:`packtool.packers.step` holds the algorithm and its figures)::

    plan = packtool.plan_step(lengths, max_tokens=16384, world_size=8, groups=uids,
                              completion_lengths=completion_lengths)
    for m, idx in enumerate(plan.micro_batches[rank]):      # the same M on every rank
        row = plan.row(token_ids, rank, m)                   # collate_numpy's keys
        loss = model_loss(row)                               # a mean over the row's targets
        (loss * plan.weights()[rank, m] * world_size).backward()   # DDP/FSDP average ranks
    logps = plan.restore(gathered)                           # the step's order again

A row's targets are its labels other than -100: each sequence's tokens after the first (no
label crosses a boundary), or its completion's when ``completion_lengths`` are given. So
``valid[r, m]``, what ``weights`` divide by, counts exactly the targets a row's loss averages,
and ``sum(weights * per-micro-batch mean loss)`` is the step's token mean (``mean="token"``)
or the mean over sequences of each sequence's token mean (``mean="sequence"``), whatever the
packing. A micro-batch of no targets has weight 0 (its mean is 0/0: skip it, or zero it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PacktoolError
from ..formats.packed.batching import collate_numpy
from ..formats.packed.layout import derive_aligned
from ..packers.step import check_lengths, plan_lengths


@dataclass
class StepPlan:
    """A step's plan; see the module docstring. Arrays [world_size, m] are per micro-batch:
    ``tokens`` (aligned: what the row holds), ``costs``, ``sequences``, ``valid`` (targets).
    ``order``: the sequences rank-major (rank 0's micro-batches first), ``inverse`` its
    inverse; ``imbalance``: max / mean rank cost, ``token_imbalance`` the same for tokens,
    ``step_imbalance``: sum over slots of the costliest rank's micro-batch / mean rank cost."""

    micro_batches: list
    order: np.ndarray
    inverse: np.ndarray
    lengths: np.ndarray
    completion_lengths: np.ndarray | None
    targets: np.ndarray
    tokens: np.ndarray
    costs: np.ndarray
    sequences: np.ndarray
    valid: np.ndarray
    align: int
    max_docs: int | None
    imbalance: float
    token_imbalance: float
    step_imbalance: float

    @property
    def world_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def m(self) -> int:
        """Micro-batches per rank (every rank the same)."""
        return self.tokens.shape[1]

    @property
    def n_valid(self) -> int:
        return int(self.valid.sum())

    def weights(self, mean: str = "token") -> np.ndarray:
        """float64 [world_size, m]: the factor of each micro-batch's mean loss such that
        their sum over ranks and micro-batches is the step's mean (see the module docstring);
        under DDP/FSDP, which average gradients over ranks, multiply by world_size."""
        if mean == "token":
            part, total = self.valid, self.n_valid
        elif mean == "sequence":
            has = (self.targets > 0).astype(np.int64)
            mb = np.empty(self.lengths.size, np.int64)
            mb[self.order] = np.repeat(np.arange(self.sequences.size), self.sequences.ravel())
            part = np.bincount(mb, has, self.sequences.size).reshape(self.sequences.shape)
            total = int(has.sum())
        else:
            raise PacktoolError(f'mean must be "token" or "sequence", got {mean!r}')
        return part / total if total else np.zeros(part.shape)

    def restore(self, outputs):
        """Per-micro-batch results, rank-major (``[r][m]`` nested or flat, one entry per
        sequence along the first axis; numpy, torch or lists), as one array in the step's
        order. (A result of the step's size in rank-major order is taken as it is.)"""
        parts = [p for rank in outputs for p in rank] if _nested(outputs) else list(outputs)
        if len(parts) == self.sequences.size:
            sizes = [len(p) for p in parts]
            expect = self.sequences.ravel().tolist()
            if sizes != expect:
                k = next(i for i, (a, b) in enumerate(zip(sizes, expect, strict=True))
                         if a != b)
                raise PacktoolError(
                    f"micro-batch {divmod(k, self.m)} (rank, m) returned {sizes[k]} entries, "
                    f"its plan holds {expect[k]} sequences: return one entry per sequence, "
                    "in the micro-batch's order")
            if hasattr(parts[0], "new_tensor"):
                import torch

                return torch.cat(parts)[torch.as_tensor(self.inverse)]
            flat = np.concatenate([np.asarray(p) for p in parts])
        else:
            flat = outputs if hasattr(outputs, "new_tensor") else np.asarray(outputs)
        if len(flat) != self.lengths.size:
            raise PacktoolError(f"restore takes {self.sequences.size} micro-batches' results "
                                f"or {self.lengths.size:,} entries in rank-major order, got "
                                f"{len(flat):,}")
        return flat[self.inverse]

    def check(self, ids, outputs):
        """``outputs`` restored (:meth:`restore`), compared with ``ids``, the step's
        per-sequence ids (a uid, a hash of the tokens) in its order; raises where one came
        back in another place (verl #2185: rewards kept the old order). Returns the
        restored array."""
        back = self.restore(outputs)
        want = np.asarray(ids)
        got = np.asarray(back.cpu() if hasattr(back, "cpu") else back)
        if got.shape != want.shape:
            raise PacktoolError(f"check: ids have shape {want.shape}, the restored results "
                                f"{got.shape}: pass one id per sequence of the step")
        wrong = np.flatnonzero((got != want).reshape(len(want), -1).any(axis=1))
        if wrong.size:
            i = int(wrong[0])
            raise PacktoolError(
                f"{wrong.size:,} sequences came back out of place: sequence {i} expected id "
                f"{want[i]!r}, got {got[i]!r}: results must come back in each micro-batch's "
                "plan order (plan.micro_batches[r][m]), rank-major")
        return back

    def row(self, token_ids, rank: int, m: int, pad_id: int = 0) -> dict:
        """Micro-batch ``m`` of ``rank`` as one padding-free ``[1, N]`` row, through
        :func:`~packtool.formats.packed.batching.collate_numpy` (its keys: input_ids, labels,
        position_ids, cu_seq_lens_q/k, max_length_q/k, seq_idx; cu_seqlens_padded where
        ``align`` > 1; cu_seq_lens of max_docs + 1 entries under ``max_docs``).
        ``token_ids``: the step's sequences, one 1-D array (or list) each, in its order."""
        if not (0 <= rank < self.world_size and 0 <= m < self.m):
            raise PacktoolError(f"micro-batch ({rank}, {m}) is outside the plan's "
                                f"{self.world_size} ranks x {self.m} micro-batches")
        idx = self.micro_batches[rank][m]
        seqs = [_tokens(token_ids, int(i), int(self.lengths[i])) for i in idx]
        ids = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
        lens = self.lengths[idx]
        mask = None
        if self.completion_lengths is not None:  # the completion is each sequence's tail
            start = np.repeat(np.cumsum(lens) - self.completion_lengths[idx], lens)
            mask = (np.arange(ids.size) >= start).astype(np.uint8)
        ex = derive_aligned(lens, ids, mask, self.align, pad_id)
        if self.align == 1:
            del ex["cu_seqlens_padded"]
        return collate_numpy([ex], max_docs=self.max_docs)

    def rows(self, token_ids, rank: int | None = None, pad_id: int = 0) -> list:
        """Every micro-batch of ``rank`` as :meth:`row` builds it (``rank=None``: every
        rank's, ``[r][m]``)."""
        if rank is None:
            return [self.rows(token_ids, r, pad_id) for r in range(self.world_size)]
        return [self.row(token_ids, rank, m, pad_id) for m in range(self.m)]


def _nested(outputs) -> bool:
    return (isinstance(outputs, (list, tuple)) and len(outputs) > 0
            and isinstance(outputs[0], (list, tuple))
            and (len(outputs[0]) == 0 or not np.isscalar(outputs[0][0])))


def _tokens(token_ids, i: int, n: int) -> np.ndarray:
    t = token_ids[i]
    a = np.asarray(t.cpu() if hasattr(t, "cpu") else t).reshape(-1)
    if a.size != n:
        raise PacktoolError(f"sequence {i} has {a.size:,} tokens, the plan's length is {n:,}: "
                            "pass the same sequences, in the same order, as were planned")
    return a.astype(np.int64, copy=False)


def plan_step(lengths, *, max_tokens: int, world_size: int, groups=None,
              completion_lengths=None, align: int = 1, max_docs: int | None = None,
              cost="attention", linear: float = 0.0, micro_batches="auto",
              multiple_of: int = 1, pipeline_order: bool = False, seed: int = 0) -> StepPlan:
    """A step's sequences (``lengths``, prompt + completion) into ``world_size`` ranks x M
    micro-batches of at most ``max_tokens`` tokens each after aligning every sequence to a
    multiple of ``align`` (2 x cp_size under context parallelism), at most ``max_docs``
    sequences each. ``groups``: a label per sequence (a GRPO uid, a DPO pair id); a group is
    never split across ranks or micro-batches. ``cost``: "attention" (``L^2 + linear x L``),
    "tokens", or a function of the aligned lengths. ``micro_batches``: "auto" (the fewest
    that fit, a multiple of ``multiple_of``, the virtual pipeline size) or a count.
    ``pipeline_order``: the cheapest micro-batches at both ends. Every bad input is a
    PacktoolError; a sequence or group over ``max_tokens`` is refused by name."""
    lengths = check_lengths(lengths)
    comp = None
    if completion_lengths is not None:
        comp = np.asarray(completion_lengths)
        if comp.shape != lengths.shape or not np.issubdtype(comp.dtype, np.integer):
            raise PacktoolError(f"completion_lengths must be integers, one per sequence "
                                f"({lengths.size:,}), got shape {comp.shape} of {comp.dtype}")
        comp = comp.astype(np.int64)
        bad = np.flatnonzero((comp < 0) | (comp > lengths))
        if bad.size:
            i = int(bad[0])
            raise PacktoolError(f"sequence {i}: completion length {int(comp[i]):,} is outside "
                                f"0..its length {int(lengths[i]):,}: pass the completion's "
                                "tokens, which end the sequence")
    layout = plan_lengths(lengths, max_tokens=max_tokens, world_size=world_size,
                          groups=groups, align=align, max_docs=max_docs, cost=cost,
                          linear=linear, micro_batches=micro_batches,
                          multiple_of=multiple_of, pipeline_order=pipeline_order, seed=seed)
    # targets: labels other than -100 (a sequence's first token has none)
    targets = np.minimum(lengths - 1, lengths if comp is None else comp)
    order = np.argsort(layout.micro_batch, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    n_mb, w, m = layout.tokens.size, world_size, layout.m
    ends = np.cumsum(layout.docs.ravel()).tolist()
    flat = [order[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    return StepPlan(
        [flat[r * m:(r + 1) * m] for r in range(w)], order, inverse, lengths,
        comp, targets, layout.tokens, layout.costs, layout.docs,
        np.bincount(layout.micro_batch, targets, n_mb).astype(np.int64).reshape(w, -1),
        int(align), max_docs, layout.imbalance(layout.costs),
        layout.imbalance(layout.tokens), layout.step_imbalance())


def rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
                            same_micro_num_in_dp=True, min_num_micro_batch=None,
                            use_dynamic_bsz_balance=True, force_group_size=1):
    """verl's ``verl.utils.seqlen_balancing.rearrange_micro_batches``, same arguments and
    return (the micro-batches, each ``batch`` indexed by one list of positions, and those
    lists), planned by :func:`plan_step` on one rank: lengths from ``attention_mask`` (or a
    nested ``input_ids``' offsets), verl's workload ``24576 L + L^2`` as the cost,
    ``force_group_size`` consecutive samples kept in one micro-batch, the count all-reduced
    to the maximum over ``dp_group`` and rounded up to ``num_batches_divided_by``, and
    ``use_dynamic_bsz_balance``'s pipeline order. A micro-batch is empty only where the count
    asked exceeds the groups (verl raises there)."""
    import torch

    ids = batch["input_ids"]
    lens = ids.offsets().diff() if ids.is_nested else batch["attention_mask"].sum(dim=1)
    lens = lens.cpu().numpy().astype(np.int64)
    g = int(force_group_size)
    if g < 1 or len(lens) % g:
        raise PacktoolError(f"batch size {len(lens)} is not a multiple of force_group_size "
                            f"{force_group_size}: pass whole groups")
    kw = dict(max_tokens=int(max_token_len), world_size=1, groups=np.arange(len(lens)) // g,
              linear=24576.0, multiple_of=int(num_batches_divided_by or 1),
              pipeline_order=bool(use_dynamic_bsz_balance))
    plan = plan_step(lens, **kw)
    m = max(plan.m, int(min_num_micro_batch or 0))
    if same_micro_num_in_dp and dp_group is not None and torch.distributed.is_initialized():
        count = torch.tensor([m], device=ids.device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX, group=dp_group)
        m = int(count.item())
    m = -(-m // kw["multiple_of"]) * kw["multiple_of"]
    if m != plan.m:
        plan = plan_step(lens, micro_batches=m, **kw)
    index = [mb.tolist() for mb in plan.micro_batches[0]]
    return [_select(batch, i) for i in index], index


def _select(batch, index: list):
    """``batch`` (a TensorDict or a dict of tensors) at the positions ``index``."""
    import torch

    at = torch.tensor(index, dtype=torch.long)
    if hasattr(batch, "batch_size"):  # a TensorDict indexes itself
        return batch[at]
    out = {}
    for k, v in batch.items():
        if getattr(v, "is_nested", False):
            parts = v.unbind()
            out[k] = torch.nested.as_nested_tensor([parts[i] for i in index],
                                                   layout=torch.jagged)
        else:
            out[k] = v[at] if hasattr(v, "shape") else [v[i] for i in index]
    return out
