"""``pack`` step 1, pure: document lengths + options -> a :class:`PackLayout` (segments, pack
assignment, order, shard boundaries, counts). No disk access, so tests check a plan directly.

    segments = documents after --overflow (split / truncate / drop; empty ones skipped)
    packs    = the packer's pack id per segment (of the lengths rounded up to multiples of
               --align K: rows, pads included, fit --seq-len; --max-docs caps its segments)
    order    = packs shuffled with --seed (or the packer's order with --no-shuffle)
    shards   = consecutive packs of about --shard-size tokens

Memory, lean by design (scripts/bench_scale_memory.py): a segment is an index into the
table the overflow policy makes of the documents (one entry per document, more only for the
few documents split into pieces), so the plan holds per segment its length (int32) and its
place in the output (int64), and per pack its segment count: the document and offset of a
segment are derived shard by shard (:meth:`PackLayout.shard_segments`), never held for all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .._numba import njit
from ..formats.packed.layout import align_up
from ..options import OVERFLOW, PackOptions
from ..packers import PackerReport, run_packer
from .order import balanced_rank, shuffle_rank
from .segments import Segments, make_segments

__all__ = ["OVERFLOW", "PackLayout", "PackOptions", "Segments", "doc_groups", "make_rounds",
           "make_segments", "plan_pack", "shard_starts"]


@njit
def order_segments(packs, rank, n_packs, idx):
    """Table entries grouped by output pack position (stable; entries with pack -1, empty,
    left out); segments per pack."""
    n = packs.shape[0]
    nseg = np.zeros(n_packs + 1, np.int64)
    for s in range(n):
        if packs[s] >= 0:
            nseg[rank[packs[s]] + 1] += 1
    start = np.cumsum(nseg)
    order = np.empty(start[-1], idx)
    pos = start[:-1].copy()
    for s in range(n):
        if packs[s] >= 0:
            r = rank[packs[s]]
            order[pos[r]] = s
            pos[r] += 1
    return order, nseg[1:].astype(np.int32)


@dataclass
class PackLayout:
    """Where every segment goes. ``order`` lists table entries (across copy rounds) in output
    order: pack by pack (in output order), segments of a pack in source order;
    ``shard_segments(k)`` gives a shard's (document, offset, length) arrays."""

    options: PackOptions
    counts: dict                 # make_segments' counts (summed over copy rounds)
    rounds: list                 # Segments per copy round (one without a mixture)
    order: np.ndarray            # table entries in output order (int32/int64, round-major)
    pack_nseg: np.ndarray        # segments per pack, output order (int32)
    shard_starts: np.ndarray     # first pack of each shard, then n_packs
    report: PackerReport
    sums: tuple | None = field(default=None, repr=False)  # see pack_sums

    @property
    def n_packs(self) -> int:
        return int(self.pack_nseg.size)

    @property
    def n_shards(self) -> int:
        return int(self.shard_starts.size) - 1

    @property
    def seg_first(self) -> np.ndarray:
        """First segment of each pack, then the segment count."""
        return np.concatenate([[0], np.cumsum(self.pack_nseg, dtype=np.int64)])

    def segments(self, a: int = 0, b: int | None = None):
        """(document, offset, length) of output segments a..b-1 (int64)."""
        idx = self.order[a:b]
        doc = np.empty(idx.size, np.int64)
        off = np.empty(idx.size, np.int64)
        length = np.empty(idx.size, np.int64)
        base = 0
        for r in self.rounds:
            m = (idx >= base) & (idx < base + r.table_length.size)
            if m.any():
                doc[m], off[m] = r.locate(idx[m] - base)
                length[m] = r.table_length[idx[m] - base]
            base += r.table_length.size
        return doc, off, length

    @property
    def seg_doc(self) -> np.ndarray:
        return self.segments()[0]

    @property
    def seg_offset(self) -> np.ndarray:
        return self.segments()[1]

    @property
    def seg_length(self) -> np.ndarray:
        return self.segments()[2]

    def ordered_lengths(self, a: int = 0, b: int | None = None) -> np.ndarray:
        """The lengths of output segments a..b-1 (every segment's by default)."""
        if len(self.rounds) == 1:
            return self.rounds[0].table_length[self.order[a:b]]
        return self.segments(a, b)[2]

    def pack_chunks(self, chunk: int = 1 << 20):
        """(first pack, end pack, their segments' first index, their lengths) about ``chunk``
        segments at a time: one gather of the segment lengths per chunk."""
        first = self.seg_first
        p0 = 0
        while p0 < self.n_packs:
            p1 = int(np.searchsorted(first, first[p0] + chunk, side="right")) - 1
            p1 = min(max(p1, p0 + 1), self.n_packs)
            a, b = int(first[p0]), int(first[p1])
            yield p0, p1, first[p0:p1] - a, self.ordered_lengths(a, b)
            p0 = p1

    def pack_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens as int64, attention cost as float64: the sum of squared segment lengths,
        in trees :func:`~packtool.formats.packed.layout.attention_costs`'s ancestor term)
        per pack, made once, a chunk of segments at a time, and kept: 16 bytes a pack,
        one gather of the segment lengths for the shard plan, the jobs' weights and the
        index's figures (at 1e8 documents each gather took ~2.6 s)."""
        if self.sums is None:
            from ..formats.packed.layout import attention_costs

            tokens = np.empty(self.n_packs, np.int64)
            costs = np.empty(self.n_packs, np.float64)
            # prefix trees: a segment sees its ancestors (seg_up per table entry)
            r = self.rounds[0] if len(self.rounds) == 1 else None
            ups = getattr(r, "up", None)
            for p0, p1, at, lengths in self.pack_chunks():
                tokens[p0:p1] = np.add.reduceat(lengths, at, dtype=np.int64)
                idx = (None if ups is None else
                       self.order[int(self.seg_first[p0]):int(self.seg_first[p1])])
                costs[p0:p1] = attention_costs(lengths, np.append(at, lengths.size),
                                               seg_up=None if idx is None else ups[idx])
            self.sums = (tokens, costs)
        return self.sums

    def pack_lengths(self) -> np.ndarray:
        """Tokens per pack (int64)."""
        return self.pack_sums()[0]

    def shard(self, k: int) -> tuple[slice, slice]:
        """(packs, segments) of shard k as slices into pack_nseg and the output order."""
        p0, p1 = int(self.shard_starts[k]), int(self.shard_starts[k + 1])
        first = self.seg_first
        return slice(p0, p1), slice(int(first[p0]), int(first[p1]))


