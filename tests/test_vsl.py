"""``pack --vsl MIN:MAX`` (Dataset Decomposition's variable sequence length): the cut against a
plain reference, the rows it plans, the format's version 4 and its row lengths, pack + verify
--source on the bundled corpus, stats' prediction, which, an export, the torch dataset, and
the options it refuses."""

import json

import naive
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import CORPUS, TOKENIZER, run

import packtool
from packtool.cli import cli
from packtool.errors import PacktoolError
from packtool.formats.packed import index_digest, open_packed
from packtool.options import PackOptions, parse_vsl
from packtool.pack.plan import plan_pack
from packtool.pack.vsl import cut, vsl_packs
from packtool.stats import stats
from packtool.verify import VerifyError, verify_packed


def reference_cut(n: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """(offset, length) of a document's pieces, the obvious way: MAX chunks while they fit,
    then the largest power of two that fits, down to MIN, then what is left."""
    out, at = [], 0
    while n - at >= hi:
        out.append((at, hi))
        at += hi
    b = hi // 2
    while b >= lo:
        if n - at >= b:
            out.append((at, b))
            at += b
        b //= 2
    if n > at:
        out.append((at, n - at))
    return out


@pytest.mark.parametrize("lo,hi", [(1, 1), (4, 4), (4, 64), (16, 1024), (256, 8192)])
def test_cut_matches_reference(lo, hi):
    rng = np.random.default_rng(lo * 7 + hi)
    lengths = np.concatenate([rng.integers(0, 5 * hi + 3, 400), [0, lo, hi, hi * 3, lo - 1,
                                                                  2 * hi - 1]]).clip(0)
    segs = cut(lengths, (lo, hi))
    nz = np.flatnonzero(segs.table_length > 0)
    doc, off = segs.locate(nz)
    got = list(zip(doc.tolist(), off.tolist(), segs.table_length[nz].tolist(), strict=True))
    want = [(d, o, n) for d, x in enumerate(lengths.tolist())
            for o, n in reference_cut(x, lo, hi)]
    assert got == want  # the same pieces, in document order, each document's in order
    for d, x in enumerate(lengths.tolist()):  # every token exactly once
        pieces = [(o, n) for dd, o, n in got if dd == d]
        assert sum(n for _, n in pieces) == x
        assert all(a[0] + a[1] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))
    n = np.array([p[2] for p in got])
    o = np.array([p[1] for p in got])
    chunk = n >= lo
    assert ((n[chunk] & (n[chunk] - 1)) == 0).all() and (n[chunk] <= hi).all()
    assert (o[chunk] % n[chunk] == 0).all() and (o[~chunk] % lo == 0).all()
    assert segs.counts["n_tokens"] == int(lengths.sum())
    assert segs.counts["n_segments"] == len(got)


def test_rows_each_chunk_alone_remnants_bfd():
    lo, hi = 16, 256
    lengths = np.random.default_rng(3).integers(0, 1200, 500)
    segs = cut(lengths, (lo, hi))
    ids, report = vsl_packs(segs.table_length, lo)
    t = segs.table_length
    chunk_ids = ids[t >= lo]
    assert np.unique(chunk_ids).size == chunk_ids.size  # every chunk a row of its own
    rem = (t > 0) & (t < lo)
    assert not np.isin(ids[rem], chunk_ids).any()
    fills = np.bincount(ids[rem] - chunk_ids.size, weights=t[rem])
    assert fills.max() <= lo
    assert sorted(fills.astype(int).tolist()) == naive.best_fit_decreasing_sizes(
        t[rem].tolist(), lo)
    assert report.n_packs == chunk_ids.size + fills.size
    assert (ids[t == 0] == -1).all()


def test_plan_is_deterministic_and_rows_fit():
    lengths = np.random.default_rng(5).integers(0, 3000, 2000)
    opts = PackOptions(vsl="64:1024", seed=4)
    a, b = plan_pack(lengths, opts), plan_pack(lengths, opts)
    assert np.array_equal(a.order, b.order) and np.array_equal(a.pack_nseg, b.pack_nseg)
    assert opts.seq_len == 1024
    rows = a.pack_lengths()
    multi = a.pack_nseg > 1
    assert (rows[multi] <= 64).all()  # remnant rows
    single = rows[~multi]
    big = single[single >= 64]
    assert ((big & (big - 1)) == 0).all() and big.max() <= 1024
    assert int(rows.sum()) == int(lengths.sum())


