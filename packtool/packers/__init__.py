"""Packers: one contract, one registry, loaded on first use.

A packer is ``pack(lengths: int64[n], capacity: int, options: PackerOptions) -> Packing``:
the pack id of every document (0..P-1, dense, in the algorithm's order of creation; -1 only
for zero-length documents, which occupy no pack) and a :class:`PackerReport` (pack count, the
options in effect, and what the algorithm knows: grid step, LP value and bound, whether the LP
converged, warnings). Every packer takes the same arguments; :data:`PACKERS` says which
options each one reads, and an option a packer does not read is an error, not ignored.

The registry names and option sets are plain data: ``packtool --help`` lists ``--algo``
choices without importing numba, scipy or highspy. :func:`run_packer` is the checked entry
point; :func:`assign_packs` returns the ids alone.

Modules: one algorithm each, its trade-off in its docstring: :mod:`.bfd` best fit
decreasing, :mod:`.ffd` first fit decreasing, :mod:`.simple` next fit (``sequential``,
``random``), :mod:`.spfhp` and :mod:`.nnlshp` Graphcore's histogram packers,
:mod:`.optimal` the cutting-stock LP rounded (solved in :mod:`._lp`); :mod:`._common` the
kernels they share (counting sort, bucket trees).
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from ..errors import PacktoolError

if TYPE_CHECKING:  # numpy loads with the first packer call, not with `packtool --help`
    import numpy as np


@dataclass(frozen=True)
class PackerOptions:
    """Options a packer may read. ``None`` means "the packer's default"."""

    seed: int = 0                       # random: the shuffle; every packer accepts it
    max_depth: int | None = None        # spfhp (12), nnlshp (3): documents per pack at most
    strict: bool = False                # spfhp: the paper's rule for new packs
    max_strategies: int | None = None   # nnlshp: NNLS columns before lengths are rounded
    work_limit: int | None = None       # optimal: pricing work budget (DP cells); reproducible
    time_limit: float | None = None     # optimal: wall-clock limit, opt-in, not reproducible
    max_docs: int | None = None         # bfd, ffd, next fit: documents per pack at most

    def given(self) -> set[str]:
        """Options set to something other than their default (seed excepted)."""
        return {f.name for f in fields(self)
                if f.name != "seed" and getattr(self, f.name) != f.default}


@dataclass
class PackerReport:
    """What a packer says about its result; JSON-ready through :meth:`to_json`."""

    algo: str
    n_packs: int
    options: dict                        # the options in effect, defaults filled in
    grid_step: int | None = None         # lengths rounded up to multiples of this (nnlshp, optimal)
    lp_value: float | None = None        # optimal: objective of the (last) master LP
    lp_bound: int | None = None          # optimal: a valid lower bound on packs from the LP
    lp_converged: bool | None = None     # True: lp_bound is ceil(LP optimum); False: Farley's bound
    columns: int | None = None           # optimal: patterns generated
    work: int | None = None              # optimal: pricing DP cells spent
    baseline_packs: int | None = None    # optimal: BFD's count, the bar the LP must beat
    used: str | None = None              # optimal: "lp" or "bfd" (never worse than BFD)
    reproducible: bool = True            # False only under an explicit wall-clock limit
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Packing:
    packs: np.ndarray
    report: PackerReport


@dataclass(frozen=True)
class PackerSpec:
    """A registry entry: where the function lives and which options it reads."""

    target: str                                  # "module:function" inside packtool.packers
    options: frozenset[str] = frozenset()
    summary: str = ""
    narrow: bool = False    # takes int32 lengths as they are (and may return int32 ids)

    def load(self):
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(f".{module}", __name__), name)


# max_docs (--max-docs) is a cap on documents per pack that the greedy packers keep as they
# place each document; the LP (optimal) and the histogram packers (spfhp, nnlshp: their
# --max-depth is such a cap already) refuse it by name (check_options)
_CAP = frozenset({"max_docs"})
PACKERS: dict[str, PackerSpec] = {
    "bfd": PackerSpec("bfd:pack", _CAP, "best-fit decreasing (default; fast, near L1)",
                      narrow=True),
    "optimal": PackerSpec("optimal:pack", frozenset({"work_limit", "time_limit"}),
                          "cutting-stock LP, rounded; never worse than bfd"),
    "ffd": PackerSpec("ffd:pack", _CAP, "first-fit decreasing"),
    "spfhp": PackerSpec("spfhp:pack", frozenset({"max_depth", "strict"}),
                        "shortest-pack-first histogram packing (bounded depth)"),
    "nnlshp": PackerSpec("nnlshp:pack", frozenset({"max_depth", "max_strategies"}),
                         "NNLS histogram packing (slow; bounded depth)"),
    "sorted": PackerSpec("simple:sorted_", _CAP, "longest first, next fit"),
    "random": PackerSpec("simple:random", _CAP, "shuffled (seed), next fit"),
    "sequential": PackerSpec("simple:sequential", _CAP, "input order, next fit"),
}


def check_lengths(lengths, capacity: int, narrow: bool = False) -> np.ndarray:
    import numpy as np

    if isinstance(capacity, bool) or int(capacity) != capacity or capacity < 1:
        raise PacktoolError(f"seq_len must be a positive integer, got {capacity!r}")
    if capacity >= 2**31:
        raise PacktoolError(f"seq_len {capacity:,} is too large: cu_seqlens are int32, so "
                            "packs hold at most 2,147,483,647 tokens")
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise PacktoolError(f"lengths must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise PacktoolError(f"lengths must be integers, got dtype {arr.dtype}")
    keep = narrow and arr.dtype == np.int32  # no int64 copy for a packer that takes int32
    arr = np.ascontiguousarray(arr, dtype=np.int32 if keep else np.int64)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0:
            i = int(np.argmin(arr))
            raise PacktoolError(f"document {i} has negative length {lo}")
        if hi > capacity:
            i = int(np.argmax(arr))
            raise PacktoolError(
                f"document {i:,} has {hi:,} tokens > seq_len {capacity:,}; pass "
                "overflow='truncate' or 'drop' to assign_packs (a pack id per document), cut "
                "documents into segments first (packtool.pack.plan.make_segments; the CLI: pack "
                "--overflow split|truncate|drop) or raise seq_len"
            )
    return arr


# Memory that grows with seq_len L, not with the data: the length histograms (bincount over
# 0..L), the L2 bound's prefix sums, the room trees of bfd/ffd/optimal (two int64 a node over
# the next power of two above L). Measured peak RSS per unit of L, `pack` and `stats` with
# every packer at L = 2**23 and 2**24 on the fixture corpus: 48 bytes (nnlshp 52); 64 leaves
# room for a tree rounded up to the next power of two. optimal's pricing DP adds its take-bit
# table, at most _lp.MAX_DP_CELLS bytes whatever --work-limit (which bounds time, not memory).
BYTES_PER_SEQ_LEN = 64
DP_TABLE_BYTES = 400_000_000  # = packers._lp.MAX_DP_CELLS (not imported: it loads numba)


def available_memory() -> int | None:
    """Bytes this process may still use: MemAvailable, less where a cgroup limit is lower."""
    from pathlib import Path

    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            avail = min(avail or 2**63, int(limit) - used)
    except (OSError, ValueError):
        pass
    return avail


def check_seq_len_memory(seq_len: int, algos=(), available: int | None = None) -> None:
    """Refuse, before allocating, a --seq-len whose tables would not fit in memory (at
    -L 2,147,483,647 ``stats --algos optimal`` was OOM-killed at 22 GB): the need is
    :data:`BYTES_PER_SEQ_LEN` a token of L (+ the DP table for optimal), against what
    :func:`available_memory` reports."""
    need = BYTES_PER_SEQ_LEN * int(seq_len) + (DP_TABLE_BYTES if "optimal" in algos else 0)
    available = available_memory() if available is None else available
    if available is None or need <= available:
        return
    fits = max((available - (DP_TABLE_BYTES if "optimal" in algos else 0))
               // BYTES_PER_SEQ_LEN, 0)
    raise PacktoolError(
        f"-L/--seq-len {int(seq_len):,} needs about {need / 2**30:,.1f} GiB of memory "
        f"({BYTES_PER_SEQ_LEN} bytes per token of seq_len: length histograms, bounds and the "
        f"packers' room trees grow with -L, not with the data"
        + (", plus the optimal packer's 0.4 GB DP table, whatever --work-limit" if "optimal"
           in algos else "")
        + f"), and {available / 2**30:,.1f} GiB are available; lower -L (at most about "
        f"{fits:,} here) or run on a machine with more memory")


def check_options(algo: str, options: PackerOptions) -> PackerSpec:
    """The registry entry for ``algo``; refuses options it does not read, by name."""
    if algo not in PACKERS:
        raise PacktoolError(f"unknown packer {algo!r}; choose one of {', '.join(PACKERS)}")
    spec = PACKERS[algo]
    unknown = sorted(options.given() - spec.options)
    if unknown:
        takes = ", ".join(f"--{o.replace('_', '-')}" for o in sorted(spec.options)) or "none"
        raise PacktoolError(
            f"--algo {algo} takes no {', '.join('--' + o.replace('_', '-') for o in unknown)} "
            f"(its options: {takes}); drop the option or choose a packer that reads it"
            + (" (--max-docs: " + ", ".join(a for a, p in PACKERS.items() if p.options >= _CAP)
               + ")" if "max_docs" in unknown else ""))
    return spec


def run_packer(lengths, seq_len: int, algo: str = "bfd",
               options: PackerOptions | None = None, narrow_ids: bool = False) -> Packing:
    """Pack ids (int64; with ``narrow_ids`` int32 where the packer makes them so, for a
    caller minding memory) and report for documents of ``lengths`` in packs of ``seq_len``
    tokens."""
    import numpy as np

    options = options or PackerOptions()
    spec = check_options(algo, options)
    arr = check_lengths(lengths, seq_len, spec.narrow)
    check_seq_len_memory(seq_len, [algo])
    if arr.size == 0 or not arr.any():
        packs = np.full(arr.size, -1, np.int64)
        return Packing(packs, PackerReport(algo, 0, _effective(options, spec)))
    packing = spec.load()(arr, int(seq_len), options)
    packs = np.asarray(packing.packs)
    packing.packs = packs if narrow_ids and packs.dtype == np.int32 else \
        packs.astype(np.int64, copy=False)
    return packing


def assign_packs(lengths, seq_len: int, algo: str = "bfd", seed: int = 0,
                 balance: str = "none", balance_ranks: int = 8, overflow: str = "error",
                 **options) -> np.ndarray:
    """Pack id of every document (see :func:`run_packer` for the report).
    ``balance="attention"`` numbers the packs so that every ``balance_ranks`` consecutive
    ids are of like attention cost (:mod:`packtool.formats.packed.balance`): the same packs,
    in an order for one pack per rank per step. A document longer than ``seq_len`` is refused
    (``overflow="error"``), packed as its first ``seq_len`` tokens (``"truncate"``) or left
    out with id -1 (``"drop"``); a split document would need several ids, so splitting is
    :func:`packtool.pack.plan.make_segments`'s (and ``packtool pack --overflow split``'s).

    >>> assign_packs([3, 5, 2, 6], 8, algo="bfd").tolist()
    [1, 1, 0, 0]
    >>> assign_packs([3, 9, 2, 6], 8, overflow="drop").tolist()
    [1, -1, 0, 0]
    """
    if balance not in ("none", "attention"):
        raise PacktoolError(f"balance {balance!r}: choose none or attention")
    lengths = _overflow(lengths, seq_len, overflow)
    known = {f.name for f in fields(PackerOptions)}
    bad = sorted(set(options) - known)
    if bad:
        raise PacktoolError(f"unknown packer option(s) {', '.join(bad)}; known: "
                            f"{', '.join(sorted(known - {'seed'}))}")
    packs = run_packer(lengths, seq_len, algo, PackerOptions(seed=int(seed), **options)).packs
    if balance == "attention" and packs.size and packs.max() >= 0:
        import numpy as np

        from ..formats.packed.balance import like_cost_order

        ok = packs >= 0
        n_packs = int(packs.max()) + 1
        costs = np.bincount(packs[ok], weights=np.asarray(lengths, np.float64)[ok] ** 2,
                            minlength=n_packs)
        new_id = np.empty(n_packs, np.int64)
        new_id[like_cost_order(np.arange(n_packs), costs, int(balance_ranks))] = \
            np.arange(n_packs)
        packs = np.where(ok, new_id[np.maximum(packs, 0)], -1)
    return packs


def _overflow(lengths, seq_len: int, overflow: str):
    """``lengths`` as ``assign_packs``'s overflow policy makes them (checked later)."""
    import numpy as np

    if overflow == "error":
        return lengths
    if overflow not in ("truncate", "drop"):
        raise PacktoolError(f"overflow {overflow!r}: choose error, truncate or drop (a split "
                            "document needs several pack ids: packtool.pack.plan.make_segments)")
    arr = np.asarray(lengths)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        return arr  # refused by check_lengths, with its message
    return np.minimum(arr, seq_len) if overflow == "truncate" else np.where(
        arr > seq_len, 0, arr)