def plan_pack(lengths: np.ndarray, options: PackOptions,
              repeats: np.ndarray | None = None, shuffle_key: tuple = (),
              images=None) -> PackLayout:
    """The whole layout of a packed dataset from document lengths alone. ``repeats`` (copies
    per document, from :func:`packtool.pack.mixture.doc_repeats`) packs copy rounds apart (see
    :func:`make_rounds`); ``None`` means every document once. ``shuffle_key`` keys the pack
    shuffle's random stream further (a group of documents planned on its own). ``images``
    (:class:`packtool.pack.caps.DocImages`): the documents' images, for --max-images and
    --max-vision-tokens and so that no split cuts an image."""
    options.check()
    lengths = np.asarray(lengths)
    if repeats is None:
        rounds = [segments_of(lengths, options)]
    else:
        rounds = make_rounds(lengths, repeats, options)
    parts, n_packs, report, vision = [], 0, None, []
    k = options.alignment
    for segs in rounds:
        weights = None if images is None else images.entry_weights(segs)
        if weights is not None:
            vision.append(weights[2])
        for a, b in doc_groups(segs, options.group_docs):
            ids, rep = _assign(segs.table_length[a:b], options,
                               None if weights is None else [w[a:b] for w in weights])
            if n_packs:
                ids[ids >= 0] += n_packs
            parts.append(ids)
            n_packs += rep.n_packs
            report = _merge_reports(report, rep)
            del ids
    if report is None:  # nothing to pack at all
        report = run_packer(np.empty(0, np.int64), options.seq_len, options.algo,
                            options.packer_options()).report
    packs = (parts[0] if len(parts) == 1 else np.concatenate(parts)) if parts else \
        np.empty(0, np.int64)
    del parts
    rank = shuffle_rank(n_packs, options.order, shuffle_key)
    if options.balance == "attention" and n_packs:
        rank = balanced_rank(rank, packs, rounds, options.balance_ranks,
                             np.concatenate(vision) if vision else None)
    n_table = sum(r.table_length.size for r in rounds)
    order, pack_nseg = order_segments(packs, rank, n_packs,
                                       np.int32 if n_table < 2**31 else np.int64)
    del packs, rank
    counts = rounds[0].counts if repeats is None else _merge_counts(rounds, lengths)
    if k > 1:  # only then: an unaligned plan's counts (and index.json) are as they were
        counts = {**counts, "n_align_tokens": sum(int(align_up(r.table_length, k).sum(
            dtype=np.int64)) for r in rounds) - counts["n_tokens"]}
    layout = PackLayout(options, counts, rounds, order, pack_nseg, np.zeros(1, np.int64),
                        report)
    pack_len = layout.pack_lengths()
    rows = pack_len if k == 1 or not n_packs else np.concatenate([np.add.reduceat(
        align_up(x, k), at, dtype=np.int64) for *_, at, x in layout.pack_chunks()])  # + pads
    if n_packs and int(rows.max()) > options.seq_len:  # a packer bug never reaches disk
        raise RuntimeError(f"packer {options.algo} made a pack of {int(rows.max())} "
                           f"> {options.seq_len} tokens" + (f" aligned to {k}" if k > 1 else ""))
    if options.max_docs and n_packs and int(pack_nseg.max()) > options.max_docs:
        raise RuntimeError(f"packer {options.algo} broke --max-docs {options.max_docs}")
    layout.shard_starts = shard_starts(pack_len, options.shard_size)
    return layout


