"""The formats' numba kernels, in a module of their own so that opening a corpus or a packed
dataset (or ``packtool tokenize``, which never gathers) does not import numba (~0.4 s); the
format modules import it on first use."""

from .._numba import njit


@njit
def gather(src, src_start, length, dst, dst_start):
    """Segment s: src[src_start[s]:+length[s]] to dst[dst_start[s]:]. A slice assignment a
    segment (numba makes it one memcpy): 381 MB of uint32 in segments of ~800 tokens, in
    source order, 0.075 s against 0.16 s for a loop a token (bench_tokens_layout.py)."""
    for s in range(src_start.shape[0]):
        a, b, n = src_start[s], dst_start[s], length[s]
        dst[b:b + n] = src[a:a + n]


@njit
def fill(dst, dst_start, length, value):
    for s in range(dst_start.shape[0]):
        dst[dst_start[s]:dst_start[s] + length[s]] = value


@njit
def check_shard(pack_offsets, seg_offsets, cu, pos, doc, seq_len):
    """Return (code, pack, token) of the first violation, or (0, -1, -1). Every offset is
    checked before it indexes an array."""
    n_packs = pack_offsets.shape[0] - 1
    n_tok = pos.shape[0]
    n_cu = cu.shape[0]
    if pack_offsets[0] != 0 or seg_offsets[0] != 0:
        return 1, 0, 0
    for p in range(n_packs):
        t0, t1 = pack_offsets[p], pack_offsets[p + 1]
        if t1 <= t0:
            return 2, p, t0
        if t1 - t0 > seq_len:
            return 3, p, t0
        if t1 > n_tok:
            return 10, p, t0
        s0, s1 = seg_offsets[p], seg_offsets[p + 1]
        if s1 <= s0:
            return 4, p, t0
        c0 = s0 + p
        if s1 + p >= n_cu:
            return 10, p, t0
        if cu[c0] != 0:
            return 5, p, t0
        if cu[s1 + p] != t1 - t0:
            return 6, p, t0
        for k in range(s1 - s0):
            a, b = cu[c0 + k], cu[c0 + k + 1]
            if b <= a or b > t1 - t0:
                return 7, p, t0 + a
            for j in range(a, b):
                if doc[t0 + j] != k:
                    return 8, p, t0 + j
                if pos[t0 + j] != j - a:
                    return 9, p, t0 + j
    return 0, -1, -1
