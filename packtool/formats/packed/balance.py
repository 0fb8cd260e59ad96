"""Steps of like attention cost: the outlier delay of WLB-LLM applied to every cost class.

Attention costs ~ the sum of squared segment lengths, so with heavy-tailed documents a pack
holding one 4,096-token document costs ~3.5x the mean pack (1M lognormal lengths, median 300,
clipped at 4,096, bfd at L=4096), and no packing can even that out: a document alone costs
what it costs, and no two such documents share a pack. What can be evened is a *step*: packs
fall into classes of costs within ``COST_RATIO`` of each other, and a step takes packs of one
class. Measured (``python scripts/bench_balance.py``, 8 ranks, mean over steps of max/mean
rank cost): 2.472 shuffled -> 1.037 at one pack per rank per step, 1.001 at four, with the same
packs. The sampler (``PackSampler(balance="attention")``) does this per epoch;
``pack --balance attention`` orders the dataset this way for readers that take packs in order;
``stats`` reports :func:`step_imbalance` for every packer. The model lives with the format it
describes (the reader's stored classes, the packers' order), the trainer only uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .costs import COST_RATIO, cost_cells, digest


@dataclass(frozen=True)
class CostClasses:
    """What a balanced sampler reads of the packs' costs, and nothing per pack in memory
    unless the source holds it there: classes are computed from an array of costs
    (:meth:`from_costs`: n float64 and n int64 in memory), or read from where a packed
    dataset keeps them (``members`` a memory map: a step touches ``G`` of its entries).

    ``sizes``: packs per class (class 0 the cheapest); ``members``: every pack, grouped by
    class, ascending within one; ``class_of(packs)`` and ``costs_of(packs)`` for the packs
    of one step (dealing) or one lookup (``which``); ``fingerprint``: what the state records
    as ``costs_sha256`` (:func:`fingerprint` of the costs)."""

    ratio: float
    sizes: np.ndarray
    members: np.ndarray
    class_of: Callable[[np.ndarray], np.ndarray]
    costs_of: Callable[[np.ndarray], np.ndarray]
    fingerprint: str
    classes: np.ndarray | None = None  # every pack's class, when held in memory

    @classmethod
    def from_costs(cls, costs: np.ndarray, ratio: float, fingerprint: str) -> CostClasses:
        classes = cost_classes(costs, ratio)
        sizes = np.bincount(classes)
        return cls(float(ratio), sizes, np.argsort(classes, kind="stable"), classes.__getitem__,
                   costs.__getitem__, fingerprint, classes)

    def position(self, pack: int, k: int) -> int:
        """Where ``pack`` (of class ``k``) is among its class's packs (ascending)."""
        find = getattr(self.members, "position", None)
        if find is not None:  # stored classes: from the shard's counts
            return int(find(pack, k))
        lo, m = int(self.sizes[:k].sum()), int(self.sizes[k])
        return int(np.searchsorted(self.members[lo:lo + m], pack))


def attention_costs(packed, linear: float = 0.0, vision: float | None = None) -> np.ndarray:
    """Per pack, the sum of its squared segment lengths plus ``linear`` x its tokens (float64),
    from every shard's segment table (no token is read; see
    :mod:`packtool.formats.packed.layout`).

    The linear term: a decoder block's forward pass costs ~24 d^2 FLOPs per token in its
    projections and MLP and ~2 d l^2 per causal segment of l tokens in attention (QK^T and AV,
    half of each skipped by the mask), so step time ~ sum(l^2) + 12 d * tokens for hidden size
    d. ``linear=0`` (the default) balances attention alone, what dominates long-context runs;
    ``linear=12 * hidden_size`` balances the whole block (at L=4096, d=4096 the linear part is
    ~12x the attention of a full one-document pack, and every full pack costs within ~6%).

    The vision term (rows with images, ``tokenize --vision``): ``vision`` x the sum over the
    row's images of t (h w)^2 patches, the vision encoder's attention, which runs per image
    (per frame). A row's cost is then ``a L + sum l^2 + v sum patches^2``; v ~ (encoder
    depth x width) / (decoder depth x width): None is the dataset's default, 1.0 where its
    rows hold images (what ``balance="attention"`` uses), 0 the language term alone.
    Balancing on text tokens alone leaves the ranks' encoder work unbalanced:
    ``scripts/bench_vision_balance.py``."""
    if vision is None:
        return packed.attention_costs(linear)
    return packed.attention_costs(linear, vision)


