"""One sampler whose step rule is a value: ``Sampler(sources, rule=..., rank=, world_size=,
seed=)``. The sampler owns what every rule shares (the rank and world-size checks, epochs,
iteration, the handed-out count a ``StatefulDataLoader`` snapshots, the one state envelope,
``which(step)``, ``where(row)``, ``left_out()``); the rule says what a step takes:

- :class:`FixedPacks` (here): ``batch_size`` packs per rank a step, shuffled and balanced;
- :class:`packtool.train.budget.TokenBudget`: ``T`` tokens a step of one slot length;
- :class:`packtool.train.mixture.Mixture`: rows of several datasets in scheduled proportions.

A rule answers the sampler's questions: the steps of an epoch (``first_step``, ``steps_in``),
the rows of each step (``deal``, ``rows``), where a row lands (``places``), what the epoch
leaves out, its fields of the state (``fields``) and their check (``load``). A new rule is
one such class. ``PackSampler(...)`` and ``MixtureSampler(...)`` are the call forms that name
the rule by its arguments.

**FixedPacks**: which packs each rank reads, step by step: shuffled, rank-sharded, balanced,
and resumable exactly, also into another world size or batch size.

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

import copy

import numpy as np

from ..errors import PacktoolError
from ..formats.packed.balance import COST_RATIO, balance_steps, cost_table
from ..formats.packed.balance import attention_costs as attention_costs  # also from here (docs)
from ..formats.packed.batching import check_int
from .order import EpochOrder, class_keys
from .state import check_state, dataset_identity, stamp


class Sampler:
    """This rank's rows, step by step, as ``rule`` deals them (see the module docstring).

    ``sources``: what the rule reads (a packed dataset, a row count, an array of row lengths,
    or for :class:`Mixture` a {name: dataset} mapping). Iterating (``iter(s)``, ``s.steps()``)
    starts at the resumed step once, then at the epoch's first step. ``state_dict(step)``
    records what the training loop finished; ``state_dict()`` what this sampler has handed
    out (torchdata's ``Stateful`` protocol). What only one rule has (the fixed rule's cost
    ``classes``, a mixture's ``ledger``) is read through the sampler from its rule.
    """

    def __init__(self, sources, *, rule, rank: int, world_size: int, seed: int = 0):
        # the rule's counts first, then seed, world_size and rank, each refused by name
        for name, v, lo in (*rule.counts(sources), ("seed", seed, 0),
                            ("world_size", world_size, 1)):
            check_int(name, v, lo)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < world_size:
            raise PacktoolError(f"rank must be in 0..{world_size - 1} (world_size "
                                f"{world_size}), got {rank!r}")
        self.rank, self.world_size, self.seed = int(rank), int(world_size), int(seed)
        self.epoch = self.start_step = self._handed = 0
        self.rule = copy.copy(rule)  # a rule value is bound to one sampler
        self.rule.bind(self, sources)

    def __getattr__(self, name):  # what one rule alone has: its tables and questions
        rule = self.__dict__.get("rule")
        if rule is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(rule, name)

    # ------------------------------------------------------------------ the epoch's steps

    def first_step(self, epoch: int | None = None) -> int:
        """The epoch's first step this sampler can deal: 0, or where a resume began it."""
        return self.rule.first_step(self.epoch if epoch is None else int(epoch))

    def steps_in(self, epoch: int | None = None) -> int | None:
        """Steps every rank takes in ``epoch`` from its start (None: a stream without end)."""
        return self.rule.steps_in(self.epoch if epoch is None else int(epoch))

    @property
    def n_steps(self) -> int | None:
        """Steps every rank takes in the current epoch."""
        return self.steps_in(self.epoch)

    def which(self, step: int, epoch: int | None = None) -> list[list]:
        """Every rank's rows of ``step`` (counted from the epoch's start) of ``epoch``; an
        IndexError for a step an epoch of known length does not take."""
        epoch = self.epoch if epoch is None else int(epoch)
        first, n = self.rule.first_step(epoch), self.rule.steps_in(epoch)
        if n is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer))
                              or not first <= step < n):
            raise IndexError(f"step {step} of {n}")
        return self.rule.rows(epoch, step)

    def where(self, row: int, source: str | None = None, epoch: int | None = None) -> list:
        """Every (step, rank) where ``epoch`` takes ``row`` (of ``source``, a mixture's):
        one, none (left out, consumed before a resume, never reached), or more (a fixed
        epoch without drop_last fills its last step with its first packs again)."""
        return self.rule.places(row, self.epoch if epoch is None else int(epoch), source)

    def left_out(self, epoch: int | None = None) -> np.ndarray:
        """Rows of ``epoch`` no step takes (fewer than a step; empty without drop_last)."""
        return self.rule.left_out(self.epoch if epoch is None else int(epoch))

    # ------------------------------------------------------------------ iteration

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (the same on every rank). Changing the epoch drops a pending
        resume; setting the resumed epoch again keeps it. A mixture's sources keep epochs of
        their own: its steps go on whatever the epoch."""
        check_int("epoch", epoch, 0)
        if int(epoch) != self.epoch and self.rule.per_epoch:
            self.start_step = self._handed = 0
            self.rule.new_epoch()
        self.epoch = int(epoch)

    def steps(self, until: int | None = None):
        """This rank's batches (lists of rows) from the resume point to the epoch's end (or
        ``until``, exclusive), computed a few steps at a time (never the whole epoch)."""
        start = self.start_step
        self.start_step = self.first_step()
        self._handed = start
        for batch in self.rule.deal(self.epoch, start, until):
            self._handed += 1  # before the yield: a snapshot after it counts the step
            yield batch

    def __iter__(self):
        """Row indices one at a time: a step counts as handed out once its last row is."""
        for step, batch in enumerate(self.steps(), self.start_step):
            self._handed = step
            yield from batch[:-1]
            if batch:  # a rule of one's own may give a rank an empty step
                self._handed = step + 1
                yield batch[-1]

    def __len__(self) -> int:
        """Row indices the next iteration yields (the rest of the epoch when resuming)."""
        return self.rule.items(self.epoch, self.start_step)

    # ------------------------------------------------------------------ state

    def state_dict(self, step: int | None = None) -> dict:
        """Where to resume, as JSON-ready plain data: ``{"format": "packtool.train.sampler",
        "version": 5, "rule": ..., ...}`` (:mod:`packtool.train.state`).

        ``step``: steps of the current epoch the training loop has finished (counted from
        the epoch's start, also after a resume; ``sampler.start_step`` before the loop says
        where a resumed iteration begins). ``step == n_steps`` points at step 0 of the next
        epoch. Without ``step``: the steps this sampler has handed out."""
        first, n = self.first_step(), self.n_steps
        roll = step is not None
        step = max(self._handed, self.start_step) if step is None else step
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) \
                or step < first or (n is not None and step > n):
            want = f"{first}..{n} (steps of epoch {self.epoch}" if n is not None else \
                f"an integer >= {first:,} (the first step of this sampler"
            raise PacktoolError(f"step must be {want}{' after the resume' if first else ''})"
                                f", got {step!r}")
        return stamp(self.rule.name, self.rule.fields(self.epoch, int(step),
                                                      roll and step == n))

    def load_state_dict(self, state) -> None:
        """Resume from ``state`` (of any rank, world size or batch size; a token budget's
        of any T or curriculum; a mixture's of any schedule): the next iteration deals what
        is left. Every refusal names the field (:mod:`packtool.train.state`)."""
        epoch, self.start_step = self.rule.load(state)
        self.epoch = self.epoch if epoch is None else epoch
        self._handed = self.start_step


class FixedPacks:
    """``batch_size`` packs per rank a step. ``balance``: None, ``"attention"``, or per-pack
    costs (``attention_costs(ds, linear=12 * hidden_size)``); ``cost_ratio``: the widest cost
    ratio inside one class of like-cost packs (balance only); ``drop_last``: leave out the
    epoch's last packs that fill no step (else fill it with the epoch's first)."""

    name, per_epoch = "fixed", True

    def __init__(self, batch_size: int = 1, *, balance=None, drop_last: bool = True,
                 cost_ratio: float = COST_RATIO):
        if isinstance(cost_ratio, bool) or not isinstance(cost_ratio, (int, float)) \
                or not 1.01 <= cost_ratio < float("inf"):
            raise PacktoolError(f"cost_ratio must be a number >= 1.01 (1.1: packs of one class "
                                f"differ by at most 10% in cost; closer classes wait longer to "
                                f"fill a step and make the state longer), got {cost_ratio!r}")
        self.batch_size, self.drop_last, self._balance = batch_size, bool(drop_last), balance
        self._ratio = float(cost_ratio)

    def counts(self, packs):
        n = packs if isinstance(packs, (int, np.integer)) else len(packs)
        return ("n_packs", n, 1), ("batch_size", self.batch_size, 1)

    def bind(self, s: Sampler, packs) -> None:
        self.s, self.seed, self.batch_size = s, s.seed, int(self.batch_size)
        self.world_size = s.world_size
        self.n_packs = int(packs if isinstance(packs, (int, np.integer)) else len(packs))
        self.global_batch = s.world_size * self.batch_size
        if self.drop_last and self.n_packs < self.global_batch:
            raise PacktoolError(
                f"{self.n_packs:,} packs < one global step of {self.global_batch:,} "
                f"(world_size {s.world_size} x batch_size {self.batch_size}): with drop_last "
                "the epoch would have no step; use drop_last=False (wrap) or a smaller batch_size")
        balance = self._balance
        self.balance = None if balance is None else (
            balance if isinstance(balance, str) else "costs")
        # costs: per pack, where they are in memory (an array given, or computed); None when
        # the dataset stores its classes, or without balance
        self._table, self.costs = cost_table(packs, balance, self._ratio, self.n_packs)
        self.cost_ratio = None if self._table is None else self._ratio
        # without balance: one class, nothing per pack
        table = self._table
        self.class_sizes = np.array([self.n_packs] if table is None else table.sizes, np.int64)
        self.n_classes = len(self.class_sizes)
        self.fingerprint = None if table is None else table.fingerprint
        self.dataset = dataset_identity(packs)
        self._resumed = None  # (epoch, consumed per class) of an elastic resume
        self._running = None  # (epoch, step, consumed per class) as deal() hands them out
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
        done = self._done(epoch)
        key = (epoch, done.tobytes())
        if self._cache_key != key:
            self._cache = EpochOrder(self.class_sizes,
                                     None if self._table is None else self._table.members,
                                     class_keys(self.seed, epoch, self.n_classes),
                                     self.global_batch, done, self.drop_last)
            self._cache_key = key
        return self._cache

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's packs in time order (:mod:`packtool.train.order`): without balance one
        keyed permutation of the packs from ``(seed, epoch)`` alone (packtool.seeds
        'sampler.epoch'), never pack's shuffle. Holds the whole epoch (n int64): for tests and
        small datasets; the sampler itself computes each step's packs as it deals them."""
        return self._epoch_order(self.s.epoch if epoch is None else int(epoch)).timeline()

    def _done(self, epoch: int) -> np.ndarray:
        """Packs per class an elastic resume of ``epoch`` consumed before it (else 0)."""
        if self._resumed is not None and self._resumed[0] == epoch:
            return self._resumed[1]
        return np.zeros(self.n_classes, np.int64)

    def first_step(self, epoch: int) -> int:
        """0, or after an elastic resume the packs already consumed // G (steps before it
        were taken under the saved shape)."""
        return int(self._done(epoch).sum()) // self.global_batch

    def steps_in(self, epoch: int) -> int:
        q, r = divmod(self.n_packs - int(self._done(epoch).sum()), self.global_batch)
        return self.first_step(epoch) + (q if self.drop_last or r == 0 else q + 1)

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

    def rows(self, epoch: int, step: int) -> list[list[int]]:
        first = self.first_step(epoch)
        return self._rows(epoch, step - first, step - first + 1)[0].tolist()

    def places(self, pack: int, epoch: int, source) -> list[tuple[int, int]]:
        """By the inverse permutation: no schedule is built."""
        pack = int(pack)
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
        ``first_step`` to its end. Holds the whole epoch: for tests, stats and small datasets
        (``steps()`` computes per step)."""
        epoch = self.s.epoch if epoch is None else int(epoch)
        return self._rows(epoch, 0, self.steps_in(epoch) - self.first_step(epoch))

    def left_out(self, epoch: int) -> np.ndarray:
        """With ``drop_last``, the last ``rest % G`` of what was left to deal (``n_packs %
        G`` without a resume); empty with ``drop_last=False``."""
        return self._epoch_order(epoch).left_out()

    def new_epoch(self) -> None:
        self._resumed = self._running = None

    def deal(self, epoch: int, start: int, until: int | None):
        """Chunks of 1, 2, 4, ... steps up to ~65k packs: the first step alone is computed
        before it is yielded (a memory-mapped class table is read at G places, not 65k)."""
        first, n = self.first_step(epoch), self.steps_in(epoch)
        n = n if until is None else min(n, until)
        order, done = self._epoch_order(epoch), self._consumed_at(epoch, start)
        chunk, most, a = 1, max(1, (1 << 16) // self.global_batch), start
        while a < n:
            b = min(a + chunk, n)
            rows, classes = order.rows(a - first, b - first, classes=True)
            mine = self._balanced(rows)[:, self.s.rank]
            for s in range(len(rows)):
                done = done + np.bincount(classes[s], minlength=self.n_classes)
                self._running = (epoch, a + s + 1, done)
                yield mine[s].tolist()
            a, chunk = b, min(2 * chunk, most)

    def items(self, epoch: int, start: int) -> int:
        return (self.steps_in(epoch) - start) * self.batch_size

    def fields(self, epoch: int, step: int, roll: bool) -> dict:
        """Packs consumed per cost class (one class without balance) of the epoch's order,
        and what defines that order (seed, pack count, drop_last, balance, cost_ratio, costs'
        fingerprint) and the dataset (``index_sha256``), which must match at load.
        ``remaining``: packs of the epoch no finished step took."""
        consumed = self._consumed_at(epoch, step)
        if roll:
            epoch, step, consumed = epoch + 1, 0, np.zeros_like(consumed)
        return {"epoch": epoch, "step": step, "consumed": consumed.tolist(),
                "remaining": self.n_packs - int(consumed.sum()),
                "world_size": self.world_size, "batch_size": self.batch_size,
                "seed": self.seed, "n_packs": self.n_packs, "drop_last": self.drop_last,
                "balance": self.balance, "cost_ratio": self.cost_ratio,
                "costs_sha256": self.fingerprint, "dataset": self.dataset}

    def _consumed_at(self, epoch: int, step: int) -> np.ndarray:
        """Packs per class the epoch's steps before ``step`` consumed (all of them at the
        epoch's end: a finished epoch's left-out tail stays left out)."""
        if step >= self.steps_in(epoch):
            return self.class_sizes.copy()
        if self._running is not None and self._running[:2] == (epoch, step):
            return self._running[2].copy()
        return self._epoch_order(epoch).consumed(step - self.first_step(epoch))

    def load(self, state) -> tuple[int, int]:
        """Under the same shape the rest of the epoch is dealt exactly as the uninterrupted
        run deals it (same steps, same numbers): tests/test_sampler.py checks it for every
        step."""
        epoch, consumed = check_state(state, self)
        self._resumed = (epoch, consumed) if consumed.any() else None
        self._running = None
        return epoch, self.first_step(epoch)


class PackSampler(Sampler):
    """``Sampler(packs, rule=FixedPacks(batch_size, ...))``, or with ``tokens_per_step=T``
    (and ``curriculum``) ``rule=TokenBudget(T, curriculum)``: the call form of one packed
    dataset. ``packs``: the number of packs, a packed dataset (``open_packed(dir)``), or for
    a token budget an array of row lengths.

    >>> s = PackSampler(100, rank=1, world_size=4, batch_size=2)
    >>> s.set_epoch(0); batches = list(s.steps())        # 12 lists of 2 pack indices
    >>> state = s.state_dict(step=5)                      # after the loop finished 5 steps
    >>> t = PackSampler(100, rank=1, world_size=4, batch_size=2); t.load_state_dict(state)
    >>> list(t.steps()) == batches[5:]
    True
    >>> u = PackSampler(100, rank=0, world_size=3, batch_size=1); u.load_state_dict(state)
    >>> u.start_step, u.n_steps                           # 40 packs done; 60 left as 20 steps
    (13, 33)
    """

    def __init__(self, packs, *, rank: int, world_size: int, seed: int = 0,
                 tokens_per_step=None, curriculum=None, balance=None, **fixed):
        if tokens_per_step is None and curriculum is None:
            rule = FixedPacks(fixed.pop("batch_size", 1), balance=balance, **fixed)
        else:
            from .budget import TokenBudget

            rule = TokenBudget.of(tokens_per_step, curriculum, balance, fixed)
        super().__init__(packs, rule=rule, rank=rank, world_size=world_size, seed=seed)
