"""packtool export: every format read back by its consumer's own reader, token for token.

megatron -> megatron-core's IndexedDataset; mds -> mosaicml-streaming's StreamingDataset;
parquet-packed -> pyarrow and Hugging Face datasets, checked against Megatron-Bridge's row
invariants; llmc -> an independent reader written here from llm.c's header layout.
"""

import json
import os
import struct
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TOKENIZER, write_jsonl
from conftest import run as run_cli

import packtool
from packtool import PacktoolError
from packtool._io import sha256_file
from packtool.export import MARKER, export
from packtool.formats.packed import IGNORE_INDEX, open_packed
from packtool.pack import pack_corpus
from packtool.tokenize import TokenizeOptions, tokenize_files

run = partial(run_cli, "export")  # every command here is an export


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunk and row-group sizes of a few entries, so every test crosses their boundaries."""
    import packtool.export.llmc as llmc
    import packtool.export.mds as mds
    import packtool.export.megatron as megatron
    import packtool.export.parquet as parquet

    monkeypatch.setattr(megatron, "CHUNK", 7)
    monkeypatch.setattr(megatron, "TOKEN_CHUNK", 50)
    monkeypatch.setattr(llmc, "TOKEN_CHUNK", 37)
    monkeypatch.setattr(mds, "GROUP", 5)
    monkeypatch.setattr(parquet, "ROWS_PER_GROUP", 5)


def write_tokens(prefix, docs, dtype="uint16", eos_id=None, vocab_size=None):
    """A token corpus written straight in the documented format (docs/FORMAT.md), for the
    vocabularies the bundled tokenizer cannot make (uint32 ids) and exact EOS layouts."""
    prefix = str(prefix)
    toks = np.concatenate([np.asarray(d, dtype=dtype) for d in docs])
    ends = np.cumsum([len(d) for d in docs]).astype("<i8")
    toks.astype(np.dtype(dtype).newbyteorder("<")).tofile(prefix + ".bin")
    ends.tofile(prefix + ".boundaries")
    meta = {
        "format": "packtool.tokens", "version": 1, "dtype": dtype,
        "vocab_size": vocab_size or (70_000 if dtype == "uint32" else 2048),
        "n_docs": len(docs), "n_tokens": int(len(toks)), "n_empty": sum(len(d) == 0 for d in docs),
        "tokenizer": {"path": "synthetic", "sha256": "0" * 64}, "bos_id": None,
        "eos_id": eos_id, "inputs": [], "mask": False, "n_trained_tokens": int(len(toks)),
        "options": {}, "checksums": {k: {"sha256": sha256_file(prefix + "." + k)}
                                     for k in ("bin", "boundaries")},
    }
    with open(prefix + ".json", "w") as f:
        json.dump(meta, f)
    return prefix


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, docs):
    d = tmp_path_factory.mktemp("corpus")
    p = write_jsonl(d / "c.jsonl", [{"text": t} for t in docs])
    tokenize_files([str(p)], TOKENIZER, d / "c", TokenizeOptions())
    return packtool.open_tokens(d / "c")


def packed_in(directory, prefix, layout: str):
    out = directory / f"p-{layout}"
    if not out.exists():
        pack_corpus([prefix], out, 96, "bfd", shard_size=1500, layout=layout)
    ds = open_packed(out)
    assert len(ds.index["shards"]) > 1 and ds.layout == layout
    return ds


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("packed")


@pytest.fixture(scope="module")
def packed(packed_dir, corpus):
    return packed_in(packed_dir, corpus.prefix, "index")


@pytest.fixture(scope="module")
def packed_tokens(packed_dir, corpus):
    """The tokens layout: the exports read the shards' own tokens."""
    return packed_in(packed_dir, corpus.prefix, "tokens")


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("sft")
    rows = [{"q": "Tell me a story " * (i % 7 + 1), "a": " Once upon a time" * (i % 5 + 1)}
            for i in range(60)]
    p = write_jsonl(d / "pc.jsonl", rows)
    tokenize_files([str(p)], TOKENIZER, d / "pc",
                   TokenizeOptions(prompt_field="q", completion_field="a"))
    return d


@pytest.fixture(scope="module")
def sft_packed(sft_dir):
    ds = packed_in(sft_dir, sft_dir / "pc", "index")
    assert ds.index["loss_mask"]
    return ds


