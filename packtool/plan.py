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

    def packer_options(self) -> PackerOptions:
        names = {f.name for f in fields(PackerOptions)}
        return PackerOptions(**{k: v for k, v in asdict(self).items() if k in names})

    def check(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or not (
                1 <= self.seq_len < 2**31):
            raise PacktoolError(f"--seq-len must be an integer from 1 to 2,147,483,647, got "
                                f"{self.seq_len!r}")
        if self.overflow not in OVERFLOW:
            raise PacktoolError(f"--overflow {self.overflow!r}: choose one of {', '.join(OVERFLOW)}")
        if self.shard_size < 1:
            raise PacktoolError(f"--shard-size must be positive, got {self.shard_size}")


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


def plan_pack(lengths: np.ndarray, options: PackOptions) -> PackLayout:
    """The whole layout of a packed dataset from document lengths alone."""
    options.check()
    segs = make_segments(lengths, options.seq_len, options.overflow)
    packing = run_packer(segs.length, options.seq_len, options.algo, options.packer_options())
    packs, n_packs = packing.packs, packing.report.n_packs
    rank = (np.random.default_rng(options.seed).permutation(n_packs) if options.shuffle
            else np.arange(n_packs)).astype(np.int64)
    order, pack_nseg = _order_segments(packs, rank, n_packs)
    layout = PackLayout(options, segs.counts, segs.doc[order], segs.offset[order],
                        segs.length[order], pack_nseg, np.zeros(1, np.int64), packing.report)
    pack_len = layout.pack_lengths()
    if n_packs and int(pack_len.max()) > options.seq_len:  # a packer bug never reaches disk
        raise RuntimeError(f"packer {options.algo} made a pack of {int(pack_len.max())} "
                           f"> {options.seq_len} tokens")
    layout.shard_starts = shard_starts(pack_len, options.shard_size)
    return layout


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
