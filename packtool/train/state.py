"""A sampler state, checked field by field before a resume: version and format, the fields
that define the epoch order (seed, number of packs, drop_last, balance, cost ratio, a
fingerprint of the per-pack costs), and counts in range. Every refusal is a
:class:`PacktoolError` naming the field, its value, what it must be and what to do."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import PacktoolError

STATE_FORMAT = "packtool.train.sampler"
STATE_VERSION = 2
_FIELDS = ("format", "version", "epoch", "step", "consumed", "world_size", "batch_size", "seed",
           "n_packs", "drop_last", "balance", "cost_ratio", "costs_sha256")


def check_state(state, sampler) -> tuple[int, np.ndarray]:
    """(epoch, consumed per class) of a well-formed state of ``sampler``'s epoch order, or a
    PacktoolError naming the field, its value, what it must be, and what to do."""
    _check_form(state)
    epoch = _count(state, "epoch", 0)
    _count(state, "step", 0, sampler.n_packs)  # a step holds at least one pack
    _count(state, "world_size", 1)
    _count(state, "batch_size", 1)
    _check_order(state, sampler)
    return epoch, _consumed(state, sampler)


def _count(state, key: str, lo: int, hi: int | None = None) -> int:
    v = state[key]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo \
            or (hi is not None and v > hi):
        limit = f"an integer >= {lo}" + (f" and <= {hi:,}" if hi is not None else "")
        raise PacktoolError(f"sampler state has {key}={v!r}: it must be {limit}; the state "
                            "is corrupt, save it again")
    return int(v)


def _check_order(state, sampler) -> None:
    """The state belongs to this sampler's epoch order (same seed, packs, costs...)."""
    for key, mine in (("seed", sampler.seed), ("n_packs", sampler.n_packs),
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


def _check_form(state) -> None:
    """A mapping of this format and version, with every field."""
    if not isinstance(state, Mapping):
        raise PacktoolError(f"sampler state must be a dict (from PackSampler.state_dict()), got "
                            f"{type(state).__name__}")
    version = state.get("version")
    if version == 1:
        raise PacktoolError(
            "sampler state version 1 (packtool before the elastic resume) cannot resume: its "
            "epoch order came from default_rng([seed, epoch]), which packtool no longer uses "
            "(the sampler's stream is now its own, issue 18.10), so resuming would repeat and "
            f"skip packs of epoch {state.get('epoch')!r}; start the next epoch with "
            "sampler.set_epoch(epoch + 1), or finish this one with the packtool that saved it")
    if version != STATE_VERSION or state.get("format") != STATE_FORMAT:
        raise PacktoolError(f"sampler state version {version!r}, format {state.get('format')!r}: "
                            f"this packtool reads version {STATE_VERSION} of {STATE_FORMAT!r}; "
                            "it was saved by another packtool (or is not a sampler state)")
    missing = [k for k in _FIELDS if k not in state]
    if missing:
        raise PacktoolError(f"sampler state lacks {', '.join(missing)}: it is truncated or was "
                            "not made by PackSampler.state_dict(); save it again")



def _consumed(state, sampler) -> np.ndarray:
    consumed = state["consumed"]
    if not isinstance(consumed, (list, tuple, np.ndarray)) or len(consumed) != sampler.n_classes:
        raise PacktoolError(f"sampler state has consumed={consumed!r}: it must list "
                            f"{sampler.n_classes} counts (one per cost class); the state is "
                            "corrupt, save it again")
    out = np.zeros(sampler.n_classes, np.int64)
    for k, v in enumerate(consumed):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) \
                or not 0 <= v <= sampler.class_sizes[k]:
            raise PacktoolError(f"sampler state has consumed[{k}]={v!r}: it must be an integer "
                                f"0..{int(sampler.class_sizes[k]):,} (the packs of cost class "
                                f"{k}); the state is corrupt, save it again")
        out[k] = int(v)
    return out
