"""Which packs each rank reads, step by step: shuffled, rank-sharded, balanced, and resumable
exactly, also into another world size or batch size.

An epoch is one seeded permutation of the packs (its *order*), cut into global steps of
``G = world_size * batch_size`` packs; rank r takes ``batch_size`` of each step's packs::

    epoch 3, seed 0 -> order   17  4 88 23 | 61  9 40 12 | ...     world_size 2, batch 2
    step 0: rank 0 [17, 4]  rank 1 [88, 23]       (balance=None: in order)
    step 1: rank 0 [61, 12] rank 1 [9, 40]        (balance="attention": by cost, see below)

Every rank computes the same schedule from ``(seed, epoch)`` alone, so ranks never talk to
each other, every rank takes exactly ``n_steps`` steps (``drop_last=True`` leaves out the last
``n_packs % G`` packs of the epoch; ``drop_last=False`` fills the last step with the epoch's
first packs again).

**Resume, elastic.** A state records what was consumed as *counts of the epoch's order*: the
packs of finished steps are always a prefix of the order (per cost class with balance, see
below), whatever the world size and batch size that consumed them. ``load_state_dict`` deals the
rest of the epoch to the new shape: a state saved at step 3 by 2 ranks x 2 packs (12 packs
consumed) resumes on 3 ranks x 1 pack as steps 4, 5, ... over packs 12, 13, ... of the order,
none repeated, none skipped. Under the same shape the resumed steps are, batch for batch, those
of the uninterrupted run. A step counts as consumed only once the training loop says it
finished (``state_dict(step)``), or, through torchdata's ``StatefulDataLoader``, once the batch
it snapshots was handed to the loop (``state_dict()``): a step that was in flight when the run
died, on any rank, is dealt again in full. When the rest does not fill whole steps of the new
shape, ``drop_last=True`` leaves out its last ``rest % G'`` packs (``left_out()`` lists them;
the state records ``remaining``), ``drop_last=False`` repeats the epoch's first packs.

Why a step index the trainer passes in: a DataLoader with workers asks the sampler for
``2 * num_workers`` batches ahead of the model, so what the sampler has handed out is not what
was trained on. Only the training loop (or StatefulDataLoader, which snapshots the sampler's
state as each batch is drawn and hands back the snapshot of the batch last yielded) knows.

``balance="attention"``: attention costs ~sum of squared segment lengths, so a pack holding one
4,096-token document costs ~40x one holding forty 100-token documents, and in data parallelism
the slowest rank sets the step time. Two things even it out:

1. *Steps of like cost* (for every batch size, also one pack per rank, where dealing cannot
   help): packs fall into cost classes whose costs differ by at most ``cost_ratio`` (1.1); a
   pack waits in its class's queue, in epoch order, until ``G`` packs of its class are there,
   and they form a step (WLB-LLM's "outlier delay", applied to every class). The last packs of
   each class (fewer than ``G``) form the epoch's last steps, in epoch order. Each class is
   consumed in epoch order, so consumption stays a prefix of the order per class: that is what
   a state counts.
2. *Dealing within a step*: longest-processing-time-first with at most ``batch_size`` packs per
   rank, then swaps between the costliest and the cheapest rank (:func:`balance_steps`).

Measured by ``python scripts/bench_balance.py`` (1M lognormal lengths, median 300, clipped at
4,096; bfd at L=4096 -> 118,860 packs; world size 8), mean over steps of max-rank / mean-rank
cost (99th percentile)::

    packs per rank per step   1               2               4
    shuffled                  2.477 (4.147)   1.999 (3.116)   1.682 (2.445)
    dealt only (before)       2.477 (4.147)   1.561 (2.383)   1.056 (1.294)
    balance="attention"       1.036 (1.062)   1.011 (1.022)   1.002 (1.006)

The same bfd packs, none added (10M lengths: 1.034 / 1.001 / 1.000 at 1 / 4 / 8 packs per rank;
0.2-0.35 s per epoch schedule of 1.19M packs). Making packs' costs even instead cannot get there:
a 4,096-token document alone costs 3.5x the mean pack (16.8M vs 4.7M), so even an ideal packing
(documents over L/2 alone, every other pack at exactly the mean) gives 2.08 shuffled at one pack
per rank, and dealt at 2 and 4 packs per rank 1.75 and 1.36, worse than bfd's uneven packs,
which leave light packs to pair with heavy ones. The price of like-cost steps: packs of like
cost train together (8 one-document packs in a step), and packs move in the order: median 13
steps earlier, 99th percentile 167 steps later, and the packs of classes with fewer than ``G``
members (a few dozen here, 57 classes) to the epoch's last steps. Whole-block cost
(``attention_costs(ds, linear=12 * d)``): see docs/TRAINING.md.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..errors import PacktoolError
from .balance import COST_RATIO, balance_steps, cost_classes, group_steps
from .state import STATE_FORMAT, STATE_VERSION, check_state


def attention_costs(packed, linear: float = 0.0) -> np.ndarray:
    """Per pack, the sum of its squared segment lengths plus ``linear`` x its tokens (float64),
    from every shard's segment table (no token is read; see
    :mod:`packtool.formats.packed.layout`).

    The linear term: a decoder block's forward pass costs ~24 d^2 FLOPs per token in its
    projections and MLP and ~2 d l^2 per causal segment of l tokens in attention (QK^T and AV,
    half of each skipped by the mask), so step time ~ sum(l^2) + 12 d * tokens for hidden size
    d. ``linear=0`` (the default) balances attention alone, what dominates long-context runs;
    ``linear=12 * hidden_size`` balances the whole block (at L=4096, d=4096 the linear part is
    ~12x the attention of a full one-document pack, and every full pack costs within ~6%)."""
    return packed.attention_costs(linear)


def fingerprint(costs: np.ndarray | None) -> str | None:
    """First 16 hex digits of the sha256 of the costs (float64, little-endian)."""
    if costs is None:
        return None
    return hashlib.sha256(np.ascontiguousarray(costs, dtype="<f8").tobytes()).hexdigest()[:16]


def step_imbalance(costs, world_size: int = 8, batch_size: int = 1, balanced: bool = False,
                   seed: int = 0) -> float:
    """Mean over an epoch's steps of the costliest rank's cost over the mean rank's cost, for
    ``costs`` per pack (e.g. ``np.bincount(packs, weights=lengths ** 2)``), in a shuffled
    epoch (``balanced=False``) or with ``balance=costs`` (steps of like cost, then dealt).
    1.0 is perfect; ``packtool stats`` reports it at 8 ranks x 1 pack for every packer."""
    costs = np.asarray(costs, dtype=np.float64)
    if not len(costs) or not costs.any():
        return 1.0
    s = PackSampler(len(costs), rank=0, world_size=world_size, batch_size=batch_size,
                    seed=seed, drop_last=False, balance=costs if balanced else None)
    per_rank = costs[s.global_schedule()].sum(axis=2)
    mean = per_rank.mean(axis=1)
    ok = mean > 0
    return float((per_rank.max(axis=1)[ok] / mean[ok]).mean())


def dataset_identity(packs) -> str | None:
    """The ``index_sha256`` of the packed dataset ``packs`` is (``open_packed``) or wraps
    (``TorchPackedDataset``), which a state records so that a state of another dataset with as
    many packs is refused; None for a pack count or any other sized object (nothing to name)."""
    index = getattr(getattr(packs, "packed", packs), "index", None)
    digest = index.get("index_sha256") if isinstance(index, dict) else None
    return digest if isinstance(digest, str) else None


class PackSampler:
    """This rank's pack indices, step by step, for one epoch at a time.

    ``packs``: the number of packs, or a packed dataset (``open_packed(dir)``, anything with
    ``len()``; ``balance="attention"`` reads its cu_seqlens). ``batch_size``: packs per rank per
    step. ``balance``: None, ``"attention"``, or an array of per-pack costs (e.g.
    ``attention_costs(ds, linear=12 * hidden_size)``). ``cost_ratio``: the widest cost ratio
    inside one class of like-cost packs (balance only).

    >>> s = PackSampler(100, rank=1, world_size=4, batch_size=2)
    >>> s.set_epoch(0); batches = list(s.steps())        # 12 lists of 2 pack indices
    >>> state = s.state_dict(step=5)                      # after the loop finished 5 steps
    >>> t = PackSampler(100, rank=1, world_size=4, batch_size=2); t.load_state_dict(state)
    >>> list(t.steps()) == batches[5:]
    True
    >>> u = PackSampler(100, rank=0, world_size=3, batch_size=1); u.load_state_dict(state)
    >>> u.start_step, u.n_steps                           # 40 packs done; 60 left as 20 steps
    (13, 33)

    Iterating (``iter(s)``, ``s.steps()``) starts at the resumed step once, then at the first
    step of the epoch (``first_step``: 0, or where an elastic resume began the epoch).
    ``state_dict()`` without a step records what this sampler has handed out, for torchdata's
    ``StatefulDataLoader``, which snapshots it as each batch is drawn.
    """

    def __init__(self, packs, *, rank: int, world_size: int, seed: int = 0,
                 drop_last: bool = True, balance=None, batch_size: int = 1,
                 cost_ratio: float = COST_RATIO):
        n = packs if isinstance(packs, (int, np.integer)) else len(packs)
        for name, v, lo in (("n_packs", n, 1), ("world_size", world_size, 1),
                            ("batch_size", batch_size, 1), ("seed", seed, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise PacktoolError(f"{name} must be an integer >= {lo}, got {v!r}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < world_size:
            raise PacktoolError(f"rank must be in 0..{world_size - 1} (world_size {world_size}), "
                                f"got {rank!r}")
        if isinstance(cost_ratio, bool) or not isinstance(cost_ratio, (int, float)) \
                or not 1.01 <= cost_ratio < float("inf"):
            raise PacktoolError(f"cost_ratio must be a number >= 1.01 (1.1: packs of one class "
                                f"differ by at most 10% in cost; closer classes wait longer to "
                                f"fill a step and make the state longer), got {cost_ratio!r}")
        self.n_packs, self.rank, self.world_size = int(n), int(rank), int(world_size)
        self.seed, self.drop_last, self.batch_size = int(seed), bool(drop_last), int(batch_size)
        self.global_batch = self.world_size * self.batch_size
        if self.drop_last and self.n_packs < self.global_batch:
            raise PacktoolError(
                f"{self.n_packs:,} packs < one global step of {self.global_batch:,} "
                f"(world_size {self.world_size} x batch_size {self.batch_size}): with drop_last "
                "the epoch would have no step; use drop_last=False (wrap) or a smaller batch_size")
        self.costs = self._costs(packs, balance)
        self.balance = None if balance is None else (
            balance if isinstance(balance, str) else "costs")
        self.cost_ratio = float(cost_ratio) if self.costs is not None else None
        self.classes = (cost_classes(self.costs, self.cost_ratio) if self.costs is not None
                        else np.zeros(self.n_packs, np.int64))
        self.n_classes = int(self.classes.max()) + 1
        self.class_sizes = np.bincount(self.classes, minlength=self.n_classes)
        self.fingerprint = fingerprint(self.costs)
        self.dataset = dataset_identity(packs)
        self.epoch, self.start_step, self._cursor = 0, 0, 0
        self._resumed = None  # (epoch, consumed per class) of an elastic resume
        self._running = None  # (epoch, step, consumed per class) as steps() hands them out
        self._cache_key, self._cache = None, None

    def _costs(self, packs, balance):
        if balance is None:
            return None
        if isinstance(balance, str):
            if balance != "attention":
                raise PacktoolError(f"balance must be None, 'attention' or an array of per-pack "
                                    f"costs, got {balance!r}")
            if not hasattr(packs, "attention_costs"):
                raise PacktoolError("balance='attention' reads segment lengths from a packed "
                                    "dataset: pass open_packed(dir) instead of a pack count, or "
                                    "pass balance=<array of per-pack costs>")
            return attention_costs(packs)
        costs = np.asarray(balance, dtype=np.float64)
        if costs.shape != (self.n_packs,) or not np.isfinite(costs).all() or (costs < 0).any():
            raise PacktoolError(f"balance costs must be {self.n_packs:,} finite numbers >= 0 (one "
                                f"per pack), got shape {costs.shape}")
        return costs

    # ------------------------------------------------------------------ the epoch's schedule

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's order: a permutation of the packs from ``(seed, epoch)`` alone, in a
        random stream of its own (packtool.seeds 'sampler.epoch'), never pack's shuffle."""
        from ..seeds import rng

        epoch = self.epoch if epoch is None else int(epoch)
        return rng(self.seed, "sampler.epoch", epoch).permutation(self.n_packs)

    def _consumed_before(self, epoch: int) -> np.ndarray | None:
        if self._resumed is not None and self._resumed[0] == epoch:
            return self._resumed[1]
        return None

    def first_step(self, epoch: int | None = None) -> int:
        """The epoch's first step this sampler can deal: 0, or after an elastic resume the
        packs already consumed // G (steps before it were taken under the saved shape)."""
        done = self._consumed_before(self.epoch if epoch is None else int(epoch))
        return 0 if done is None else int(done.sum()) // self.global_batch

    def steps_in(self, epoch: int | None = None) -> int:
        """Steps every rank takes in ``epoch`` (counted from the epoch's start)."""
        epoch = self.epoch if epoch is None else int(epoch)
        done = self._consumed_before(epoch)
        rest = self.n_packs - (0 if done is None else int(done.sum()))
        q, r = divmod(rest, self.global_batch)
        return self.first_step(epoch) + (q if self.drop_last or r == 0 else q + 1)

    @property
    def n_steps(self) -> int:
        """Steps every rank takes in the current epoch."""
        return self.steps_in(self.epoch)

    def _plan(self, epoch: int):
        """(schedule [steps, W, B] from first_step, left-out packs) of ``epoch``, cached."""
        done = self._consumed_before(epoch)
        key = (epoch, None if done is None else done.tobytes())
        if self._cache_key == key:
            return self._cache
        steps, out = self._steps(epoch, done)
        self._cache_key, self._cache = key, (self._balanced(steps), out)
        return self._cache

    def _balanced(self, steps: np.ndarray) -> np.ndarray:
        """Steps [s, G] -> [s, world_size, batch_size], each step's packs dealt to ranks."""
        if self.costs is not None and len(steps):
            slots = balance_steps(self.costs[steps], self.world_size, self.batch_size)
            steps = np.take_along_axis(steps, slots.reshape(len(steps), -1), axis=1)
        return steps.reshape(len(steps), self.world_size, self.batch_size)

    def schedule_row(self, epoch: int, i: int) -> np.ndarray:
        """Row ``i`` of ``global_schedule(epoch)`` ([world_size, batch_size]), balancing only
        that step (balancing is per step): what ``packtool which`` needs of an epoch."""
        epoch = int(epoch)
        done = self._consumed_before(epoch)
        if self._cache_key == (epoch, None if done is None else done.tobytes()):
            return self._cache[0][i]
        steps, _ = self._steps(epoch, done)
        if not 0 <= i < len(steps):
            raise IndexError(f"step {i} of {len(steps)}")
        return self._balanced(steps[i:i + 1])[0]

    def _steps(self, epoch: int, done):
        """(steps [s, G] of like-cost packs, not yet balanced across ranks; left-out packs)."""
        perm = self.order(epoch)
        g = self.global_batch
        if done is None:
            rest = perm
        else:  # drop the first done[k] packs of every class, in epoch order
            c = self.classes[perm]
            seen = np.empty(len(perm), np.int64)
            by_class = np.argsort(c, kind="stable")
            starts = np.concatenate([[0], np.cumsum(self.class_sizes)[:-1]])
            seen[by_class] = np.arange(len(perm)) - np.repeat(starts, self.class_sizes)
            rest = perm[seen >= done[c]]
        full, left = group_steps(rest, self.classes, self.n_classes, g)
        q, r = divmod(len(left), g)
        out = np.zeros(0, np.int64)
        if r and not self.drop_last:
            left = np.concatenate([left, np.resize(perm, g - r)])  # the epoch's first packs
            q += 1
        elif r:
            left, out = left[:q * g], left[q * g:]
        return np.concatenate([full, left.reshape(q, g)]), out

    def global_schedule(self, epoch: int | None = None) -> np.ndarray:
        """[steps, world_size, batch_size] pack indices of every rank for ``epoch``, from its
        ``first_step`` (0 unless an elastic resume began the epoch) to its end."""
        return self._plan(self.epoch if epoch is None else int(epoch))[0]

    def left_out(self, epoch: int | None = None) -> np.ndarray:
        """Packs of ``epoch`` no step takes: with ``drop_last``, the last ``rest % G`` of what
        was left to deal (``n_packs % G`` without a resume); empty with ``drop_last=False``."""
        return self._plan(self.epoch if epoch is None else int(epoch))[1]

    # ------------------------------------------------------------------ iteration

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (the same on every rank). Changing the epoch drops a pending
        resume; setting the resumed epoch again keeps it."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise PacktoolError(f"epoch must be an integer >= 0, got {epoch!r}")
        epoch = int(epoch)
        if epoch != self.epoch:
            self.start_step = self._cursor = 0
            self._resumed = self._running = None
        self.epoch = epoch

    def steps(self):
        """This rank's batches (lists of pack indices) from the resume point to the epoch's end."""
        start, first = self.start_step, self.first_step()
        self.start_step = first
        sched = self.global_schedule()
        mine = sched[:, self.rank]
        done = self._consumed_at(start)
        self._cursor = start
        for s in range(start, self.n_steps):
            done = done + np.bincount(self.classes[sched[s - first].ravel()],
                                      minlength=self.n_classes)
            # before the yield: a snapshot taken after it counts step s as handed out
            self._cursor, self._running = s + 1, (self.epoch, s + 1, done)
            yield mine[s - first].tolist()

    def __iter__(self):
        last = self.batch_size - 1
        step = self.start_step
        for batch in self.steps():
            self._cursor = step  # step `step` counts once its last pack is handed out
            for j, i in enumerate(batch):
                if j == last:
                    self._cursor = step + 1
                yield i
            step += 1

    def __len__(self) -> int:
        """Pack indices the next iteration yields (the rest of the epoch when resuming)."""
        return (self.n_steps - self.start_step) * self.batch_size

    # ------------------------------------------------------------------ state

    def state_dict(self, step: int | None = None) -> dict:
        """Where to resume, as JSON-ready plain data.

        ``step``: steps of the current epoch the training loop has finished (counted from the
        epoch's start, also after a resume; read ``sampler.start_step`` before the loop to know
        where a resumed iteration begins). ``step == n_steps`` points at step 0 of the next
        epoch. Without ``step`` (the torchdata ``Stateful`` protocol): the steps this sampler
        has handed out; at the epoch's end, that epoch, finished.

        The state counts consumed packs per cost class (one class without balance) of the
        epoch's order, and records what defines that order (seed, pack count, drop_last,
        balance, cost_ratio, costs' fingerprint) and the dataset (its packed index's
        ``index_sha256``; None when built from a count), which must match at load; world size
        and batch size may change (:mod:`packtool.train.state` says what is checked).
        ``remaining``: packs of the epoch no finished step took (not counting the epoch's first
        packs repeated by drop_last=False)."""
        first, n_steps = self.first_step(), self.n_steps
        roll = step is not None
        if step is None:
            step = max(self._cursor, self.start_step)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) \
                or not first <= step <= n_steps:
            raise PacktoolError(f"step must be {first}..{n_steps} (steps of epoch {self.epoch}"
                                f"{' after the resume' if first else ''}), got {step!r}")
        step, epoch = int(step), self.epoch
        consumed = self._consumed_at(step)
        if step == n_steps and roll:
            epoch, step, consumed = epoch + 1, 0, np.zeros_like(consumed)
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": epoch,
                "step": step, "consumed": consumed.tolist(),
                "remaining": self.n_packs - int(consumed.sum()),
                "world_size": self.world_size, "batch_size": self.batch_size,
                "seed": self.seed, "n_packs": self.n_packs, "drop_last": self.drop_last,
                "balance": self.balance, "cost_ratio": self.cost_ratio,
                "costs_sha256": self.fingerprint, "dataset": self.dataset}

    def _consumed_at(self, step: int) -> np.ndarray:
        """Packs per class the current epoch's steps before ``step`` consumed (all of them at
        the epoch's end: a finished epoch's left-out tail stays left out)."""
        if step >= self.n_steps:
            return self.class_sizes.copy()
        if self._running is not None and self._running[:2] == (self.epoch, step):
            return self._running[2].copy()
        done = self._consumed_before(self.epoch)
        out = np.zeros(self.n_classes, np.int64) if done is None else done.copy()
        took = self.global_schedule()[:step - self.first_step()].ravel()
        return out + np.bincount(self.classes[took], minlength=self.n_classes)

    def load_state_dict(self, state) -> None:
        """Resume from ``state`` (from :meth:`state_dict`, of any rank, world size or batch
        size): the next iteration deals what the epoch has left to this sampler's shape. Every
        refusal names the field: a malformed state, another version, a step that disagrees with
        the packs consumed, a state of another epoch order (seed, pack count, drop_last, balance,
        cost_ratio, costs) or of another dataset."""
        epoch, consumed = check_state(state, self)
        self.epoch = epoch
        # under the same shape the rest of the epoch is dealt exactly as the uninterrupted run
        # deals it (same steps, same numbers): tests/test_sampler.py checks it for every step
        self._resumed = (epoch, consumed) if consumed.any() else None
        self._running = None
        self.start_step = self._cursor = self.first_step()
