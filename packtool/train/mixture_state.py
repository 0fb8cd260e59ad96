"""The mixture rule's state fields (:mod:`.state` reads the envelope): the sources by name and
identity (a packed dataset's ``index_sha256``, else its row count) with each one's epoch and
position, the schedule segment (start, weights, rows, counts, the positions where it began)
and the origin (step, rows) where the run began, every count in range and all of them what
the schedule computes from each other. World size, batch size, ``exhausted`` and the schedule
may change at a resume."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from ..errors import PacktoolError
from .schedule import Segment, counts_after
from .state import read_state

_MIXTURE_FIELDS = ("format", "version", "step", "world_size", "batch_size", "seed", "exhausted",
           "segment", "sources")


def check_mixture_state(state, sampler):
    """(step, saved segment, its rows taken and counts, epochs, positions) of a well-formed
    state of ``sampler``'s sources, or a PacktoolError naming what is wrong."""
    read_state(state, "mixture", _MIXTURE_FIELDS)
    step = _count(state["step"], "step")
    if state["seed"] != sampler.seed:
        raise PacktoolError(
            f"sampler state has seed={state['seed']!r} but this sampler has seed="
            f"{sampler.seed!r}: every source's epoch order comes from the seed, and resuming "
            "would repeat and skip rows; build the sampler with the saved seed")
    epoch, pos = _sources(state["sources"], sampler)
    seg, taken, counts = _segment(state["segment"], sampler.names, step)
    _agree(state, sampler, step, seg, taken, counts,
           [e * src.n + p for e, p, src in zip(epoch, pos, sampler.sources, strict=True)])
    return step, seg, taken, counts, epoch, pos


def _agree(state, sampler, step: int, seg: Segment, taken: int, counts: tuple,
           total: list[int]) -> None:
    """The counts, positions and step are what the schedule computes from each other: the
    segment's counts are the deadline order's after its rows; each source's rows since the
    segment began are its count; every step since the state's origin (0, or where a resume
    began) took ``world_size x batch_size`` rows. A state of packtool before issue 38 has no
    origin (nor the segment's start positions): its step is checked to be at most its rows, and
    its positions against the counts where its segment began at step 0."""
    names = sampler.names
    want = counts_after(seg, taken)
    if tuple(want) != tuple(counts):
        raise PacktoolError(
            f"sampler state has segment counts {dict(zip(names, counts, strict=True))} after "
            f"{taken:,} rows, but the schedule's deadline order gives "
            f"{dict(zip(names, want, strict=True))}: resuming would break the weights' bound "
            "and take rows in other proportions; the state is corrupt, save it again")
    saved = state["segment"].get("positions")
    if saved is None and seg.start == 0:
        saved = dict.fromkeys(names, 0)
    if saved is not None:
        if not isinstance(saved, Mapping) or set(saved) != set(names):
            raise PacktoolError(f"sampler state has segment.positions={saved!r}: it must give "
                                "every source's rows; the state is corrupt, save it again")
        for n, t, c in zip(names, total, counts, strict=True):
            at = _count(saved[n], f"segment.positions.{n}")
            if t - at != c:
                raise PacktoolError(
                    f"sampler state has source {n} at position {t:,} of its stream (epoch x "
                    f"rows + position) but its segment began at {at:,} and counts {c:,} rows "
                    f"of {n}: a row would be {'repeated' if t - at < c else 'skipped'}; the "
                    "state is corrupt, save it again")
    g = _count(state["world_size"], "world_size") * _count(state["batch_size"], "batch_size")
    origin = state.get("origin")
    if origin is None:
        s0, rows0, ok = 0, 0, step <= sum(total)
    else:
        if not isinstance(origin, Mapping) or set(origin) != {"step", "rows"}:
            raise PacktoolError(f"sampler state has origin={origin!r}: it must be {{'step': S, "
                                "'rows': N}}; the state is corrupt, save it again")
        s0, rows0 = _count(origin["step"], "origin.step", step), _count(origin["rows"],
                                                                          "origin.rows")
        ok = sum(total) - rows0 == (step - s0) * g and (
            seg.start <= s0 or taken == (step - seg.start) * g)
    if not ok:
        raise PacktoolError(
            f"sampler state has step={step:,} but its sources took {sum(total) - rows0:,} rows "
            f"since step {s0:,}, at {g} rows a step (world_size x batch_size): one of the two "
            "is wrong and resuming would repeat or skip rows; the state is corrupt, save it "
            "again")