def make_rounds(lengths: np.ndarray, repeats: np.ndarray, options: PackOptions
                ) -> list[Segments]:
    """Segments of copy r of every document repeated more than r times, one list per r:
    packing each round on its own is what keeps copies of a document out of each other's
    packs."""
    return [segments_of(np.where(repeats > r, lengths, 0), options)
            for r in range(int(repeats.max()) if repeats.size else 0)]


def segments_of(lengths: np.ndarray, options: PackOptions) -> Segments:
    """The segments of documents ``lengths``: --overflow's pieces, or --vsl's chunks."""
    if options.vsl is not None:
        from .vsl import cut

        return cut(lengths, options.rows.vsl_bounds)
    return make_segments(lengths, options.seq_len, options.overflow)


def _assign(table: np.ndarray, options: PackOptions, weights=None):
    """(pack id per table entry, the packer's report): --vsl's rows, or the packer's packs
    of the entries' lengths rounded up to --align's multiple; with ``weights`` (images and
    image tokens per entry) --max-images / --max-vision-tokens kept (:mod:`.caps`)."""
    if options.vsl is not None:
        from .vsl import vsl_packs

        return vsl_packs(table, options.rows.vsl_bounds[0], options.seed)
    packing = run_packer(align_up(table, options.alignment), options.seq_len, options.algo,
                         options.packer_options(), narrow_ids=True)
    if weights is None:
        return packing.packs, packing.report
    from .caps import cap_packs

    packs, added = cap_packs(packing.packs, table, options.seq_len, {
        "--max-images": (weights[0], options.max_images),
        "--max-vision-tokens": (weights[1], options.max_vision_tokens)})
    packing.report.n_packs += added
    return packs, packing.report


def doc_groups(segs: Segments, group_docs: int | None) -> list[tuple[int, int]]:
    """Table-entry ranges of consecutive groups of ``group_docs`` documents, each packed on
    its own: OLMo-core packs per source file this way, and it bounds one packer call's
    memory and time. Measured on 10M lognormal lengths (scripts/bench_scale.py, bfd, seq_len
    4096): see docs/SCALE.md for packs vs global."""
    n_docs = segs.counts["n_docs"]
    if group_docs is None or n_docs <= group_docs:
        return [(0, int(segs.table_length.size))]
    cuts = np.arange(group_docs, n_docs, group_docs, dtype=np.int64)
    extra = np.searchsorted(segs.split_docs, cuts, side="left")  # split docs before each cut
    before = np.concatenate([[0], np.cumsum(segs.split_pieces - 1)])[extra]
    bounds = np.concatenate([[0], cuts + before, [segs.table_length.size]])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def _merge_reports(a: PackerReport | None, b: PackerReport) -> PackerReport:
    """One report for packs made in several rounds: counts add up; an LP bound of one round
    is no bound of the whole, so LP figures are kept only for a single round."""
    if a is None:
        return b
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
