"""``MixtureSampler``: rows of several packed datasets (sources) per step, in proportions that
a schedule sets and may change mid-run, with a ledger of what each source gave and an exact
resume, also under another schedule, world size or batch size::

    MixtureSampler({"web": ds_web, "code": ds_code}, schedule=[(0, {"web": 0.7, "code": 0.3}),
                   (50_000, {"web": 0.5, "code": 0.5})], rank=r, world_size=8, batch_size=4)

    step s: G = 8 x 4 = 32 rows; slot j of the step -> a source by deadline order
            (:mod:`.schedule`: from each point on, every source's count of rows is its weight
            times the rows taken, rounded down or up)
            the source's rows come in its own epoch order, one after the other
            rank r takes slots r * 4 .. r * 4 + 3 (each rank a mix of the sources)

**A source's stream.** Source ``name`` reads its rows (packs) in a seeded permutation per
epoch (packtool.seeds 'mixture.epoch', keyed by the crc32 of its name, so adding a source
leaves the others' orders alone). Rows are taken from it in that order, never repeated or
skipped within an epoch; when an epoch is used up, ``exhausted="next_epoch"`` starts the next
(the ledger counts it) and ``exhausted="stop"`` ends the iteration before the first step that
would need a row of it.

**State and resume.** What was consumed is, per source, a position in its stream (epoch, rows
of it taken): the state records those at the step the training loop finished, with the step,
the sources' identities (``index_sha256`` of a packed dataset, else its row count) and the
deadline order's counters. Loading it continues each source from its position, so no row of
any source is repeated or skipped in its epoch, at any world size or batch size. Under the
same schedule the run continues exactly (the steps are those of the uninterrupted run at the
same shape); under another, the weights the new schedule gives the resume step count from
that step on (a new segment: the bound holds from it), and its later points as written.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import cached_property

import numpy as np

from ..errors import PacktoolError
from .sampler import Sampler
from .schedule import Segment, check_schedule, counts_after, deal, least_step
from .state import check_mixture_state

EXHAUSTED = ("next_epoch", "stop")


@dataclass(frozen=True)
class Cursor:
    """Where the mixture stands before ``step``: its segment (index into the sampler's
    segments), the segment's rows taken and per source count, and per source its epoch and
    rows of that epoch taken (0..n: an epoch used up rolls over when its next row is
    needed)."""

    step: int
    seg: int
    taken: int
    counts: tuple
    epoch: tuple
    pos: tuple


class Source:
    """A source's rows and what tells it apart: a packed dataset (``index_sha256``, tokens per
    row from its pack lengths) or a row count (tokens: rows x ``seq_len`` when given)."""

    def __init__(self, name: str, data, seq_len: int | None):
        n = data if isinstance(data, (int, np.integer)) else len(data)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise PacktoolError(f"source {name!r} has {n!r} rows: a source must be a packed "
                                "dataset (open_packed(dir)) or a row count >= 1")
        self.name, self.n, self.data = name, int(n), data
        index = getattr(data, "index", None)  # a wrapper (TorchPackedDataset) by its rows:
        sha = index.get("index_sha256") if isinstance(index, Mapping) else None  # as saved
        self.identity = {"index_sha256": sha} if sha else {"n_rows": self.n}
        self.seq_len = getattr(data, "seq_len", None) or seq_len
        self.tokens_from = ("pack lengths" if hasattr(data, "shard") else
                            "rows x seq_len" if self.seq_len else None)

    @cached_property
    def lengths(self) -> np.ndarray:
        """Tokens of every row (pack), from the shards' segment tables (no token read)."""
        ds = self.data
        return np.concatenate(
            [np.diff(np.asarray(ds.shard(k).po, np.int64)) for k in range(ds.n_shards)])

    def tokens(self, order: np.ndarray, epoch: int, pos: int) -> int | None:
        if self.tokens_from is None:
            return None
        if self.tokens_from == "rows x seq_len":
            return (epoch * self.n + pos) * int(self.seq_len)
        lengths = self.lengths
        return epoch * int(lengths.sum()) + int(lengths[order[:pos]].sum())


