"""``pack --vsl MIN:MAX``: variable sequence length, Dataset Decomposition's cutting
(Pouransari et al., NeurIPS 2024; OLMo-core's variable-sequence-length dataset cuts the same).

Every document is cut, by the binary representation of its length, into chunks of 2**k tokens
with MIN <= 2**k <= MAX, longest first, each a row of its own (one segment, no padding, no
other document); a document longer than MAX first gives ``n // MAX`` chunks of MAX. What is
left under MIN tokens (``n % MIN``) is a remnant, packed with bfd into rows of MIN::

    n = 1,000, --vsl 256:2048     1000 = 512 + 256 + 232
    chunks     (offset 0, 512)  (offset 512, 256)          rows of 512 and 256 tokens
    remnant    (offset 768, 232)                            bfd into rows of 256 with others

    n = 5,000, --vsl 256:2048     5000 = 2 x 2048 + 512 + 256 + 136

So a chunk of 2**k starts at a multiple of 2**k in its document, a remnant at a multiple of
MIN; a document keeps its chunks in order (offsets rise) and its source document id. A row's
slot length is its chunk's length, or MIN for a remnant row: ``max(MIN, tokens of the row)``,
derived from the segment table (a chunk row holds >= MIN tokens, a remnant row <= MIN), so the
format stores nothing per row for it.

The plan is the ordinary one (:mod:`packtool.pack.plan`) over a table of these chunks and
remnants: table entries per document in order, one entry (length 0) for an empty document,
each chunk its own pack id, the remnants bfd's. Measured (scripts/bench_vsl.py, 10**7
lognormal documents, 2 cores): see docs/TRAINING.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._numba import njit
from .segments import Segments


@njit
def _fill(lengths, lo, hi, first, table):
    """Each document's chunks longest first, then its remnant, from table entry first[d]."""
    for d in range(lengths.shape[0]):
        n = np.int64(lengths[d])
        t = first[d]
        if n == 0:
            table[t] = 0
            continue
        for _ in range(n // hi):
            table[t] = hi
            t += 1
        r = n % hi
        b = hi >> 1
        while b >= lo:
            if r & b:
                table[t] = b
                t += 1
            b >>= 1
        if n % lo:
            table[t] = n % lo


@njit
def _offsets(length, j, lo, hi, out):
    """Offset of piece j of a cut document of ``length`` tokens (a cut is determined by the
    length alone): j * MAX for its MAX chunks, then the set bits above, then the remnant."""
    for i in range(length.shape[0]):
        n, k = np.int64(length[i]), np.int64(j[i])
        q = n // hi
        if k < q:
            out[i] = k * hi
            continue
        off = q * hi
        r = n % hi
        b = hi >> 1
        k -= q
        while b >= lo and k > 0:
            if r & b:
                off += b
                k -= 1
            b >>= 1
        out[i] = off


@dataclass
class VslSegments(Segments):
    """:class:`Segments` of a vsl cut: ``split_*`` list the documents cut into several
    pieces (as for --overflow split), ``split_lengths`` their lengths, from which the offset
    of each piece follows."""

    split_lengths: np.ndarray = None
    vsl: tuple = (1, 1)

    def piece_offsets(self, split: np.ndarray, piece: np.ndarray) -> np.ndarray:
        out = np.empty(piece.size, np.int64)
        _offsets(self.split_lengths[split], piece, self.vsl[0], self.vsl[1], out)
        return out


def cut(lengths: np.ndarray, vsl: tuple[int, int]) -> VslSegments:
    """The table of chunks and remnants of documents ``lengths`` (see the module's doc),
    with the counts ``make_segments`` gives: n_split documents cut into n_split_pieces."""
    lo, hi = vsl
    lengths = np.asarray(lengths)
    n_docs = lengths.size
    src = lengths.astype(np.int64, copy=False)
    pieces = src // hi + (src % lo > 0)  # per document: its chunks, its remnant, 1 if empty
    b = hi >> 1
    while b >= lo:  # a chunk per bit of n % MAX from MIN up (n & b is (n % MAX) & b)
        pieces += (src & b) > 0
        b >>= 1
    np.maximum(pieces, 1, out=pieces)
    first = np.zeros(n_docs, np.int64)
    np.cumsum(pieces[:-1], out=first[1:])
    total = int(first[-1] + pieces[-1]) if n_docs else 0
    table = np.empty(total, np.int32)  # MAX <= 2**30
    _fill(src, lo, hi, first, table)
    split = np.flatnonzero(pieces > 1)
    counts = {"n_docs": int(n_docs), "n_empty": int(np.count_nonzero(lengths == 0)),
              "n_overlong": int(np.count_nonzero(lengths > hi)), "n_split": int(split.size),
              "n_split_pieces": int(pieces[split].sum()), "n_truncated": 0,
              "n_truncated_tokens": 0, "n_dropped": 0, "n_dropped_tokens": 0,
              "n_segments": int(np.count_nonzero(table)),
              "n_tokens": int(src.sum(dtype=np.int64))}
    return VslSegments(table, split.astype(np.int64), first[split], pieces[split], hi,
                       counts, split_lengths=src[split], vsl=(lo, hi))


def vsl_packs(table: np.ndarray, lo: int, seed: int = 0):
    """Pack id per table entry: every chunk (>= MIN tokens) a pack of its own, in table order,
    then the remnants' bfd packs of MIN; -1 for an empty entry. (ids, the bfd report)"""
    from ..packers import PackerOptions, run_packer

    table = np.asarray(table)
    ids = np.full(table.size, -1, np.int64)
    chunk = table >= lo
    n_chunks = int(np.count_nonzero(chunk))
    ids[chunk] = np.arange(n_chunks)
    rem = np.flatnonzero((table > 0) & ~chunk)
    packing = run_packer(table[rem], lo, "bfd", PackerOptions(seed=seed))
    ids[rem] = packing.packs + n_chunks
    packing.report.n_packs += n_chunks
    return ids, packing.report


def slot_lengths(row_tokens: np.ndarray, lo: int) -> np.ndarray:
    """Each row's slot length: its chunk's length, or MIN for a remnant row (int64)."""
    return np.maximum(np.asarray(row_tokens, np.int64), lo)


def row_table(slots: np.ndarray, row_tokens: np.ndarray, row_segments: np.ndarray,
              vsl: tuple[int, int]) -> dict:
    """index.json's ``vsl`` entry: MIN, MAX, rows per slot length (remnant rows apart), the
    remnant rows and their tokens, and the slot tokens (what a trainer's batches hold)."""
    lo, hi = vsl
    slots = np.asarray(slots, np.int64)
    remnant = (np.asarray(row_tokens) < lo) | (np.asarray(row_segments) > 1)
    lengths, n = np.unique(slots[~remnant], return_counts=True)
    return {"min": lo, "max": hi,
            "rows": {str(int(k)): int(c) for k, c in zip(lengths, n, strict=True)},
            "n_remnant_rows": int(remnant.sum()),
            "n_remnant_tokens": int(np.asarray(row_tokens, np.int64)[remnant].sum()),
            "n_slot_tokens": int(slots.sum())}


def predict(lengths: np.ndarray, vsl: tuple[int, int], seed: int = 0) -> dict:
    """``stats --vsl``: the rows ``pack --vsl`` writes for documents ``lengths`` (its very
    cut and bfd), as index.json's ``vsl`` entry plus the tokens, rows and remnant share."""
    segs = cut(lengths, vsl)
    ids, _ = vsl_packs(segs.table_length, vsl[0], seed)
    ok = ids >= 0
    n_rows = int(ids.max()) + 1 if ok.any() else 0
    tokens = np.bincount(ids[ok], weights=segs.table_length[ok], minlength=n_rows)
    nseg = np.bincount(ids[ok], minlength=n_rows)
    tokens = tokens.astype(np.int64)
    entry = row_table(slot_lengths(tokens, vsl[0]), tokens, nseg, vsl)
    n_tok = segs.counts["n_tokens"]
    return {**entry, "n_rows": n_rows, "n_tokens": n_tok,
            "remnant_share": entry["n_remnant_tokens"] / max(n_tok, 1)}