@pytest.fixture(scope="module")
def sft_packed_tokens(sft_dir):
    """The tokens layout of an SFT corpus: its loss mask folded into the token words."""
    ds = packed_in(sft_dir, sft_dir / "pc", "tokens")
    assert ds.index["loss_mask"] and ds.index["mask_storage"] == "folded"
    return ds


def segments(ex):
    cu = ex["cu_seqlens"]
    return [ex["input_ids"][a:b].tolist() for a, b in zip(cu[:-1], cu[1:], strict=False)]


# ---------------------------------------------------------------- megatron


def megatron_dataset(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(str(prefix))


@pytest.mark.slow
def test_megatron_corpus_hardlinks_bin_and_reads_back(tmp_path, corpus):
    r = run(corpus.prefix, "--format", "megatron", "--out", tmp_path / "m" / "corpus", "--json")
    assert r.exit_code == 0, r.output  # the missing folder m/ is created
    res = json.loads(r.stdout)
    assert res["details"]["bin"] == "hardlink" and "hard-linked" in res["notes"][0]
    out_bin = tmp_path / "m" / "corpus.bin"
    assert os.stat(out_bin).st_ino == os.stat(f"{corpus.prefix}.bin").st_ino
    r = run(corpus.prefix, "--format", "megatron", "--out", tmp_path / "m" / "corpus", "-q",
            "--overwrite")  # replacing a link to the same file leaves no temporary behind
    assert r.exit_code == 0 and sorted(os.listdir(tmp_path / "m")) == [
        ".corpus.export.json", "corpus.bin", "corpus.idx"]
    mds = megatron_dataset(tmp_path / "m" / "corpus")
    assert len(mds) == len(corpus) and mds.index.dtype == np.uint16
    assert mds.document_indices.tolist() == list(range(len(corpus) + 1))
    for i in range(len(corpus)):
        got = mds[i]
        assert got.dtype == np.uint16 and got.tolist() == corpus[i].tolist()
    assert mds.sequence_lengths.tolist() == corpus.lengths.tolist()


def test_megatron_corpus_without_eos_is_noted(tmp_path, corpus):
    """docs/EXPORT.md: Megatron's reset flags need an end token; a corpus tokenized without
    --eos went through export without a word. One note says so; with --eos, none."""
    r = run(corpus.prefix, "--format", "megatron", "--out", tmp_path / "a", "-q", "--json")
    assert r.exit_code == 0, r.output
    (note,) = [n for n in json.loads(r.stdout)["notes"] if "--eos" in n]
    assert f"{corpus.prefix} was tokenized without --eos" in note
    assert "--reset-attention-mask" in note and "\n" not in note
    r = run(corpus.prefix, "--format", "megatron", "--out", tmp_path / "b")
    assert r.exit_code == 0 and f"note: {note}" in r.stdout
    with_eos = write_tokens(tmp_path / "e", [[1, 2, 9], [3, 9]], eos_id=9)
    r = run(with_eos, "--format", "megatron", "--out", tmp_path / "c", "--json")
    assert r.exit_code == 0 and not [n for n in json.loads(r.stdout)["notes"] if "--eos" in n]


def test_megatron_corpus_copy_and_cross_filesystem_fallback(tmp_path, corpus, monkeypatch):
    res = export(corpus.prefix, "megatron", tmp_path / "a", link=False)
    assert res.details["bin"] == "copy" and "not requested" in res.notes[0]
    assert os.stat(tmp_path / "a.bin").st_ino != os.stat(f"{corpus.prefix}.bin").st_ino
    assert (tmp_path / "a.bin").read_bytes() == Path(f"{corpus.prefix}.bin").read_bytes()

    def no_link(src, dst):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    res = export(corpus.prefix, "megatron", tmp_path / "b")
    assert res.details["bin"] == "copy" and "Invalid cross-device link" in res.notes[0]
    assert res.bytes_written > corpus.n_tokens * 2
    mds = megatron_dataset(tmp_path / "b")
    assert [mds[i].tolist() for i in range(len(mds))] == [corpus[i].tolist()
                                                          for i in range(len(corpus))]


def test_megatron_uint32_corpus_as_int32(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 70_000, int(n)) for n in rng.integers(0, 50, 40)]
    prefix = write_tokens(tmp_path / "big", docs, "uint32")
    res = export(prefix, "megatron", tmp_path / "m")
    assert res.details == {**res.details, "dtype": "int32", "bin": "hardlink"}
    mds = megatron_dataset(tmp_path / "m")
    assert mds.index.dtype == np.int32
    assert [mds[i].tolist() for i in range(len(mds))] == [d.tolist() for d in docs]
    pack_corpus([prefix], tmp_path / "p", 64, "bfd", shard_size=300)
    ds = open_packed(tmp_path / "p")
    export(ds.directory, "megatron", tmp_path / "mp")
    mp = megatron_dataset(tmp_path / "mp")
    assert mp.index.dtype == np.int32
    idx = mp.document_indices
    assert [[mp[s].tolist() for s in range(idx[p], idx[p + 1])] for p in range(len(ds))] == [
        segments(ds[p]) for p in range(len(ds))]


