"""``pack`` step 1, pure: document lengths + options -> a :class:`PackLayout` (segments, pack
assignment, order, shard boundaries, counts). No disk access, so tests check a plan directly.

    segments = documents after --overflow (split / truncate / drop; empty ones skipped)
    packs    = the packer's pack id per segment
    order    = packs shuffled with --seed (or the packer's order with --no-shuffle)
    shards   = consecutive packs of about --shard-size tokens

Memory: O(documents) int64 arrays (10M documents: ~0.5 GB peak).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import numpy as np

from . import seeds
from ._numba import njit
from .errors import PacktoolError
from .packers import PackerOptions, PackerReport, run_packer

OVERFLOW = ("split", "truncate", "drop")


@dataclass(frozen=True)
class PackOptions:
    """Everything ``pack`` is asked to do besides where to read and write."""

    seq_len: int
    algo: str = "bfd"
    overflow: str = "split"
    seed: int = 0
    shuffle: bool = True
    shard_size: int = 1 << 27           # tokens per shard, about
    max_depth: int | None = None        # packer options (see PackerOptions)
    strict: bool = False
    max_strategies: int | None = None
    work_limit: int | None = None
    time_limit: float | None = None
    valid_docs: int | None = None       # hold out this many documents (seeded, per source) ...
    valid_fraction: float | None = None  # ... or this fraction of each source, packed apart
    group_docs: int | None = None       # pack consecutive groups of this many documents apart

    def packer_options(self) -> PackerOptions:
        names = {f.name for f in fields(PackerOptions)}
        return PackerOptions(**{k: v for k, v in asdict(self).items() if k in names})

    def check(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or not (
                1 <= self.seq_len < 2**31):
            raise PacktoolError(f"--seq-len must be an integer from 1 to 2,147,483,647, got "
                                f"{self.seq_len!r}")
        if self.overflow not in OVERFLOW:
            raise PacktoolError(f"--overflow {self.overflow!r}: choose one of "
                                f"{', '.join(OVERFLOW)}")
        if self.shard_size < 1:
            raise PacktoolError(f"--shard-size must be positive, got {self.shard_size}")
        if self.group_docs is not None and (isinstance(self.group_docs, bool) or not isinstance(
                self.group_docs, int) or self.group_docs < 1):
            raise PacktoolError(f"--group-docs must be a positive number of documents, got "
                                f"{self.group_docs!r}")


@dataclass(frozen=True)
class RunOptions:
    """Where a plan runs (see :mod:`packtool.scale`): in this process (``local``), as Ray
    tasks, or as task ``task`` of ``tasks`` batch-scheduler array tasks (then ``finalize``
    once). The data files are the same bytes whichever way."""

    executor: str = "local"
    ray_address: str | None = None     # None: start a local Ray instance
    ray_cpus: int = 1                  # tokenizer threads per Ray task
    max_retries: int = 3               # Ray's retries of a task whose worker died
    tasks: int | None = None
    task: int | None = None
    finalize: bool = False

    @property
    def one_task(self) -> bool:
        """One array task of several: it shares the output with the others."""
        return self.task is not None and self.tasks is not None and self.tasks > 1 \
            and not self.finalize


@dataclass
class Segments:
    doc: np.ndarray      # global source document index
    offset: np.ndarray   # token offset inside that document
    length: np.ndarray
    counts: dict = field(default_factory=dict)


def make_segments(lengths: np.ndarray, seq_len: int, overflow: str = "split") -> Segments:
    """Turn documents into segments of at most ``seq_len`` tokens under an overflow policy.

    Every document and token is accounted for in ``counts``: empty documents are skipped;
    over-long ones are split into ceil(n / L) pieces, truncated to their first L tokens, or
    dropped.
    """
    if overflow not in OVERFLOW:
        raise PacktoolError(f"--overflow {overflow!r}: choose one of {', '.join(OVERFLOW)}")
    lengths = np.asarray(lengths, dtype=np.int64)
    over = lengths > seq_len
    n_over = int(over.sum())
    over_tokens = int(lengths[over].sum())
    counts = {
        "n_docs": int(lengths.size),
        "n_empty": int((lengths == 0).sum()),
        "n_overlong": n_over,
        "n_split": 0, "n_split_pieces": 0,
        "n_truncated": 0, "n_truncated_tokens": 0,
        "n_dropped": 0, "n_dropped_tokens": 0,
    }
    if overflow == "split":
        pieces = -(-lengths // seq_len)
        doc = np.repeat(np.arange(lengths.size, dtype=np.int64), pieces)
        first = np.repeat(np.cumsum(pieces) - pieces, pieces)
        offset = (np.arange(doc.size, dtype=np.int64) - first) * seq_len
        length = np.minimum(lengths[doc] - offset, seq_len)
        counts.update(n_split=n_over, n_split_pieces=int(pieces[over].sum()))
    else:
        keep = lengths > 0
        if overflow == "drop":
            keep &= ~over
            counts.update(n_dropped=n_over, n_dropped_tokens=over_tokens)
        else:
            counts.update(n_truncated=n_over, n_truncated_tokens=over_tokens - n_over * seq_len)
        doc = np.flatnonzero(keep).astype(np.int64)
        offset = np.zeros(doc.size, np.int64)
        length = np.minimum(lengths[doc], seq_len)
    counts["n_segments"] = int(doc.size)
    counts["n_tokens"] = int(length.sum())
    return Segments(doc, offset, length, counts)


@njit
def _order_segments(packs, rank, n_packs):
    """Segments grouped by output pack position (stable); segments per pack."""
    n = packs.shape[0]
    nseg = np.zeros(n_packs + 1, np.int64)
    for s in range(n):
        nseg[rank[packs[s]] + 1] += 1
    start = np.cumsum(nseg)
    order = np.empty(n, np.int64)
    pos = start[:-1].copy()
    for s in range(n):
        r = rank[packs[s]]
        order[pos[r]] = s
        pos[r] += 1
    return order, nseg[1:]


@dataclass
class PackLayout:
    """Where every segment goes. Segment arrays are in output order: pack by pack (in output
    order), segments of a pack in source order."""

    options: PackOptions
    counts: dict                # make_segments' counts
    seg_doc: np.ndarray
    seg_offset: np.ndarray
    seg_length: np.ndarray
    pack_nseg: np.ndarray       # segments per pack, output order
    shard_starts: np.ndarray    # first pack of each shard, then n_packs
    report: PackerReport

    @property
    def n_packs(self) -> int:
        return int(self.pack_nseg.size)

    @property
    def n_shards(self) -> int:
        return int(self.shard_starts.size) - 1

    @property
    def seg_first(self) -> np.ndarray:
        """First segment of each pack, then the segment count."""
        return np.concatenate([[0], np.cumsum(self.pack_nseg)]).astype(np.int64)

    def pack_lengths(self) -> np.ndarray:
        ends = np.cumsum(self.seg_length)
        first = self.seg_first
        tok = np.concatenate([[0], ends[first[1:] - 1]]) if self.n_packs else np.zeros(1)
        return np.diff(tok).astype(np.int64)

    def shard(self, k: int) -> tuple[slice, slice]:
        """(packs, segments) of shard k as slices into pack_nseg and the segment arrays."""
        p0, p1 = int(self.shard_starts[k]), int(self.shard_starts[k + 1])
        first = self.seg_first
        return slice(p0, p1), slice(int(first[p0]), int(first[p1]))


def plan_pack(lengths: np.ndarray, options: PackOptions,
              repeats: np.ndarray | None = None) -> PackLayout:
    """The whole layout of a packed dataset from document lengths alone. ``repeats`` (copies
    per document, from :func:`doc_repeats`) packs copy rounds apart (see :func:`make_rounds`);
    ``None`` means every document once."""
    options.check()
    lengths = np.asarray(lengths, np.int64)
    if repeats is None:
        rounds = [make_segments(lengths, options.seq_len, options.overflow)]
    else:
        rounds = make_rounds(lengths, repeats, options.seq_len, options.overflow)
    parts, n_packs, report = [], 0, None
    for segs in rounds:
        for a, b in doc_groups(segs.doc, lengths.size, options.group_docs):
            packing = run_packer(segs.length[a:b], options.seq_len, options.algo,
                                 options.packer_options())
            parts.append(np.where(packing.packs >= 0, packing.packs + n_packs, -1))
            n_packs += packing.report.n_packs
            report = _merge_reports(report, packing.report)
    if report is None:  # nothing to pack at all
        report = run_packer(np.empty(0, np.int64), options.seq_len, options.algo,
                            options.packer_options()).report
    cat = (lambda f: np.concatenate([f(r) for r in rounds])) if rounds else (
        lambda f: np.empty(0, np.int64))
    seg_doc = cat(lambda r: r.doc)
    seg_off = cat(lambda r: r.offset)
    seg_len = cat(lambda r: r.length)
    packs = np.concatenate(parts) if parts else np.empty(0, np.int64)
    rank = (seeds.rng(options.seed, "pack.shuffle").permutation(n_packs) if options.shuffle
            else np.arange(n_packs)).astype(np.int64)
    order, pack_nseg = _order_segments(packs, rank, n_packs)
    counts = rounds[0].counts if repeats is None else _merge_counts(rounds, lengths)
    layout = PackLayout(options, counts, seg_doc[order], seg_off[order],
                        seg_len[order], pack_nseg, np.zeros(1, np.int64), report)
    pack_len = layout.pack_lengths()
    if n_packs and int(pack_len.max()) > options.seq_len:  # a packer bug never reaches disk
        raise RuntimeError(f"packer {options.algo} made a pack of {int(pack_len.max())} "
                           f"> {options.seq_len} tokens")
    layout.shard_starts = shard_starts(pack_len, options.shard_size)
    return layout


def doc_groups(seg_doc: np.ndarray, n_docs: int, group_docs: int | None
               ) -> list[tuple[int, int]]:
    """Segment ranges of consecutive groups of ``group_docs`` documents (segments are in
    document order), each packed on its own: OLMo-core packs per source file this way, and
    it bounds one packer call's memory and time. Measured on 10M lognormal lengths
    (scripts/bench_scale.py, bfd, seq_len 4096): see docs/SCALE.md for packs vs global."""
    if group_docs is None or n_docs <= group_docs:
        return [(0, int(seg_doc.size))]
    cuts = np.searchsorted(seg_doc, np.arange(0, n_docs + group_docs, group_docs)[1:],
                           side="left")
    starts = np.concatenate([[0], cuts[:-1]])
    return [(int(a), int(b)) for a, b in zip(starts, cuts, strict=True) if b > a]


def _merge_reports(a: PackerReport | None, b: PackerReport) -> PackerReport:
    """One report for packs made in several rounds: counts add up; an LP bound of one round
    is no bound of the whole, so LP figures are kept only for a single round."""
    if a is None:
        return b
    from dataclasses import replace

    return replace(a, n_packs=a.n_packs + b.n_packs, lp_value=None, lp_bound=None,
                   lp_converged=None, warnings=list(dict.fromkeys(a.warnings + b.warnings)))


_SUMMED = ("n_overlong", "n_split", "n_split_pieces", "n_truncated", "n_truncated_tokens",
           "n_dropped", "n_dropped_tokens", "n_segments", "n_tokens")


def _merge_counts(rounds: list[Segments], lengths: np.ndarray) -> dict:
    """Counts over copy rounds: overflow figures and segments add up (per copy); documents
    and empty documents are those of the sources."""
    counts = {k: sum(r.counts[k] for r in rounds) for k in _SUMMED}
    return {"n_docs": int(lengths.size), "n_empty": int((lengths == 0).sum()), **counts}


def shard_starts(pack_len: np.ndarray, shard_size: int) -> np.ndarray:
    """First pack of each shard (then the pack count): a shard closes once it holds
    >= shard_size tokens; every shard holds at least one pack."""
    n_packs = pack_len.size
    starts = [0]
    if n_packs:
        cum = np.concatenate([[0], np.cumsum(pack_len)])
        while True:
            p0 = starts[-1]
            p1 = max(int(np.searchsorted(cum, cum[p0] + shard_size, side="left")), p0 + 1)
            if p1 >= n_packs:
                break
            starts.append(p1)
    starts.append(n_packs)
    return np.array(starts, np.int64)


# ------------------------------------------------------------------ mixtures and held-out docs


def parse_source(spec: str) -> tuple[str, float]:
    """``PREFIX`` or ``PREFIX:FACTOR`` (``web:2.0``, ``books:0.5``) -> (prefix, factor)."""
    head, sep, tail = str(spec).rpartition(":")
    if sep and head:
        try:
            factor = float(tail)
        except ValueError:
            return str(spec), 1.0
        if not (0 <= factor < 1e6) or factor != factor:
            raise PacktoolError(f"{spec}: repeat factor {tail} must be a number from 0 to "
                                "999,999 (2.0 = every document twice, 0.5 = a seeded half)")
        return head, factor
    return str(spec), 1.0


def _sub_seed(seed: int, domain: str, source: int) -> np.random.Generator:
    return seeds.rng(seed, domain, source)  # == default_rng([seed, 1 or 2, source]), as before


def held_out(lengths: np.ndarray, sizes: list[int], seed: int, valid_docs: int | None = None,
             valid_fraction: float | None = None) -> np.ndarray:
    """Boolean mask of the documents held out for validation: whole non-empty documents, a
    seeded sample of each source in proportion to its size (``valid_docs`` in all, or
    ``valid_fraction`` of each source), at least one from every source that has any."""
    mask = np.zeros(lengths.size, bool)
    if valid_docs is None and valid_fraction is None:
        return mask
    if valid_docs is not None and valid_fraction is not None:
        raise PacktoolError("give --valid-docs or --valid-fraction, not both")
    total = int(sum(sizes))
    nonempty = lengths > 0
    if valid_docs is not None and not 1 <= valid_docs < int(nonempty.sum()):
        raise PacktoolError(f"--valid-docs {valid_docs}: must be from 1 to "
                            f"{int(nonempty.sum()) - 1:,}"
                            " (the non-empty documents, less one for training)")
    if valid_fraction is not None and not 0 < valid_fraction < 1:
        raise PacktoolError(f"--valid-fraction {valid_fraction}: must be above 0 and below 1")
    base = 0
    for k, n in enumerate(sizes):
        docs = base + np.flatnonzero(nonempty[base:base + n])
        share = valid_fraction if valid_fraction is not None else valid_docs / total
        want = min(max(1, round(share * docs.size)), docs.size) if docs.size else 0
        pick = (_sub_seed(seed, "mixture.held_out", k).choice(docs, size=want, replace=False)
                if want else docs[:0])
        mask[pick] = True
        base += n
    return mask


def doc_repeats(sizes: list[int], factors: list[float], seed: int,
                exclude: np.ndarray | None = None) -> np.ndarray:
    """How many copies of each document a mixture uses: floor(factor) of every document, plus
    one more for a seeded sample of round(frac(factor) * n) of them (``exclude``d documents,
    e.g. held-out ones, get none and are not sampled)."""
    reps = np.zeros(int(sum(sizes)), np.int64)
    base = 0
    for k, (n, factor) in enumerate(zip(sizes, factors, strict=True)):
        whole, frac = int(factor), factor - int(factor)
        eligible = np.arange(base, base + n)
        if exclude is not None:
            eligible = eligible[~exclude[base:base + n]]
        reps[eligible] = whole
        extra = round(frac * eligible.size)
        if extra:
            pick = _sub_seed(seed, "mixture.repeats", k).choice(eligible, size=extra, replace=False)
            reps[pick] += 1
        base += n
    return reps


def make_rounds(lengths: np.ndarray, repeats: np.ndarray, seq_len: int, overflow: str
                ) -> list[Segments]:
    """Segments of copy r of every document repeated more than r times, one list per r:
    packing each round on its own is what keeps copies of a document out of each other's
    packs."""
    rounds = []
    for r in range(int(repeats.max()) if repeats.size else 0):
        keep = repeats > r
        rounds.append(make_segments(np.where(keep, lengths, 0), seq_len, overflow))
    return rounds


def mixture_plan(lengths: np.ndarray, sizes: list[int], factors: list[float],
                 options: PackOptions) -> tuple[np.ndarray | None, np.ndarray]:
    """(copies per document for the training packs, or None for "each once"; held-out mask).
    A pure function of the inputs and options: ``verify`` recomputes it to check a pack."""
    valid = held_out(lengths, sizes, options.seed, options.valid_docs, options.valid_fraction)
    if all(f == 1 for f in factors) and not valid.any():
        return None, valid
    return doc_repeats(sizes, factors, options.seed, exclude=valid), valid


def expected_segments(lengths: np.ndarray, seq_len: int, overflow: str,
                      repeats: np.ndarray | None) -> Segments:
    """Every segment a pack of these documents must hold (copies included), unordered."""
    if repeats is None:
        return make_segments(lengths, seq_len, overflow)
    rounds = make_rounds(lengths, repeats, seq_len, overflow)
    cat = (lambda f: np.concatenate([f(r) for r in rounds])) if rounds else (
        lambda f: np.empty(0, np.int64))
    return Segments(cat(lambda r: r.doc), cat(lambda r: r.offset), cat(lambda r: r.length),
                    _merge_counts(rounds, lengths))