def fingerprint(costs: np.ndarray | None) -> str | None:
    """:func:`.costs.digest` of the costs, None for none."""
    return None if costs is None else digest(costs)


def cost_table(packs, balance, ratio: float, n_packs: int):
    """(cost classes, per-pack costs or None) of a sampler's ``balance`` (:func:`costs_of`),
    "attention" from the classes the packed index stores where it has them
    (``packs.cost_classes(ratio)``: a memory map, nothing per pack read at start)."""
    stored = getattr(packs, "cost_classes", None)
    if isinstance(balance, str) and balance == "attention" and stored is not None \
            and (table := stored(ratio)) is not None:
        return table, None
    kind, costs = costs_of(packs, balance, n_packs)
    if kind is None:
        return None, None
    digest = packs.costs_fingerprint() if kind == "attention" and hasattr(
        packs, "costs_fingerprint") else fingerprint(costs)  # a packed dataset's: its shards'
    return CostClasses.from_costs(costs, ratio, digest), costs


def costs_of(rows, balance, n: int) -> tuple[str | None, np.ndarray | None]:
    """(balance as a sampler's state records it, per-row costs or None) of ``balance``: None;
    "attention", from every row's segment table; or an array of per-row costs."""
    from ...errors import PacktoolError

    if balance is None:
        return None, None
    if isinstance(balance, str):
        if balance != "attention":
            raise PacktoolError(f"balance must be None, 'attention' or an array of per-row "
                                f"costs, got {balance!r}")
        if not hasattr(rows, "attention_costs"):
            raise PacktoolError("balance='attention' reads segment lengths from a packed "
                                "dataset: pass open_packed(dir) instead of a count, or pass "
                                "balance=<array of per-row costs>")
        return "attention", np.asarray(rows.attention_costs(), np.float64)
    costs = np.asarray(balance, dtype=np.float64)
    if costs.shape != (n,) or not np.isfinite(costs).all() or (costs < 0).any():
        raise PacktoolError(f"balance costs must be {n:,} finite numbers >= 0 (one per row), "
                            f"got shape {costs.shape}")
    return "costs", costs


def cost_classes(costs: np.ndarray, ratio: float = COST_RATIO) -> np.ndarray:
    """Class of every pack: the occupied cells of one fixed grid, [ratio^k, ratio^(k+1)),
    numbered from 0 (the cheapest). The grid's edges are products of ``ratio`` from 1.0, no
    logarithms, so every rank gets the same classes bit for bit, and a shard's classes follow
    from its own packs (what pack stores: :mod:`packtool.formats.packed.costs`)."""
    cells = cost_cells(costs, ratio)
    return np.searchsorted(np.unique(cells), cells).astype(np.int64)


def group_steps(order: np.ndarray, cls: np.ndarray, n_classes: int, g: int) -> np.ndarray:
    """Packs of ``order`` (already filtered to what is left of an epoch) as steps of ``g``:
    [full, g] for the steps of one class, emitted when their class's queue fills (in order of
    the pack that filled it), then the leftovers of every class in epoch order as a flat array
    (the caller cuts it). Returns (steps [s, g], leftovers [m])."""
    n = len(order)
    c = cls[order]
    by_class = np.argsort(c, kind="stable")  # positions grouped by class, in epoch order
    counts = np.bincount(c, minlength=n_classes)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rows, in_full = [], np.zeros(n, bool)
    for k in np.flatnonzero(counts >= g):
        m = counts[k] // g * g
        pos = by_class[starts[k]:starts[k] + m]
        in_full[pos] = True
        rows.append(pos.reshape(-1, g))
    full = np.concatenate(rows) if rows else np.zeros((0, g), np.int64)
    full = full[np.argsort(full[:, -1], kind="stable")]  # emitted when the last one arrives
    return order[full], order[~in_full]


def like_cost_order(order: np.ndarray, costs: np.ndarray, g: int,
                    ratio: float = COST_RATIO) -> np.ndarray:
    """``order`` (pack ids) rearranged so that every block of ``g`` consecutive packs is of
    one cost class where the classes allow (the rest, too few of a class to fill a block,
    last, in their original order): what ``g`` ranks taking one pack each per step need."""
    costs = np.asarray(costs, np.float64)
    if not len(order):
        return np.asarray(order)
    cls = cost_classes(costs, ratio)
    full, left = group_steps(np.asarray(order), cls, int(cls.max()) + 1, g)
    return np.concatenate([full.ravel(), left])


