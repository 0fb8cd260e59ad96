"""Token-budget steps: every global step takes rows of one slot length ``L``, ``T / L`` of them,
so every step holds exactly ``T`` token slots (a remnant row of a ``--vsl`` dataset counts as
its slot, MIN), whatever its length; a curriculum picks each step's length.

    PackSampler(ds, rank=r, world_size=2, tokens_per_step=8192, curriculum="uniform")

    lengths      512: 3,000 rows   1024: 1,200 rows   4096: 300 rows     (ds.row_lengths())
    rows a step  16                8                  2                  (T / L: 8 per rank,
    step 0: L=512  rank 0 [rows of 512 #0..7]  rank 1 [#8..15]            4, 1 at 2 ranks)
    step 1: L=4096 rank 0 [row of 4096 #0]     rank 1 [#1]
    step 2: L=512  rank 0 [#16..23]            rank 1 [#24..31]  ...

``#i`` is position ``i`` of the length's order for the epoch: a keyed permutation of that
length's rows (:class:`packtool.train.permute.Feistel`, packtool.seeds 'budget.order' of
``[seed, epoch, L]``), computed per step, never held; the ``i``-th row of a length is found
through a table of counts per block of rows (:mod:`packtool.train.by_length`). A step of
length ``L`` takes the next ``T / L`` positions of its order, so what an epoch has consumed is
one count per length, whatever the world size or ``T`` that consumed it. Each step's length
is drawn (:mod:`packtool.train.curriculum`) from ``(seed, epoch, step, rows left per
length)`` alone: every rank draws the same, and a resume under the same settings deals the
steps of the uninterrupted run.

**Epoch end, leftovers.** A length that has fewer than ``T / L`` rows left cannot fill a step:
its weight drops to 0. The epoch ends when no length can fill one, after exactly
``sum(rows_L // (T / L))`` steps (known in advance; the curriculum orders them). What is left
(fewer than ``T / L`` rows of each length, under ``T`` tokens each) is in no step of the epoch:
``left_out()`` lists it, the state's ``remaining`` counts it, and the next epoch permutes
every row again, those included.

**Resume, elastic.** The state records the epoch, the step and the rows consumed per length,
which any other world size, ``T`` or curriculum continues: the next step draws its length from
what is left and takes the next positions of that length's order, so nothing is repeated or
skipped. Step numbers go on from the saved step (a state saved by 2 ranks after step 5 resumes
on 1 rank at step 5).

**Refused by name**: a length present whose ``T / L`` is not a whole number, or not divisible
by the world size; a curriculum that gives weight to no length that can still fill a step;
``batch_size`` (rows a step follow from ``T / L``) or ``drop_last=False`` (a leftover row would
make a step of mixed lengths).
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError
from ..formats.packed.balance import balance_steps, costs_of, fingerprint
from .by_length import RowsByLength
from .curriculum import curriculum_of, draw, draw_steps
from .permute import ROUNDS, Feistel
from .state import check_budget_state, dataset_identity


def _rows_by_length(rows) -> RowsByLength:
    """The rows' slot lengths: an array of them, ``rows.row_lengths()`` (a ``--vsl`` dataset),
    or ``len(rows)`` rows of ``rows.seq_len`` (a fixed-length dataset)."""
    if isinstance(rows, np.ndarray):
        lengths = rows
    elif hasattr(rows, "row_lengths"):
        lengths = np.asarray(rows.row_lengths())
        if lengths.shape != (len(rows),):
            raise PacktoolError(f"row_lengths() gave shape {lengths.shape} for {len(rows):,} "
                                "rows: it must give one slot length per row")
    elif hasattr(rows, "seq_len") and hasattr(rows, "__len__"):
        return RowsByLength.constant(len(rows), int(rows.seq_len))
    else:
        raise PacktoolError(
            f"tokens_per_step needs every row's slot length, and {type(rows).__name__} gives "
            "none: pass the packed dataset (open_packed(dir): row_lengths() of a --vsl pack, "
            "else seq_len) or an array of row lengths")
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise PacktoolError(f"row lengths must be a 1-D integer array, got {lengths.dtype} of "
                            f"shape {lengths.shape}")
    return RowsByLength(lengths.astype(np.int64, copy=False))


class TokenBudget:
    """The step rule of ``tokens_per_step`` token slots a global step, rows of one slot
    length ``L`` (``T / L`` of them). ``curriculum``: ``"uniform"``, ``"grow-p2"`` or a
    callable ``step -> weights per length``. ``balance`` (the sampler's argument): None,
    ``"attention"`` or per-row costs: the rows of a step dealt so every rank's share costs
    alike (:func:`balance_steps`). The sampler's ``sources``: a packed dataset or an array of
    row lengths.

    >>> lengths = np.repeat([512, 1024, 4096], [300, 120, 30])
    >>> s = PackSampler(lengths, rank=0, world_size=2, tokens_per_step=8192)
    >>> s.n_steps                                 # 300 // 16 + 120 // 8 + 30 // 2
    48
    >>> state = s.state_dict(step=5)
    >>> t = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=16384)
    >>> t.load_state_dict(state); t.start_step    # the rest as steps of 16,384 tokens
    5
    """

    name, per_epoch = "budget", True

    def __init__(self, tokens_per_step: int, curriculum="uniform", *, balance=None):
        self.tokens_per_step, self._balance = tokens_per_step, balance
        self.curriculum, self._weights = curriculum_of(curriculum)

    @classmethod
    def of(cls, tokens_per_step, curriculum, balance, kw: dict) -> TokenBudget:
        """``PackSampler(rows, tokens_per_step=T, ...)``: refuses what applies to fixed
        batches."""
        if tokens_per_step is None:
            raise PacktoolError("curriculum picks each step's slot length: give "
                                "tokens_per_step=T too (steps of T tokens of one length), or "
                                "drop curriculum")
        for name, ok in (("batch_size", 1), ("drop_last", True), ("cost_ratio", None)):
            if name in kw and kw.pop(name) != ok:
                raise PacktoolError(
                    f"{name} does not apply with tokens_per_step: a step takes T / L rows of one "
                    "slot length L (dealt evenly to the ranks) and leaves out what cannot fill a "
                    f"step; drop {name}, or drop tokens_per_step for fixed batches")
        if kw:
            raise TypeError(f"unexpected keyword argument {next(iter(kw))!r}")
        return cls(tokens_per_step, "uniform" if curriculum is None else curriculum,
                   balance=balance)

    def counts(self, rows):
        return (("tokens_per_step", self.tokens_per_step, 1),)

    def bind(self, s, rows) -> None:
        self.s, self.world_size, self.seed = s, s.world_size, s.seed
        self.tokens_per_step = int(self.tokens_per_step)
        self.index = _rows_by_length(rows)
        self.lengths, self.sizes = self.index.values, self.index.sizes
        self.n_rows = int(self.sizes.sum())
        self.per_step = self._check_shape()
        self.balance, self.costs = costs_of(rows, self._balance, self.n_rows)
        self.fingerprint = fingerprint(self.costs)
        self.dataset = None if isinstance(rows, np.ndarray) else dataset_identity(rows)
        self._resumed = None  # (epoch, step, consumed per length) of a resume
        self._sched = None  # the epoch's draws (_schedule)
        self._cache: dict = {}

    def _check_shape(self) -> np.ndarray:
        t, w = self.tokens_per_step, self.world_size
        least = int(np.lcm.reduce(self.lengths)) * w  # T / L rows divisible by w for every L
        for length, m in zip(self.lengths.tolist(), self.sizes.tolist(), strict=True):
            why = (f"is not a multiple of slot length {length:,} ({m:,} rows have it): a step "
                   f"of that length would not hold exactly {t:,} tokens" if t % length else
                   f"/ slot length {length:,} = {t // length:,} rows a step, which {w} ranks "
                   "cannot share evenly" if (t // length) % w else None)
            if why:
                raise PacktoolError(f"tokens_per_step {t:,} {why}; use a multiple of {least:,} "
                                    f"(every length {self.lengths.tolist()} x world size {w})")
        return t // self.lengths

    # ------------------------------------------------------------------ the epoch's draws

    def _keyed(self, epoch: int):
        """(draw key, per length its Feistel order) of ``epoch``, cached for two epochs."""
        from ..seeds import rng

        if epoch not in self._cache:
            if len(self._cache) >= 2:
                del self._cache[next(iter(self._cache))]
            key = int(rng(self.seed, "budget.length", epoch).integers(0, 1 << 63))
            perms = [Feistel(int(m), rng(self.seed, "budget.order", epoch, int(length))
                             .integers(0, 1 << 63, ROUNDS, dtype=np.uint64))
                     for length, m in zip(self.lengths, self.sizes, strict=True)]
            self._cache[epoch] = (key, perms)
        return self._cache[epoch]

    def _origin(self, epoch: int) -> tuple[int, np.ndarray]:
        if self._resumed is not None and self._resumed[0] == epoch:
            return self._resumed[1], self._resumed[2]
        return 0, np.zeros(len(self.lengths), np.int64)

    def _next(self, epoch: int, step: int, consumed: np.ndarray, per_step=None,
              weights=None) -> int | None:
        """The length index step ``step`` takes after ``consumed``, None at the epoch's end
        (``per_step``, ``weights``: another T's rows a step and another curriculum's)."""
        per_step = self.per_step if per_step is None else per_step
        left = self.sizes - consumed
        fill = left >= per_step
        if not fill.any():
            return None
        w = (weights or self._weights)(step, self.lengths, left * self.lengths,
                                       self.sizes * self.lengths)
        w = [int(x) if f else 0 for x, f in zip(w, fill.tolist(), strict=True)]
        if not sum(w):
            can = [int(v) for v, f in zip(self.lengths, fill, strict=True) if f]
            raise PacktoolError(
                f"curriculum {self.curriculum!r} gives step {step} of epoch {epoch} weight 0 "
                f"for every length that can still fill a step ({can}; the others have fewer "
                f"than tokens_per_step / L rows left): give one of them a weight > 0")
        return draw(self._keyed(epoch)[0], step, w)

    def draws(self, epoch: int, start: int, consumed: np.ndarray, until: int | None = None,
              per_step=None, curriculum: str | None = None):
        """(the length index of every step from ``start`` (after ``consumed``) to the epoch's
        end, or to ``until``; the refusal of a callable curriculum that stopped them early, or
        None): the named curricula by one kernel pass, a callable step by step (``per_step``,
        ``curriculum``: another T's rows a step and another curriculum)."""
        per_step = self.per_step if per_step is None else per_step
        name = self.curriculum if curriculum is None else curriculum
        n = int(((self.sizes - consumed) // per_step).sum())
        n = n if until is None else max(0, min(n, until - start))
        ks = draw_steps(name, self._keyed(epoch)[0], start, consumed, per_step,
                        self.lengths, self.sizes, n)
        if ks is None:
            weights = self._weights if name == self.curriculum else curriculum_of(name)[1]
            ks, c = np.empty(n, np.int16 if len(per_step) < 1 << 15 else np.int32), consumed.copy()
            for i in range(n):
                try:
                    ks[i] = k = self._next(epoch, start + i, c, per_step, weights)
                except PacktoolError as e:  # raised when a step reaches it
                    return ks[:i], e
                c[k] += per_step[k]
        return ks, None

    def _schedule(self, epoch: int):
        """(first step, rows consumed then, every step's length index, per length the steps
        (from the first) that take it) of ``epoch``: one pass of draws, kept for the epoch. A
        callable curriculum's refusal is raised when a question reaches its step."""
        if self._sched is None or self._sched[0] != epoch:
            first, consumed = self._origin(epoch)
            ks, stop = self.draws(epoch, first, consumed)
            order = np.argsort(ks, kind="stable").astype(np.int32 if len(ks) < 2**31 else
                                                          np.int64)  # 6 bytes a step in all
            ends = np.cumsum(np.bincount(ks, minlength=len(self.lengths)))
            self._sched = (epoch, first, consumed, ks, np.split(order, ends[:-1]), stop)
        return self._sched[1:5]

    def _reach(self, epoch: int, step: int) -> None:
        """Raise the curriculum's refusal if it stopped the draws before ``step``."""
        first, _, ks, _ = self._schedule(epoch)
        if self._sched[5] is not None and step - first > len(ks):
            raise self._sched[5]

    def _consumed_at(self, epoch: int, step: int) -> np.ndarray:
        """Rows per length consumed before ``step``: the steps of each length before it, by
        binary search in the epoch's schedule (O(lengths x log steps))."""
        first, consumed, _, taking = self._schedule(epoch)
        if step < first:
            raise PacktoolError(f"step {step} of epoch {epoch} comes before step {first}, where "
                                "this sampler resumed: ask a sampler that did not resume")
        self._reach(epoch, step)
        before = [np.searchsorted(t, step - first) for t in taking]
        return consumed + self.per_step * np.array(before, np.int64)

    def _deal(self, epoch: int, consumed: np.ndarray, k: int) -> np.ndarray:
        """The step of length index ``k`` after ``consumed``: [world_size, rows a rank]."""
        r = int(self.per_step[k])
        pos = int(consumed[k]) + np.arange(r, dtype=np.int64)
        rows = self.index.select(k, self._keyed(epoch)[1][k].perm(pos))
        b = r // self.world_size
        if self.costs is None:
            return rows.reshape(self.world_size, b)
        slots = balance_steps(self.costs[rows][None], self.world_size, b)[0]
        return rows[slots]

    # ------------------------------------------------------------------ the schedule

    def first_step(self, epoch: int) -> int:
        """0, or the step where a resume began ``epoch``."""
        return self._origin(epoch)[0]

    def steps_in(self, epoch: int) -> int:
        first, consumed = self._origin(epoch)
        return first + int(((self.sizes - consumed) // self.per_step).sum())

    def rows(self, epoch: int, step: int) -> list[list[int]]:
        """Every rank's rows of ``step``: [world_size][T / L / world_size]."""
        first, _, ks, _ = self._schedule(epoch)
        self._reach(epoch, step + 1)
        consumed = self._consumed_at(epoch, int(step))
        return self._deal(epoch, consumed, int(ks[step - first])).tolist()

    def _walk(self, epoch: int, start: int | None = None):
        """(step, rows consumed before it, its length index) of every step from ``start``
        (the epoch's first)."""
        first, consumed, ks, _ = self._schedule(epoch)
        start = first if start is None else start
        consumed = self._consumed_at(epoch, start)
        for i, k in enumerate(ks[start - first:].tolist()):
            yield start + i, consumed, k
            consumed = consumed.copy()
            consumed[k] += self.per_step[k]
        self._reach(epoch, first + len(ks) + 1)

    def step_lengths(self, epoch: int | None = None) -> np.ndarray:
        """The slot length of every step of ``epoch`` from its first step."""
        epoch = self.s.epoch if epoch is None else int(epoch)
        first, _, ks, _ = self._schedule(epoch)
        self._reach(epoch, first + len(ks) + 1)
        return self.lengths[ks]

    def global_schedule(self, epoch: int | None = None) -> list[np.ndarray]:
        """Every step's [world_size, rows a rank] from the epoch's first step (for tests)."""
        epoch = self.s.epoch if epoch is None else int(epoch)
        return [self._deal(epoch, c, k) for _, c, k in self._walk(epoch)]

    def places(self, row: int, epoch: int, source) -> list[tuple[int, int]]:
        """[(step, rank)] where ``epoch`` takes ``row``: one, or none (left out, or consumed
        before the resume); the step is the (i / (T / L))-th of the row's length, looked up."""
        row = int(row)
        if not 0 <= row < self.n_rows:
            raise PacktoolError(f"row {row} is not one of the {self.n_rows:,} rows")
        k, local = self.index.locate(row)
        i = int(self._keyed(epoch)[1][k].inverse([local])[0])
        first, consumed, _, taking = self._schedule(epoch)
        u = (i - int(consumed[k])) // int(self.per_step[k])
        if i < consumed[k]:
            return []
        if u >= len(taking[k]):
            self._reach(epoch, self.steps_in(epoch))  # a callable's refusal came first
            return []
        step = first + int(taking[k][u])
        dealt = self._deal(epoch, self._consumed_at(epoch, step), k)
        return [(step, int(np.argwhere(dealt == row)[0][0]))]

    def left_out(self, epoch: int) -> np.ndarray:
        """Per length, the last ``left % (T / L)`` of what was left to deal (fewer than a
        step)."""
        _, consumed = self._origin(epoch)
        perms, out = self._keyed(epoch)[1], []
        for k, (m, r) in enumerate(zip(self.sizes.tolist(), self.per_step.tolist(),
                                       strict=True)):
            c = int(consumed[k])
            start = c + (m - c) // r * r
            out.append(self.index.select(k, perms[k].perm(np.arange(start, m))))
        return np.sort(np.concatenate(out))

    # ------------------------------------------------------------------ iteration and state

    def new_epoch(self) -> None:
        self._resumed = self._sched = None

    def deal(self, epoch: int, start: int, until: int | None):
        """This rank's rows (lists of ``T / L / world_size`` indices), one step at a time."""
        for step, consumed, k in self._walk(epoch, start):
            if until is not None and step >= until:
                return
            yield self._deal(epoch, consumed, k)[self.s.rank].tolist()

    def items(self, epoch: int, start: int) -> int:
        """Known without drawing: every length gives ``left // (T / L)`` steps of ``T / L /
        world_size`` rows a rank."""
        full = (self.sizes - self._consumed_at(epoch, start)) // self.per_step
        return int((full * (self.per_step // self.world_size)).sum())

    def fields(self, epoch: int, step: int, roll: bool) -> dict:
        """The rows consumed per length and what defines the orders (seed, rows per length,
        costs, dataset); world size, ``tokens_per_step``, curriculum and balance may change."""
        consumed, (first, at) = self._consumed_at(epoch, step), self._origin(epoch)
        if roll:
            epoch, step, consumed, first, at = epoch + 1, 0, np.zeros_like(consumed), 0, 0 * at
        names = [str(v) for v in self.lengths.tolist()]
        origin = {"step": first, "tokens": int((at * self.lengths).sum()),
                  "consumed": dict(zip(names, at.tolist(), strict=True))}
        return {"epoch": epoch,
                "step": step, "consumed": dict(zip(names, consumed.tolist(), strict=True)),
                "remaining": self.n_rows - int(consumed.sum()),
                "origin": origin,
                "world_size": self.world_size, "tokens_per_step": self.tokens_per_step,
                "curriculum": self.curriculum, "seed": self.seed,
                "rows": dict(zip(names, self.sizes.tolist(), strict=True)),
                "balance": self.balance, "costs_sha256": self.fingerprint,
                "dataset": self.dataset}

    def load(self, state) -> tuple[int, int]:
        """Refused by name: a malformed state, a fixed-length PackSampler's state, another
        seed, other rows per length or dataset, a step that disagrees with the rows consumed,
        rows consumed that the draws from the state's origin do not give."""
        epoch, step, consumed = check_budget_state(state, self)
        self._resumed = (epoch, step, consumed) if step else None
        self._sched = None
        return epoch, step
