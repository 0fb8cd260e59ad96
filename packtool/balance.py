"""Steps of like attention cost: the outlier delay of WLB-LLM applied to every cost class.

Attention costs ~ the sum of squared segment lengths, so with heavy-tailed documents a pack
holding one 4,096-token document costs ~3.5x the mean pack (1M lognormal lengths, median 300,
clipped at 4,096, bfd at L=4096), and no packing can even that out: a document alone costs
what it costs, and no two such documents share a pack. What can be evened is a *step*: packs
fall into classes of costs within ``COST_RATIO`` of each other, and a step takes packs of one
class. Measured (``python scripts/bench_balance.py``, 8 ranks, mean over steps of max/mean
rank cost): 2.477 shuffled -> 1.036 at one pack per rank per step, 1.002 at four, with the same
packs. The sampler (``PackSampler(balance="attention")``) does this per epoch;
``pack --balance attention`` orders the dataset this way for readers that take packs in order.
"""

from __future__ import annotations

import numpy as np

COST_RATIO = 1.1


def cost_classes(costs: np.ndarray, ratio: float = COST_RATIO) -> np.ndarray:
    """Class of every pack: sorted by cost, a class starts at its cheapest pack c and holds every
    pack up to c * ratio. Comparisons and one multiplication per class, no logarithms, so every
    rank gets the same classes bit for bit. Class 0 is the cheapest."""
    costs = np.asarray(costs, dtype=np.float64)
    order = np.argsort(costs, kind="stable")
    srt = costs[order]
    cls_sorted = np.zeros(len(costs), np.int64)
    start, k = 0, 0
    while start < len(srt):
        end = int(np.searchsorted(srt, srt[start] * ratio if srt[start] > 0 else 0.0, "right"))
        end = max(end, start + 1)
        cls_sorted[start:end] = k
        start, k = end, k + 1
    out = np.empty(len(costs), np.int64)
    out[order] = cls_sorted
    return out


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
