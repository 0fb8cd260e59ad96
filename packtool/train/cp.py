"""Context parallelism: one packed row cut across ``cp_size`` ranks, each document still exact.

Causal attention makes a sequence's end costlier than its start (the query at in-segment
position p looks at p + 1 keys), so a plain contiguous split gives the last rank most of the
work: 7/16 of an 8,192-token document's at CP = 4, against 1/16 for the first rank.
Two layouts, both covering every row position exactly once over the ranks::

    one segment of 16 tokens, cp_size 2: 2 x cp = 4 chunks, rank r takes r and 2cp-1-r
    zigzag     | r0  r0  r0  r0 | r1  r1  r1  r1 | r1  r1  r1  r1 | r0  r0  r0  r0 |
    a segment of 7 tokens, cp_size 2, balanced: pairs (p, 6-p) cost 8 each, the middle 4
    balanced   | r0  r0  r1 | r1 | r1  r0  r0 |      r0 2 pairs (work 16), r1 1 and the middle
                                                     (12); the row's other segments even it

``mode="zigzag"`` is Transformer Engine's THD layout (``thd_get_partitioned_indices``, which
Megatron-LM and NeMo use): every segment, of a length that is a multiple of 2 x cp_size
(``pack --cp N`` / ``--align``, or ``collate_numpy(..., pad_multiple=2N, per_segment=True)``),
is cut into 2 x cp_size equal chunks and rank r takes chunks r and 2cp-1-r, so every rank
holds the same number of tokens of every segment. Its positions equal TE's index for index
(tests/test_cp.py holds a transcription of TE's kernel).

``mode="balanced"`` takes segments of any length. Positions p and L-1-p of a segment of L
tokens cost (p + 1) + (L - p) = L + 1 together, whatever p: a rank that takes n such pairs
takes 2n tokens and n(L + 1) work. Each segment's L // 2 pairs are dealt in blocks of
``L // 2 // cp_size`` pairs per rank; the ``L // 2 % cp_size`` pairs left over, and the middle
token of an odd L, go to the ranks with the least work so far, segments taken longest first
(LPT: the largest units are placed while there is most room to even them out). A rank's share
of a segment is then at most two runs (its block of pairs from the front, their mirror from the
back; one run for the innermost block), the same shape as zigzag, and on rows whose segments
are multiples of 2 x cp_size it *is* zigzag, position for position. Token counts per rank may
differ, by a few tokens (pairs are 2 tokens, the middle token 1).
Measured (``python scripts/bench_cp.py``; CP = 4; lognormal lengths clipped at 8,192, bfd at
seq_len 8192), max-rank / mean-rank causal work per row, mean and worst over the rows, and the
largest token-count spread between a row's ranks:

    200,000 docs, median 300, sigma 1    -> 12,053 rows   balanced 1.0002 / 1.0008, 2 tokens
                                                           contiguous split 1.152 / 2.000
    100,000 docs, median 1000, sigma 1.5 -> 25,327 rows   balanced 1.0001 / 1.0008, 4 tokens
                                                           contiguous split 1.575 / 2.000

One call is ~1 ms for an 8,192-token row of 30 segments (every rank deals the whole row).

What a rank gets back (all numpy; arrays are int64 unless said):

- ``input_ids``, ``labels``, ``position_ids``, ``doc_ids`` (and ``loss_mask`` where the row
  has one): the row's values at ``positions``, the row positions this rank took, ascending.
  ``position_ids`` are the row's (in-segment) ones, so rotary embeddings are those of the
  whole document. ``seq_idx`` (int32): the segment of the row each token is in.
- ``shift_labels``: the row's label at position + 1 (-100 at the row's end). A Hugging Face
  model shifts ``labels`` by one *inside its own tokens*, which is wrong where a rank's tokens
  are not consecutive (chunk ends): pass ``shift_labels=`` instead (transformers' causal-LM
  loss takes it), or compute the loss on it. Labels are -100 at each segment's first token, so
  no shifted label crosses a document boundary.
- ``cu_seqlens_q`` (int32, [P + 1]): the rank's local tokens as P pieces, each a run of
  consecutive row positions inside one segment; ``max_length_q``.
- ``cu_seqlens_k`` (int32, [P + 1]) and ``key_positions``: piece p's keys are the row's
  tokens from its segment's start to the piece's last token, ``key_positions[cu_seqlens_k[p]:
  cu_seqlens_k[p + 1]]`` (row positions; most of them held by other ranks); ``max_length_k``.
  With K and V all-gathered over the CP group and put back in row order (``kv[positions_r] =
  kv_r`` for every rank r), ``flash_attn_varlen_func(q, kv_k[key_positions],
  kv_v[key_positions], cu_seqlens_q, cu_seqlens_k, max_length_q, max_length_k, causal=True)``
  is exact: flash-attention aligns the causal mask bottom-right when a piece has fewer queries
  than keys, so query j of a piece sees exactly the keys up to its own row position. A ring
  (P2P) implementation that takes arbitrary layouts masks block (q, k) by ``seq_idx[q] ==
  seq_idx[k] and positions[k] <= positions[q]`` with both ranks' ``positions`` and ``seq_idx``.
- zigzag only, what TE's ``DotProductAttention(qkv_format="thd")`` takes on every CP rank
  (the whole row's, TE divides them by cp_size itself): ``cu_seqlens`` (int32, real lengths),
  ``cu_seqlens_padded`` (int32, the segments the chunks were cut from: the row's
  ``cu_seqlens_padded`` where it has one, else its ``cu_seqlens``) and ``max_seqlen``.
  TE's THD attention takes no other layout, so "balanced" shards go to an all-gather or
  FlexAttention implementation with the keys above.
"""

