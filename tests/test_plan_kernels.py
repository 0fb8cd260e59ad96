"""The planner's and the layout's fast paths against the slow references of tests/naive.py,
on random inputs (hypothesis): segments, their order, shard boundaries, a whole plan, the
gather kernel and the per-token derivation (issue 19)."""

import naive
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.formats.packed.layout import derive
from packtool.options import PackOptions
from packtool.pack.plan import make_segments, order_segments, plan_pack, shard_starts

lengths_st = st.lists(st.integers(0, 60), min_size=0, max_size=80)


@settings(max_examples=150, deadline=None)
@given(lengths_st, st.integers(1, 25), st.sampled_from(["split", "truncate", "drop"]))
def test_make_segments_matches_the_reference(lengths, seq_len, overflow):
    segs = make_segments(np.array(lengths, np.int64), seq_len, overflow)
    want = naive.segments(lengths, seq_len, overflow)
    got = list(zip(segs.doc.tolist(), segs.offset.tolist(), segs.length.tolist(), strict=True))
    assert got == want
    # every table entry locates to its own document and offset
    idx = np.arange(segs.table_length.size)
    doc, off = segs.locate(idx)
    for i in range(idx.size):
        if segs.table_length[i]:
            assert (int(doc[i]), int(off[i]), int(segs.table_length[i])) in want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-1, 9), max_size=60), st.integers(0, 3))
def test_order_segments_matches_the_reference(packs, seed):
    n_packs = max(packs, default=-1) + 1
    packs_arr = np.array(packs, np.int64)
    rank = np.random.default_rng(seed).permutation(n_packs).astype(np.int64)
    order, nseg = order_segments(packs_arr, rank, n_packs, np.int64)
    want_order, want_nseg = naive.order_segments(packs, rank.tolist(), n_packs)
    assert order.tolist() == want_order and nseg.tolist() == want_nseg


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 50), max_size=60), st.integers(1, 200))
def test_shard_starts_matches_the_reference(pack_len, shard_size):
    got = shard_starts(np.array(pack_len, np.int64), shard_size).tolist()
    assert got == naive.shard_starts(pack_len, shard_size)


@settings(max_examples=60, deadline=None)
@given(lengths_st, st.integers(4, 40), st.sampled_from(["split", "truncate", "drop"]),
       st.sampled_from(["bfd", "ffd", "sequential"]), st.booleans(), st.integers(20, 200))
def test_plan_holds_every_segment_once_within_capacity(lengths, seq_len, overflow, algo,
                                                       shuffle, shard_size):
    lay = plan_pack(np.array(lengths, np.int64),
                    PackOptions(seq_len, algo, overflow, shuffle=shuffle, shard_size=shard_size))
    doc, off, length = lay.segments()
    assert sorted(zip(doc.tolist(), off.tolist(), length.tolist(), strict=True)) == \
        naive.segments(lengths, seq_len, overflow)
    assert (lay.pack_lengths() <= seq_len).all() and (lay.pack_nseg > 0).all()
    assert lay.shard_starts[0] == 0 and lay.shard_starts[-1] == lay.n_packs
    first = lay.seg_first
    for j in range(lay.n_packs):  # segments of a pack in document order
        d = doc[first[j]:first[j + 1]]
        assert (np.diff(d) >= 0).all()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=12), st.integers(0, 3),
       st.booleans())
def test_derive_matches_the_reference(seg_lengths, seed, with_mask):
    rng = np.random.default_rng(seed)
    n = sum(seg_lengths)
    ids = rng.integers(0, 30000, n).astype(np.uint16)
    mask = rng.integers(0, 2, n).astype(np.uint8) if with_mask else None
    got = derive(np.array(seg_lengths, np.uint16), ids, mask)
    want = naive.derive(seg_lengths, ids, mask)
    for key, value in want.items():
        assert got[key].tolist() == value, key
    assert got["max_seqlen"] == max(seg_lengths)
    # a mask folded into the token word's top bit gives the same pack
    if with_mask:
        folded = ids.astype(np.uint32) | (mask.astype(np.uint32) << 31)
        again = derive(np.array(seg_lengths, np.uint16), folded, None, mask_shift=31)
        for key, value in want.items():
            assert again[key].tolist() == value, key


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=30), st.data())
def test_gather_copies_exactly_the_segments(tmp_path_factory, lengths, data):
    from synth import write_token_corpus

    from packtool.formats.tokens import gather, open_tokens

    d = tmp_path_factory.mktemp("g")
    write_token_corpus(d / "c", np.array(lengths), vocab_size=500, seed=1)
    c = open_tokens(d / "c")
    docs = [i for i, n in enumerate(lengths) if n]
    if not docs:
        return
    picks = data.draw(st.lists(st.sampled_from(docs), min_size=1, max_size=10))
    seg = []
    for doc in picks:
        off = data.draw(st.integers(0, lengths[doc] - 1))
        seg.append((doc, off, data.draw(st.integers(1, lengths[doc] - off))))
    doc, off, n = (np.array(x, np.int64) for x in zip(*seg, strict=True))
    dst = np.zeros(int(n.sum()) + 3, c.dtype)
    start = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
    gather([c], doc, off, n, dst, start)
    want = np.concatenate([c[int(a)][int(b):int(b) + int(k)] for a, b, k in seg])
    assert dst[:n.sum()].tolist() == want.tolist() and (dst[n.sum():] == 0).all()
    again = np.zeros_like(dst)
    c.gather(doc, off, n, again, start)  # the corpus' own method (public on TokenCorpus)
    assert again.tolist() == dst.tolist()
