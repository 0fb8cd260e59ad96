"""``pack --align K`` (segments padded in their rows, Transformer Engine's THD layout, planned
in the packer) and ``pack --max-docs K`` (segments a pack capped, a fixed cu_seqlens length):
the packers' cap against slow references, the options' checks, rows on the bundled corpus
against the definition, stats' predictions against what pack writes, verify, the readers,
collate and the exports."""

import json
from math import lcm

import naive
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import CORPUS, TOKENIZER
from invariants import check_assignment
from synth import lognormal_lengths, write_token_corpus

import packtool
from packtool.cli import cli
from packtool.errors import PacktoolError
from packtool.formats.packed import index_digest, open_packed
from packtool.formats.packed.batching import collate_numpy
from packtool.lengths import load_histogram_csv, reference_histogram
from packtool.options import PackOptions
from packtool.pack import pack_corpus
from packtool.pack.plan import plan_pack
from packtool.packers import PackerOptions, run_packer
from packtool.stats import stats
from packtool.verify import VerifyError, verify_packed

CAPPED = ("bfd", "ffd", "sorted", "random", "sequential")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The bundled corpus tokenized with the bundled tokenizer (its pad token is id 0)."""
    d = tmp_path_factory.mktemp("align")
    r = CliRunner().invoke(cli, ["tokenize", str(CORPUS), "-t", str(TOKENIZER), "--eos",
                                 "<|eos|>", "-o", str(d / "c"), "-q"])
    assert r.exit_code == 0, r.output
    return d / "c"


def documents(prefix) -> list[np.ndarray]:
    c = packtool.open_tokens(prefix)
    return [np.asarray(c[i], np.int64) for i in range(len(c))]


# ------------------------------------------------------------------ the packers' cap
@pytest.mark.parametrize("algo", CAPPED)
@pytest.mark.parametrize("cap", [1, 2, 4, 7])
def test_max_docs_is_never_exceeded(algo, cap):
    rng = np.random.default_rng(cap)
    lengths = rng.integers(0, 40, 3_000)
    packs = run_packer(lengths, 128, algo, PackerOptions(seed=1, max_docs=cap)).packs
    check_assignment(lengths, packs, 128)
    assert np.bincount(packs[packs >= 0]).max() <= cap
    free = run_packer(lengths, 128, algo, PackerOptions(seed=1)).report.n_packs
    assert packs.max() + 1 >= max(free, -(-int((lengths > 0).sum()) // cap))


@pytest.mark.parametrize("seed", range(6))
def test_capped_kernels_equal_the_references(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 50, 400)
    cap = int(rng.integers(1, 6))
    ffd = run_packer(lengths, 100, "ffd", PackerOptions(max_docs=cap)).packs
    assert ffd.tolist() == naive.capped_first_fit_decreasing(lengths.tolist(), 100, cap)
    bfd = run_packer(lengths, 100, "bfd", PackerOptions(max_docs=cap)).packs
    used = np.bincount(bfd[bfd >= 0], weights=lengths[bfd >= 0]).astype(int)
    held = np.bincount(bfd[bfd >= 0])
    assert sorted(zip(used.tolist(), held.tolist(), strict=True)) == \
        naive.capped_best_fit_decreasing_sizes(lengths.tolist(), 100, cap)
    order = np.arange(lengths.size)
    seq = run_packer(lengths, 100, "sequential", PackerOptions(max_docs=cap)).packs
    expect, p, room, held_ = [-1] * lengths.size, -1, 0, cap
    for i in order:
        if lengths[i]:
            if lengths[i] > room or held_ >= cap:
                p, room, held_ = p + 1, 100, 0
            expect[i], room, held_ = p, room - lengths[i], held_ + 1
    assert seq.tolist() == expect


@pytest.mark.parametrize("algo", ["optimal", "spfhp", "nnlshp"])
def test_max_docs_refused_by_the_packers_that_cannot_keep_it(algo):
    with pytest.raises(PacktoolError, match=f"--algo {algo} takes no --max-docs.*bfd"):
        run_packer([3, 4, 5], 16, algo, PackerOptions(max_docs=2))


# ------------------------------------------------------------------ the options
@pytest.mark.parametrize("kw,k", [({"align": 16}, 16), ({"cp": 4}, 8),
                                  ({"cp": 2, "tp": 3, "sequence_parallel": True}, 12),
                                  ({"cp": 2, "fp8": True}, 16), ({"align": 24, "fp8": True}, 48),
                                  ({"tp": 8, "sequence_parallel": True, "cp": 1}, 8), ({}, 1)])
def test_alignment_derived_as_documented(kw, k):
    opts = PackOptions(seq_len=lcm(k, 48) * 8, **kw)
    opts.check()
    assert opts.alignment == k


@pytest.mark.parametrize("kw,match", [
    ({"seq_len": 1000, "align": 16}, "--seq-len 1,000 is not a multiple of the alignment 16 "
                                     r"\(--align 16\).*--seq-len 1,008 or 992"),
    ({"seq_len": 100, "cp": 4}, r"alignment 8 \(--cp 4\)"),
    ({"seq_len": 64, "tp": 2}, "--tp 2 alone does not split sequences"),
    ({"seq_len": 64, "sequence_parallel": True}, "also pass --tp"),
    ({"seq_len": 64, "pad_id": 3}, "--pad-id is the id of alignment pads"),
    ({"seq_len": 64, "align": 0}, "--align must be a positive integer"),
])
def test_bad_alignment_refused_by_name(kw, match):
    with pytest.raises(PacktoolError, match=match):
        PackOptions(**kw).check()


# ------------------------------------------------------------------ the plan
@pytest.mark.parametrize("k", [8, 16, 64])
def test_aligned_plan_fits_seq_len_with_its_pads(k):
    lengths = lognormal_lengths(5_000, median=200, sigma=1.2, cap=6_000, seed=k)
    lay = plan_pack(lengths, PackOptions(seq_len=1024, align=k))
    doc, off, length = lay.segments()
    padded = -(-length // k) * k
    first = lay.seg_first
    rows = np.add.reduceat(padded, first[:-1])
    assert rows.max() <= 1024 and length.sum() == lengths.sum()
    assert lay.counts["n_align_tokens"] == int(padded.sum() - length.sum())
    assert "n_align_tokens" not in plan_pack(lengths, PackOptions(seq_len=1024)).counts


# ------------------------------------------------------------------ real-shaped corpora
@pytest.fixture(scope="module")
def aligned(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("aligned") / "p"
    pack_corpus([corpus], out, 1024, align=16, max_docs=12, layout="tokens")
    return out


def test_aligned_rows_follow_the_thd_layout(corpus, aligned):
    """Every row of the bundled corpus at --align 16: each segment's tokens (the corpus's, in
    order) at cu_seqlens_padded[j], pads of the tokenizer's pad id up to the next, labels -100
    on pads and first tokens, positions running on, doc ids; cu_seqlens the real tokens."""
    docs = documents(corpus)
    ds = open_packed(aligned)
    assert ds.index["version"] == 3 and ds.index["align"] == 16 and ds.pad_id == 0
    seen = np.zeros(sum(d.size for d in docs), np.int64)
    starts = np.concatenate([[0], np.cumsum([d.size for d in docs])])
    pads = 0
    for i in range(len(ds)):
        ex = ds[i]
        cu, cup = ex["cu_seqlens"].astype(int), ex["cu_seqlens_padded"].astype(int)
        assert ex["input_ids"].size == cup[-1] <= 1024 and (cup % 16 == 0).all()
        assert len(cu) == len(cup) <= 13
        for j, (d, o) in enumerate(zip(ex["source_docs"], ex["source_offsets"], strict=True)):
            n, a, b = cu[j + 1] - cu[j], cup[j], cup[j + 1]
            assert b - a == -(-n // 16) * 16
            assert ex["input_ids"][a:a + n].tolist() == docs[d][o:o + n].tolist()
            assert (ex["input_ids"][a + n:b] == 0).all()
            assert (ex["labels"][a + n:b] == -100).all() and ex["labels"][a] == -100
            assert ex["labels"][a + 1:a + n].tolist() == docs[d][o + 1:o + n].tolist()
            assert ex["position_ids"][a:b].tolist() == list(range(b - a))
            assert (ex["doc_ids"][a:b] == j).all()
            seen[starts[d] + o:starts[d] + o + n] += 1
            pads += b - a - n
    assert (seen == 1).all()  # every source token exactly once
    assert pads == ds.index["n_align_tokens"]
    assert verify_packed(aligned, [corpus]).align["align"] == 16


def test_unaligned_dataset_stays_version_2(corpus, tmp_path):
    pack_corpus([corpus], tmp_path / "p", 1000)
    idx = json.loads((tmp_path / "p" / "index.json").read_text())
    assert idx["version"] == 2 and not {"align", "pad_id", "parallel", "n_align_tokens"} & set(idx)
    assert "cu_seqlens_padded" not in open_packed(tmp_path / "p")[0]


def _rewrite(out, **changes):
    path = out / "index.json"
    idx = {**json.loads(path.read_text()), **changes}
    idx["index_sha256"] = index_digest(idx)
    path.write_text(json.dumps(idx))


def test_verify_refuses_an_alignment_edited(corpus, aligned, tmp_path):
    import shutil

    for change, match in (({"align": 64}, "longer than seq_len|n_align_tokens"),
                          ({"pad_id": 5000}, "pad_id 5,000 is outside the id space"),
                          ({"parallel": {"cp": 16, "tp": None, "sequence_parallel": False,
                                         "fp8": False}}, "need a multiple of 32"),
                          ({"version": 2}, "version 2 with the keys align")):
        out = tmp_path / str(change)
        shutil.copytree(aligned, out)
        _rewrite(out, **change)
        with pytest.raises(PacktoolError, match=match):  # a VerifyError or the reader's
            verify_packed(out, [corpus])


def test_verify_refuses_a_pad_id_changed_within_the_vocabulary(corpus, aligned, tmp_path):
    """issue 38: a pad_id moved to another id of the vocabulary, the digest recomputed, was
    accepted (nothing contradicted it). index.json records where the id came from
    (``pad_from``), and verify --source recomputes it from the source with its own code."""
    import shutil

    idx = json.loads((aligned / "index.json").read_text())
    assert idx["pad_from"] in ("tokenizer", "eos")
    assert verify_packed(aligned, [corpus]).align["pad_id"] == idx["pad_id"]
    out = tmp_path / "p"
    shutil.copytree(aligned, out)
    _rewrite(out, pad_id=idx["pad_id"] + 1)
    with pytest.raises(VerifyError, match="pad_id .* is not the"):
        verify_packed(out, [corpus])


def test_verify_refuses_a_pack_over_max_docs(corpus, aligned, tmp_path):
    import shutil

    out = tmp_path / "p"
    shutil.copytree(aligned, out)
    idx = json.loads((out / "index.json").read_text())
    _rewrite(out, algo_options={**idx["algo_options"], "max_docs": 2})
    with pytest.raises(VerifyError, match="segments > --max-docs 2"):
        verify_packed(out, [corpus])


@pytest.mark.parametrize("k", [8, 64])
def test_stats_predicts_the_packs_pack_writes(corpus, tmp_path, k):
    """stats --align / --max-docs on the bundled corpus and on a real-shaped histogram
    (squad11-384, 88,641 documents): its packs are those pack writes (bfd, the default)."""
    squad = load_histogram_csv(reference_histogram("squad11-384"))
    write_token_corpus(tmp_path / "squad", squad, vocab_size=500)
    for prefix, seq_len in ((corpus, 1024), (tmp_path / "squad", 512)):
        plain = stats([str(prefix)], seq_lens=[seq_len], algos="bfd").report["seq_lens"][0]
        for extra in ({"align": k}, {"max_docs": 4}, {"align": k, "max_docs": 8}):
            rep = stats([str(prefix)], seq_lens=[seq_len], **extra).report["seq_lens"][0]
            row = rep["algos"][0]
            out = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
            res = pack_corpus([prefix], out, seq_len, pad_id=1 if "align" in extra else None,
                              **extra)
            assert row["algo"] == "bfd" and row["packs"] == res.n_packs
            if "align" in extra:
                assert rep["align_tokens"] == res.counts["n_align_tokens"]
                assert row["packs_unaligned"] <= row["packs"]
                # compared with the plain packs, not the capped ones (issue 38)
                assert row["packs_unaligned"] == plain["algos"][0]["packs"]
            if "max_docs" in extra:
                assert row["packs_uncapped"] <= row["packs"]
                ds = open_packed(out)
                assert max(len(ds.segments(i)[2]) for i in range(len(ds))) <= extra["max_docs"]


def test_stats_refuses_a_seq_len_off_the_alignment(corpus):
    with pytest.raises(PacktoolError, match="--seq-len 1,004 is not a multiple of the "
                                            "alignment 8"):
        stats([str(corpus)], seq_lens=[1004], cp=4)


# ------------------------------------------------------------------ collate
def test_collate_max_docs_gives_a_fixed_length(corpus, tmp_path):
    pack_corpus([corpus], tmp_path / "p", 1024, max_docs=4)
    ds = open_packed(tmp_path / "p")
    assert max(len(ds.segments(i)[2]) for i in range(len(ds))) == 4
    short = next(i for i in range(len(ds)) if len(ds.segments(i)[2]) < 4)
    row = collate_numpy([ds[0], ds[short]], max_docs=4)
    cu = row["cu_seq_lens_q"]
    assert cu.size == 9 and cu[-1] == row["input_ids"].shape[1]
    real = np.concatenate([[0], np.cumsum(np.concatenate(
        [ds.segments(0)[2], ds.segments(short)[2]]))])
    assert cu[:real.size].tolist() == real.tolist() and (cu[real.size:] == cu[-1]).all()
    padded = collate_numpy([ds.get(0), ds.get(short)], max_docs=5)  # pad_to adds a segment
    assert padded["cu_seq_lens_k"].size == 11 and padded["input_ids"].shape[1] == 2048
    with pytest.raises(PacktoolError, match="example 1 of the batch holds 4 segments > "
                                            "max_docs 3"):
        collate_numpy([ds[short], ds[0]], max_docs=3) if len(ds.segments(short)[2]) <= 3 \
            else collate_numpy([ds[0], ds[0]], max_docs=3)
    with pytest.raises(PacktoolError, match="collate max_docs=K x collate pad_multiple"):
        collate_numpy([ds[0]], max_docs=4, pad_multiple=64)


def test_collate_aligned_rows(aligned):
    ds = open_packed(aligned)
    a, b = ds[0], ds[1]
    row = collate_numpy([a, b], max_docs=12)
    n_a = int(a["cu_seqlens_padded"][-1])
    assert row["input_ids"].shape[1] == n_a + int(b["cu_seqlens_padded"][-1])
    cup = np.concatenate([a["cu_seqlens_padded"], b["cu_seqlens_padded"][1:] + n_a])
    cu = np.concatenate([a["cu_seqlens"], b["cu_seqlens"][1:] + a["cu_seqlens"][-1]])
    assert row["cu_seqlens_padded"][:cup.size].tolist() == cup.tolist()
    assert row["cu_seq_lens_q"][:cu.size].tolist() == cu.tolist()
    assert row["cu_seq_lens_q"].size == row["cu_seqlens_padded"].size == 25
    # max_docs: the longest pack's length, a bound on every segment (one value, one compile)
    assert row["max_length_q"] == max(n_a, int(b["cu_seqlens_padded"][-1])) >= np.diff(cup).max()
    assert row["seq_idx"].shape == row["input_ids"].shape
    got = ds.get(0, pad_to=1024)  # a row pad: a segment of its own in both boundaries
    assert got["cu_seqlens_padded"][-1] == 1024 and len(got["cu_seqlens"]) == len(
        got["cu_seqlens_padded"])
    odd = next(i for i in range(len(ds)) if (np.diff(ds[i]["cu_seqlens_padded"]) % 32).any())
    with pytest.raises(PacktoolError, match="pack again with --align 32"):
        ds.get(odd, pad_multiple=32, per_segment=True)
    assert ds.get(odd, pad_multiple=8, per_segment=True)["input_ids"].size == \
        ds[odd]["input_ids"].size  # per-segment padding to a divisor of K changes nothing


def test_torch_collate_and_model_inputs(aligned):
    torch = pytest.importorskip("torch")
    from packtool.torch import collate_tensors, model_inputs

    ds = open_packed(aligned)
    batch = collate_tensors([ds[0], ds[1]], max_docs=12)
    assert batch["cu_seq_lens_q"].shape == (25,) and batch["cu_seq_lens_q"].dtype == torch.int32
    inputs = model_inputs(batch)  # a Hugging Face kernel indexes the row: padded boundaries
    assert torch.equal(inputs["cu_seq_lens_q"], batch["cu_seqlens_padded"])


# ------------------------------------------------------------------ exports
def test_exports_of_an_aligned_dataset(aligned, tmp_path):
    import pyarrow.parquet as pq

    from packtool.export import export

    ds = open_packed(aligned)
    export(aligned, "parquet", tmp_path / "e.parquet")
    row = pq.read_table(tmp_path / "e.parquet").slice(0, 1).to_pylist()[0]
    ex = ds[0]
    assert row["input_ids"] == ex["input_ids"].tolist() and row["labels"] == ex["labels"].tolist()
    assert row["seq_lengths"] == np.diff(ex["cu_seqlens_padded"]).tolist()
    export(aligned, "parquet-packed", tmp_path / "b.parquet")
    row = pq.read_table(tmp_path / "b.parquet").slice(0, 1).to_pylist()[0]
    assert row["seq_start_id"] == ex["cu_seqlens_padded"][:-1].tolist()
    assert row["loss_mask"] == (ex["labels"] != -100).astype(int).tolist()
    with pytest.raises(PacktoolError, match="aligned to 16.*no loss mask"):
        export(aligned, "megatron", tmp_path / "m")


def test_cli_pack_align_and_stats(corpus, tmp_path):
    r = CliRunner().invoke(cli, ["pack", str(corpus), "-L", "1024", "--cp", "4", "--fp8",
                                 "--max-docs", "16", "-o", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert "segments aligned:" in r.output and "pad tokens" in r.output
    idx = json.loads((tmp_path / "p" / "index.json").read_text())
    assert idx["align"] == 16 and idx["parallel"] == {"cp": 4, "tp": None,
                                                      "sequence_parallel": False, "fp8": True}
    r = CliRunner().invoke(cli, ["verify", str(tmp_path / "p"), "--source", str(corpus)])
    assert r.exit_code == 0 and "aligned to 16" in r.output, r.output
    r = CliRunner().invoke(cli, ["stats", str(corpus), "-L", "1024", "--align", "16",
                                 "--max-docs", "4"])
    assert r.exit_code == 0, r.output
    assert "aligned to 16" in r.output and "uncapped" in r.output
    r = CliRunner().invoke(cli, ["pack", str(corpus), "-L", "1000", "--align", "16", "-o",
                                 str(tmp_path / "q")])
    assert r.exit_code != 0 and "not a multiple of the alignment 16" in r.output


# ------------------------------------------------------------------ the sampler and which
def test_sampler_and_which_on_an_aligned_dataset(aligned):
    from packtool.train.sampler import PackSampler
    from packtool.train.which import which_step

    ds = open_packed(aligned)
    sampler = PackSampler(ds, rank=0, world_size=2, batch_size=2, seed=3)
    other = PackSampler(ds, rank=1, world_size=2, batch_size=2, seed=3)
    seen = [i for s in (sampler, other) for step in s.steps() for i in step]
    assert len(seen) == len(set(seen)) and len(seen) >= len(ds) - 3  # drop_last: < 1 step
    row = collate_numpy([ds[i] for i in next(iter(sampler.steps()))], max_docs=12)
    assert row["cu_seq_lens_q"].size == 25 and "cu_seqlens_padded" in row
    res = which_step(aligned, 0, 0, 0, world_size=2, batch_size=2, seed=3)
    first = res.segments[0].pack
    cup = ds[first]["cu_seqlens_padded"]
    got = [s.position[0] for s in res.segments if s.pack == first]
    assert got == cup[:-1].tolist()  # where each segment starts in the aligned row


@pytest.mark.parametrize("layout,vocab", [("index", 500), ("tokens", 500), ("tokens", 65_000)])
def test_aligned_rows_with_a_loss_mask(tmp_path, layout, vocab):
    """SFT sources: the mask (from the source, folded in the token word, or 1 bit a token)
    lands on the real tokens of an aligned row; pads are -100; verify recomputes it all."""
    lengths = lognormal_lengths(400, median=40, sigma=1.0, cap=600, seed=5)
    write_token_corpus(tmp_path / "c", lengths, vocab_size=vocab, mask=True, seed=5)
    pack_corpus([tmp_path / "c"], tmp_path / "p", 256, align=8, pad_id=1, layout=layout)
    ds = open_packed(tmp_path / "p")
    assert ds.index["mask_storage"] == {"index": "source", "tokens": "folded" if vocab == 500
                                        else "bits"}[layout]
    part = packtool.open_tokens(tmp_path / "c").parts[0]  # one part: documents in order
    starts = np.concatenate([[0], np.asarray(part.ends, np.int64)])
    for i in range(len(ds)):
        ex = ds[i]
        cu, cup = ex["cu_seqlens"], ex["cu_seqlens_padded"]
        for j, (d, o) in enumerate(zip(ex["source_docs"], ex["source_offsets"], strict=True)):
            n, a = int(cu[j + 1] - cu[j]), int(cup[j])
            mask = np.asarray(part.mask[starts[d] + o:starts[d] + o + n])
            want = np.where(mask == 0, -100, ex["input_ids"][a:a + n])
            want[0] = -100
            assert ex["labels"][a:a + n].tolist() == want.tolist()
            assert (ex["labels"][a + n:int(cup[j + 1])] == -100).all()
    verify_packed(tmp_path / "p", [tmp_path / "c"])


def test_stats_of_an_aligned_dataset(aligned):
    rep = stats([str(aligned)]).report
    ds = open_packed(aligned)
    assert rep["align"] == 16 and rep["n_align_tokens"] == ds.index["n_align_tokens"]
    rows = [int(ds[i]["cu_seqlens_padded"][-1]) for i in range(len(ds))]
    assert rep["pack_fill"]["mean"] == pytest.approx(np.mean(rows) / 1024)  # pads count
    assert "pad tokens of id 0" in stats([str(aligned)]).summary()
