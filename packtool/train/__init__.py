"""The training side: what a trainer needs from a packed dataset once it is written.

- :mod:`.sampler`: ``Sampler``, one sampler whose step rule is a value, resumable at any world
  size, its numpy core the arithmetic (torch wraps it); the rule ``FixedPacks`` (the epoch
  order of packs per rank: ``PackSampler``) and the rank/world-size checks.
- :mod:`.budget`: the rule ``TokenBudget`` (``PackSampler(..., tokens_per_step=T)``).
- :mod:`.mixture` (:mod:`.schedule`): the rule ``Mixture`` (``MixtureSampler``), rows of
  several packed datasets per step in proportions a schedule sets and may change mid-run,
  with a ledger and an exact resume under another schedule or shape.
- :mod:`.state`: one state for every step rule (fixed packs, token budget, mixture) and one
  reader that refuses a forged one: counts, step and positions as the rule computes them.
- :mod:`.cp`: ``cp_shard``, a row cut across context-parallel ranks (TE's zigzag, or balanced).
- :mod:`.step`: ``plan_step``, an RL step's micro-batches planned from lengths (groups whole,
  the same count on every rank), with restore/check and the loss weights; verl's
  ``rearrange_micro_batches`` signature.
- :mod:`.torch`: the torch dataset, samplers and collators (``packtool.torch``).
- :mod:`.preference`: ``sequence_logps`` (each sequence's summed completion log-probability
  in a packed batch of pairs, groups or prefix trees), ``dpo_loss``, ``grpo_loss`` (the
  clipped per-sequence policy loss with the step plan's normaliser), ``sft_loss`` (tree
  rows as the records flat), ``sequence_rewards`` (a row's rewards from its source corpora).
- :mod:`.trl`: ``PackedDPOTrainer`` / ``PackedGRPOTrainer``, TRL's trainers forwarding
  each batch as one tree row (imports TRL; not imported here).
- :mod:`.trees`: a row's prefix tree (``seg_parent``, or a depth-1 batch's ``seg_prompt``):
  the ancestor-causal mask (``allowed``), which logit predicts which token, each sequence's
  path.
- :mod:`.which`: which step and rank a record lands in, and what a step holds (one dataset
  or a mixture); :mod:`.records` names a document's input file and record.
- :mod:`.conformance`: does a model architecture keep packed documents apart on each input
  path (``packtool conformance``), vision-language models (Qwen-VL) with their images too.
- :mod:`.vision`: ``ImageCollator``, a row's images read (only the row's, in the DataLoader
  workers) and turned into pixel_values by the user's processor, beside its mRoPE ids.
- :mod:`.attention`: ``attn_implementation="packtool"``, a varlen kernel fed by the row's
  boundaries, chosen once per process, and the CPU reference conformance checks against;
  :mod:`.prepare`: ``prepare_model``, which sets it and proves it on a packed row.
- :mod:`.order` (:mod:`.permute`): an epoch's steps computed one at a time from a keyed
  permutation, never the epoch in memory.
- :mod:`.by_length`, :mod:`.curriculum`: a token budget's rows of one slot length a step,
  the length drawn by a curriculum.

The cost model (:mod:`packtool.formats.packed.balance`) and the collation
(:mod:`packtool.formats.packed.batching`) live with the packed format.
"""

from ..formats.packed.batching import collate_numpy
from .budget import TokenBudget
from .cp import cp_shard
from .mixture import Mixture, MixtureSampler
from .preference import dpo_loss, grpo_loss, sequence_logps, sequence_rewards, sft_loss
from .sampler import FixedPacks, PackSampler, Sampler

__all__ = ["FixedPacks", "Mixture", "MixtureSampler", "PackSampler", "Sampler", "TokenBudget",
           "collate_numpy", "cp_shard", "dpo_loss", "grpo_loss", "sequence_logps",
           "sequence_rewards", "sft_loss"]
