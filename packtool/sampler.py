"""Which packs each rank reads, step by step: shuffled, rank-sharded, resumable, balanced.

An epoch is one seeded permutation of the packs, cut into global steps of
``world_size * batch_size`` packs; rank r takes ``batch_size`` of each step's packs::

    epoch 3, seed 0 -> permutation   17  4 88 23 | 61  9 40 12 | ...     world_size 2, batch 2
    step 0: rank 0 [17, 4]  rank 1 [88, 23]       (balance=None: in permutation order)
    step 1: rank 0 [61, 12] rank 1 [9, 40]        (balance="attention": by cost, see below)

Every rank computes the same schedule from ``(seed, epoch)`` alone, so ranks never talk to
each other, every rank takes exactly ``n_steps`` steps (``drop_last=True`` drops the last
``n_packs % (world_size * batch_size)`` packs of the permutation; ``drop_last=False`` wraps,
repeating its first packs), and a run resumed from ``state_dict(step)`` yields, batch for
batch, what the uninterrupted run would have: the state is ``(epoch, step)``, not a position
in an iterator, so it does not depend on DataLoader workers or their prefetching.

Why a step index the trainer passes in: a DataLoader with workers asks the sampler for
``2 * num_workers`` batches ahead of the model, so what the sampler has handed out is not what
was trained on. Only the training loop knows how many steps it finished.

``balance="attention"``: attention costs ~sum of squared segment lengths, so a pack holding one
4,096-token document costs ~40x one holding forty 100-token documents, and in data parallelism the
slowest rank sets the step time. Within every global step the step's packs are dealt to ranks
by longest-processing-time-first with at most ``batch_size`` packs per rank (the costliest pack
goes to the least-loaded rank that still has room), then improved by swaps between the costliest
and the cheapest rank, vectorised over all steps of the epoch at once. Measured by
``python scripts/bench_balance.py`` (10M lognormal lengths, median 300, bfd at L=4096 -> 1.19M
packs, world size 8), mean over steps of max-rank / mean-rank cost, shuffled vs balanced
(lower bound; seconds per epoch schedule)::

    packs per rank per step   1      2              4               8
    shuffled                  2.48   2.00           1.67            1.46
    balance="attention"       2.48   1.56 (1.55)    1.056 (1.032)   1.002 (1.000; 0.5 s)

With one pack per rank there is nothing to deal; from 4 up the slowest rank is within ~5% of
the mean (8: 0.2%), against 46-67% shuffled.
"""

from __future__ import annotations

import numpy as np

from .errors import PacktoolError

STATE_VERSION = 1


def attention_costs(packed) -> np.ndarray:
    """Per pack, the sum of its squared segment lengths (float64), from every shard's
    segment table (no token is read; see :mod:`packtool.formats.packed.layout`)."""
    return packed.attention_costs()


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
    if batch_size == 1 or world_size == 1:
        return slots  # one pack per rank, or one rank: nothing to swap
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


