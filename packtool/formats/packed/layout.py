"""The packed layout's arithmetic, in one place: from a pack's segment lengths everything
per token follows, so the reader, the exports, the sampler and stats derive it here instead of
storing it. One pack of seq_len 16 holding three segments (documents or pieces of one)::

    seg_length    5              3          8
    input_ids     a0 a1 a2 a3 a4 | b0 b1 b2 | c0 c1 c2 c3 c4 c5 c6 c7
    position_ids   0  1  2  3  4 |  0  1  2 |  0  1  2  3  4  5  6  7
    doc_ids        0  0  0  0  0 |  1  1  1 |  2  2  2  2  2  2  2  2
    labels       -100 a1 a2 a3 a4|-100 b1 b2|-100 c1 c2 c3 c4 c5 c6 c7
    cu_seqlens    [0, 5, 8, 16]           max_seqlen 8

Attention must stay inside a segment (block-diagonal causal mask): flash-attention's varlen
kernels take ``cu_seqlens``; Hugging Face models derive it from ``position_ids`` restarting at
0. ``labels`` hide each segment's first token, so no token is trained to predict across a
boundary (the ``DataCollatorWithFlattening`` convention); with SFT/chat sources they are also
-100 wherever the loss mask is 0.

Measured (scripts/bench_reader.py, 8,192-token packs of ~16 segments): a pack costs 13 us
(tokens layout) to 17 us (index layout) of CPU beyond reading its bare tokens, ~10 us of it
this derivation's one numba pass: 5-6e8 tokens/s per core.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit
from .schema import IGNORE_INDEX


def token_ends(seg_length: np.ndarray) -> np.ndarray:
    """[0, end of segment 0, end of segment 1, ...] in tokens (int64, n_segments + 1)."""
    out = np.zeros(seg_length.size + 1, np.int64)
    np.cumsum(seg_length, out=out[1:])
    return out


def pack_offsets(seg_length: np.ndarray, pack_seg: np.ndarray) -> np.ndarray:
    """Token offset of each pack, then the token count (int64, n_packs + 1): 8 bytes a pack,
    never 8 a segment (a shard of short documents holds millions). Raises ValueError where
    ``pack_seg`` does not rise from 0 to the segment count or a segment is empty."""
    po, bad = scan_packs(seg_length, pack_seg)
    if bad:
        raise ValueError(bad)
    return po


def scan_packs(seg_length: np.ndarray, pack_seg: np.ndarray) -> tuple[np.ndarray, str]:
    """A shard's pack offsets (as ``pack_offsets``) and what is wrong with its segment table
    ('' when nothing): ``pack_seg`` must start at 0, rise strictly and end at the segment
    count; every segment must hold a token. Two passes over the segments (a min and a
    reduceat summing into int64, no temporary per segment): 10M segments in ~20 ms, without
    starting numba (whose first call in a process costs ~0.45 s, more than a ``which``)."""
    ps = np.asarray(pack_seg)
    sl = np.asarray(seg_length)
    n = max(ps.size - 1, 0)
    po = np.zeros(n + 1, np.int64)
    if ps.size == 0:
        return po, "no pack table"
    if n == 0:
        return po, "" if sl.size == 0 else "segments outside any pack"
    if int(ps[0]) != 0 or int(ps[-1]) != sl.size:
        return po, "pack table does not run from 0 to the segment count"
    if (np.diff(ps.astype(np.int64)) <= 0).any():
        return po, "pack table does not rise"
    if int(sl.min()) <= 0:
        return po, "an empty segment"
    np.cumsum(np.add.reduceat(sl, ps[:-1].astype(np.intp), dtype=np.int64), out=po[1:])
    return po, ""


def pack_lengths(seg_length: np.ndarray, pack_seg: np.ndarray) -> np.ndarray:
    return np.diff(pack_offsets(seg_length, pack_seg))


def ancestor_terms(x: np.ndarray, up) -> np.ndarray:
    """What each segment of lengths ``x`` (float64) adds to its row's attention cost beyond
    ``x * x``: a segment of a prefix tree (``seg_up``: segments back to its parent, 0 a root;
    :mod:`.groups`) attends to its ancestors' a tokens too, 2 a x in the same unit (a
    document of a + x tokens costs a^2 + 2 a x + x^2, its ancestors alone a^2); 0 for a
    root. ``up`` per segment in row order (a parent before its children); a depth-d tree
    takes d vector passes."""
    extra = np.zeros(x.size)
    if up is None:
        return extra
    up = np.asarray(up, np.int64)
    child = np.flatnonzero(up > 0)
    if not child.size:
        return extra
    parent = child - up[child]
    anc = np.zeros(x.size)
    while True:  # the tokens above each segment, one level more each pass
        nxt = anc.copy()
        nxt[child] = anc[parent] + x[parent]
        if np.array_equal(nxt, anc):
            break
        anc = nxt
    return 2.0 * anc * x


def attention_costs(seg_length: np.ndarray, pack_seg: np.ndarray, linear: float = 0.0,
                    chunk: int = 1 << 20, seg_up=None) -> np.ndarray:
    """Per pack, the sum of its squared segment lengths (float64): what causal attention
    costs, up to a constant; ``linear`` x the tokens is added (see
    packtool.train.sampler.attention_costs for the block's linear term). Each segment's term
    ``x * x + linear * x`` (and in a prefix tree a segment's attention to its ancestors:
    :func:`ancestor_terms`, from ``seg_up``) summed in segment
    order, ``chunk`` segments at a time (8 bytes a
    segment of one chunk, never of the shard): 10M segments in ~25 ms, in numpy, so that a
    ``which --balance attention`` does not start numba (~0.45 s in a fresh process)."""
    ps = np.asarray(pack_seg, np.int64)
    sl = np.asarray(seg_length)
    n = ps.size - 1
    out = np.zeros(max(n, 0))
    j, lin = 0, float(linear)
    while j < n:
        j1 = min(n, max(j + 1, int(np.searchsorted(ps, ps[j] + chunk, side="right")) - 1))
        x = sl[ps[j]:ps[j1]].astype(np.float64)
        term = x * x
        if seg_up is not None:  # a chunk ends at a row's end: a tree is whole in it
            term += ancestor_terms(x, seg_up[ps[j]:ps[j1]])
        if lin:
            term += lin * x
        out[j:j1] = np.add.reduceat(term, ps[j:j1] - ps[j])
        j = j1
    return out


def v1_segments(cu: np.ndarray, seg_offsets: np.ndarray) -> np.ndarray:
    """Segment lengths of a version-1 shard from its packs' cu_seqlens stored back to back
    (pack j's are cu[so[j]+j : so[j+1]+j+1])."""
    cu = np.asarray(cu, np.int64)
    so = np.asarray(seg_offsets, np.int64)
    n = so.size - 1
    if n <= 0:
        return np.zeros(0, np.int64)
    keep = np.ones(cu.size, bool)
    keep[so[:-1] + np.arange(n)] = False  # each pack's leading 0
    d = np.diff(cu)
    # d[i] = cu[i+1] - cu[i]; a segment's length sits at the index of its end, minus one
    return d[keep[1:]].astype(np.int64)


@njit
def _derive(seg_length, ids, input_ids, labels, positions, doc_ids, cu):
    """One pass over a pack: input_ids/labels (int64, labels -100 at each segment's first
    token), positions (int64), doc_ids and cu_seqlens (int32). Branch-free inner loops that
    LLVM vectorises: ~10 us for 8,192 tokens with its allocations (at load ~4; an
    earlier quiet run measured 3.4 us; a loop with the mask's branches inside took 15.6)."""
    t = 0
    cu[0] = 0
    for s in range(seg_length.shape[0]):
        n = seg_length[s]
        for j in range(n):
            v = np.int64(ids[t + j])
            input_ids[t + j] = v
            labels[t + j] = v
            positions[t + j] = j
            doc_ids[t + j] = s
        if n:
            labels[t] = -100
        t += n
        cu[s + 1] = t


@njit
def _mask_labels(labels, mask):
    for t in range(mask.shape[0]):
        if mask[t] == 0:
            labels[t] = -100


def derive(seg_length: np.ndarray, ids: np.ndarray, mask: np.ndarray | None = None,
           mask_shift: int = 0, align: int = 1, pad_id: int = 0) -> dict:
    """A pack as the trainer takes it, from its segment lengths and its tokens (and loss
    mask: per token, or folded into the ids' bit ``mask_shift``); ``align`` > 1: the aligned
    row of :func:`derive_aligned`."""
    if mask_shift:
        mask = (ids >> mask_shift) & 1
        ids = ids & ((1 << mask_shift) - 1)
    if align > 1:
        return derive_aligned(seg_length, ids, mask, align, pad_id)
    n = ids.shape[0]
    k = seg_length.shape[0]
    input_ids, labels = np.empty(n, np.int64), np.empty(n, np.int64)
    positions, doc_ids = np.empty(n, np.int64), np.empty(n, np.int32)
    cu = np.empty(k + 1, np.int32)
    _derive(seg_length, ids, input_ids, labels, positions, doc_ids, cu)
    if mask is not None:
        _mask_labels(labels, mask)
    return {"input_ids": input_ids, "labels": labels, "position_ids": positions,
            "doc_ids": doc_ids, "cu_seqlens": cu,
            "max_seqlen": int(seg_length.max()) if k else 0}


@njit
def _derive_aligned(seg_length, k, pad_id, ids, mask, input_ids, labels, positions, doc_ids,
                    cu, cup):
    """:func:`_derive` for an aligned row: segment s's tokens from its padded start, then
    pads up to the next multiple of k (pad_id, labels -100, positions running on, doc id s);
    ``cu`` the real cumulative lengths, ``cup`` the padded ones. ``mask`` empty: none."""
    t = 0
    r = 0
    cu[0] = 0
    cup[0] = 0
    has_mask = mask.shape[0] > 0
    for s in range(seg_length.shape[0]):
        n = seg_length[s]
        p = (n + k - 1) // k * k
        for j in range(n):
            v = np.int64(ids[t + j])
            input_ids[r + j] = v
            labels[r + j] = -100 if has_mask and mask[t + j] == 0 else v
            positions[r + j] = j
            doc_ids[r + j] = s
        for j in range(n, p):
            input_ids[r + j] = pad_id
            labels[r + j] = -100
            positions[r + j] = j
            doc_ids[r + j] = s
        if n:
            labels[r] = -100
        t += n
        r += p
        cu[s + 1] = t
        cup[s + 1] = r


def align_up(lengths: np.ndarray, k: int) -> np.ndarray:
    """Segment lengths rounded up to multiples of k: what each occupies in its row (0 stays
    0). int64, or int32 kept as it is (a plan's table: no wider copy; no overflow, a length
    is at most --seq-len, itself a multiple of k below 2**31)."""
    a = np.asarray(lengths)
    a = a if a.dtype == np.int32 else a.astype(np.int64, copy=False)
    return a if k == 1 else (a + (k - 1)) // k * k


def derive_aligned(seg_length: np.ndarray, ids: np.ndarray, mask: np.ndarray | None, k: int,
                   pad_id: int) -> dict:
    """An aligned pack as the trainer takes it (Transformer Engine's THD layout)::

        seg_length         5                         3            (k = 4)
        input_ids          a0 a1 a2 a3 a4 P  P  P  | b0 b1 b2 P
        position_ids        0  1  2  3  4 5  6  7  |  0  1  2 3
        doc_ids             0  0  0  0  0 0  0  0  |  1  1  1 1
        labels           -100 a1 a2 a3 a4 -100 ... |-100 b1 b2 -100     pads: -100
        cu_seqlens         [0, 5, 8]                  the real tokens (TE's cu_seqlens)
        cu_seqlens_padded  [0, 8, 12]                 where each segment starts in the row

    ``max_seqlen`` is the longest padded segment: a bound for a kernel given either."""
    n = seg_length.shape[0]
    padded = align_up(seg_length, k)
    total = int(padded.sum())
    input_ids, labels = np.empty(total, np.int64), np.empty(total, np.int64)
    positions, doc_ids = np.empty(total, np.int64), np.empty(total, np.int32)
    cu, cup = np.empty(n + 1, np.int32), np.empty(n + 1, np.int32)
    m = np.zeros(0, np.uint8) if mask is None else np.asarray(mask, np.uint8)
    _derive_aligned(np.asarray(seg_length, np.int64), k, pad_id, ids, m, input_ids, labels,
                    positions, doc_ids, cu, cup)
    return {"input_ids": input_ids, "labels": labels, "position_ids": positions,
            "doc_ids": doc_ids, "cu_seqlens": cu, "cu_seqlens_padded": cup,
            "max_seqlen": int(padded.max()) if n else 0}


def pad_range(r: dict, k: int, pad_id: int) -> dict:
    """A :meth:`PackedReader.read_range` result laid out as aligned rows: ``ids``,
    ``labels``, ``positions``, ``mask`` (0 at pads) with each segment's pads after it;
    ``seg_length``, ``seg_start`` and ``pack_tok`` those of the padded segments (what a
    format that holds rows indexes them by); ``real_length`` the segments' tokens."""
    real = r["seg_length"]
    padded = align_up(real, k)
    ends_real, ends_pad = token_ends(real), token_ends(padded)
    dest = (np.arange(ends_real[-1], dtype=np.int64)
            + np.repeat(ends_pad[:-1] - ends_real[:-1], real))
    total = int(ends_pad[-1])

    def spread(values, fill, dtype):
        out = np.full(total, fill, dtype)
        out[dest] = values
        return out

    ps = r["pack_seg"]
    return {"ids": spread(r["ids"], pad_id, np.int64),
            "labels": spread(r["labels"], IGNORE_INDEX, np.int64),
            "positions": positions(padded),
            "mask": None if r["mask"] is None else spread(r["mask"], 0, np.uint8),
            "seg_length": padded, "real_length": real, "pack_seg": ps,
            "seg_start": segment_starts(padded, ps), "pack_tok": ends_pad[ps] - ends_pad[ps[0]]}


def labels_from(input_ids: np.ndarray, cu: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The label rule alone (for formats that store tokens and cu_seqlens, and for
    consecutive segments: ``cu`` their :func:`token_ends`): -100 at each segment's first
    token and where the loss mask is 0."""
    labels = np.array(input_ids, dtype=np.int64)
    if mask is not None:
        labels[np.asarray(mask) == 0] = IGNORE_INDEX
    labels[np.asarray(cu[:-1], np.int64)] = IGNORE_INDEX
    return labels


def segment_starts(seg_length: np.ndarray, pack_seg: np.ndarray) -> np.ndarray:
    """Each segment's start within its pack (int64), for segments of consecutive packs."""
    ends = token_ends(seg_length)
    ps = np.asarray(pack_seg, np.int64)
    pack_of = np.repeat(np.arange(ps.size - 1), np.diff(ps))
    return ends[:-1] - ends[ps[:-1]][pack_of]


def positions(seg_length: np.ndarray) -> np.ndarray:
    """Position of every token in its segment (int64), for consecutive segments."""
    ends = token_ends(seg_length)
    return np.arange(ends[-1], dtype=np.int64) - np.repeat(ends[:-1], seg_length)


def unpack_mask(bits: np.ndarray, t0: int, t1: int) -> np.ndarray:
    """Tokens t0..t1-1 of a 1-bit-a-token mask (np.packbits, bitorder little)."""
    b0 = t0 // 8
    raw = np.unpackbits(np.asarray(bits[b0:-(-t1 // 8)]), bitorder="little")
    return raw[t0 - 8 * b0:t1 - 8 * b0]


def fold_shift(token_dtype: np.dtype) -> int:
    """The bit of a token word that carries a folded loss mask."""
    return np.dtype(token_dtype).itemsize * 8 - 1