def balance_steps(costs: np.ndarray, world_size: int, batch_size: int,
                  rounds: int = 64) -> np.ndarray:
    """``costs``: [steps, world_size * batch_size], the cost of every slot of every step.
    Returns [steps, world_size, batch_size]: the slots each rank takes.

    First longest-processing-time: the costliest slot goes to the least-loaded rank that still
    has room (ties: lowest rank). Then up to ``rounds`` rounds of the best swap between the
    costliest and the cheapest rank of every step, where it lowers the costlier of the two
    (1M lengths, batch 4, world size 8: LPT alone 1.062, with swaps 1.054).
    Vectorised over steps; no randomness, so every rank computes the same result."""
    steps, g = costs.shape
    order = np.argsort(-costs, axis=1, kind="stable")
    if batch_size == 1:
        # every rank with room has load 0, so the j-th costliest slot goes to rank j: the LPT
        # loop below gives the same, in O(W^2) a step (world size 100,000: minutes, not ms)
        return order.reshape(steps, world_size, 1)
    load = np.zeros((steps, world_size))
    count = np.zeros((steps, world_size), dtype=np.int64)
    slots = np.empty((steps, world_size, batch_size), dtype=np.int64)
    rows = np.arange(steps)
    for j in range(g):
        slot = order[:, j]
        r = np.argmin(np.where(count < batch_size, load, np.inf), axis=1)
        slots[rows, r, count[rows, r]] = slot
        load[rows, r] += costs[rows, slot]
        count[rows, r] += 1
    if world_size == 1:
        return slots  # one rank: nothing to swap
    active = rows
    for _ in range(rounds):
        c = costs[active[:, None, None], slots[active]]  # [a, W, B]
        load = c.sum(axis=2)
        hi, lo = load.argmax(axis=1), load.argmin(axis=1)
        ar = np.arange(len(active))
        d = c[ar, hi][:, :, None] - c[ar, lo][:, None, :]  # moving d from hi to lo, [a, B, B]
        new = np.maximum(load[ar, hi][:, None, None] - d, load[ar, lo][:, None, None] + d)
        best = new.reshape(len(active), -1).argmin(axis=1)
        gain = load[ar, hi] - new.reshape(len(active), -1)[ar, best]
        ok = gain > 1e-12 * load[ar, hi]
        if not ok.any():
            break
        active, hi, lo, best = active[ok], hi[ok], lo[ok], best[ok]
        i, k = np.divmod(best, batch_size)
        a, b = slots[active, hi, i], slots[active, lo, k]
        slots[active, hi, i], slots[active, lo, k] = b, a
    return slots


def step_imbalance(costs, world_size: int = 8, batch_size: int = 1, balanced: bool = False,
                   seed: int = 0) -> float:
    """Mean over an epoch's steps of the costliest rank's cost over the mean rank's cost, for
    ``costs`` per pack (e.g. ``np.bincount(packs, weights=lengths ** 2)``), in a shuffled
    epoch (``balanced=False``: packs in a seeded random order, ``G = world_size x
    batch_size`` a step, the last step filled from the front) or balanced (the same order
    made of steps of one cost class where the classes allow, :func:`like_cost_order`, then
    dealt by :func:`balance_steps`): what the balanced sampler does, without its time line.
    1.0 is perfect; ``packtool stats`` reports it at 8 ranks x 1 pack for every packer."""
    from ...seeds import rng

    costs = np.asarray(costs, dtype=np.float64)
    if not len(costs) or not costs.any():
        return 1.0
    g = int(world_size) * int(batch_size)
    order = rng(seed, "stats.imbalance").permutation(len(costs))
    if balanced:
        order = like_cost_order(order, costs, g)
    steps = costs[np.resize(order, -(-len(order) // g) * g)].reshape(-1, g)
    if balanced:
        slots = balance_steps(steps, world_size, batch_size).reshape(len(steps), g)
        steps = np.take_along_axis(steps, slots, axis=1)
    per_rank = steps.reshape(len(steps), world_size, batch_size).sum(axis=2)
    mean = per_rank.mean(axis=1)
    ok = mean > 0
    return float((per_rank.max(axis=1)[ok] / mean[ok]).mean())