class Mixture:
    """The step rule of rows of several packed datasets (the sampler's sources: {name: packed
    dataset or row count}). ``schedule``: ``[(step, {name: weight}), ...]`` (see
    :mod:`packtool.train.schedule`), or one dict for the whole run. ``batch_size``: rows per
    rank per step. ``exhausted``: ``"next_epoch"`` (a source used up starts its next epoch)
    or ``"stop"``. ``seq_len``: tokens per row for the ledger of a source given as a row
    count. Steps count from the run's start: the sources keep epochs of their own."""

    name, per_epoch = "mixture", False

    def __init__(self, schedule, batch_size: int = 1, *, exhausted: str = "next_epoch",
                 seq_len: int | None = None):
        if exhausted not in EXHAUSTED:
            raise PacktoolError(f"exhausted must be 'next_epoch' (a source used up starts its "
                                f"next epoch) or 'stop', got {exhausted!r}")
        self.schedule, self.batch_size, self.exhausted = schedule, batch_size, exhausted
        self.seq_len = seq_len

    def counts(self, datasets):
        if not isinstance(datasets, Mapping) or not datasets:
            raise PacktoolError(f"datasets must be a non-empty dict {{source name: packed "
                                f"dataset or row count}}, got {type(datasets).__name__}")
        bad = [n for n in datasets if not isinstance(n, str) or not n]
        if bad:
            raise PacktoolError(f"source names must be non-empty strings, got {bad[0]!r}")
        return (("batch_size", self.batch_size, 1),)

    def bind(self, s, datasets) -> None:
        self.s, self.seed, self.world_size = s, s.seed, s.world_size
        self.names = sorted(datasets)
        self.sources = [Source(n, datasets[n], self.seq_len) for n in self.names]
        self.batch_size = int(self.batch_size)
        self.global_batch = self.world_size * self.batch_size
        self.segments: list[Segment] = check_schedule(self.schedule, self.names)
        zeros = (0,) * len(self.names)
        self._begin(Cursor(0, 0, 0, zeros, zeros, zeros))
        self._orders: dict = {}

    def _begin(self, origin: Cursor) -> None:
        self._origin = origin
        n = [src.n for src in self.sources]
        self._total0 = tuple(_stream(e, p, n_) for e, p, n_ in zip(origin.epoch, origin.pos, n,
                                                                    strict=True))
        # rows of each source's stream the sampler may take: with exhausted="stop" the rest of
        # the epoch it stands in at the origin
        self._limit = None if self.exhausted != "stop" else tuple(
            (e + 1) * n_ for e, n_ in zip(origin.epoch, n, strict=True))
        self._stop = None  # the step the sampler stops before (stop), found when asked

    # ------------------------------------------------------------------ the streams

    def order(self, source: str, epoch: int) -> np.ndarray:
        """Source ``source``'s rows in the order ``epoch`` takes them (from the seed, the
        source's name and the epoch alone)."""
        from ..seeds import rng

        i = self._index(source)
        key = (i, int(epoch))
        if key not in self._orders:
            if len(self._orders) >= 2 * len(self.names):
                del self._orders[next(iter(self._orders))]
            self._orders[key] = rng(self.seed, "mixture.epoch", zlib.crc32(source.encode()),
                                    int(epoch)).permutation(self.sources[i].n)
        return self._orders[key]

    def _index(self, source: str) -> int:
        if source not in self.names:
            raise PacktoolError(f"no source {source!r}: this sampler's sources are "
                                f"{', '.join(self.names)}")
        return self.names.index(source)

    def _take(self, i: int, epoch: list, pos: list, m: int) -> np.ndarray | None:
        """Source i's next ``m`` rows (epoch and pos updated), None when ``exhausted="stop"``
        and its epoch has fewer left."""
        n, out = self.sources[i].n, []
        while m:
            if pos[i] == n:
                if self.exhausted == "stop":
                    return None
                epoch[i], pos[i] = epoch[i] + 1, 0
            k = min(m, n - pos[i])
            out.append(self.order(self.names[i], epoch[i])[pos[i]:pos[i] + k])
            pos[i], m = pos[i] + k, m - k
        return np.concatenate(out)

    # ------------------------------------------------------------------ the steps

    def _advance(self, cur: Cursor):
        """(cursor after step ``cur.step``, its (source index, row) per slot), or None when
        the sampler stops there (``exhausted="stop"``)."""
        seg, taken, counts, slots = self._deal(cur)
        need = np.bincount(slots, minlength=len(self.names))
        epoch, pos, rows = list(cur.epoch), list(cur.pos), {}
        for i in np.flatnonzero(need).tolist():
            got = self._take(i, epoch, pos, int(need[i]))
            if got is None:
                return None
            rows[i] = iter(got.tolist())
        pairs = [(i, next(rows[i])) for i in slots]
        return Cursor(cur.step + 1, seg, taken + self.global_batch, tuple(counts),
                      tuple(epoch), tuple(pos)), pairs

    def _deal(self, cur: Cursor):
        """(segment, its rows taken and counts after step ``cur.step``, the step's sources
        per slot): a schedule point at this step starts a new segment."""
        seg, taken, counts = cur.seg, cur.taken, list(cur.counts)
        while seg + 1 < len(self.segments) and self.segments[seg + 1].start <= cur.step:
            seg, taken, counts = seg + 1, 0, [0] * len(counts)
        return seg, taken, counts, deal(self.segments[seg], taken, counts, self.global_batch)

    def _cursor_at(self, step: int) -> Cursor:
        """The cursor before ``step`` (>= start_step), computed, not replayed: per schedule
        segment the rows it dealt (:func:`.schedule.counts_after`), O(segments) for any step."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) \
                or step < self._origin.step:
            raise PacktoolError(f"step must be an integer >= {self._origin.step:,} (the first "
                                "step of this sampler" + (", where it resumed" if self._origin.step
                                                          else "") + f"), got {step!r}")
        step = int(step)
        if self.exhausted == "stop" and step > self._stop_step():
            raise PacktoolError(self._stopped(self._at(self._stop_step()), f"step {step:,}"))
        return self._at(step)

    def _at(self, step: int) -> Cursor:
        o = self._origin
        seg, taken, counts, at = o.seg, o.taken, o.counts, o.step
        total = list(self._total0)
        while at < step:
            if seg + 1 < len(self.segments) and self.segments[seg + 1].start <= at:
                seg, taken, counts = seg + 1, 0, (0,) * len(self.names)
            nxt = self.segments[seg + 1].start if seg + 1 < len(self.segments) else step
            end = min(step, nxt)
            rows = taken + (end - at) * self.global_batch
            new = counts_after(self.segments[seg], rows)
            total = [t + b - a for t, a, b in zip(total, counts, new, strict=True)]
            at, taken, counts = end, rows, new
        places = [_place(t, e, p, t0, src.n) for t, e, p, t0, src in zip(
            total, o.epoch, o.pos, self._total0, self.sources, strict=True)]
        return Cursor(step, seg, taken, tuple(counts), tuple(e for e, _ in places),
                      tuple(p for _, p in places))

    def _total(self, step: int) -> list[int]:
        """Per source, rows of its stream taken before ``step``."""
        c = self._at(step)
        return [_stream(e, p, src.n) for e, p, src in zip(c.epoch, c.pos, self.sources,
                                                          strict=True)]

    def _stop_step(self) -> int:
        """exhausted="stop": the first step that needs a row past a source's epoch."""
        if self._stop is None:
            self._stop = least_step(self._origin.step, lambda s: any(
                t > lim for t, lim in zip(self._total(s + 1), self._limit, strict=True)))
        return self._stop

    def _stopped(self, cur: Cursor, what: str) -> str:
        need = np.bincount(self._deal(cur)[3], minlength=len(self.names))
        short = [f"{s.name} has {s.n - p:,} row(s) of its epoch {e} left and the step needs "
                 f"{int(k):,}" for s, p, e, k in zip(self.sources, cur.pos, cur.epoch, need,
                                                      strict=True) if s.n - p < k]
        return (f"{what} is past the sampler's last step: it stops before step {cur.step:,} "
                f"(exhausted='stop'): {'; '.join(short)}; use exhausted='next_epoch' to go on")

    def first_step(self, epoch: int) -> int:
        return self._origin.step

    def steps_in(self, epoch: int) -> None:
        return None  # with exhausted="stop" the stream ends where a source runs out

    def left_out(self, epoch: int) -> np.ndarray:
        return np.zeros(0, np.int64)  # every source's rows come in its own epochs, in full

    def items(self, epoch: int, start: int) -> int:
        raise TypeError("a mixture's stream has no length: iterate with steps(until=N)")

    def deal(self, epoch: int, start: int, until: int | None):
        """This rank's lists of ``batch_size`` (source name, row) pairs from ``start``; with
        ``exhausted="next_epoch"`` and no ``until`` the stream never ends."""
        cur = self._cursor_at(start)
        lo = self.s.rank * self.batch_size
        while until is None or cur.step < until:
            nxt = self._advance(cur)
            if nxt is None:
                return
            cur, pairs = nxt
            yield [(self.names[i], r) for i, r in pairs[lo:lo + self.batch_size]]

    def rows(self, epoch: int, step: int) -> list[list[tuple[str, int]]]:
        """Every rank's (source, row) pairs of global ``step`` (from the run's start)."""
        nxt = self._advance(self._cursor_at(step))
        if nxt is None:
            raise PacktoolError(self._stopped(self._cursor_at(step), f"step {step:,}"))
        b = self.batch_size
        return [[(self.names[i], r) for i, r in nxt[1][k * b:(k + 1) * b]]
                for k in range(self.world_size)]

    def places(self, row: int, epoch: int, source: str | None) -> list[tuple[int, int]]:
        """[(step, rank)] that takes row ``row`` of ``source`` in its epoch ``epoch``; none
        when the sampler never does (it stops first, or the source's weight is 0 from some
        point on before it)."""
        if source is None:
            raise PacktoolError(f"a mixture's row is a row of one source: name it (one of "
                                f"{', '.join(self.names)})")
        i = self._index(source)
        n = self.sources[i].n
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < n:
            raise PacktoolError(f"row must be an integer 0..{n - 1:,} (source {source}), got "
                                f"{row!r}")
        order = self.order(source, epoch)
        at = int(epoch) * n + int(np.flatnonzero(order == row)[0])  # its place in the stream
        if self._total(self._origin.step)[i] > at:
            raise PacktoolError(f"row {row} of {source} (epoch {epoch}) was taken before step "
                                f"{self._origin.step:,}, where this sampler resumed; ask a sampler "
                                "that did not resume")
        last = max(self.segments[-1].start, self._origin.step)
        if not self.segments[-1].shares[i] and self._total(last)[i] <= at:
            return []  # weight 0 from there on: never
        step = least_step(self._origin.step, lambda s: self._total(s + 1)[i] > at)
        if self.exhausted == "stop" and step >= self._stop_step():
            return []
        cur = self._at(step)
        k = at - _stream(cur.epoch[i], cur.pos[i], n)  # the step's k-th row of source i
        slot = [j for j, (src, _) in enumerate(self._advance(cur)[1]) if src == i][k]
        return [(step, slot // self.batch_size)]

    # ------------------------------------------------------------------ the ledger

    def ledger(self, step: int) -> dict:
        """Per source, what steps before ``step`` consumed since the run began (a resumed
        sampler: counted from the state's positions): ``rows``, ``epochs`` (started, the
        current one included), ``tokens`` and ``tokens_from`` ("pack lengths" of a packed
        dataset, "rows x seq_len" of a row count given ``seq_len``, None: unknown)."""
        cur = self._cursor_at(step)
        out = {}
        for i, src in enumerate(self.sources):
            e, p = cur.epoch[i], cur.pos[i]
            order = self.order(src.name, e) if src.tokens_from == "pack lengths" else None
            out[src.name] = {"rows": e * src.n + p, "epochs": e + (p > 0),
                             "tokens": src.tokens(order, e, p), "tokens_from": src.tokens_from}
        return out

    # ------------------------------------------------------------------ state

    def fields(self, epoch: int, step: int, roll: bool) -> dict:
        """Per source its identity and position (epoch, rows of it taken), the schedule's
        segment and its counters, and the origin (step, rows) where this sampler began."""
        cur, total = self._cursor_at(step), self._total(step)
        seg = self.segments[cur.seg]
        return {"step": cur.step,
                "world_size": self.world_size, "batch_size": self.batch_size,
                "seed": self.seed, "exhausted": self.exhausted,
                "segment": {"start": seg.start, "weights": _weights_json(seg, self.names),
                            "rows": cur.taken,
                            "counts": dict(zip(self.names, cur.counts, strict=True)),
                            "positions": {n: t - c for n, t, c in zip(
                                self.names, total, cur.counts, strict=True)}},
                "origin": {"step": self._origin.step, "rows": sum(self._total0)},
                "sources": {s.name: {**s.identity, "n_rows": s.n, "epoch": cur.epoch[i],
                                     "position": cur.pos[i]}
                            for i, s in enumerate(self.sources)}}

    def load(self, state) -> tuple[None, int]:
        """Every source goes on from its position. Refused by name: a malformed state,
        another format or version, another seed, other sources (by name, or a source whose
        identity differs)."""
        step, seg, taken, counts, epoch, pos = check_mixture_state(state, self)
        mine = max(k for k, s in enumerate(self.segments) if s.start <= step)
        later = self.segments[mine + 1:]
        same = self.segments[mine].start <= seg.start and \
            _weights_json(self.segments[mine], self.names) == _weights_json(seg, self.names)
        if same:  # the same weights since the saved segment began: it goes on
            self.segments = [seg, *later]
        else:  # the new schedule's weights count from the resume step on
            self.segments = [replace(self.segments[mine], start=step), *later]
            taken, counts = 0, (0,) * len(self.names)
        self._begin(Cursor(step, 0, taken, counts, epoch, pos))
        return None, step


def _stream(epoch: int, pos: int, n: int) -> int:
    """Rows of a source's stream taken at (epoch, rows of it taken)."""
    return epoch * n + pos


def _place(total: int, epoch: int, pos: int, total0: int, n: int) -> tuple[int, int]:
    """(epoch, rows of it) after ``total`` rows of the stream, as taking them one by one from
    (``epoch``, ``pos``) = ``total0`` leaves it: an epoch used up rolls over when its next row
    is taken, so ``n`` rows of epoch 0 stand at (0, n)."""
    if total == total0:
        return epoch, pos
    e = (total - 1) // n
    return e, total - e * n


def _weights_json(seg: Segment, names: list[str]) -> dict:
    """A segment's weights as exact fractions ("7/10"), by source."""
    return {n: str(Fraction(a, seg.total)) for n, a in zip(names, seg.shares, strict=True)}


class MixtureSampler(Sampler):
    """``Sampler(datasets, rule=Mixture(schedule, batch_size, ...))``: this rank's ``(source,
    row)`` pairs, step by step, over several packed datasets.

    >>> s = MixtureSampler({"web": 700, "code": 300}, {"web": 0.7, "code": 0.3}, rank=0,
    ...                    world_size=2, batch_size=5)
    >>> batches = list(s.steps(until=10))          # 10 lists of 5 (source, row) pairs
    >>> s.ledger(10)["web"]["rows"]                 # 70 of the 100 rows, to the row
    70
    >>> state = s.state_dict(step=4)                # after the loop finished 4 steps
    >>> t = MixtureSampler({"web": 700, "code": 300}, {"web": 0.5, "code": 0.5}, rank=0,
    ...                    world_size=1, batch_size=3)
    >>> t.load_state_dict(state); t.start_step     # 50/50 from step 4 on, 3 rows a step
    4
    """

    def __init__(self, datasets, schedule, *, rank: int, world_size: int, batch_size: int = 1,
                 seed: int = 0, exhausted: str = "next_epoch", seq_len: int | None = None):
        super().__init__(datasets, rule=Mixture(schedule, batch_size, exhausted=exhausted,
                                                seq_len=seq_len),
                         rank=rank, world_size=world_size, seed=seed)
