"""Which packs each rank reads, step by step: shuffled, rank-sharded, balanced, and resumable
exactly, also into another world size or batch size.

An epoch is one seeded permutation of the packs (its *order*), cut into global steps of
``G = world_size * batch_size`` packs; rank r takes ``batch_size`` of each step's packs::

    epoch 3, seed 0 -> order   17  4 88 23 | 61  9 40 12 | ...     world_size 2, batch 2
    step 0: rank 0 [17, 4]  rank 1 [88, 23]       (balance=None: in order)
    step 1: rank 0 [61, 12] rank 1 [9, 40]        (balance="attention": by cost, see below)

The order is a keyed permutation computed per step (:mod:`packtool.train.order`), never held
whole: at 2.5 x 10^8 packs, 8 ranks x 4, a rank's first step is ready in ~0.1 s with ~7 MB
allocated, where drawing the epoch took 135 s and 10 GB (``scripts/bench_sampler_start.py``).
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
   help): packs fall into cost classes whose costs differ by at most ``cost_ratio`` (1.1);
   each class has an order of its own, spread evenly over the epoch's time line, and a step
   is ``G`` consecutive packs of one class, due when the last of them is (WLB-LLM's "outlier
   delay", applied to every class). The last packs of each class (fewer than ``G``) form the
   epoch's last steps, in time order. Each class is consumed in its order, so consumption
   stays a prefix of each class's order: that is what a state counts.
2. *Dealing within a step*: longest-processing-time-first with at most ``batch_size`` packs per
   rank, then swaps between the costliest and the cheapest rank (:func:`balance_steps`).

Measured by ``python scripts/bench_balance.py`` (1M lognormal lengths, median 300, clipped at
4,096; bfd at L=4096 -> 118,860 packs; world size 8), mean over steps of max-rank / mean-rank
cost (99th percentile)::

    packs per rank per step   1               2               4
    shuffled                  2.472 (4.181)   1.989 (3.111)   1.679 (2.481)
    dealt only (before)       2.472 (4.181)   1.558 (2.402)   1.056 (1.309)
    balance="attention"       1.037 (1.065)   1.010 (1.024)   1.001 (1.005)

The same bfd packs, none added. Why no packing objective gets there alone (a 4,096-token
document costs 3.5x the mean pack whatever shares it), the price of like-cost steps, and the
whole block's cost (``attention_costs(ds, linear=12 * d)``): docs/TRAINING.md.
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError
from ..formats.packed.balance import COST_RATIO, balance_steps, cost_table
from ..formats.packed.balance import attention_costs as attention_costs  # also from here (docs)
from ..formats.packed.balance import fingerprint as fingerprint  # the state's costs_sha256
from .order import EpochOrder, class_keys
from .shape import check_shape
from .state import check_state, dataset_identity, stamp


class PackSampler:
    """This rank's pack indices, step by step, for one epoch at a time.

    ``packs``: the number of packs, or a packed dataset (``open_packed(dir)``, anything with
    ``len()``; ``balance="attention"`` reads its cu_seqlens). ``batch_size``: packs per rank per
    step. ``balance``: None, ``"attention"``, or an array of per-pack costs (e.g.
    ``attention_costs(ds, linear=12 * hidden_size)``). ``cost_ratio``: the widest cost ratio
    inside one class of like-cost packs (balance only).
    ``tokens_per_step=T`` (and ``curriculum``) makes a token-budget sampler instead: steps of
    one slot length and exactly T tokens (:mod:`packtool.train.budget`).

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

    def __new__(cls, packs=None, *, tokens_per_step=None, curriculum=None, **kw):
        """With ``tokens_per_step``: a :class:`packtool.train.budget.BudgetSampler`."""
        if tokens_per_step is None and curriculum is None:
            return super().__new__(cls)
        from .budget import budget_sampler

        return budget_sampler(packs, tokens_per_step, curriculum, kw)

    def __init__(self, packs, *, rank: int, world_size: int, seed: int = 0,
                 drop_last: bool = True, balance=None, batch_size: int = 1,
                 cost_ratio: float = COST_RATIO, tokens_per_step=None, curriculum=None):
        # tokens_per_step, curriculum: None here (else __new__ made a BudgetSampler)
        n = packs if isinstance(packs, (int, np.integer)) else len(packs)
        check_shape(rank, world_size, ("n_packs", n, 1), ("batch_size", batch_size, 1),
                    ("seed", seed, 0))
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
        self.balance = None if balance is None else (
            balance if isinstance(balance, str) else "costs")
        # costs: per pack, where they are in memory (an array given, or computed); None when
        # the dataset stores its classes, or without balance
        self._table, self.costs = cost_table(packs, balance, float(cost_ratio), self.n_packs)
        self.cost_ratio = None if self._table is None else float(cost_ratio)
        # without balance: one class, nothing per pack
        self.n_classes, self.class_sizes = 1, np.array([self.n_packs], np.int64)
        self.fingerprint = None
        if self._table is not None:
            self.class_sizes = np.asarray(self._table.sizes, np.int64)
            self.n_classes, self.fingerprint = len(self.class_sizes), self._table.fingerprint
        self.dataset = dataset_identity(packs)
        self.epoch, self.start_step, self._cursor = 0, 0, 0
        self._resumed = None  # (epoch, consumed per class) of an elastic resume
        self._running = None  # (epoch, step, consumed per class) as steps() hands them out
        self._cache_key, self._cache = None, None

    # ------------------------------------------------------------------ the epoch's schedule

    @property
    def classes(self) -> np.ndarray:
        """Cost class of every pack (all 0 without balance: made only when asked, n int64)."""
        if self._table is None:
            return np.zeros(self.n_packs, np.int64)
        if self._table.classes is not None:
            return self._table.classes
        return np.asarray(self._table.class_of(np.arange(self.n_packs)), np.int64)

    def _epoch_order(self, epoch: int) -> EpochOrder:
        """The steps of ``epoch`` from its ``first_step``, computed per step (cached)."""
        done = self._consumed_before(epoch)
        key = (epoch, None if done is None else done.tobytes())
        if self._cache_key != key:
            zero = np.zeros(self.n_classes, np.int64)
            self._cache = EpochOrder(self.class_sizes,
                                     None if self._table is None else self._table.members,
                                     class_keys(self.seed, epoch, self.n_classes),
                                     self.global_batch, zero if done is None else done,
                                     self.drop_last)
            self._cache_key = key
        return self._cache

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's packs in time order (:mod:`packtool.train.order`): without balance one
        keyed permutation of the packs from ``(seed, epoch)`` alone (packtool.seeds
        'sampler.epoch'), never pack's shuffle. Holds the whole epoch (n int64): for tests and
        small datasets; the sampler itself computes each step's packs as it deals them."""
        return self._epoch_order(self.epoch if epoch is None else int(epoch)).timeline()

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

    def _slots(self, steps: np.ndarray) -> np.ndarray:
        """Steps [s, G] -> [s, world_size, batch_size]: the slot of the step each rank takes
        (balance: by cost, :func:`balance_steps`; else in order)."""
        if self._table is not None and len(steps):
            costs = np.asarray(self._table.costs_of(steps.ravel()), np.float64)
            return balance_steps(costs.reshape(steps.shape), self.world_size, self.batch_size)
        g = np.arange(self.global_batch).reshape(self.world_size, self.batch_size)
        return np.broadcast_to(g, (len(steps), self.world_size, self.batch_size))

    def _balanced(self, steps: np.ndarray) -> np.ndarray:
        """Steps [s, G] -> [s, world_size, batch_size], each step's packs dealt to ranks."""
        slots = self._slots(steps).reshape(len(steps), -1)
        return np.take_along_axis(steps, slots, axis=1).reshape(
            len(steps), self.world_size, self.batch_size)

    def _rows(self, epoch: int, a: int, b: int) -> np.ndarray:
        """Rows a..b of ``global_schedule(epoch)``, computed for those steps alone."""
        return self._balanced(self._epoch_order(epoch).rows(a, b))

    def schedule_row(self, epoch: int, i: int) -> np.ndarray:
        """Row ``i`` of ``global_schedule(epoch)`` ([world_size, batch_size]), computed for
        that step alone: what ``packtool which`` needs of an epoch."""
        epoch = int(epoch)
        n = self.steps_in(epoch) - self.first_step(epoch)
        if not 0 <= i < n:
            raise IndexError(f"step {i} of {n}")
        return self._rows(epoch, i, i + 1)[0]

    def places(self, pack: int, epoch: int | None = None) -> list[tuple[int, int]]:
        """Every (step, rank) where ``epoch`` yields ``pack`` (steps from the epoch's start):
        one, none (left out by drop_last, or consumed before a resume), or more (it also fills
        the last step without drop_last), by the inverse permutation: no schedule is built."""
        epoch, pack = self.epoch if epoch is None else int(epoch), int(pack)
        if not 0 <= pack < self.n_packs:
            raise PacktoolError(f"pack {pack} is not one of the {self.n_packs:,} packs")
        k, local = 0, pack
        if self._table is not None:
            k = int(self._table.class_of(np.array([pack]))[0])
            local = self._table.position(pack, k)
        o, first = self._epoch_order(epoch), self.first_step(epoch)
        out = []
        for step, slot in o.places(pack, k, local):
            slots = self._slots(o.rows(step, step + 1))[0]
            rank = int(np.argwhere(slots == slot)[0][0])
            out.append((first + step, rank))
        return sorted(out)

    def global_schedule(self, epoch: int | None = None) -> np.ndarray:
        """[steps, world_size, batch_size] pack indices of every rank for ``epoch``, from its
        ``first_step`` (0 unless an elastic resume began the epoch) to its end. Holds the
        whole epoch: for tests, stats and small datasets (``steps()`` computes per step)."""
        epoch = self.epoch if epoch is None else int(epoch)
        return self._rows(epoch, 0, self.steps_in(epoch) - self.first_step(epoch))

    def left_out(self, epoch: int | None = None) -> np.ndarray:
        """Packs of ``epoch`` no step takes: with ``drop_last``, the last ``rest % G`` of what
        was left to deal (``n_packs % G`` without a resume); empty with ``drop_last=False``."""
        return self._epoch_order(self.epoch if epoch is None else int(epoch)).left_out()

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
        """This rank's batches (lists of pack indices) from the resume point to the epoch's end,
        computed a chunk of steps at a time (never the whole epoch)."""
        start, first, n = self.start_step, self.first_step(), self.n_steps
        self.start_step = first
        order = self._epoch_order(self.epoch)
        done = self._consumed_at(start)
        self._cursor = start
        # chunks of 1, 2, 4, ... steps up to ~65k packs: the first step alone is computed
        # before it is yielded (a memory-mapped class table is read at G places, not 65k)
        chunk, most, a = 1, max(1, (1 << 16) // self.global_batch), start
        while a < n:
            b = min(a + chunk, n)
            rows, classes = order.rows(a - first, b - first, classes=True)
            mine = self._balanced(rows)[:, self.rank]
            for s in range(len(rows)):
                done = done + np.bincount(classes[s], minlength=self.n_classes)
                # before the yield: a snapshot taken after it counts step s as handed out
                self._cursor, self._running = a + s + 1, (self.epoch, a + s + 1, done)
                yield mine[s].tolist()
            a, chunk = b, min(2 * chunk, most)

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
        return stamp("fixed", {
                "epoch": epoch, "step": step, "consumed": consumed.tolist(),
                "remaining": self.n_packs - int(consumed.sum()),
                "world_size": self.world_size, "batch_size": self.batch_size,
                "seed": self.seed, "n_packs": self.n_packs, "drop_last": self.drop_last,
                "balance": self.balance, "cost_ratio": self.cost_ratio,
                "costs_sha256": self.fingerprint, "dataset": self.dataset})

    def _consumed_at(self, step: int) -> np.ndarray:
        """Packs per class the current epoch's steps before ``step`` consumed (all of them at
        the epoch's end: a finished epoch's left-out tail stays left out)."""
        if step >= self.n_steps:
            return self.class_sizes.copy()
        if self._running is not None and self._running[:2] == (self.epoch, step):
            return self._running[2].copy()
        return self._epoch_order(self.epoch).consumed(step - self.first_step())

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