@pytest.mark.parametrize("spec,msg", [
    ("100:2048", "MIN 100 is not a power of two"), ("256:3000", "MAX 3,000 is not a power"),
    ("4096:256", "MIN 4,096 > MAX 256"), ("256", "give MIN:MAX"), ("a:b", "give MIN:MAX"),
    ("0:256", "MIN 0 is not a power")])
def test_bad_bounds_refused(spec, msg):
    with pytest.raises(PacktoolError, match=msg):
        parse_vsl(spec)


@pytest.mark.parametrize("extra,msg", [
    (["--align", "16"], "--vsl x alignment"), (["--max-docs", "4"], "--max-docs"),
    (["--algo", "ffd"], "--vsl x --algo other than bfd: --vsl packs its remnants with bfd"),
    (["-L", "4096"], "--seq-len 4,096 is not --vsl's MAX 2,048"),
    (["--overflow", "drop"], "--overflow drop"), (["--group-docs", "10"], "--group-docs"),
    (["--balance", "attention"], "--balance attention"), (["--vsl", "100:2048"], "power of two")])
def test_pack_options_refused(tmp_path, extra, msg):
    args = ["pack", "unused", "-o", str(tmp_path / "p")]
    r = run(*args, *(extra if extra[0] == "--vsl" else ["--vsl", "256:2048", *extra]))
    assert r.exit_code != 0 and msg in r.output, r.output
    assert not (tmp_path / "p").exists()


def test_pack_needs_seq_len_or_vsl(tmp_path):
    r = run("pack", "unused", "-o", str(tmp_path / "p"))
    assert r.exit_code != 0 and "--seq-len (-L) N, or --vsl MIN:MAX" in r.output


# ------------------------------------------------------------- the bundled corpus, end to end
@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("vsl")
    r = CliRunner().invoke(cli, ["tokenize", str(CORPUS), "-t", str(TOKENIZER), "--eos",
                                 "<|eos|>", "-o", str(d / "c"), "-q"])
    assert r.exit_code == 0, r.output
    r = run("pack", str(d / "c"), "--vsl", "256:2048", "--valid-docs", "20", "-o",
            str(d / "p"), "--json")
    assert r.exit_code == 0, r.output
    return d, json.loads(r.stdout)


def test_pack_verify_source(packed):
    d, res = packed
    r = run("verify", str(d / "p"), "--source", str(d / "c"))
    assert r.exit_code == 0 and "packed exactly once" in r.output, r.output
    ds = open_packed(d / "p")
    assert ds.version == 4 and ds.vsl == (256, 2048) and ds.seq_len == 2048
    lengths = ds.row_lengths()
    assert lengths.dtype == np.int64 and lengths.size == len(ds)
    for i in range(len(ds)):
        ex = ds[i]
        n = ex["input_ids"].size
        assert ds.row_length(i) == lengths[i]
        if ex["cu_seqlens"].size == 2 and n >= 256:  # a chunk row: one document, 2**k tokens
            assert n == lengths[i] and n & (n - 1) == 0 and n <= 2048
        else:  # a remnant row
            assert lengths[i] == 256 and n <= 256
            assert (np.diff(ex["cu_seqlens"]) < 256).all()
        starts = np.repeat(ex["cu_seqlens"][:-1], np.diff(ex["cu_seqlens"]))
        assert np.array_equal(ex["position_ids"], np.arange(n) - starts)  # restart per segment
    for bad in (1.5, "1", True):  # not an index: refused by name, not a numpy IndexError
        with pytest.raises(PacktoolError, match="pack index must be an integer"):
            ds.row_length(bad)
        with pytest.raises(PacktoolError, match="pack index must be an integer"):
            ds[bad]
    assert ds.row_length(np.int64(0)) == lengths[0]
    v = ds.index["vsl"]
    rows = {str(k): int(c) for k, c in zip(*np.unique(lengths, return_counts=True),
                                           strict=True)}
    rows["256"] -= v["n_remnant_rows"]
    assert {k: c for k, c in rows.items() if c} == v["rows"]
    assert res["vsl"] == v and res["n_tokens"] == ds.index["n_tokens"]
    valid = open_packed(d / "p" / "valid")
    assert valid.vsl == (256, 2048) and valid.index["n_docs"] == ds.index["n_docs"]


