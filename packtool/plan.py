"""``pack`` step 1, pure: document lengths + options -> a :class:`PackLayout` (segments, pack
assignment, order, shard boundaries, counts). No disk access, so tests check a plan directly.

    segments = documents after --overflow (split / truncate / drop; empty ones skipped)
    packs    = the packer's pack id per segment
    order    = packs shuffled with --seed (or the packer's order with --no-shuffle)
    shards   = consecutive packs of about --shard-size tokens

Memory: O(documents) int64 arrays (10M documents: ~0.5 GB peak).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._numba import njit
from .errors import PacktoolError
from .options import OVERFLOW, PackOptions
from .packers import PackerReport, run_packer

__all__ = ["OVERFLOW", "PackLayout", "PackOptions", "Segments", "doc_groups", "make_rounds",
           "make_segments", "plan_pack", "shard_starts"]




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
    rank = (np.random.default_rng(options.seed).permutation(n_packs) if options.shuffle
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