from __future__ import annotations

import numpy as np

from .. import conflicts
from ..errors import PacktoolError
from ..formats.packed.batching import IGNORE_INDEX, check_int

MODES = ("zigzag", "balanced")
PER_TOKEN = ("input_ids", "labels", "position_ids", "doc_ids", "loss_mask")
REAL_KEYS = ("cu_seqlens", "cu_seq_lens_q")                 # a pack's; a collated row's
PADDED_KEYS = ("cu_seqlens_padded", "cu_seq_lens_q_padded")


def cp_shard(example: dict, cp_size: int, cp_rank: int, mode: str = "zigzag") -> dict:
    """Rank ``cp_rank``'s share of one packed row (``open_packed(dir)[i]``, or one collated
    ``[1, N]`` row) under context parallelism of ``cp_size`` ranks; see the module docstring
    for the two modes and what every returned key means."""
    cp_size = check_int("cp_size", cp_size, 1)
    cp_rank = check_int("cp_rank", cp_rank, 0)
    if cp_rank >= cp_size:
        raise PacktoolError(f"cp_rank {cp_rank} is out of range for cp_size {cp_size}: ranks "
                            f"are 0..{cp_size - 1}")
    if mode not in MODES:
        raise PacktoolError(f"cp_shard mode {mode!r}: choose {' or '.join(MODES)}")
    from .trees import is_shared, row_tree

    tree = None
    if is_shared(example):
        if mode == "zigzag":
            conflicts.check({"shared_rows", "cp_zigzag"}, "this row shares prefixes")
        tree = row_tree(example)
    if "image_grid_thw" in example or "position_ids_3d" in example:
        conflicts.check({"images", "cp_shard"}, "this row holds images")
    tokens, real, padded = _row(example)
    starts, ends = (_zigzag if mode == "zigzag" else _balanced)(padded, cp_size, cp_rank)
    out = _gather(tokens, padded, starts, ends, tree)
    if mode == "zigzag":
        out.update(cu_seqlens=real.astype(np.int32), cu_seqlens_padded=padded.astype(np.int32),
                   max_seqlen=int(np.diff(padded).max()) if len(padded) > 1 else 0)
    return out


