"""What documents become before packing: the segments of an overflow policy (--overflow
split, truncate, drop), as a table with an entry per document plus one per extra piece
(:class:`Segments`); ``pack --vsl``'s cut (:mod:`.vsl`) makes the same kind of table."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import PacktoolError
from ..options import OVERFLOW


def _narrow(a: np.ndarray) -> np.ndarray:
    """int32 when the values fit, else int64."""
    a = np.asarray(a)
    if a.size and (int(a.max()) >= 2**31 or int(a.min()) < -2**31):
        return a.astype(np.int64, copy=False)
    return a.astype(np.int32, copy=False)


@dataclass
class Segments:
    """The segments an overflow policy makes of documents, in document order, a piece after
    another: table entry ``s`` is document ``s`` until the first split document, and in
    general ``s`` minus the extra pieces of the split documents before it. ``table_length``
    has an entry for every document (0: empty or dropped) plus one per extra piece; ``doc``,
    ``offset``, ``length`` list the non-empty segments (computed on use, for tests and
    reports)."""

    table_length: np.ndarray     # int32/int64 per table entry
    split_docs: np.ndarray       # documents cut into several pieces, ascending (int64)
    split_first: np.ndarray      # the table entry of each one's first piece (int64)
    split_pieces: np.ndarray     # and its number of pieces (int64)
    seq_len: int
    counts: dict = field(default_factory=dict)

    def locate(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(document, offset) of table entries ``index`` (int64 arrays)."""
        index = np.asarray(index, np.int64)
        if not self.split_docs.size:
            return index, np.zeros(index.size, np.int64)
        extra = np.concatenate([[0], np.cumsum(self.split_pieces - 1)])
        j = np.searchsorted(self.split_first, index, side="right") - 1
        jj = np.maximum(j, 0)
        inside = (j >= 0) & (index < self.split_first[jj] + self.split_pieces[jj])
        doc = np.where(inside, self.split_docs[jj], index - extra[j + 1])
        offset = np.zeros(index.size, np.int64)
        at = np.flatnonzero(inside)
        offset[at] = self.piece_offsets(jj[at], index[at] - self.split_first[jj[at]])
        return doc.astype(np.int64), offset

    def piece_offsets(self, split: np.ndarray, piece: np.ndarray) -> np.ndarray:
        """Offset of piece ``piece`` of split document ``split`` (an index into split_*)."""
        return piece * self.seq_len

    @property
    def _nonempty(self) -> np.ndarray:
        return np.flatnonzero(self.table_length > 0)

    @property
    def doc(self) -> np.ndarray:
        return self.locate(self._nonempty)[0]

    @property
    def offset(self) -> np.ndarray:
        return self.locate(self._nonempty)[1]

    @property
    def length(self) -> np.ndarray:
        return self.table_length[self._nonempty].astype(np.int64)


def make_segments(lengths: np.ndarray, seq_len: int, overflow: str = "split") -> Segments:
    """Turn documents into segments of at most ``seq_len`` tokens under an overflow policy.

    Every document and token is accounted for in ``counts``: empty documents are skipped;
    over-long ones are split into ceil(n / L) pieces, truncated to their first L tokens, or
    dropped."""
    if overflow not in OVERFLOW:
        raise PacktoolError(f"--overflow {overflow!r}: choose one of {', '.join(OVERFLOW)}")
    lengths = np.asarray(lengths)
    over = np.flatnonzero(lengths > seq_len)
    over_tokens = int(lengths[over].sum(dtype=np.int64))
    counts = {"n_docs": int(lengths.size), "n_empty": int(np.count_nonzero(lengths == 0)),
              "n_overlong": int(over.size), "n_split": 0, "n_split_pieces": 0,
              "n_truncated": 0, "n_truncated_tokens": 0, "n_dropped": 0, "n_dropped_tokens": 0}
    table = _narrow(np.minimum(lengths, seq_len))
    none = np.empty(0, np.int64)
    split_docs, split_first, pieces = none, none, none
    if overflow == "split" and over.size:
        n_over = lengths[over].astype(np.int64)
        pieces = -(-n_over // seq_len)
        split_docs = over.astype(np.int64)
        split_first = split_docs + np.concatenate([[0], np.cumsum(pieces - 1)[:-1]])
        # each split document's entries: its pieces, in place (later documents move down)
        keep = np.ones(lengths.size, bool)
        keep[over] = False
        rest = table.size + int((pieces - 1).sum())
        new = np.empty(rest, table.dtype)
        idx = np.arange(lengths.size, dtype=np.int64)
        extra_before = np.zeros(lengths.size, np.int64)
        extra_before[over] = pieces - 1
        shift = np.cumsum(extra_before) - extra_before  # extra pieces before each document
        new[(idx + shift)[keep]] = table[keep]
        within = np.arange(int(pieces.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(pieces) - pieces, pieces)
        starts = np.repeat(split_first, pieces)
        new[starts + within] = np.minimum(np.repeat(n_over, pieces) - within * seq_len,
                                          seq_len)
        table = new
        counts.update(n_split=int(over.size), n_split_pieces=int(pieces.sum()))
    elif overflow == "drop":
        table[over] = 0
        counts.update(n_dropped=int(over.size), n_dropped_tokens=over_tokens)
    elif overflow == "truncate":
        counts.update(n_truncated=int(over.size),
                      n_truncated_tokens=over_tokens - int(over.size) * seq_len)
    counts["n_segments"] = int(np.count_nonzero(table))
    counts["n_tokens"] = int(table.sum(dtype=np.int64))
    return Segments(table, split_docs, split_first, pieces, seq_len, counts)