class PackSampler:
    """This rank's pack indices, step by step, for one epoch at a time.

    ``packs``: the number of packs, or a packed dataset (``open_packed(dir)``, anything with
    ``len()``; ``balance="attention"`` reads its cu_seqlens). ``batch_size``: packs per rank per
    step. ``balance``: None, ``"attention"``, or an array of per-pack costs.

    >>> s = PackSampler(100, rank=1, world_size=4, batch_size=2)
    >>> s.set_epoch(0); batches = list(s.steps())        # 12 lists of 2 pack indices
    >>> state = s.state_dict(step=5)                      # after the loop finished 5 steps
    >>> t = PackSampler(100, rank=1, world_size=4, batch_size=2); t.load_state_dict(state)
    >>> list(t.steps()) == batches[5:]
    True

    Iterating (``iter(s)``, ``s.steps()``) starts at the resumed step once, then at step 0 of
    later epochs.
    """

    def __init__(self, packs, *, rank: int, world_size: int, seed: int = 0,
                 drop_last: bool = True, balance=None, batch_size: int = 1):
        n = packs if isinstance(packs, (int, np.integer)) else len(packs)
        for name, v, lo in (("n_packs", n, 1), ("world_size", world_size, 1),
                            ("batch_size", batch_size, 1), ("seed", seed, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise PacktoolError(f"{name} must be an integer >= {lo}, got {v!r}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < world_size:
            raise PacktoolError(f"rank must be in 0..{world_size - 1} (world_size {world_size}), "
                                f"got {rank!r}")
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
        self.epoch, self.start_step = 0, 0
        self._schedule_key, self._schedule = None, None

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
        if costs.shape != (self.n_packs,) or not np.isfinite(costs).all():
            raise PacktoolError(f"balance costs must be {self.n_packs:,} finite numbers (one per "
                                f"pack), got shape {costs.shape}")
        return costs

    @property
    def n_steps(self) -> int:
        """Steps every rank takes per epoch."""
        q, r = divmod(self.n_packs, self.global_batch)
        return q if self.drop_last or r == 0 else q + 1

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (the same on every rank). Changing the epoch drops a pending
        resume offset; setting the resumed epoch again keeps it."""
        if int(epoch) != self.epoch:
            self.start_step = 0
        self.epoch = int(epoch)

    def global_schedule(self, epoch: int | None = None) -> np.ndarray:
        """[n_steps, world_size, batch_size] pack indices of every rank for ``epoch``."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._schedule_key == epoch:
            return self._schedule
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_packs)
        need = self.n_steps * self.global_batch
        order = np.resize(perm, need)  # drop the tail, or wrap around to the first packs
        steps = order.reshape(self.n_steps, self.global_batch)
        if self.costs is not None:
            slots = balance_steps(self.costs[steps], self.world_size, self.batch_size)
            steps = np.take_along_axis(steps, slots.reshape(self.n_steps, -1), axis=1)
        sched = steps.reshape(self.n_steps, self.world_size, self.batch_size)
        self._schedule_key, self._schedule = epoch, sched
        return sched

    def steps(self):
        """This rank's batches (lists of pack indices) from the resume point to the epoch's end."""
        start, self.start_step = self.start_step, 0
        mine = self.global_schedule()[:, self.rank]
        for s in range(start, self.n_steps):
            yield mine[s].tolist()

    def __iter__(self):
        for batch in self.steps():
            yield from batch

    def __len__(self) -> int:
        """Pack indices the next iteration yields (a full epoch unless resuming)."""
        return (self.n_steps - self.start_step) * self.batch_size

    def state_dict(self, step: int) -> dict:
        """Where to resume: ``step`` = steps of the current epoch the training loop has finished
        (counted from the epoch's start, also after a resume; ``sampler.start_step`` read before
        the loop is where a resumed iteration begins)."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) \
                or not 0 <= step <= self.n_steps:
            raise PacktoolError(f"step must be 0..{self.n_steps} (steps per epoch), got {step!r}")
        epoch, step = (self.epoch + 1, 0) if step == self.n_steps else (self.epoch, int(step))
        return {"version": STATE_VERSION, "epoch": epoch, "step": step, "seed": self.seed,
                "n_packs": self.n_packs, "world_size": self.world_size,
                "batch_size": self.batch_size, "drop_last": self.drop_last,
                "balance": self.balance}

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration starts at ``state['step']`` of ``state['epoch']``.
        Refuses a state from a different schedule (seed, pack count, world size, batch size,
        drop_last, balance), naming the field: those would give different batches."""
        if state.get("version") != STATE_VERSION:
            raise PacktoolError(f"sampler state version {state.get('version')!r} is not "
                                f"{STATE_VERSION}; it was saved by another packtool version")
        mine = self.state_dict(0)
        for key in ("seed", "n_packs", "world_size", "batch_size", "drop_last", "balance"):
            if state.get(key) != mine[key]:
                raise PacktoolError(
                    f"sampler state has {key}={state.get(key)!r} but this sampler has "
                    f"{key}={mine[key]!r}; resuming would give different batches: build the "
                    f"sampler with the saved {key}")
        self.epoch, self.start_step = int(state["epoch"]), int(state["step"])