@pytest.mark.parametrize("which", ["packed", "sft_packed", "packed_tokens", "sft_packed_tokens"])
def test_megatron_packed_segments_and_packs(tmp_path, which, request):
    ds = request.getfixturevalue(which)
    res = export(ds.directory, "megatron", tmp_path / "m")
    assert res.details["n_documents"] == len(ds)
    assert any("loss mask" in n for n in res.notes) == bool(ds.index["loss_mask"])
    mds = megatron_dataset(tmp_path / "m")
    idx = mds.document_indices
    assert len(idx) == len(ds) + 1 and len(mds) == ds.index["n_segments"]
    for p in range(len(ds)):
        ex = ds[p]
        got = [mds[s].tolist() for s in range(idx[p], idx[p + 1])]
        assert got == segments(ex)


# ---------------------------------------------------------------- llm.c


def read_llmc(directory):
    """Independent reader: llm.c's GPT-2 shard = 256 little-endian int32 (magic 20240520,
    version 1, token count), then uint16 tokens. Returns the token stream and shard sizes."""
    stream, sizes = [], []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".bin"):
            continue
        raw = (Path(directory) / name).read_bytes()
        magic, version, n = struct.unpack("<3i", raw[:12])
        assert (magic, version) == (20240520, 1)
        assert raw[12:1024] == bytes(1012)
        assert len(raw) == 1024 + 2 * n
        stream.extend(struct.unpack(f"<{n}H", raw[1024:]))
        sizes.append(n)
    return stream, sizes


def test_llmc_inserts_eos_before_each_document_and_shards(tmp_path, corpus):
    r = run(corpus.prefix, "--format", "llmc", "--out", tmp_path / "l", "-q")
    assert r.exit_code == 1 and "--eos-id" in r.output and not (tmp_path / "l").exists()
    r = run(corpus.prefix, "--format", "llmc", "--out", tmp_path / "l", "--eos-id", 2,
            "--shard-tokens", 700, "--json", "-q")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    stream, sizes = read_llmc(tmp_path / "l")
    want = [t for i in range(len(corpus)) for t in [2, *corpus[i].tolist()]]
    assert stream == want
    assert sizes[:-1] == [700] * (len(sizes) - 1) and 0 < sizes[-1] <= 700 and len(sizes) > 2
    assert res["details"]["n_shards"] == len(sizes) == len(res["files"])
    assert res["bytes_written"] == sum(os.path.getsize(p) for p in
                                       (tmp_path / "l").iterdir())
    # documents split on the EOS give back the corpus, the empty one included
    docs = []
    for t in stream:
        if t == 2:
            docs.append([])
        else:
            docs[-1].append(t)
    assert docs == [corpus[i].tolist() for i in range(len(corpus))]


def test_llmc_corpus_that_already_ends_with_eos(tmp_path):
    docs = [[5, 6, 7, 1], [8, 1], [1], [9, 9, 9, 9, 1]]
    prefix = write_tokens(tmp_path / "e", docs, eos_id=1)
    res = export(prefix, "llmc", tmp_path / "l", shard_tokens=3)
    assert not res.details["eos_inserted"]
    stream, sizes = read_llmc(tmp_path / "l")
    assert stream == [t for d in docs for t in d] and sizes == [3, 3, 3, 3]
    with pytest.raises(packtool.PacktoolError, match="already end with EOS id 1"):
        export(prefix, "llmc", tmp_path / "l2", eos_id=7)