def _flat(name: str, v) -> np.ndarray:
    a = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
    if a.ndim == 2 and a.shape[0] == 1:  # a collated [1, N] row
        a = a[0]
    if a.ndim != 1:
        raise PacktoolError(f"{name} has shape {a.shape}: cp_shard takes one row (a pack, or "
                            "a collated [1, N] row); shard each row of a batch on its own")
    return a


def _boundaries(example: dict, keys: tuple, n: int | None) -> np.ndarray | None:
    """The first of ``keys`` the row has, checked: from 0, never down, up to ``n`` tokens
    (real boundaries of an aligned row end short of the row: its last pads are after them)."""
    key = next((k for k in keys if k in example), None)
    if key is None:
        return None
    cu = _flat(key, example[key]).astype(np.int64)
    if len(cu) < 1 or cu[0] != 0 or (n is not None and cu[-1] != n) or (np.diff(cu) < 0).any():
        upto = "" if n is None else f" up to the row's {n:,} tokens"
        raise PacktoolError(f"{key} {cu.tolist()[:8]}{'...' if len(cu) > 8 else ''} does not "
                            f"run from 0{upto} without going down: pass the row's own "
                            "boundaries")
    return cu


def _row(example: dict):
    """The per-token arrays, the real and the padded segment boundaries of a row, checked."""
    if "input_ids" not in example:
        raise PacktoolError("cp_shard needs a packed row with input_ids and cu_seqlens "
                            f"(open_packed(dir)[i] or collate_numpy); got keys {sorted(example)}")
    tokens = {k: _flat(k, example[k]) for k in PER_TOKEN if k in example}
    n = len(tokens["input_ids"])
    for k, v in tokens.items():
        if len(v) != n:
            raise PacktoolError(f"{k} has {len(v):,} tokens, input_ids {n:,}: not one row")
    padded = _boundaries(example, PADDED_KEYS, n)
    real = _boundaries(example, REAL_KEYS, None if padded is not None else n)
    if real is None and padded is None:
        raise PacktoolError("cp_shard needs the row's segment boundaries: cu_seqlens (a pack) "
                            "or cu_seq_lens_q (a collated row)")
    if real is None:
        real = padded
    if padded is None:
        padded = real
    elif len(padded) != len(real) or (np.diff(real) > np.diff(padded)).any():
        raise PacktoolError("cu_seqlens_padded does not hold cu_seqlens' segments (one padded "
                            "segment per segment, each at least as long): pass the row as "
                            "pack --align wrote it")
    return tokens, real, padded


