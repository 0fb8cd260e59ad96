"""A sampler state, checked field by field before a resume: version and format, every field's
type, the fields that define the epoch order (seed, number of packs, drop_last, balance, cost
ratio, a fingerprint of the per-pack costs), the dataset it was saved for, counts in range, and
the step against the packs consumed. Every refusal is a :class:`PacktoolError` naming the
field, its value (or type), what it must be and what to do.

Versions: 4 (issue 32) has the fields of 3 but counts them in another epoch order: each
step's packs are computed per step from a keyed permutation (:mod:`packtool.train.order`)
where 2 and 3 drew the whole epoch with ``rng.permutation``, so their consumed counts name
other packs; they are refused by name (finish that epoch with the packtool that saved the
state, or start the next epoch). ``dataset`` (since 3) is the ``index_sha256`` of the packed
dataset the sampler was built from (None when it was built from a pack count, which names no
dataset), so that a state of another dataset with as many packs is refused (with
``balance=None`` nothing else tells the two apart). It is compared when both the state and the
sampler know it: a sampler built from a count cannot check it, and a state saved from a count
carries none. Version 1 and unknown versions are refused by name too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import PacktoolError

STATE_FORMAT = "packtool.train.sampler"
STATE_VERSION = 4
_READS = (4,)
_OLD_ORDER = (2, 3)  # the epoch drawn whole by rng.permutation: another order of the packs
_INT, _STR_OR_NONE = (int, np.integer), (str, type(None))
_TYPES = {  # field -> (accepted types, what to say); bool is refused where an int is meant
    "format": ((str,), "a string"), "version": (_INT, "an integer"),
    "epoch": (_INT, "an integer"), "step": (_INT, "an integer"),
    "consumed": ((list, tuple, np.ndarray), "a list of integers"),
    "world_size": (_INT, "an integer"), "batch_size": (_INT, "an integer"),
    "seed": (_INT, "an integer"), "n_packs": (_INT, "an integer"),
    "drop_last": ((bool, np.bool_), "true or false"), "balance": (_STR_OR_NONE, "a string or null"),
    "cost_ratio": ((int, float, type(None)), "a number or null"),
    "costs_sha256": (_STR_OR_NONE, "a string or null"),
    "dataset": (_STR_OR_NONE, "a string or null"),
}
_FIELDS = tuple(_TYPES)


def check_state(state, sampler) -> tuple[int, np.ndarray]:
    """(epoch, consumed per class) of a well-formed state of ``sampler``'s epoch order and
    dataset, or a PacktoolError naming the field, its value, what it must be, and what to do."""
    _check_form(state)
    epoch = _count(state, "epoch", 0)
    _count(state, "step", 0, sampler.n_packs)  # a step holds at least one pack
    _count(state, "world_size", 1)
    _count(state, "batch_size", 1)
    _check_order(state, sampler)
    consumed = _consumed(state, sampler)
    _check_step(state, int(consumed.sum()), sampler.n_packs)
    return epoch, consumed


def _count(state, key: str, lo: int, hi: int | None = None) -> int:
    v = state[key]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo \
            or (hi is not None and v > hi):
        limit = f"an integer >= {lo}" + (f" and <= {hi:,}" if hi is not None else "")
        raise PacktoolError(f"sampler state has {key}={v!r}: it must be {limit}; the state "
                            "is corrupt, save it again")
    return int(v)


def _check_types(state) -> None:
    """Every field of the expected type, before any comparison: an array where a number
    belongs would otherwise compare element-wise and fail inside numpy."""
    for key, (types, what) in _TYPES.items():
        if key not in state:
            continue
        v = state[key]
        wrong_bool = isinstance(v, (bool, np.bool_)) and types is _INT
        if wrong_bool or not isinstance(v, types):
            raise PacktoolError(f"sampler state has {key} of type {type(v).__name__}: it must "
                                f"be {what}; the state is corrupt or was not made by "
                                "PackSampler.state_dict(), save it again")


def _check_order(state, sampler) -> None:
    """The state belongs to this sampler's epoch order (same seed, packs, costs...) and, where
    both know it, to the same dataset."""
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
    saved = state.get("dataset")
    if saved is not None and sampler.dataset is not None and saved != sampler.dataset:
        raise PacktoolError(
            f"sampler state has dataset={saved!r} but this sampler reads dataset "
            f"{sampler.dataset!r} (the packed index's index_sha256): the state was saved for "
            f"another packed dataset with as many packs ({sampler.n_packs:,}), and resuming "
            "would train packs that were never in its epoch order; build the sampler from the "
            "dataset the state was saved for, or start its epoch afresh")


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


def _check_form(state) -> None:
    """A mapping of a version this packtool reads and this format, with every field typed."""
    if not isinstance(state, Mapping):
        raise PacktoolError(f"sampler state must be a dict (from PackSampler.state_dict()), got "
                            f"{type(state).__name__}")
    _check_types({k: state[k] for k in ("version", "format") if k in state})
    version = state.get("version")
    if state.get("format") == "packtool.train.budget":
        raise PacktoolError(
            "this is a token-budget sampler's state (format 'packtool.train.budget', rows "
            "consumed per slot length): resume it with PackSampler(..., tokens_per_step=T), "
            "any T; a fixed-length PackSampler cannot continue it")
    if version == 1:
        raise PacktoolError(
            "sampler state version 1 (packtool before the elastic resume) cannot resume: its "
            "epoch order came from default_rng([seed, epoch]), which packtool no longer uses "
            "(the sampler's stream is now its own, issue 18.10), so resuming would repeat and "
            f"skip packs of epoch {state.get('epoch')!r}; start the next epoch with "
            "sampler.set_epoch(epoch + 1), or finish this one with the packtool that saved it")
    if version in _OLD_ORDER:
        raise PacktoolError(
            f"sampler state version {version} cannot resume in this packtool: its epoch order "
            "(the whole epoch drawn by rng.permutation) was replaced by one computed per step "
            "(a keyed permutation, issue 32), so its consumed counts name other packs and "
            f"resuming would repeat and skip packs of epoch {state.get('epoch')!r}; finish "
            "that epoch with the packtool that saved the state, or start the next one here "
            "(sampler.set_epoch(epoch + 1) without load_state_dict)")
    if version not in _READS or state.get("format") != STATE_FORMAT:
        raise PacktoolError(f"sampler state version {version!r}, format {state.get('format')!r}: "
                            f"this packtool reads version {', '.join(map(str, _READS))} of "
                            f"{STATE_FORMAT!r}; it was saved by another packtool (or is not a "
                            "sampler state)")
    missing = [k for k in _FIELDS if k not in state]
    if missing:
        raise PacktoolError(f"sampler state lacks {', '.join(missing)}: it is truncated or was "
                            "not made by PackSampler.state_dict(); save it again")
    _check_types(state)


def _consumed(state, sampler) -> np.ndarray:
    consumed = state["consumed"]
    if (isinstance(consumed, np.ndarray) and consumed.ndim != 1) \
            or len(consumed) != sampler.n_classes:
        raise PacktoolError(f"sampler state has consumed={consumed!r}: it must list "
                            f"{sampler.n_classes} counts (one per cost class); the state is "
                            "corrupt, save it again")
    out = np.zeros(sampler.n_classes, np.int64)
    for k, v in enumerate(consumed):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) \
                or not 0 <= v <= sampler.class_sizes[k]:
            raise PacktoolError(f"sampler state has consumed[{k}]={v!r}: it must be an integer "
                                f"0..{int(sampler.class_sizes[k]):,} (the packs of cost class "
                                f"{k}); the state is corrupt, save it again")
        out[k] = int(v)
    return out


def dataset_identity(packs) -> str | None:
    """The ``index_sha256`` of the packed dataset ``packs`` is (``open_packed``) or wraps
    (``TorchPackedDataset``), which a state records so that a state of another dataset with as
    many packs is refused; None for a pack count or any other sized object (nothing to name)."""
    index = getattr(getattr(packs, "packed", packs), "index", None)
    digest = index.get("index_sha256") if isinstance(index, dict) else None
    return digest if isinstance(digest, str) else None