def test_llmc_refuses_uint32_vocabulary(tmp_path):
    prefix = write_tokens(tmp_path / "big", [[70_000, 3], [4]], "uint32")
    r = run(prefix, "--format", "llmc", "--out", tmp_path / "l", "--eos-id", 0)
    assert r.exit_code == 1 and "uint32" in r.output and "uint16" in r.output
    assert "--format megatron" in r.output and not (tmp_path / "l").exists()
    assert os.listdir(tmp_path) == [p for p in os.listdir(tmp_path) if p.startswith("big")]


# ---------------------------------------------------------------- MosaicML Streaming


@pytest.mark.parametrize("which", ["packed", "sft_packed", "packed_tokens", "sft_packed_tokens"])
def test_mds_reads_back_with_streaming_dataset(tmp_path, which, request):
    ds = request.getfixturevalue(which)
    r = run(ds.directory, "--format", "mds", "--out", tmp_path / "mds", "-q")
    assert r.exit_code == 0, r.output
    from packtool.export.mds import import_streaming

    streaming = import_streaming()
    sd = streaming.StreamingDataset(local=str(tmp_path / "mds"), shuffle=False, batch_size=1)
    assert len(sd) == len(ds)
    has_mask = bool(ds.index["loss_mask"])
    for i in range(len(ds)):
        got, ex = sd[i], ds[i]
        assert set(got) == {"input_ids", "position_ids", "cu_seqlens", "labels"} | (
            {"loss_mask"} if has_mask else set())
        for k in ("input_ids", "position_ids", "cu_seqlens", "labels"):
            assert got[k].dtype == np.int32 and got[k].tolist() == ex[k].tolist(), (i, k)
        if has_mask:  # the mask as the reader unfolds it, whatever its storage
            k, j = ds.locate(i)
            mask = ds.read_range(k, j, j + 1)["mask"]
            assert got["loss_mask"].dtype == np.uint8
            assert got["loss_mask"].tolist() == mask.tolist()


