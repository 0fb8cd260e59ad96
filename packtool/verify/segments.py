"""Every segment the packs of a split must hold, and nothing else, checked in memory that does
not grow with the corpus, with verify's own code (never the planner's).

What must be there, from the definition (docs/FORMAT.md): a source document of n tokens with
c copies (the mixture and the held-out split: :mod:`.draws`) becomes under ``--overflow``

    split     its pieces (d, j*L, min(L, n - j*L)) for j < ceil(n / L)
    truncate  (d, 0, min(n, L))
    drop      (d, 0, n) when n <= L
    --vsl MIN:MAX  n // MAX chunks (d, j*MAX, MAX), then one (d, o, 2**k) for every bit 2**k
              of n % MAX from MAX/2 down to MIN (o: the tokens before it), then the remnant
              (d, n - n % MIN, n % MIN) if n % MIN

each c times (an empty document: nothing). The packs' segments must be exactly that multiset.
Both sides are summed into fingerprints, per bucket of consecutive documents (4,096 buckets):
two 64-bit sums of a keyed hash of (document, offset, length), times its copies, the keys
drawn afresh each run. Equal multisets give equal sums; unequal ones give equal sums with
probability about 2**-128. The sources are read a chunk of documents at a time (their
boundaries), the packs a shard at a time. Where a bucket differs, one more pass over the
shards counts that bucket's segments exactly and names the first document that is off (how
often it is in the packs, how often it must be) or the segment that is no document's piece.

Memory: 64 KB of sums a split, one chunk of 2**18 documents, one shard's segment table: no
byte per document. Time: ~4 keyed hashes (a few numpy passes) per segment on each side.
"""

from __future__ import annotations

import os

import numpy as np

from ..formats.packed import ValidationError
from .draws import CHUNK, Selection, lengths_of, source_lengths

