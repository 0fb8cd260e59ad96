"""packtool export of pairs and groups: mds and parquet carry a plain pack's groups (seq_group,
seq_role per segment) and read back equal to the source corpus's roles; every format that
cannot carry them (megatron, llmc, parquet-packed), and every format but parquet (which
carries the tree, seq_up) for a --share-prompt pack, is refused by name with the reason and
the fix, and writes nothing."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import TOKENIZER, run, write_jsonl

import packtool
from packtool.export import export
from packtool.formats.packed import open_packed
from packtool.pack import pack_corpus
from packtool.tokenize import TokenizeOptions, tokenize_files

RECORDS = [{"prompt": f"Question {i}: what is {i} plus {i}?" + " more" * (i % 4),
            "chosen": f"It is {2 * i}." + " yes" * (i % 3),
            "rejected": "I do not know." + " no" * (i % 5)} for i in range(30)]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pref-export")
    p = write_jsonl(d / "pairs.jsonl", RECORDS)
    tokenize_files([str(p)], TOKENIZER, d / "pairs", TokenizeOptions(
        prompt_field="prompt", chosen_field="chosen", rejected_field="rejected"))
    out = {}
    for share in (False, True):
        out[share] = d / f"packed-{share}"
        pack_corpus([d / "pairs"], out[share], 128, shard_size=600, share_prompt=share,
                    layout="tokens")
    return packtool.open_tokens(d / "pairs"), out


def source_roles(corpus, ex) -> list[int]:
    """Each segment's role as the token corpus holds it (independent of the export)."""
    return corpus.per_doc("roles")[ex["source_docs"]].astype(int).tolist()


def test_parquet_carries_groups_and_roles(tmp_path, pairs):
    corpus, packed = pairs
    ds = open_packed(packed[False])
    assert len(ds.index["shards"]) > 1
    export(packed[False], "parquet", tmp_path / "p.parquet")
    rows = pq.read_table(tmp_path / "p.parquet").to_pylist()
    assert len(rows) == len(ds)
    seen = []
    for i, row in enumerate(rows):
        ex = ds[i]
        assert row["input_ids"] == ex["input_ids"].tolist()
        assert row["labels"] == ex["labels"].tolist()
        assert row["position_ids"] == ex["position_ids"].tolist()
        assert row["seq_lengths"] == np.diff(ex["cu_seqlens"]).tolist()
        assert row["seq_group"] == ex["seq_group"].tolist()
        assert row["seq_role"] == source_roles(corpus, ex)
        seen += row["seq_group"]
    # every pair whole: both of its sequences, in one row
    assert sorted(seen) == sorted(list(range(len(RECORDS))) * 2)


def test_parquet_carries_a_shared_prompt_tree(tmp_path, pairs):
    """A --share-prompt pack (version 6) exports its tree: seq_up per segment and the
    positions a completion continues from its prompt with, as the reader gives them."""
    _, packed = pairs
    ds = open_packed(packed[True])
    export(packed[True], "parquet", tmp_path / "s.parquet")
    rows = pq.read_table(tmp_path / "s.parquet").to_pylist()
    assert len(rows) == len(ds)
    for i, row in enumerate(rows):
        ex = ds[i]
        up = np.asarray(row["seq_up"])
        assert np.array_equal(np.where(up > 0, np.arange(up.size) - up, -1), ex["seg_parent"])
        assert row["position_ids"] == ex["position_ids"].tolist()
        assert row["labels"] == ex["labels"].tolist()
        assert [r for r in row["seq_role"] if r] == ex["seq_role"].tolist()


def test_mds_carries_groups_and_roles(tmp_path, pairs):
    corpus, packed = pairs
    ds = open_packed(packed[False])
    from packtool.export.mds import import_streaming

    export(packed[False], "mds", tmp_path / "mds")
    streaming = import_streaming()
    sd = streaming.StreamingDataset(local=str(tmp_path / "mds"), shuffle=False, batch_size=1)
    assert len(sd) == len(ds)
    for i in range(len(ds)):
        got, ex = sd[i], ds[i]
        assert got["input_ids"].tolist() == ex["input_ids"].tolist()
        assert got["cu_seqlens"].tolist() == ex["cu_seqlens"].tolist()
        assert got["seq_group"].tolist() == ex["seq_group"].tolist()
        assert got["seq_role"].tolist() == source_roles(corpus, ex)


@pytest.mark.parametrize("fmt,share,why", [
    ("megatron", False, "GPTDataset has no notion of a group"),
    ("megatron", True, "GPTDataset has no notion of a group"),
    ("parquet-packed", False, "GPTSFTPackedParquetDataset has no group or role"),
    ("parquet-packed", True, "GPTSFTPackedParquetDataset has no group or role"),
    ("mds", True, "attend within your own segment"),
])
def test_packed_formats_that_cannot_carry_groups_are_refused(tmp_path, pairs, fmt, share, why):
    _, packed = pairs
    out = tmp_path / ("x.parquet" if fmt.startswith("parquet") else "x")
    r = run("export", packed[share], "--format", fmt, "--out", out)
    assert r.exit_code != 0
    assert "preference pairs" in r.output and why in r.output
    assert ("packed with --share-prompt" in r.output) == share
    assert "packtool.torch" in r.output and "without --share-prompt" in r.output
    assert "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt,why", [("megatron", "GPTDataset has no notion of a group"),
                                     ("llmc", "llm.c token stream has no groups")])
def test_corpus_formats_refuse_pairs(tmp_path, pairs, fmt, why):
    corpus, _ = pairs
    r = run("export", corpus.prefix, "--format", fmt, "--out", tmp_path / "x")
    assert r.exit_code != 0 and why in r.output and "preference pairs" in r.output
    assert list(tmp_path.iterdir()) == []