def test_mds_torchvision_stand_in_is_gone_after_the_import():
    """The stand-in torchvision lives only for ``import streaming``: left in sys.modules it
    made transformers think torchvision was there, and its image processors (Qwen-VL's, the
    ImageCollator's) then failed importing ``InterpolationMode`` from it, in the same process
    as an mds export."""
    pytest.importorskip("transformers")
    code = ("import sys\n"
            "from packtool.export.mds import import_streaming\n"
            "import_streaming()\n"
            "assert not [n for n, m in sys.modules.items() if getattr(m, '__stand_in__', 0)]\n"
            "import transformers.image_utils\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(packtool.__file__).parents[1])})
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("which", ["packed", "sft_packed"])
def test_mds_batches_through_streaming_dataloader(tmp_path, which, request):
    """StreamingDataLoader with the named collator: each batch is the packs' one varlen row,
    equal to collate_tensors of the same packs read by packtool."""
    torch = pytest.importorskip("torch")
    from packtool.export.mds import import_streaming
    from packtool.torch import collate_mds, collate_tensors

    ds = request.getfixturevalue(which)
    assert run(ds.directory, "--format", "mds", "--out", tmp_path / "mds", "-q").exit_code == 0
    streaming = import_streaming()
    sd = streaming.StreamingDataset(local=str(tmp_path / "mds"), shuffle=False, batch_size=3)
    loader = streaming.StreamingDataLoader(sd, batch_size=3, collate_fn=collate_mds)
    seen = 0
    for batch in loader:
        idx = range(seen, min(seen + 3, len(ds)))
        want = collate_tensors([{k: torch.from_numpy(np.asarray(v)) for k, v in ds[i].items()}
                                for i in idx])
        assert set(batch) == set(want)
        for k, v in want.items():
            assert (batch[k].equal(v) if torch.is_tensor(v) else batch[k] == v), k
        seen += len(idx)
    assert seen == len(ds)
    with pytest.raises(PacktoolError, match="lacks cu_seqlens"):
        collate_mds([{"input_ids": np.zeros(3), "labels": np.zeros(3),
                      "position_ids": np.zeros(3)}])


# ---------------------------------------------------------------- Parquet


def check_bridge_row(i, input_ids, loss_mask, seq_start_id):
    """Megatron-Bridge's GPTSFTPackedParquetDataset.validate_row invariants."""
    assert len(loss_mask) == len(input_ids), i
    assert seq_start_id and seq_start_id[0] == 0, i
    assert all(s < len(input_ids) for s in seq_start_id), i
    assert all(a <= b for a, b in zip(seq_start_id, seq_start_id[1:], strict=False)), i


@pytest.mark.parametrize("which,out", [
    ("packed", "x.idx.parquet"), ("packed", "xdir"), ("sft_packed", "x.idx.parquet"),
    ("sft_packed", "xdir"), ("packed_tokens", "xdir"), ("sft_packed_tokens", "x.idx.parquet")])
def test_parquet_packed_megatron_bridge_layout(tmp_path, which, out, request):
    ds = request.getfixturevalue(which)
    r = run(ds.directory, "--format", "parquet-packed", "--out", tmp_path / out, "-q")
    assert r.exit_code == 0, r.output
    path = tmp_path / out
    files = [path] if path.is_file() else sorted(path.glob("*.parquet"))
    assert all(f.name.endswith(".idx.parquet") for f in files)
    schema = pq.read_schema(files[0])
    assert schema.field("input_ids").type == pa.list_(pa.int32())
    assert schema.field("loss_mask").type == pa.list_(pa.uint8())
    assert schema.field("seq_start_id").type == pa.list_(pa.int32())
    assert pq.ParquetFile(files[0]).metadata.row_group(0).column(0).compression == "ZSTD"
    rows = [row for f in files for row in pq.read_table(f).to_pylist()]
    assert len(rows) == len(ds)
    assert pq.read_table(path).num_rows == len(ds)  # a directory reads whole: marker skipped
    for i, row in enumerate(rows):
        ex = ds[i]
        check_bridge_row(i, row["input_ids"], row["loss_mask"], row["seq_start_id"])
        assert row["input_ids"] == ex["input_ids"].tolist()
        assert row["seq_start_id"] == ex["cu_seqlens"][:-1].tolist()
        assert row["loss_mask"] == (ex["labels"] != IGNORE_INDEX).astype(int).tolist()
    datasets = pytest.importorskip("datasets")
    data_files = [str(f) for f in files]
    hf = datasets.load_dataset("parquet", data_files=data_files, split="train")
    assert hf[len(ds) - 1]["input_ids"] == ds[len(ds) - 1]["input_ids"].tolist()


def test_a_glob_over_a_parquet_export_reads_the_shards_alone(tmp_path, packed):
    """Issue 18.6: ``load_dataset("parquet", data_files="DIR/*")`` read packtool's marker
    as a shard and failed; the marker is hidden now, and a glob does not pick it up."""
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "pq"
    assert run(packed.directory, "--format", "parquet", "--out", out, "-q").exit_code == 0
    assert (out / MARKER).is_file() and MARKER.startswith(".")
    hf = datasets.load_dataset("parquet", data_files=f"{out}/*", split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == len(packed)
    assert hf[0]["input_ids"] == packed[0]["input_ids"].tolist()


def test_an_export_marked_under_the_old_name_is_still_ours(tmp_path, corpus):
    """An export written before the marker was renamed (_packtool-export.json) is replaced
    by --overwrite, leaving only the new marker; the old name beside the user's file is
    still refused."""
    from packtool.export.marker import OLD_MARKER

    out = tmp_path / "o"
    args = (corpus.prefix, "--format", "llmc", "--eos-id", 2, "--out", out, "-q")
    assert run(*args).exit_code == 0
    (out / MARKER).rename(out / OLD_MARKER)
    assert run(*args, "--overwrite").exit_code == 0
    assert (out / MARKER).is_file() and not (out / OLD_MARKER).exists()
    (out / MARKER).rename(out / OLD_MARKER)
    (out / "notes.txt").write_text("mine")
    r = run(*args, "--overwrite")
    assert r.exit_code == 1 and "notes.txt" in r.output
    assert (out / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- rules every export keeps


def test_source_kind_mismatches_name_the_fix(tmp_path, corpus, packed):
    r = run(corpus.prefix, "--format", "mds", "--out", tmp_path / "o")
    assert r.exit_code == 1 and "packtool pack" in r.output
    r = run(packed.directory, "--format", "llmc", "--out", tmp_path / "o")
    assert r.exit_code == 1 and "token corpus it was packed from" in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("fmt", ["llmc", "mds", "parquet", "parquet-packed", "megatron"])
def test_overwrite_and_self_overwrite(tmp_path, fmt, corpus, packed):
    src = corpus.prefix if fmt == "llmc" else packed.directory
    out = tmp_path / "o"
    extra = ["--eos-id", 2] if fmt == "llmc" else []
    assert run(src, "--format", fmt, "--out", out, "-q", *extra).exit_code == 0
    r = run(src, "--format", fmt, "--out", out, "-q", *extra)
    assert r.exit_code == 1 and "--overwrite" in r.output
    r = run(src, "--format", fmt, "--out", out, "-q", "--overwrite", *extra)
    assert r.exit_code == 0, r.output
    if out.is_dir():
        assert json.loads((out / MARKER).read_text())["export_format"] == fmt
    src = corpus.prefix if fmt in ("llmc", "megatron") else packed.directory
    r = run(src, "--format", fmt, "--out", src, "-q", "--overwrite", *extra)
    assert r.exit_code == 1 and "would replace the source" in r.output


@pytest.mark.parametrize("fmt", ["parquet", "mds", "megatron"])
def test_an_export_inside_the_packed_dataset_it_reads_is_refused(tmp_path, corpus, fmt):
    """`export P --format parquet -o P/ex` wrote inside the dataset it read (and `verify P`
    still passed): refused by name, also from P/valid into P, and nothing is written."""
    p = tmp_path / "p"
    pack_corpus([corpus.prefix], p, 96, valid_docs=5)
    before = sorted(os.listdir(p))
    for src, out in ((p, p / "ex"), (p, p / "deep" / "ex"), (p / "valid", p / "ex")):
        r = run(src, "--format", fmt, "--out", out, "-q")
        assert r.exit_code == 1, r.output
        assert f"--out {out} is inside the packed dataset {p} it exports from" in r.output
        assert "choose an --out outside it" in r.output
    assert sorted(os.listdir(p)) == before
    assert run(p, "--format", fmt, "--out", tmp_path / "ex", "-q").exit_code == 0


def test_options_that_do_not_apply_are_refused(tmp_path, corpus, packed):
    r = run(corpus.prefix, "--format", "megatron", "--out", tmp_path / "m", "--shard-tokens", 9)
    assert r.exit_code == 1 and "--shard-tokens applies to --format llmc" in r.output
    r = run(packed.directory, "--format", "megatron", "--out", tmp_path / "m", "--copy")
    assert r.exit_code == 1 and "--copy applies to --format megatron from a token" in r.output
    r = run(packed.directory, "--format", "mds", "--out", tmp_path / "m", "--eos-id", 2)
    assert r.exit_code == 1 and "--eos-id" in r.output
    assert os.listdir(tmp_path) == []


def test_overwrite_never_deletes_a_foreign_directory(tmp_path, packed):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    r = run(packed.directory, "--format", "mds", "--out", tmp_path / "mine", "--overwrite")
    assert r.exit_code == 1 and "other files" in r.output
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_failure_midway_leaves_nothing(tmp_path, corpus, monkeypatch):
    import packtool.export.llmc as llmc

    calls = []

    def boom(toks, starts, eos, out=None):
        calls.append(1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(llmc, "_with_eos", boom)
    r = run(corpus.prefix, "--format", "llmc", "--out", tmp_path / "l", "--eos-id", 2)
    assert r.exit_code == 1 and "no space left" in r.output.lower() and calls
    assert f"for {tmp_path / 'l'}" in r.output  # the output, not a hidden temporary
    assert os.listdir(tmp_path) == []


def test_summary_and_json_agree_with_files(tmp_path, packed):
    res = export(packed.directory, "megatron", tmp_path / "m")
    assert res.bytes_written == sum(os.path.getsize(f) for f in res.files)
    assert f"{len(packed):,} packs" in res.summary()
    assert res.to_json()["n_tokens"] == packed.index["n_tokens"]
    r = run(packed.directory, "--format", "parquet", "--out", tmp_path / "p.parquet", "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["bytes_written"] == os.path.getsize(tmp_path / "p.parquet")


def test_every_format_is_documented():
    from packtool.export import FORMATS

    text = (Path(__file__).resolve().parent.parent / "docs" / "EXPORT.md").read_text()
    for fmt in FORMATS:
        assert f"| `{fmt}` |" in text and f"--format {fmt} " in text, fmt