BUCKETS = 4096
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (a bijection of 64-bit words), in place."""
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


class Tally:
    """A split's fingerprints per bucket of documents, and its segment and token counts."""

    def __init__(self, n_docs: int, keys: np.ndarray):
        self.per = max(1, -(-n_docs // BUCKETS))
        self.keys = keys
        self.sums = [np.zeros(BUCKETS, np.uint64), np.zeros(BUCKETS, np.uint64)]
        self.n_segments = self.n_tokens = 0

    def add(self, doc, off, length, copies=None) -> None:
        z = _mix(np.asarray(doc).astype(np.uint64) ^ self.keys[0])
        z ^= np.asarray(off).astype(np.uint64)
        z = _mix(z)
        z ^= np.asarray(length).astype(np.uint64) + self.keys[1]
        h1 = _mix(z)
        h2 = _mix(h1 ^ self.keys[2])
        c = 1 if copies is None else copies.astype(np.uint64)
        bucket = np.asarray(doc, np.int64) // self.per
        np.add.at(self.sums[0], bucket, h1 * c)
        np.add.at(self.sums[1], bucket, h2 * c)
        n = len(doc) if copies is None else int(copies.sum(dtype=np.int64))
        self.n_segments += n
        self.n_tokens += int(np.asarray(length, np.int64).sum() if copies is None
                             else (np.asarray(length, np.int64) * copies).sum())

    def first_difference(self, other: Tally) -> int | None:
        bad = np.flatnonzero((self.sums[0] != other.sums[0]) | (self.sums[1] != other.sums[1]))
        return int(bad[0]) if bad.size else None


def fresh_keys() -> np.ndarray:
    return np.frombuffer(os.urandom(24), np.uint64).copy()


def vsl_entries(n: np.ndarray, first: int, vsl: tuple[int, int]):
    """:func:`entries` of a --vsl cut, from its definition: piece by piece, a bit at a time
    (numpy over the documents, a pass per bit of MAX/MIN and per MAX chunk of the longest)."""
    lo, hi = vsl
    n = np.asarray(n, np.int64)
    idx, off, length = [], [], []
    done = np.zeros(n.size, np.int64)
    for j in range(int((n // hi).max(initial=0))):
        has = np.flatnonzero(n // hi > j)
        idx.append(has), off.append(done[has].copy()), length.append(np.full(has.size, hi))
        done[has] += hi
    b = hi // 2
    while b >= lo:
        has = np.flatnonzero(n % hi & b)
        idx.append(has), off.append(done[has].copy()), length.append(np.full(has.size, b))
        done[has] += b
        b //= 2
    has = np.flatnonzero(n % lo)
    idx.append(has), off.append(done[has].copy()), length.append(n[has] % lo)
    idx, off, length = (np.concatenate(a).astype(np.int64) for a in (idx, off, length))
    return first + idx, off, length, idx


def policy_of(index: dict):
    """What cut the documents: the overflow policy's name, or (MIN, MAX) of --vsl."""
    v = index.get("vsl")
    return (int(v["min"]), int(v["max"])) if v else index["overflow"]


def described(policy) -> str:
    return f"--vsl {policy[0]}:{policy[1]}" if isinstance(policy, tuple) else \
        f"--overflow {policy}"


def entries(n: np.ndarray, first: int, seq_len: int, overflow):
    """(document, offset, length, index of its document in ``n``) of every segment the
    policy makes of documents first, first+1, ... of lengths ``n`` (``overflow``: a policy's
    name, or (MIN, MAX) of a --vsl cut)."""
    if isinstance(overflow, tuple):
        return vsl_entries(n, first, overflow)
    n = np.asarray(n, np.int64)
    if overflow == "split":
        pieces = np.where(n > seq_len, -(-n // seq_len), (n > 0).astype(np.int64))
    elif overflow == "truncate":
        pieces = (n > 0).astype(np.int64)
    else:
        pieces = ((n > 0) & (n <= seq_len)).astype(np.int64)
    idx = np.repeat(np.arange(n.size), pieces)
    j = np.arange(idx.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    off = j * seq_len
    length = np.minimum(n[idx] - off, seq_len)
    return first + idx, off, length, idx


def expected(corpora: list, sel: Selection, seq_len: int, overflow: str,
             tallies: dict) -> None:
    """Add every segment the sources must give each split (``tallies``: split -> Tally)."""
    base = 0
    for k, c in enumerate(corpora):
        at = 0
        for x in source_lengths(c):
            doc, off, length, idx = entries(x, base + at, seq_len, overflow)
            for split, copies in zip(("train", "valid"), sel.copies(k, at, at + x.size),
                                     strict=True):
                if split in tallies:
                    w = copies[idx]
                    keep = w > 0
                    tallies[split].add(doc[keep], off[keep], length[keep], w[keep])
            at += x.size
        base += len(c)


def packed(ds, tally: Tally, seq_len: int, overflow: str, n_docs: int) -> None:
    """Add every segment of a split's shards, each first checked on its own: inside the
    sources, of a length 1..L, at an offset the policy cuts at (a chunk at a time)."""
    for sh, _, doc, off, length in shard_chunks(ds):
        ok = (doc < n_docs) & (length >= 1) & (length <= seq_len) & (off >= 0)
        if isinstance(overflow, tuple):  # --vsl: a chunk at a multiple of its length
            ok &= off % np.where(length < overflow[0], overflow[0], length) == 0
        else:
            ok &= (off % seq_len == 0) if overflow == "split" else (off == 0)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise ValidationError(
                f"{ds.directory} {sh.name}: segment mismatch: (document {int(doc[i]):,}, "
                f"offset {int(off[i]):,}, length {int(length[i]):,}) is not one "
                f"{described(overflow)} makes of a document: tokens lost, duplicated or moved")
        tally.add(doc, off, length)


def shard_chunks(ds, chunk: int = CHUNK):
    """(shard, first segment, documents, offsets, lengths) of every shard's segments, int64,
    ``chunk`` segments at a time."""
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        for s0 in range(0, int(sh.seg_length.size), chunk):
            yield (sh, s0, *(np.asarray(a[s0:s0 + chunk], np.int64)
                             for a in (sh.seg_doc, sh.seg_offset, sh.seg_length)))


def name_difference(ds, corpora: list, sel: Selection, split: str, bucket: int,
                    want: Tally, got: Tally, overflow: str) -> None:
    """Raise naming the first segment of ``bucket``'s documents that the packs hold a
    different number of times than the sources make (one more pass over the shards)."""
    lo = bucket * want.per
    hi = min(lo + want.per, sum(len(c) for c in corpora))
    rows, weights = _expected_rows(corpora, sel, split, lo, hi, int(ds.index["seq_len"]),
                                   overflow)
    seen = []
    for _, _, doc, off, length in shard_chunks(ds):
        m = (doc >= lo) & (doc < hi)
        seen.append(np.stack([doc[m], off[m], length[m]], 1))
    seen = np.concatenate(seen) if seen else np.zeros((0, 3), np.int64)
    table, inv = np.unique(np.concatenate([rows, seen]), axis=0, return_inverse=True)
    inv = inv.ravel()
    n_want = np.bincount(inv[:len(rows)], weights=weights, minlength=len(table))
    n_got = np.bincount(inv[len(rows):], minlength=len(table))
    bad = np.flatnonzero(n_want != n_got)
    if not bad.size:  # cannot happen: the sums differ only if the multisets do
        raise ValidationError(f"{ds.directory}: the segments of documents {lo:,}..{hi - 1:,} "
                              "differ from what the sources make")
    d, o, n = (int(v) for v in table[bad[0]])
    # ``rows`` holds every segment the policy makes of the bucket's documents, copies or not
    if n_want[bad[0]] == 0 and not (rows == table[bad[0]]).all(1).any():
        raise ValidationError(
            f"{ds.directory}: segment mismatch: (document {d:,}, offset {o:,}, length {n:,}) "
            f"is not one {described(overflow)} makes of its source document: tokens lost, "
            "duplicated or moved")
    raise ValidationError(
        f"{ds.directory}: source document {d:,} (offset {o:,}) is in the packs "
        f"{int(n_got[bad[0]])} time(s), expected {int(n_want[bad[0]])}: segment mismatch, "
        f"tokens lost, duplicated or moved (the shards hold {got.n_segments:,} segments, the "
        f"sources under {described(overflow)} and the mixture make {want.n_segments:,})")


def _expected_rows(corpora, sel, split, lo, hi, seq_len, overflow):
    rows, weights, base = [], [], 0
    for k, c in enumerate(corpora):
        a, b = max(lo - base, 0), min(hi - base, len(c))
        if b > a:
            doc, off, length, idx = entries(lengths_of(c, a, b), base + a, seq_len, overflow)
            w = sel.copies(k, a, b)[0 if split == "train" else 1][idx]
            rows.append(np.stack([doc, off, length], 1))
            weights.append(w)
        base += len(c)
    if not rows:
        return np.zeros((0, 3), np.int64), np.zeros(0)
    return np.concatenate(rows), np.concatenate(weights).astype(np.float64)


def doc_span(parts: list, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end) in its part's .bin of each document (global index), and its part, from
    the parts' boundaries: two reads a document, nothing per document of the corpus held."""
    base = np.cumsum([0] + [len(q) for q in parts]).astype(np.int64)
    which = np.searchsorted(base, doc, side="right") - 1
    start, end = np.zeros(doc.size, np.int64), np.zeros(doc.size, np.int64)
    for p in np.unique(which).tolist():
        m = which == p
        local = doc[m] - base[p]
        ends = parts[p].ends
        end[m] = np.asarray(ends[local], np.int64)
        start[m] = np.where(local > 0, np.asarray(ends[np.maximum(local - 1, 0)], np.int64), 0)
    return start, end, which