def test_fixed_length_row_lengths(tmp_path, packed):
    d, _ = packed
    r = run("pack", str(d / "c"), "-L", "512", "-o", str(tmp_path / "f"), "-q")
    assert r.exit_code == 0, r.output
    ds = open_packed(tmp_path / "f")
    assert ds.vsl is None and ds.version == 2 and ds.row_length(3) == 512
    assert (ds.row_lengths() == 512).all() and ds.row_lengths().size == len(ds)


def test_stats_predicts_pack(packed):
    d, _ = packed
    # the training split's documents: pack without the held-out ones for the comparison
    out = d / "whole"
    assert run("pack", str(d / "c"), "--vsl", "256:2048", "-o", str(out), "-q").exit_code == 0
    rep = stats([str(d / "c")], seq_lens=(2048,), vsl="256:2048").report["vsl"]
    idx = open_packed(out).index
    assert {k: rep[k] for k in idx["vsl"]} == idx["vsl"]
    assert rep["n_rows"] == idx["n_packs"]
    r = run("stats", str(d / "c"), "--vsl", "256:2048", "-L", "2048")
    assert r.exit_code == 0 and "predicted: vsl 256:2048" in r.output, r.output


def test_validator_refuses_edited_rows(packed, tmp_path):
    import shutil

    d, _ = packed
    bad = tmp_path / "bad"
    shutil.copytree(d / "whole", bad)
    idx = json.loads((bad / "index.json").read_text())
    idx["vsl"]["n_remnant_rows"] += 1
    idx["index_sha256"] = index_digest(idx)
    (bad / "index.json").write_text(json.dumps(idx))
    with pytest.raises(VerifyError, match="vsl says"):
        verify_packed(bad)


def test_which_names_a_vsl_row(packed):
    d, _ = packed
    r = run("which", str(d / "p"), "--step", "1", "--batch-size", "64", "--json")
    assert r.exit_code == 0, r.output
    ds = open_packed(d / "p")
    segs = json.loads(r.stdout)["segments"]
    assert len({s["pack"] for s in segs}) == 64
    assert any(s["tokens"][0] > 0 for s in segs)  # a chunk from inside its document
    for s in segs:
        doc, off, length = (a.astype(np.int64) for a in ds.segments(s["pack"]))
        j = int(np.flatnonzero((doc == s["document"]["doc"]) & (off == s["tokens"][0]))[0])
        assert s["tokens"][1] == off[j] + length[j]


def test_export_parquet_holds_variable_rows(packed, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    d, _ = packed
    r = run("export", str(d / "p"), "--format", "parquet", "-o", str(tmp_path / "x.parquet"),
            "-q")
    assert r.exit_code == 0, r.output
    table = pq.read_table(tmp_path / "x.parquet")
    ds = open_packed(d / "p")
    got = [len(x) for x in table.column("input_ids").to_pylist()]
    assert got == [ds[i]["input_ids"].size for i in range(len(ds))]
    assert len(set(got)) > 3  # rows of several lengths


def test_torch_dataset_pads_rows_to_their_slot(packed):
    pytest.importorskip("torch")
    from packtool.train.torch import TorchPackedDataset

    d, _ = packed
    ds = TorchPackedDataset(d / "p", pad_rows=True)
    lengths = ds.packed.row_lengths()
    for i in range(0, len(ds), 7):
        ex = ds[i]
        assert ex["input_ids"].shape[0] == lengths[i]
        real = ds.packed[i]["input_ids"].size
        assert ex["position_ids"][:real].tolist() == ds.packed[i]["position_ids"].tolist()
    assert packtool.open_packed(d / "p").vsl == (256, 2048)


def test_validator_refuses_a_max_that_is_not_seq_len(packed, tmp_path):
    """vsl.max edited to 2x seq_len (digest recomputed) was accepted, issue 38."""
    import shutil

    d, _ = packed
    bad = tmp_path / "bad"
    shutil.copytree(d / "whole", bad)
    idx = json.loads((bad / "index.json").read_text())
    idx["vsl"]["max"] = 2 * idx["seq_len"]
    idx["index_sha256"] = index_digest(idx)
    (bad / "index.json").write_text(json.dumps(idx))
    with pytest.raises(PacktoolError, match="disagrees with seq_len"):
        verify_packed(bad)
