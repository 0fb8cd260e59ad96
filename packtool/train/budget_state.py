"""A token-budget sampler's state (``PackSampler(..., tokens_per_step=T)``), checked field by
field before a resume; every refusal is a :class:`PacktoolError` naming the field, its value,
what it must be and what to do.

Its own format (``packtool.train.budget``, version 1), not the fixed-length sampler's
(``packtool.train.sampler`` v4): what it counts is rows consumed *per slot length* of the
epoch's per-length orders, which a fixed-length sampler cannot continue, so each refuses the
other's state by name. What must match: the seed (it keys every order and draw), the rows per
length (the dataset's composition) and the dataset (``index_sha256``, where both know it).
World size, ``tokens_per_step``, curriculum and balance (it deals rows within a step, and
consumes none) may change. ``origin``
(the step and tokens where the saving shape began the epoch) lets the step be checked against
the rows consumed: ``tokens - origin.tokens == (step - origin.step) * tokens_per_step``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import PacktoolError

STATE_FORMAT = "packtool.train.budget"
STATE_VERSION = 1
FIXED_FORMAT = "packtool.train.sampler"
_FIELDS = ("format", "version", "epoch", "step", "consumed", "origin", "world_size",
           "tokens_per_step", "curriculum", "seed", "rows", "balance", "costs_sha256",
           "dataset")


def check_budget_state(state, sampler) -> tuple[int, int, np.ndarray, tuple]:
    """(epoch, step, rows consumed per length, (origin step, its rows consumed per length or
    None)) of a well-formed state of ``sampler``'s orders, or a PacktoolError naming what is
    wrong."""
    _check_form(state)
    epoch, step = _int(state, "epoch"), _int(state, "step")
    _int(state, "world_size", 1)
    t = _int(state, "tokens_per_step", 1)
    _same(state, sampler)
    consumed = _per_length(state["consumed"], "consumed", sampler)
    for k, (c, m) in enumerate(zip(consumed.tolist(), sampler.sizes.tolist(), strict=True)):
        if c > m:
            raise PacktoolError(f"budget state has consumed[{int(sampler.lengths[k])}]={c:,}: "
                                f"there are {m:,} rows of that length; the state is corrupt, "
                                "save it again")
    origin = state["origin"]
    if not isinstance(origin, Mapping) or not {"step", "tokens"} <= set(origin) <= {
            "step", "tokens", "consumed"}:
        raise PacktoolError(f"budget state has origin={origin!r}: it must be {{'step': S, "
                            "'tokens': N, 'consumed': {length: rows}}; the state is corrupt, "
                            "save it again")
    s0, t0 = _int(origin, "step"), _int(origin, "tokens")
    c0 = None if s0 else np.zeros_like(consumed)  # a state from step 0 began with nothing
    if "consumed" in origin:
        c0 = _per_length(origin["consumed"], "origin.consumed", sampler)
        if (c0 > consumed).any() or int((c0 * sampler.lengths).sum()) != t0:
            raise PacktoolError(f"budget state has origin={origin!r}: its rows must be at most "
                                f"those consumed and hold its {t0:,} tokens; the state is "
                                "corrupt, save it again")
    tokens = int((consumed * sampler.lengths).sum())
    if not s0 <= step or not t0 <= tokens or tokens - t0 != (step - s0) * t \
            or (s0 == 0 and t0 != 0):
        raise PacktoolError(
            f"budget state has step={step} but consumed counts {tokens:,} tokens: from its "
            f"origin (step {s0}, {t0:,} tokens) at {t:,} tokens a step that is step "
            f"{s0 + (tokens - t0) / t:g}, so one of the two is wrong and resuming would repeat "
            "or skip rows; the state is corrupt, save it again")
    return epoch, step, consumed, (s0, c0)


def _check_form(state) -> None:
    if not isinstance(state, Mapping):
        raise PacktoolError(f"budget state must be a dict (from state_dict()), got "
                            f"{type(state).__name__}")
    if state.get("format") == FIXED_FORMAT:
        raise PacktoolError(
            "this is a fixed-length PackSampler's state (format 'packtool.train.sampler'): it "
            "counts packs of one epoch order, not rows per slot length, so a token-budget "
            "sampler cannot continue it; resume it with PackSampler(...) without "
            "tokens_per_step, or start the next epoch here")
    if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
        raise PacktoolError(f"budget state version {state.get('version')!r}, format "
                            f"{state.get('format')!r}: this packtool reads version "
                            f"{STATE_VERSION} of {STATE_FORMAT!r}; it was saved by another "
                            "packtool, or is not a sampler state")
    missing = [k for k in _FIELDS if k not in state]
    if missing:
        raise PacktoolError(f"budget state lacks {', '.join(missing)}: it is truncated or was "
                            "not made by state_dict(); save it again")


def _int(state, key: str, lo: int = 0) -> int:
    v = state[key]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < lo:
        raise PacktoolError(f"budget state has {key}={v!r}: it must be an integer >= {lo}; the "
                            "state is corrupt, save it again")
    return int(v)


def _per_length(saved, what: str, sampler) -> np.ndarray:
    """A {length: count} field as counts aligned with ``sampler.lengths``."""
    names = [str(v) for v in sampler.lengths.tolist()]
    if not isinstance(saved, Mapping) or sorted(saved, key=str) != sorted(names):
        got = sorted(map(str, saved)) if isinstance(saved, Mapping) else saved
        raise PacktoolError(f"budget state has {what} for lengths {got!r} but this dataset's "
                            f"rows have lengths {names}: it was saved for another dataset; "
                            "build the sampler from the dataset the state was saved for")
    out = np.zeros(len(names), np.int64)
    for k, name in enumerate(names):
        v = saved[name]
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
            raise PacktoolError(f"budget state has {what}[{name}]={v!r}: it must be an integer "
                                ">= 0; the state is corrupt, save it again")
        out[k] = int(v)
    return out


def _same(state, sampler) -> None:
    """Seed, rows per length and dataset as the sampler's."""
    rows = _per_length(state["rows"], "rows", sampler)
    if not np.array_equal(rows, sampler.sizes):
        raise PacktoolError(
            f"budget state has rows per length {state['rows']!r} but this dataset has "
            f"{dict(zip(map(str, sampler.lengths.tolist()), sampler.sizes.tolist(), strict=True))}"
            ": it was saved for another dataset, and resuming would repeat and skip rows; "
            "build the sampler from the dataset the state was saved for")
    if state["seed"] != sampler.seed:  # balance deals within a step: it may change
        raise PacktoolError(
            f"budget state has seed={state['seed']!r} but this sampler has seed="
            f"{sampler.seed!r}: the seed keys every length's order and every draw, and "
            "resuming would repeat and skip rows; build the sampler with the saved seed")
    saved = state["dataset"]
    if saved is not None and sampler.dataset is not None and saved != sampler.dataset:
        raise PacktoolError(
            f"budget state has dataset={saved!r} but this sampler reads dataset "
            f"{sampler.dataset!r} (index_sha256): it was saved for another packed dataset; "
            "build the sampler from the dataset the state was saved for")
