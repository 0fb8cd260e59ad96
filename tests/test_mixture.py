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
from packtool.mixture import doc_repeats, held_out, parse_source
from packtool.pack import pack_corpus
from packtool.verify import VerifyError, verify_packed


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from packtool.synth import make_documents

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
