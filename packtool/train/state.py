"""One state for every step rule: ``{"format": "packtool.train.sampler", "version": 5,
"rule": R, ...}``, R the sampler's step rule and its fields. One reader (:func:`read_state`)
takes it, and the format each rule saved before (fixed ``packtool.train.sampler`` v4, budget
``packtool.train.budget`` v1, mixture ``packtool.train.mixture`` v1: tests/data/sampler-states
resume exactly), and refuses another rule's state by name; then the rule's check proves the
counts consistent, so a forged state that would repeat or skip rows is refused:

- ``fixed``: packs consumed per cost class of the epoch order, against the step.
- ``budget``: rows consumed per slot length are what the curriculum's draws take from the
  origin (step, tokens, rows per length where the saving run began the epoch), and
  ``tokens - origin.tokens == (step - origin.step) * T``.
- ``mixture``: the segment's counts are the deadline order's after
  its rows, each source's position is where the segment began plus its count, and every step
  since the origin took ``world_size x batch_size`` rows.

Every refusal is a :class:`PacktoolError` naming the field, its value (or type), what it must
be and what to do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from ..errors import PacktoolError
from .curriculum import curriculum_of
from .schedule import Segment, counts_after

STATE_FORMAT = "packtool.train.sampler"
STATE_VERSION = 5
RULES = {  # rule -> (what its state counts, the sampler that continues it)
    "fixed": ("a fixed-length PackSampler's state: packs consumed of one epoch order",
              "PackSampler(...) without tokens_per_step"),
    "budget": ("a token-budget sampler's state: rows consumed per slot length",
               "PackSampler(..., tokens_per_step=T), any T"),
    "mixture": ("a MixtureSampler's state: a position in each source's stream",
                "MixtureSampler(...) with its sources"),
}
_BEFORE = {STATE_FORMAT: ("fixed", 4), "packtool.train.budget": ("budget", 1),
           "packtool.train.mixture": ("mixture", 1)}  # each rule's format before version 5


def is_state(v) -> bool:
    """A sampler state of any rule (a loader's state holds one)."""
    return isinstance(v, Mapping) and v.get("format") in _BEFORE


def stamp(rule: str, fields: dict) -> dict:
    """``fields`` as a state of ``rule``."""
    return {"format": STATE_FORMAT, "version": STATE_VERSION, "rule": rule, **fields}


def read_state(state, rule: str, sampler) -> None:
    """``state`` is a mapping of a version this packtool reads, of ``rule``, with the rule's
    fields (:data:`FIELDS`) each of its type (an array where a number belongs would otherwise
    compare element-wise inside numpy), and of ``sampler``'s seed; else a PacktoolError naming
    what it is and what continues it."""
    if not isinstance(state, Mapping):
        raise PacktoolError(f"sampler state must be a dict (from the sampler's state_dict()), "
                            f"got {type(state).__name__}")
    _typed(state, {"format": _STR, "rule": _STR, "version": _INT})
    fmt, version = state.get("format"), state.get("version")
    saved, last = ("fixed", 1) if fmt is None else _BEFORE.get(fmt, (None, None))
    if fmt == STATE_FORMAT and "rule" in state:
        saved, last = state["rule"], STATE_VERSION
    if saved in RULES and saved != rule:
        raise PacktoolError(f"this is {RULES[saved][0]} (rule {saved!r}), and this sampler's "
                            f"rule is {rule!r}: it cannot continue it; resume it with "
                            f"{RULES[saved][1]}, or start the next epoch here")
    if saved == "fixed" and version in (1, 2, 3):  # another stream, or the epoch drawn whole
        why = ("its epoch order came from default_rng([seed, epoch]), which packtool no longer "
               "uses (issue 18.10)" if version == 1 else "its epoch order (the whole epoch "
               "drawn by rng.permutation) was replaced by a keyed permutation (issue 32)")
        raise PacktoolError(
            f"sampler state version {version} cannot resume in this packtool: {why}, so its "
            "consumed counts name other packs and resuming would repeat and skip packs of "
            f"epoch {state.get('epoch')!r}; finish that epoch with the packtool that saved the "
            "state, or start the next one here (sampler.set_epoch(epoch + 1))")
    if saved not in RULES or version not in (last, STATE_VERSION) \
            or (version == STATE_VERSION) != (fmt == STATE_FORMAT and "rule" in state):
        raise PacktoolError(f"sampler state version {version}, format {fmt!r}: this packtool "
                            f"reads version {STATE_VERSION} of {STATE_FORMAT!r} (and each "
                            f"rule's format before it); it was saved by another packtool, or "
                            "is not a sampler state")
    fields = FIELDS[rule]
    missing = [k for k in ("format", "version", *fields) if k not in state]
    if missing:
        raise PacktoolError(f"sampler state lacks {', '.join(missing)}: it is truncated or was "
                            "not made by the sampler's state_dict(); save it again")
    _typed(state, fields)
    if state["seed"] != sampler.seed:
        raise PacktoolError(
            f"sampler state has seed={state['seed']!r} but this sampler has seed="
            f"{sampler.seed!r}: the seed keys every order and draw, and resuming would repeat "
            "and skip rows; build the sampler with the saved seed")


def _typed(state, fields: dict) -> None:
    """Each of ``fields`` in ``state`` of its type (bool is refused as an integer)."""
    for key, (types, what) in fields.items():
        v = state.get(key)
        if key in state and ((isinstance(v, (bool, np.bool_)) and types is _INT[0])
                             or not isinstance(v, types)):
            raise PacktoolError(f"sampler state has {key} of type {type(v).__name__}: it must "
                                f"be {what}; the state is corrupt or was not made by the "
                                "sampler's state_dict(), save it again")


def count(v, what: str, lo: int = 0, hi: int | None = None) -> int:
    """A state's count ``v`` (named ``what``): an integer in lo..hi, else refused by name."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < lo \
            or (hi is not None and v > hi):
        limit = f"an integer >= {lo}" + (f" and <= {hi:,}" if hi is not None else "")
        raise PacktoolError(f"sampler state has {what}={v!r}: it must be {limit}; the state "
                            "is corrupt, save it again")
    return int(v)


def _same_dataset(saved, sampler) -> None:
    if saved is not None and sampler.dataset is not None and saved != sampler.dataset:
        raise PacktoolError(
            f"sampler state has dataset={saved!r} but this sampler reads dataset "
            f"{sampler.dataset!r} (the packed index's index_sha256): the state was saved for "
            "another packed dataset, and resuming would train rows that were never in its "
            "order; build the sampler from the dataset the state was saved for, or start its "
            "epoch afresh")


# ------------------------------------------------------------------ each rule's fields
_INT, _NAME = ((int, np.integer), "an integer"), ((str, type(None)), "a string or null")
_DICT, _STR = ((Mapping,), "a dict"), ((str,), "a string")
FIELDS = {  # rule -> {field: (accepted types, what to say)}; bool is refused as an integer
    "fixed": {"epoch": _INT, "step": _INT, "world_size": _INT, "batch_size": _INT,
              "consumed": ((list, tuple, np.ndarray), "a list of integers"), "seed": _INT,
              "n_packs": _INT, "drop_last": ((bool, np.bool_), "true or false"),
              "balance": _NAME, "cost_ratio": ((int, float, type(None)), "a number or null"),
              "costs_sha256": _NAME, "dataset": _NAME},
    "budget": {"epoch": _INT, "step": _INT, "consumed": _DICT, "origin": _DICT,
               "world_size": _INT, "tokens_per_step": _INT, "curriculum": _STR, "seed": _INT,
               "rows": _DICT, "balance": _NAME, "costs_sha256": _NAME, "dataset": _NAME},
    "mixture": {"step": _INT, "world_size": _INT, "batch_size": _INT, "seed": _INT,
                "exhausted": _STR, "segment": _DICT, "sources": _DICT},
}


# ------------------------------------------------------------------ fixed packs per step
def check_state(state, sampler) -> tuple[int, np.ndarray]:
    """(epoch, consumed per class) of a well-formed state of ``sampler``'s epoch order and
    dataset, or a PacktoolError naming the field, its value, what it must be, and what to do."""
    read_state(state, "fixed", sampler)
    epoch = count(state["epoch"], "epoch")
    count(state["step"], "step", 0, sampler.n_packs)  # a step holds at least one pack
    count(state["world_size"], "world_size", 1)
    count(state["batch_size"], "batch_size", 1)
    _check_order(state, sampler)
    consumed = _consumed(state, sampler)
    _check_step(state, int(consumed.sum()), sampler.n_packs)
    return epoch, consumed


def _check_order(state, sampler) -> None:
    """The state belongs to this sampler's epoch order (same seed, packs, costs...) and, where
    both know it, to the same dataset."""
    for key, mine in (("n_packs", sampler.n_packs),
                      ("drop_last", sampler.drop_last), ("balance", sampler.balance),
                      ("cost_ratio", sampler.cost_ratio),
                      ("costs_sha256", sampler.fingerprint)):
        if state[key] != mine:
            raise PacktoolError(
                f"sampler state has {key}={state[key]!r} but this sampler has {key}={mine!r}: "
                "the state belongs to another epoch order, and resuming would repeat and skip "
                f"packs; build the sampler with the saved {key}"
                + (" (the same packed dataset and per-pack costs)"
                   if key in ("n_packs", "costs_sha256") else ""))
    _same_dataset(state.get("dataset"), sampler)


def _check_step(state, consumed: int, n_packs: int) -> None:
    """``step`` agrees with the packs consumed. Steps of the saving shape take G packs each, from
    the step where its resume began (``D // G`` after D packs consumed before it), so mid-epoch
    ``consumed = D + (step - D // G) * G``, i.e. ``0 <= consumed - step * G < G``; a finished
    epoch (every pack counted, left-out tail included) ends at ``step * G`` within ``2G`` below
    and ``G`` above the epoch's packs (drop_last leaves out up to ``G - 1``; wrapping fills up
    to ``G - 1``; a resume's step begins up to ``G - 1`` packs early)."""
    step, g = int(state["step"]), int(state["world_size"]) * int(state["batch_size"])
    if consumed < n_packs:
        ok, want = 0 <= consumed - step * g < g, f"step {consumed // g}"
    else:
        lo, hi = max(0, (n_packs - 2 * g) // g + 1), -(-(n_packs + g) // g) - 1
        ok, want = lo <= step <= hi, f"a step in {lo}..{hi} (the epoch is finished)"
    if not ok:
        raise PacktoolError(
            f"sampler state has step={step} but consumed counts {consumed:,} packs: at "
            f"world_size {state['world_size']} x batch_size {state['batch_size']} ({g} packs a "
            f"step) that is {want}, so one of the two is wrong and resuming would repeat or "
            "skip packs; the state is corrupt, save it again")


def _consumed(state, sampler) -> np.ndarray:
    consumed = state["consumed"]
    if (isinstance(consumed, np.ndarray) and consumed.ndim != 1) \
            or len(consumed) != sampler.n_classes:
        raise PacktoolError(f"sampler state has consumed={consumed!r}: it must list "
                            f"{sampler.n_classes} counts (one per cost class); the state is "
                            "corrupt, save it again")
    return np.array([count(v, f"consumed[{k}] (cost class {k})", 0, int(m))
                     for k, (v, m) in enumerate(zip(consumed, sampler.class_sizes, strict=True))],
                    np.int64)


def dataset_identity(packs) -> str | None:
    """The ``index_sha256`` of the packed dataset ``packs`` is (``open_packed``) or wraps
    (``TorchPackedDataset``), which a state records so that a state of another dataset with as
    many packs is refused; None for a pack count or any other sized object (nothing to name)."""
    index = getattr(getattr(packs, "packed", packs), "index", None)
    digest = index.get("index_sha256") if isinstance(index, dict) else None
    return digest if isinstance(digest, str) else None


# ------------------------------------------------------------------ a token budget per step

def check_budget_state(state, sampler) -> tuple[int, int, np.ndarray]:
    """(epoch, step, rows consumed per length) of a well-formed state of ``sampler``'s orders,
    or a PacktoolError naming what is wrong."""
    read_state(state, "budget", sampler)
    epoch, step = count(state["epoch"], "epoch"), count(state["step"], "step")
    count(state["world_size"], "world_size", 1)
    t = count(state["tokens_per_step"], "tokens_per_step", 1)
    _same_rows(state, sampler)
    consumed = _per_length(state["consumed"], "consumed", sampler, bounded=True)
    origin = state["origin"]  # a dict (read_state): with the keys it must have
    if not {"step", "tokens"} <= set(origin) <= {"step", "tokens", "consumed"}:
        raise PacktoolError(f"sampler state has origin={origin!r}: it must be {{'step': S, "
                            "'tokens': N, 'consumed': {length: rows}}; the state is corrupt, "
                            "save it again")
    s0, t0 = count(origin["step"], "origin.step"), count(origin["tokens"], "origin.tokens")
    c0 = None if s0 else np.zeros_like(consumed)  # a state from step 0 began with nothing
    if "consumed" in origin:
        c0 = _per_length(origin["consumed"], "origin.consumed", sampler)
        if (c0 > consumed).any() or int((c0 * sampler.lengths).sum()) != t0:
            raise PacktoolError(f"sampler state has origin={origin!r}: its rows must be at most "
                                f"those consumed and hold its {t0:,} tokens; the state is "
                                "corrupt, save it again")
    tokens = int((consumed * sampler.lengths).sum())
    if not s0 <= step or not t0 <= tokens or tokens - t0 != (step - s0) * t \
            or (s0 == 0 and t0 != 0):
        raise PacktoolError(
            f"sampler state has step={step} but consumed counts {tokens:,} tokens: from its "
            f"origin (step {s0}, {t0:,} tokens) at {t:,} tokens a step that is step "
            f"{s0 + (tokens - t0) / t:g}, so one of the two is wrong and resuming would repeat "
            "or skip rows; the state is corrupt, save it again")
    _check_draws(state, sampler, epoch, step, consumed, (s0, c0))
    return epoch, step, consumed


def _per_length(saved, what: str, sampler, bounded: bool = False) -> np.ndarray:
    """A {length: count} field as counts aligned with ``sampler.lengths`` (``bounded``: each
    at most the rows of its length)."""
    names = [str(v) for v in sampler.lengths.tolist()]
    if not isinstance(saved, Mapping) or sorted(saved, key=str) != sorted(names):
        got = sorted(map(str, saved)) if isinstance(saved, Mapping) else saved
        raise PacktoolError(f"sampler state has {what} for lengths {got!r} but this dataset's "
                            f"rows have lengths {names}: it was saved for another dataset; "
                            "build the sampler from the dataset the state was saved for")
    return np.array([count(saved[n], f"{what}[{n}]", 0, int(m) if bounded else None)
                     for n, m in zip(names, sampler.sizes, strict=True)], np.int64)


def _same_rows(state, sampler) -> None:
    """Rows per length and dataset as the sampler's."""
    rows = _per_length(state["rows"], "rows", sampler)
    if not np.array_equal(rows, sampler.sizes):
        raise PacktoolError(
            f"sampler state has rows per length {state['rows']!r} but this dataset has "
            f"{dict(zip(map(str, sampler.lengths.tolist()), sampler.sizes.tolist(), strict=True))}"
            ": it was saved for another dataset, and resuming would repeat and skip rows; "
            "build the sampler from the dataset the state was saved for")
    _same_dataset(state["dataset"], sampler)


def _check_draws(state, sampler, epoch: int, step: int, consumed, origin) -> None:
    """``consumed`` is what the saving run's draws took from its origin (the step where it
    began the epoch and the rows consumed then): the same token total spread over other
    lengths would repeat and skip rows. A state saved before its origin's rows were
    recorded (packtool before issue 38) that began its epoch by a resume is checked by its
    tokens alone."""
    s0, c0 = origin
    if c0 is None:
        return
    t, name = int(state["tokens_per_step"]), state["curriculum"]
    if name == "callable" and sampler.curriculum != "callable":
        return  # the saving run's own function: nothing here can replay it
    if name not in ("callable", sampler.curriculum):
        try:
            curriculum_of(name)
        except PacktoolError:
            raise PacktoolError(f"budget state has curriculum={name!r}: this packtool "
                                "knows no such curriculum; the state is corrupt, save it "
                                "again") from None
    if (t % sampler.lengths).any():
        raise PacktoolError(f"budget state has tokens_per_step={t:,}: not a multiple of "
                            f"every slot length {sampler.lengths.tolist()}; the state is "
                            "corrupt, save it again")
    per_step = t // sampler.lengths
    ks, stop = sampler.draws(epoch, s0, c0, step, per_step, name)
    if stop is not None:
        raise stop
    c = c0 + per_step * np.bincount(ks, minlength=len(per_step))
    if not np.array_equal(c, consumed):
        names = [str(v) for v in sampler.lengths.tolist()]
        raise PacktoolError(
            f"budget state has consumed {dict(zip(names, consumed.tolist(), strict=True))} "
            f"but its {step - s0} step(s) of {t:,} tokens from step {s0} (curriculum "
            f"{name}, seed {sampler.seed}) take {dict(zip(names, c.tolist(), strict=True))}: "
            "resuming would repeat and skip rows; the state is corrupt, save it again")


# ------------------------------------------------------------------ a mixture of sources
# (the fields: Mixture.fields). World size, batch size, ``exhausted`` and the schedule may
# change at a resume.

def check_mixture_state(state, sampler):
    """(step, saved segment, its rows taken and counts, epochs, positions) of a well-formed
    state of ``sampler``'s sources, or a PacktoolError naming what is wrong."""
    read_state(state, "mixture", sampler)  # sources and segment are dicts from here on
    step = count(state["step"], "step")
    epoch, pos = _sources(state["sources"], sampler)
    seg, taken, counts = _segment(state["segment"], sampler.names, step)
    _agree(state, sampler, step, seg, taken, counts,
           [e * src.n + p for e, p, src in zip(epoch, pos, sampler.sources, strict=True)])
    return step, seg, taken, counts, epoch, pos


def _agree(state, sampler, step: int, seg: Segment, taken: int, counts: tuple,
           total: list[int]) -> None:
    """The module docstring's ``mixture`` rule. A state of packtool before issue 38 has no
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
            at = count(saved[n], f"segment.positions.{n}")
            if t - at != c:
                raise PacktoolError(
                    f"sampler state has source {n} at position {t:,} of its stream (epoch x "
                    f"rows + position) but its segment began at {at:,} and counts {c:,} rows "
                    f"of {n}: a row would be {'repeated' if t - at < c else 'skipped'}; the "
                    "state is corrupt, save it again")
    g = count(state["world_size"], "world_size") * count(state["batch_size"], "batch_size")
    origin = state.get("origin")
    if origin is None:
        s0, rows0, ok = 0, 0, step <= sum(total)
    else:
        if not isinstance(origin, Mapping) or set(origin) != {"step", "rows"}:
            raise PacktoolError(f"sampler state has origin={origin!r}: it must be {{'step': S, "
                                "'rows': N}}; the state is corrupt, save it again")
        s0, rows0 = count(origin["step"], "origin.step", 0, step), count(origin["rows"],
                                                                          "origin.rows")
        ok = sum(total) - rows0 == (step - s0) * g and (
            seg.start <= s0 or taken == (step - seg.start) * g)
    if not ok:
        raise PacktoolError(
            f"sampler state has step={step:,} but its sources took {sum(total) - rows0:,} rows "
            f"since step {s0:,}, at {g} rows a step (world_size x batch_size): one of the two "
            "is wrong and resuming would repeat or skip rows; the state is corrupt, save it "
            "again")


def _sources(saved, sampler) -> tuple[tuple, tuple]:
    """Per source (in the sampler's name order) its saved epoch and position."""
    missing = [n for n in sampler.names if n not in saved]
    extra = sorted(str(n) for n in saved if n not in sampler.names)
    if missing or extra:
        lacks = [f"the {who} lacks {', '.join(names)}" for who, names in (
            ("state", missing), ("sampler", extra)) if names]
        raise PacktoolError(
            f"mixture state is of the sources {', '.join(sorted(map(str, saved)))} but this "
            f"sampler has {', '.join(sampler.names)} ({'; '.join(lacks)}): it belongs to "
            "another mixture; build the sampler with the saved sources")
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
        epoch.append(count(s.get("epoch"), f"sources.{src.name}.epoch"))
        pos.append(count(s.get("position"), f"sources.{src.name}.position", 0, src.n))
    return tuple(epoch), tuple(pos)


def _segment(seg, names: list[str], step: int) -> tuple[Segment, int, tuple]:
    """The saved segment (start, weights) and its counters."""
    if not all(k in seg for k in ("start", "weights", "rows", "counts")) \
            or not isinstance(seg["weights"], Mapping) or \
            not isinstance(seg["counts"], Mapping) or \
            set(seg["weights"]) != set(names) or set(seg["counts"]) != set(names):
        raise PacktoolError(f"sampler state has segment={seg!r}: it must hold start, weights "
                            "and counts of every source, and rows; the state is corrupt, save "
                            "it again")
    start = count(seg["start"], "segment.start", 0, step)
    taken = count(seg["rows"], "segment.rows")
    counts = tuple(count(seg["counts"][n], f"segment.counts.{n}", 0, taken) for n in names)
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