def _effective(options: PackerOptions, spec: PackerSpec) -> dict:
    """The options in effect; the cap ``max_docs`` only when given, so that a plan without it
    records exactly what it recorded before the cap existed (index.json byte for byte)."""
    return {k: getattr(options, k) for k in sorted(spec.options | {"seed"})
            if not (k in _CAP and getattr(options, k) is None)}


def report(algo: str, packs: np.ndarray, options: PackerOptions, **extra) -> PackerReport:
    """A report for ``packs`` (pack count from the ids) with ``algo``'s effective options."""
    n_packs = int(packs.max()) + 1 if packs.size and packs.max() >= 0 else 0
    return PackerReport(algo, n_packs, _effective(options, PACKERS[algo]), **extra)


def depth_warning(algo: str, lengths: np.ndarray, capacity: int, depth: int,
                  n_packs: int) -> list[str]:
    """A warning when a depth cap, not the lengths, decides how full packs are.

    With at most ``depth`` documents per pack, packs >= n / depth, so efficiency is at most
    depth * mean / L: on prose (mean ~90 tokens) at L=2048, depth 12 caps it near 50%.
    """
    tokens = int(lengths.sum())
    n = int((lengths > 0).sum())
    if not n_packs or not n:
        return []
    efficiency = tokens / (n_packs * capacity)
    mean = tokens / n
    if efficiency >= 0.9 or depth * mean >= capacity:
        return []
    need = -(-capacity // max(int(mean), 1))
    return [f"{algo} at --max-depth {depth}: packs are only {100 * efficiency:.1f}% full, "
            f"because documents average {mean:,.0f} tokens and at most {depth} fit in a pack of "
            f"{capacity:,}; raise --max-depth to {need} or more, or use --algo bfd or optimal"]


def depth_capped_efficiency(lengths: np.ndarray, capacity: int, depth: int) -> float:
    """Upper bound on the efficiency of any packing with <= ``depth`` documents per pack."""
    import numpy as np

    n = int((np.asarray(lengths) > 0).sum())
    if not n:
        return 1.0
    min_packs = max(-(-n // depth), -(-int(np.sum(lengths)) // capacity))
    return int(np.sum(lengths)) / (min_packs * capacity)