def _count(v, what: str, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (hi is not None and v > hi):
        limit = "an integer >= 0" + (f" and <= {hi:,}" if hi is not None else "")
        raise PacktoolError(f"sampler state has {what}={v!r}: it must be {limit}; the state "
                            "is corrupt, save it again")
    return v


def _sources(saved, sampler) -> tuple[tuple, tuple]:
    """Per source (in the sampler's name order) its saved epoch and position."""
    if not isinstance(saved, Mapping):
        raise PacktoolError(f"sampler state has sources={saved!r}: it must be a dict by source "
                            "name; the state is corrupt, save it again")
    missing = [n for n in sampler.names if n not in saved]
    extra = sorted(str(n) for n in saved if n not in sampler.names)
    if missing or extra:
        raise PacktoolError(
            f"mixture state is of the sources {', '.join(sorted(map(str, saved)))} but this "
            f"sampler has {', '.join(sampler.names)}"
            + (f" (the state lacks {', '.join(missing)}" if missing else " (")
            + (f"{'; ' if missing else ''}the sampler lacks {', '.join(extra)})" if extra
               else ")")
            + ": it belongs to another mixture; build the sampler with the saved sources")
    epoch, pos = [], []
    for src in sampler.sources:
        s = saved[src.name]
        if not isinstance(s, Mapping):
            raise PacktoolError(f"sampler state has sources.{src.name}={s!r}: it must be a "
                                "dict; the state is corrupt, save it again")
        for key, mine in src.identity.items():
            if s.get(key) != mine:
                raise PacktoolError(
                    f"sampler state has source {src.name} with {key}={s.get(key)!r} but this "
                    f"sampler's {src.name} has {key}={mine!r}: it is another dataset, and "
                    f"resuming would repeat and skip its rows; give {src.name} the dataset the "
                    "state was saved with")
        epoch.append(_count(s.get("epoch"), f"sources.{src.name}.epoch"))
        pos.append(_count(s.get("position"), f"sources.{src.name}.position", src.n))
    return tuple(epoch), tuple(pos)


def _segment(seg, names: list[str], step: int) -> tuple[Segment, int, tuple]:
    """The saved segment (start, weights) and its counters."""
    ok = isinstance(seg, Mapping) and all(k in seg for k in ("start", "weights", "rows",
                                                             "counts"))
    if not ok or not isinstance(seg["weights"], Mapping) or \
            not isinstance(seg["counts"], Mapping) or \
            set(seg["weights"]) != set(names) or set(seg["counts"]) != set(names):
        raise PacktoolError(f"sampler state has segment={seg!r}: it must hold start, weights "
                            "and counts of every source, and rows; the state is corrupt, save "
                            "it again")
    start = _count(seg["start"], "segment.start", step)
    taken = _count(seg["rows"], "segment.rows")
    counts = tuple(_count(seg["counts"][n], f"segment.counts.{n}", taken) for n in names)
    try:
        w = [Fraction(str(seg["weights"][n])) for n in names]
    except (ValueError, ZeroDivisionError):
        w = [Fraction(-1)]
    if sum(counts) != taken or min(w) < 0 or sum(w) != 1:
        raise PacktoolError(f"sampler state has segment={seg!r}: its counts must sum to its "
                            "rows and its weights be fractions >= 0 summing to 1; the state is "
                            "corrupt, save it again")
    den = math.lcm(*(f.denominator for f in w))
    shares = tuple(int(f * den) for f in w)
    return Segment(start, shares, sum(shares)), taken, counts

