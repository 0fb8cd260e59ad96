"""Mixtures (PREFIX:FACTOR) and held-out splits: what the index says is what the packs hold,
copies of a document never share a pack, no document is in training and validation, and
verify recomputes all of it from the sources."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TOKENIZER, write_jsonl

import packtool
from packtool.cli import cli
from packtool.formats.packed import open_packed
from packtool.pack import pack_corpus
from packtool.pack.mixture import doc_repeats, held_out, parse_source
from packtool.verify import VerifyError, verify_packed


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from synth import make_documents

    d = tmp_path_factory.mktemp("mix")
    for name, n, seed in (("web", 60, 1), ("books", 40, 2), ("code", 30, 3)):
        docs = make_documents(n, seed=seed, median_words=25, max_words=300)
        docs[0] = ""  # an empty document in every source
        write_jsonl(d / f"{name}.jsonl", [{"text": t} for t in docs])
        r = CliRunner().invoke(cli, ["tokenize", str(d / f"{name}.jsonl"), "-t", str(TOKENIZER),
                                     "--eos", "<|eos|>", "-o", str(d / name), "-q"])
        assert r.exit_code == 0, r.output
    return d


def test_parse_source():
    assert parse_source("out/web:2.0") == ("out/web", 2.0)
    assert parse_source("out/web") == ("out/web", 1.0)
    assert parse_source("c:/data/web") == ("c:/data/web", 1.0)  # not a number: a path
    with pytest.raises(packtool.PacktoolError, match="repeat factor"):
        parse_source("web:-1")


def test_repeats_and_held_out_are_exact_and_seeded():
    reps = doc_repeats([10, 7], [2.5, 0.0], seed=3)
    assert reps[:10].min() == 2 and (reps[:10] == 3).sum() == 5 and not reps[10:].any()
    assert np.array_equal(reps, doc_repeats([10, 7], [2.5, 0.0], seed=3))
    lengths = np.arange(1, 101)
    mask = held_out(lengths, [60, 40], seed=0, valid_docs=10)
    assert mask.sum() == 10 and mask[:60].sum() == 6 and mask[60:].sum() == 4
    reps = doc_repeats([60, 40], [1.0, 1.0], seed=0, exclude=mask)
    assert not reps[mask].any() and (reps[~mask] == 1).all()


@pytest.mark.slow
def test_mixture_uses_what_it_says(tmp_path, sources):
    specs = [f"{sources / 'web'}:2.0", f"{sources / 'books'}:0.5", str(sources / "code")]
    res = pack_corpus(specs, tmp_path / "p", 128, "bfd", seed=7, shard_size=4000)
    corpora = {n: packtool.open_tokens(sources / n) for n in ("web", "books", "code")}
    by = {s["prefix"].rsplit("/", 1)[-1]: s for s in res.sources}
    web, books, code = by["web"], by["books"], by["code"]
    assert web["factor"] == 2.0 and web["tokens_used"] == 2 * corpora["web"].n_tokens
    assert web["docs_used"] == 2 * int((corpora["web"].lengths > 0).sum())
    assert code["tokens_used"] == corpora["code"].n_tokens
    assert 0 < books["tokens_used"] < corpora["books"].n_tokens
    assert sum(s["token_share"] for s in res.sources) == pytest.approx(1.0)
    assert "% of the packed tokens" in res.summary()
    assert verify_packed(tmp_path / "p", specs).summary().startswith("OK")
    # copies of one document never share a pack
    ds = open_packed(tmp_path / "p")
    for i in range(len(ds)):
        docs = ds[i]["source_docs"]
        assert len(np.unique(docs)) == len(docs), f"pack {i} holds two copies of a document"
    # stats of the packed directory shows the realized shares
    r = CliRunner().invoke(cli, ["stats", str(tmp_path / "p")])
    assert r.exit_code == 0 and "x2, " in r.output and "% of the packed tokens" in r.output


def test_verify_recomputes_the_mixture(tmp_path, sources):
    """A dataset packed as web:2.0 does not verify against a mix of web once: the sources'
    tokens must appear exactly as often as the mix says."""
    pack_corpus([f"{sources / 'web'}:2.0"], tmp_path / "p", 128, "bfd")
    index_path = tmp_path / "p" / "index.json"
    index = json.loads(index_path.read_text())
    index["sources"][0]["factor"] = 1.0
    from packtool.formats.packed import index_digest

    index["index_sha256"] = index_digest(index)
    index_path.write_text(json.dumps(index))
    with pytest.raises(VerifyError, match="make"):
        verify_packed(tmp_path / "p", [sources / "web"])


def test_held_out_split(tmp_path, sources):
    runner = CliRunner()
    r = runner.invoke(cli, ["pack", str(sources / "web"), str(sources / "books"), "-L", "128",
                            "--valid-docs", "5", "-o", str(tmp_path / "p"), "--json", "-q"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["valid"]["n_docs_held_out"] == 5 and out["valid"]["path"] == "valid"
    train, valid = open_packed(tmp_path / "p"), open_packed(tmp_path / "p" / "valid")
    assert valid.index["split"] == "valid" and train.index["held_out"]["valid_docs"] == 5
    tdocs = np.concatenate([train[i]["source_docs"] for i in range(len(train))])
    vdocs = np.concatenate([valid[i]["source_docs"] for i in range(len(valid))])
    assert not np.intersect1d(tdocs, vdocs).size and len(np.unique(vdocs)) == 5
    r = runner.invoke(cli, ["verify", str(tmp_path / "p"), "-s", str(sources / "web"), "-s",
                            str(sources / "books")])
    assert r.exit_code == 0 and r.output.startswith("OK"), r.output
    # a tiny eval set still packs: one document
    res = pack_corpus([sources / "code"], tmp_path / "q", 4096, "bfd", valid_docs=1)
    assert res.valid["n_docs_held_out"] == 1 and res.valid["n_packs"] == 1
    assert verify_packed(tmp_path / "q", [sources / "code"]).summary().startswith("OK")


def test_a_document_in_both_splits_is_caught(tmp_path, sources):
    pack_corpus([sources / "code"], tmp_path / "p", 128, "bfd", valid_fraction=0.2)
    valid = open_packed(tmp_path / "p" / "valid")
    train = open_packed(tmp_path / "p")
    leaked = int(train[0]["source_docs"][0])
    path = tmp_path / "p" / "valid" / valid.index["shards"][0]["files"]["seg_doc"]["name"]
    arr = np.load(path)
    arr[0] = leaked
    np.save(path, arr)
    from packtool._io import crc32_file
    from packtool.formats.packed import index_digest

    index_path = tmp_path / "p" / "valid" / "index.json"
    index = json.loads(index_path.read_text())
    index["shards"][0]["files"]["seg_doc"]["crc32"] = crc32_file(path)
    index["index_sha256"] = index_digest(index)
    index_path.write_text(json.dumps(index))
    with pytest.raises(VerifyError, match="in the training packs and in the held-out packs"):
        verify_packed(tmp_path / "p")


def test_duplicate_source_suggests_a_factor(tmp_path, sources):
    with pytest.raises(packtool.PacktoolError, match=r"web:2.0\) instead"):
        pack_corpus([sources / "web", sources / "web"], tmp_path / "p", 128)


# ------------------------------- issue 18 2.8: ambiguity, empty training sets, idle sources
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """``c`` (50 documents), ``b`` (1), ``e`` (none), and ``c.jsonl``, a raw input."""
    from synth import make_documents

    d = tmp_path_factory.mktemp("small")
    docs = make_documents(51, seed=4, median_words=30, max_words=100)
    write_jsonl(d / "c.jsonl", [{"text": t} for t in docs[:50]])
    write_jsonl(d / "b.jsonl", [{"text": docs[50]}])
    (d / "e.jsonl").write_text("")
    for name in ("c", "b", "e"):
        r = CliRunner().invoke(cli, ["tokenize", str(d / f"{name}.jsonl"), "-t",
                                     str(TOKENIZER), "-o", str(d / name), "-q"])
        assert r.exit_code == 0, r.output
    return d


def _pack(small, tmp_path, *args):
    r = CliRunner().invoke(cli, ["pack", *[str(a) for a in args], "-L", "128", "-o",
                                 str(tmp_path / "o"), "-q", "--json"])
    return r, (json.loads(r.stdout) if r.exit_code == 0 else None)


def test_a_factor_and_a_corpus_of_that_name_are_ambiguous(small, tmp_path):
    import shutil

    shutil.copy(small / ".c.part.json", tmp_path / ".c.part.json")  # c's own, kept by c:2
    for s in (".json", ".bin", ".boundaries"):
        shutil.copy(small / f"c{s}", tmp_path / f"c{s}")
        shutil.copy(small / f"c{s}", tmp_path / f"c:2{s}")
    r, _ = _pack(small, tmp_path, tmp_path / "c:2")
    assert r.exit_code == 1 and "ambiguous" in r.output, r.output
    assert "c:2.json" in r.output and "c.json" in r.output
    (tmp_path / "c.json").unlink()  # only the corpus named c:2 is left: it is meant
    r, out = _pack(small, tmp_path, tmp_path / "c:2")
    assert r.exit_code == 0 and out["sources"][0]["factor"] == 1.0, r.output


@pytest.mark.parametrize("specs,extra,match", [
    (["c:0"], [], "training set would be empty"),
    (["c:0", "b:0"], [], "training set would be empty"),
    (["c:1e-9"], [], r"c would add nothing .* factor 1e-09 selects none of its 50"),
    (["c", "b:0.4"], [], r"b would add nothing"),
    (["c", "e"], [], r"e would add nothing .* holds no non-empty document"),
    (["c:999999"], [], r"repeat factor 999999 must be a number from 0 to 1,000"),
    (["x:2"], [], r"':2' was read as a repeat factor of the corpus .*x"),
    (["c.jsonl"], [], r"packtool tokenize .*c.jsonl"),
    (["e"], ["--valid-docs", "1"], r"--valid-docs 1: no document can be held out"),
    (["c", "b"], ["--valid-docs", "50"], r"--valid-docs 50: must be from 1 to 49"),
])
def test_empty_or_idle_mixtures_are_refused(small, tmp_path, specs, extra, match):
    import re

    r, _ = _pack(small, tmp_path, *[small / s for s in specs], *extra)
    assert r.exit_code == 1, r.output
    assert re.search(match, r.output), r.output
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()


@pytest.mark.parametrize("specs,extra,match", [
    (["c:1e-9"], [], r"c would add nothing"),
    (["c", "b:0.4"], [], r"b would add nothing"),
    (["c", "e"], [], r"e would add nothing .* holds no non-empty document"),
    (["c:0", "b:0"], [], "training set would be empty"),
])
def test_grouped_plans_refuse_idle_mixtures_too(small, tmp_path, specs, extra, match):
    """--group-docs draws the mixture apart from the global planner (bitmaps, streaming):
    it refuses what the global plan refuses."""
    import re

    r, _ = _pack(small, tmp_path, *[small / s for s in specs], *extra, "--group-docs", 20)
    assert r.exit_code == 1 and re.search(match, r.output), r.output


@pytest.mark.parametrize("group", [[], ["--group-docs", "20"]])
def test_holdout_is_exact_and_never_empties_a_source(small, tmp_path, group):
    """``c b --valid-docs 1`` held out b's only document and 2 documents in all (at least one
    per source): now exactly 1, and every source keeps a document for training."""
    r, out = _pack(small, tmp_path, small / "c", small / "b", "--valid-docs", 1, *group)
    assert r.exit_code == 0, r.output
    assert out["valid"]["n_docs_held_out"] == 1
    by = {s["prefix"].rsplit("/", 1)[-1]: s for s in out["sources"]}
    assert by["b"]["docs_used"] == 1 and by["c"]["docs_used"] == 49
    v = CliRunner().invoke(cli, ["verify", str(tmp_path / "o"), "-s", str(small / "c"), "-s",
                                 str(small / "b")])
    assert v.exit_code == 0, v.output
    # --valid-fraction 0.999999 left no document for training: one stays
    r, out = _pack(small, tmp_path, small / "c", "--valid-fraction", 0.999999, "--overwrite",
                   *group)
    assert r.exit_code == 0 and out["n_packs"] >= 1 and out["valid"]["n_docs_held_out"] == 49
    # a source at factor 0 on purpose: its documents serve the held-out split only
    r, out = _pack(small, tmp_path, f"{small / 'c'}:0", small / "b", "--valid-docs", 3,
                   "--overwrite", *group)
    assert r.exit_code == 0 and out["valid"]["n_docs_held_out"] == 3, r.output


def test_holdout_counts_match_verifys_own_rule():
    from packtool.pack.mixture import holdout_counts
    from packtool.verify.rules import expected_holdout

    rng = np.random.default_rng(0)
    for _ in range(300):
        m = [int(x) for x in rng.integers(0, 30, rng.integers(1, 5))]
        if sum(max(x - 1, 0) for x in m) < 1:
            continue
        n = int(rng.integers(1, sum(max(x - 1, 0) for x in m) + 1))
        got = holdout_counts(m, valid_docs=n)
        assert sum(got) == n and all(g <= max(x - 1, 0) for g, x in zip(got, m, strict=True))
        assert got == expected_holdout({"rule": 2, "valid_docs": n}, m, sum(m))
        f = float(rng.uniform(0.01, 0.99))
        assert holdout_counts(m, valid_fraction=f) == expected_holdout(
            {"rule": 2, "valid_docs": None, "valid_fraction": f}, m, sum(m))


# ------------------------------- issue 32.3: target token shares, PREFIX=SHARE
@pytest.fixture(scope="module")
def unequal(tmp_path_factory):
    """``prose`` (3,000 documents, median 300 tokens) and ``code`` (700, median 600): the
    scarce one is code."""
    from synth import lognormal_lengths, write_token_corpus

    d = tmp_path_factory.mktemp("shares")
    write_token_corpus(d / "prose", lognormal_lengths(3000, median=300, seed=1), seed=1)
    write_token_corpus(d / "code", lognormal_lengths(700, median=600, seed=2), seed=2)
    return d


def _shares(out) -> dict:
    return {s["prefix"].rsplit("/", 1)[-1]: s for s in out["sources"]}


@pytest.mark.parametrize("group", [[], ["--group-docs", "500"]])
def test_target_shares_are_realized_within_one_percent(unequal, tmp_path, group):
    from conftest import run

    total = {n: int(packtool.open_tokens(unequal / n).lengths.sum()) for n in ("prose", "code")}
    r = run("pack", f"{unequal / 'prose'}=0.3", f"{unequal / 'code'}=0.7", "-L", 2048, "-o",
            tmp_path / "p", "--json", "--seed", 3, *group)  # the expected factor alone: 28.2%
    assert r.exit_code == 0, r.output
    by = _shares(json.loads(r.stdout))
    assert abs(by["prose"]["token_share"] - 0.3) < 0.01, by
    assert abs(by["code"]["token_share"] - 0.7) < 0.01, by
    assert by["code"]["factor"] == 1.0 and by["code"]["tokens_used"] == total["code"]
    assert by["prose"]["factor"] < 1 and by["prose"]["target_share"] == pytest.approx(0.3)
    r = run("verify", tmp_path / "p", "--source", f"{unequal / 'prose'},{unequal / 'code'}")
    assert r.exit_code == 0, r.output  # verify recomputes the mixture from the factors
    r = run("pack", f"{unequal / 'prose'}=3", f"{unequal / 'code'}=7", "-L", 2048, "-o",
            tmp_path / "q", *group)
    assert r.exit_code == 0 and "(target 30.00%)" in r.output and "(target 70.00%)" in r.output


def test_tokens_sets_the_total_and_repeats_where_needed(unequal, tmp_path):
    from conftest import run

    code = int(packtool.open_tokens(unequal / "code").lengths.sum())
    want = 3 * code
    r = run("pack", f"{unequal / 'prose'}=0.2", f"{unequal / 'code'}=0.8", "--tokens", want,
            "-L", 2048, "-o", tmp_path / "p", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    by = _shares(out)
    assert 2 < by["code"]["factor"] < 3  # 2.4x its tokens: two copies and a sample
    assert abs(by["code"]["token_share"] - 0.8) < 0.01 and abs(out["n_tokens"] / want - 1) < 0.01


@pytest.mark.parametrize("specs,extra,match", [
    (["prose=0.5", "code:2"], [], r"code:2 has no target share while other sources do: .*not "
                                  "both"),
    (["prose=0.5", "code"], [], r"code has no target share"),
    (["prose", "code"], ["--tokens", "1000"], r"--tokens 1,000 sets the total of target "
                                              "shares: give the sources as PREFIX=SHARE"),
    (["prose=0", "code=0"], [], r"target shares sum to 0"),
    (["prose=-1", "code=1"], [], r"target share -1 must be a number >= 0"),
    (["nothing=1"], [], r"'=1' was read as a target share of the corpus .*nothing"),
    (["prose=1e-9", "code=1"], [], r"prose: its target share is 0 tokens, less than one of "
                                   "its documents"),
    (["prose=1", "code=1"], ["--tokens", "10000000000"], r"at most 1,000 copies"),
])
def test_bad_shares_refused_by_name(unequal, tmp_path, specs, extra, match):
    import re

    from conftest import run

    r = run("pack", *[unequal / s for s in specs], *extra, "-L", 2048, "-o", tmp_path / "o")
    assert r.exit_code == 1 and re.search(match, r.output), r.output
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()