def _zigzag(cu: np.ndarray, cp: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunks r and 2cp-1-r of every segment (start, end row positions, ascending)."""
    lens = np.diff(cu)
    bad = np.flatnonzero(lens % (2 * cp))
    if bad.size:
        j = int(bad[0])
        raise PacktoolError(
            f"segment {j} of the row has {int(lens[j]):,} tokens, not a multiple of 2 x cp_size "
            f"= {2 * cp} ({bad.size:,} such segments): zigzag (TE's THD layout) cuts every "
            f"segment into {2 * cp} equal chunks; pack with `packtool pack --cp {cp}` (or "
            f"--align {2 * cp}), or collate with pad_multiple={2 * cp}, per_segment=True; or "
            "use mode='balanced', which takes segments of any length")
    c = lens // (2 * cp)
    first, second = cu[:-1] + r * c, cu[:-1] + (2 * cp - 1 - r) * c
    starts = np.stack([first, second], 1).ravel()
    return starts, starts + np.repeat(c, 2)


def _balanced(cu: np.ndarray, cp: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank r's runs under the pair dealing of the module docstring (start, end, ascending).
    Every rank computes the whole deal, so all agree without talking. Plain Python ints: the
    loop runs once per segment over cp-long lists, where numpy's per-call cost dominates."""
    lens = np.diff(cu).tolist()
    starts = cu[:-1].tolist()
    load = [(0, 0, k) for k in range(cp)]  # (causal work, tokens, rank) dealt so far
    runs = []
    for j in sorted(range(len(lens)), key=lambda j: -lens[j]):  # stable: ties in row order
        L, s = lens[j], starts[j]
        if L == 0:
            continue
        pairs, odd = divmod(L, 2)
        n = [pairs // cp] * cp
        for _, _, k in sorted(load)[:pairs % cp]:  # leftover pairs to the least loaded
            n[k] += 1
        load = [(w + n[k] * (L + 1), t + 2 * n[k], k) for w, t, k in load]
        order = list(range(cp))
        if odd:  # the middle token to the least loaded, innermost, so its share is one run
            w, t, mid = min(load)
            load[mid] = (w + pairs + 1, t + 1, mid)
            order.remove(mid)
            order.append(mid)
        i = order.index(r)
        o, k = sum(n[q] for q in order[:i]), n[r]
        if odd and i == cp - 1:
            runs.append((j, s + o, s + L - o))
        elif k:
            runs += [(j, s + o, s + o + k), (j, s + L - o - k, s + L - o)]
    runs.sort()
    a = np.array(runs, np.int64).reshape(-1, 3)
    return a[:, 1], a[:, 2]


def _keys(cu: np.ndarray, piece_seg: np.ndarray, piece_end: np.ndarray, tree):
    """(keys per piece, key row positions): the piece's segment from its start to the piece's
    last token, after every ancestor segment whole (a row of shared prefixes)."""
    if tree is None:
        k_lens = piece_end - cu[piece_seg]
        return k_lens, (np.repeat(cu[piece_seg] - np.cumsum(k_lens) + k_lens, k_lens)
                        + np.arange(int(k_lens.sum()), dtype=np.int64))
    runs = [[(cu[a], cu[a + 1]) for a in tree.ancestors(int(s))[:-1]] + [(cu[s], e)]
            for s, e in zip(piece_seg, piece_end, strict=True)]
    k_lens = np.array([sum(int(b - a) for a, b in r) for r in runs], np.int64)
    pos = [np.arange(a, b, dtype=np.int64) for r in runs for a, b in r]
    return k_lens, np.concatenate(pos) if pos else np.zeros(0, np.int64)


def _gather(tokens: dict, cu: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            tree=None) -> dict:
    """The rank's tokens at the runs [starts, ends) and the attention metadata of its pieces
    (runs merged where they touch inside one segment); ``tree``: a row of shared prefixes,
    whose pieces also key their ancestors."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    seg = np.searchsorted(cu, starts, side="right") - 1
    join = np.flatnonzero((starts[1:] == ends[:-1]) & (seg[1:] == seg[:-1])) + 1
    piece_start = np.delete(starts, join)
    piece_end = np.delete(ends, join - 1)
    piece_seg = np.delete(seg, join)
    lens = ends - starts
    positions = (np.repeat(starts - np.cumsum(lens) + lens, lens)
                 + np.arange(int(lens.sum()), dtype=np.int64))
    q_lens = piece_end - piece_start
    k_lens, key_positions = _keys(cu, piece_seg, piece_end, tree)
    out = {k: v[positions] for k, v in tokens.items()}
    if "labels" in tokens:
        nxt = np.append(tokens["labels"][1:], IGNORE_INDEX)
        out["shift_labels"] = nxt[positions].astype(np.int64)
    out.update(
        positions=positions,
        seq_idx=(np.searchsorted(cu, positions, side="right") - 1).astype(np.int32),
        cu_seqlens_q=np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
        cu_seqlens_k=np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32),
        key_positions=key_positions,
        max_length_q=int(q_lens.max()) if len(q_lens) else 0,
        max_length_k=int(k_lens.max()) if len(k_lens) else 0,
    )
    if tree is not None:  # the ancestor rule for a ring (P2P) implementation's blocks
        out.update(tree_in=tree.tree_in[positions].astype(np.int32),
                   tree_out=tree.tree_out[positions].astype(np.int32))
    return out
