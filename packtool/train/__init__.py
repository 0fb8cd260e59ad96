"""The training side: what a trainer needs from a packed dataset once it is written.

- :mod:`.sampler` (and :mod:`.state`): ``PackSampler``, the epoch order of packs per rank,
  resumable at any world size; its numpy core is the arithmetic, torch wraps it.
- :mod:`.mixture` (:mod:`.schedule`, :mod:`.mixture_state`): ``MixtureSampler``, rows of
  several packed datasets per step in proportions a schedule sets and may change mid-run,
  with a ledger and an exact resume under another schedule or shape.
- :mod:`.balance`: packs dealt so each rank's step costs the same attention work.
- :mod:`.batching`: packs collated into one padding-free ``[1, N]`` row (numpy).
- :mod:`.cp`: ``cp_shard``, a row cut across context-parallel ranks (TE's zigzag, or balanced).
- :mod:`.torch`: the torch dataset, samplers and collators (``packtool.torch``).
- :mod:`.preference`: ``sequence_logps`` (each sequence's summed completion log-probability
  in a packed batch of pairs or groups), ``dpo_loss``, ``sequence_rewards`` (a row's
  rewards from its source corpora), and their attention masks.
- :mod:`.which`: which step and rank a record lands in, and what a step holds.
- :mod:`.conformance`: does a model architecture keep packed documents apart on each input
  path (``packtool conformance``); :mod:`.attention` the reference attention it checks
  against on CPU (what varlen flash attention and a document-causal mask compute).
- :mod:`.order` (:mod:`.permute`): an epoch's steps computed one at a time from a keyed
  permutation, never the epoch in memory.
- :mod:`.budget` (:mod:`.budget_state`, :mod:`.by_length`, :mod:`.curriculum`): token-budget
  steps (``tokens_per_step=T``): rows of one slot length a step, the length drawn by a
  curriculum.
- :mod:`.shape`: the rank/world-size checks every sampler shares.
- :mod:`.which_mixture`: :mod:`.which` for a mixture.

The cost model (:mod:`packtool.formats.packed.balance`) and the collation
(:mod:`packtool.formats.packed.batching`) live with the packed format.
"""

from ..formats.packed.batching import collate_numpy
from .cp import cp_shard
from .mixture import MixtureSampler
from .preference import dpo_loss, sequence_logps, sequence_rewards
from .sampler import PackSampler

__all__ = ["MixtureSampler", "PackSampler", "collate_numpy", "cp_shard", "dpo_loss",
           "sequence_logps", "sequence_rewards"]
