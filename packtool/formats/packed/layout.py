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


def pack_offsets(seg_length: np.ndarray, pack_seg: np.ndarray, chunk: int = 1 << 20
                 ) -> np.ndarray:
    """Token offset of each pack, then the token count (int64, n_packs + 1), summed about
    ``chunk`` segments at a time: 8 bytes a pack, never 8 a segment (a shard of short
    documents holds millions)."""
    ps = np.asarray(pack_seg, np.int64)
    po = np.zeros(ps.size, np.int64)
    j, n = 0, ps.size - 1
    while j < n:
        j1 = min(n, max(j + 1, int(np.searchsorted(ps, ps[j] + chunk, side="right")) - 1))
        ends = token_ends(np.asarray(seg_length[ps[j]:ps[j1]], np.int64))
        po[j + 1:j1 + 1] = po[j] + ends[ps[j + 1:j1 + 1] - ps[j]]
        j = j1
    return po


def pack_lengths(seg_length: np.ndarray, pack_seg: np.ndarray) -> np.ndarray:
    return np.diff(pack_offsets(seg_length, pack_seg))


def attention_costs(seg_length: np.ndarray, pack_seg: np.ndarray, linear: float = 0.0
                    ) -> np.ndarray:
    """Per pack, the sum of its squared segment lengths (float64): what causal attention
    costs, up to a constant; ``linear`` x the tokens is added (see
    packtool.sampler.attention_costs for the block's linear term). One pass of a kernel over
    the segments, no temporary per segment: 10M segments in ~15 ms (the numpy form, squares
    then a reduceat, took 80)."""
    ps = np.asarray(pack_seg)
    n = ps.size - 1
    out = np.zeros(max(n, 0))
    if n > 0:
        _costs(np.asarray(seg_length), ps, float(linear), out)
    return out


@njit(cache=True)
def _costs(seg_length, pack_seg, linear, out):
    for p in range(out.size):
        c = 0.0
        for s in range(pack_seg[p], pack_seg[p + 1]):
            x = float(seg_length[s])
            c += x * x + linear * x
        out[p] = c


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
           mask_shift: int = 0) -> dict:
    """A pack as the trainer takes it, from its segment lengths and its tokens (and loss
    mask: per token, or folded into the ids' bit ``mask_shift``)."""
    if mask_shift:
        mask = (ids >> mask_shift) & 1
        ids = ids & ((1 << mask_shift) - 1)
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


def labels_from(input_ids: np.ndarray, cu: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The label rule alone (for formats that store tokens and cu_seqlens): -100 at each
    segment's first token and where the loss mask is 0."""
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


def range_labels(ids: np.ndarray, seg_length: np.ndarray, mask: np.ndarray | None
                 ) -> np.ndarray:
    """The label rule over consecutive segments: -100 at each segment's first token and
    where the mask is 0."""
    labels = np.asarray(ids, np.int64).copy()
    if mask is not None:
        labels[np.asarray(mask) == 0] = IGNORE_INDEX
    labels[token_ends(seg_length)[:-1]] = IGNORE_INDEX
    return labels


def unpack_mask(bits: np.ndarray, t0: int, t1: int) -> np.ndarray:
    """Tokens t0..t1-1 of a 1-bit-a-token mask (np.packbits, bitorder little)."""
    b0 = t0 // 8
    raw = np.unpackbits(np.asarray(bits[b0:-(-t1 // 8)]), bitorder="little")
    return raw[t0 - 8 * b0:t1 - 8 * b0]


def fold_shift(token_dtype: np.dtype) -> int:
    """The bit of a token word that carries a folded loss mask."""
    return np.dtype(token_dtype).itemsize * 8 - 1
