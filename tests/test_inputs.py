"""Inputs at the edges: record-size limits, hostile nesting, Parquet/Arrow variants, folders
that hide files, empty compressed streams, histogram CSVs, numba's cache, progress."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TOKENIZER, corpus_docs, encode_all, write_jsonl

from packtool.cli import cli
from packtool.errors import PacktoolError
from packtool.lengths import load_histogram_csv
from packtool.sources import InputStats, ReadOptions, expand_inputs, iter_documents
from packtool.tokenize import TokenizeOptions, tokenize_files


def run_tokenize(tmp_path, *args):
    return CliRunner().invoke(
        cli, ["tokenize", *map(str, args), "-t", str(TOKENIZER), "--out", str(tmp_path / "out"),
              "-q"])


def assert_fails(tmp_path, match, *args):
    result = run_tokenize(tmp_path, *args)
    assert result.exit_code != 0, result.output
    assert match in result.output, result.output
    assert "Traceback" not in result.output
    assert not list(tmp_path.glob("out*")), "nothing may be written at PREFIX"
    return result.output


def read_all(path, **kw):
    stats = InputStats(path=str(path), kind="")
    return list(iter_documents(Path(path), ReadOptions(**kw), stats)), stats


# --- maximum record size --------------------------------------------------------------------

def test_record_over_the_limit_is_refused_or_skipped(tmp_path, tokenizer):
    big = "word " * 3000  # 15,000 characters
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "short one"}, {"text": big}, {"text": "end"}])
    out = assert_fails(tmp_path, "line 2", p, "--max-record-bytes", "10000")
    assert "10,000" in out and "--max-record-bytes" in out and "--skip-bad-records" in out
    result = run_tokenize(tmp_path, p, "--max-record-bytes", "10000", "--skip-bad-records")
    assert result.exit_code == 0, result.output
    assert corpus_docs(tmp_path / "out") == encode_all(tokenizer, ["short one", "end"])
    meta = json.loads((tmp_path / "out.json").read_text())
    assert meta["inputs"][0]["skipped"] == {"too_large": 1}
    assert meta["inputs"][0]["skipped_records"] == [2]
    assert meta["options"]["max_record_bytes"] == 10000
    # the default takes it
    result = run_tokenize(tmp_path, p, "--overwrite")
    assert result.exit_code == 0, result.output


def test_record_limit_reads_a_huge_line_in_bounded_pieces(tmp_path):
    # a single 3 MB line with a 1 MB limit: refused without json-parsing it, line counted right
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"text": "a"}\n' + b'{"text": "' + b"x" * 3_000_000 + b'"}\n{"text": "b"}\n')
    docs, stats = read_all(p, max_record_bytes=1 << 20, skip_bad_records=True)
    assert docs == ["a", "b"] and stats.skipped_records == [2]


@pytest.mark.parametrize("split", ["file", "line", "blank-line"])
def test_record_limit_txt(tmp_path, split):
    p = tmp_path / "a.txt"
    p.write_text("small\n\n" + "y" * 5000 + "\n\nlast\n")
    with pytest.raises(PacktoolError, match="5,000 bytes|5,000|over --max-record-bytes"):
        read_all(p, txt_split=split, max_record_bytes=4000)
    docs, stats = read_all(p, txt_split=split, max_record_bytes=4000, skip_bad_records=True)
    assert stats.skipped.get("too_large") == 1
    if split != "file":
        assert docs[0] == "small" and docs[-1] == "last"


def test_record_limit_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "z" * 5000, "b"]}), tmp_path / "a.parquet")
    with pytest.raises(PacktoolError, match="row 2"):
        read_all(tmp_path / "a.parquet", max_record_bytes=4000)
    docs, stats = read_all(tmp_path / "a.parquet", max_record_bytes=4000, skip_bad_records=True)
    assert docs == ["a", "b"] and stats.skipped_records == [2]


def test_record_limit_option_checked():
    with pytest.raises(PacktoolError, match="max-record-bytes"):
        tokenize_files(["x"], TOKENIZER, "o", TokenizeOptions(max_record_bytes=0))


# --- deeply nested JSON ---------------------------------------------------------------------

@pytest.mark.parametrize("parser", ["json", "orjson"])
def test_deeply_nested_json_is_a_bad_record(tmp_path, tokenizer, parser, monkeypatch):
    """A record nested past what the parser takes (the standard library's recursion limit,
    orjson's 1,024 levels; an older orjson parses it and then finds no text field) is a bad
    record: a clear error naming file and line, or skipped and counted. Which reason a parser
    version gives is its business; that the record is refused by name and counted is ours."""
    import packtool.sources.jsonl as jsonl

    if parser == "json":
        monkeypatch.setattr(jsonl, "_parse_json", lambda line: (json.loads(line), False))
    else:
        pytest.importorskip("orjson")
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "ok"}\n' + '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    out = assert_fails(tmp_path, "line 2", p)
    assert str(p) in out.replace("\n", "")
    result = run_tokenize(tmp_path, p, "--skip-bad-records")
    assert result.exit_code == 0, result.output
    assert corpus_docs(tmp_path / "out") == encode_all(tokenizer, ["ok"])
    meta = json.loads((tmp_path / "out.json").read_text())
    skipped = meta["inputs"][0]["skipped"]
    assert sum(skipped.values()) == 1, skipped
    assert set(skipped) <= {"too_deep", "invalid_json", "missing_field"}, skipped


# --- Parquet variants -----------------------------------------------------------------------

def test_parquet_invalid_utf8_in_string_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    col = pa.array([b"fine", b"bad \xff byte", b"also fine"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": col}), tmp_path / "a.parquet")
    assert_fails(tmp_path, "a.parquet row 2: invalid UTF-8", tmp_path / "a.parquet")
    docs, stats = read_all(tmp_path / "a.parquet", skip_bad_records=True)
    assert docs == ["fine", "also fine"] and stats.skipped == {"invalid_utf8": 1}


def test_parquet_dictionary_and_string_view_columns(tmp_path, tokenizer):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = ["one", "two", "one", "", "three"]
    dict_col = pa.array(texts).dictionary_encode()
    pq.write_table(pa.table({"text": dict_col}), tmp_path / "d.parquet", use_dictionary=True)
    assert pq.read_schema(tmp_path / "d.parquet").field("text").type == dict_col.type
    assert read_all(tmp_path / "d.parquet")[0] == texts
    view = pa.array(texts, pa.string_view())
    pq.write_table(pa.table({"text": view}), tmp_path / "v.parquet")
    assert read_all(tmp_path / "v.parquet")[0] == texts
    large = pa.array(texts, pa.large_string()).dictionary_encode()
    pq.write_table(pa.table({"text": large}), tmp_path / "l.parquet")
    assert read_all(tmp_path / "l.parquet")[0] == texts


def test_parquet_wrong_type_does_not_suggest_text_field(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "c.parquet")
    out = assert_fails(tmp_path, "has type int64", tmp_path / "c.parquet")
    assert "--text-field" not in out and "convert" in out


# --- Arrow files and datasets.save_to_disk folders -------------------------------------------

def test_datasets_save_to_disk_folder(tmp_path, tokenizer):
    datasets = pytest.importorskip("datasets")
    texts = [f"document number {i} " * (i % 7 + 1) for i in range(300)]
    d = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": texts, "id": list(range(300))}).save_to_disk(
        str(d), num_shards=2)
    assert (d / "dataset_info.json").is_file() and (d / "state.json").is_file()
    paths = expand_inputs([str(d)])
    assert [p.name for p in paths] == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    result = run_tokenize(tmp_path, d)
    assert result.exit_code == 0, result.output
    assert corpus_docs(tmp_path / "out") == encode_all(tokenizer, texts)
    assert expand_inputs([str(d / "*")]) == paths  # a glob skips the metadata too


def test_arrow_file_format_and_stream(tmp_path, tokenizer):
    pa = pytest.importorskip("pyarrow")
    texts = ["alpha", "beta gamma", "", "delta"]
    table = pa.table({"text": texts})
    for name, new, chunk in (("f.arrow", pa.ipc.new_file, 2), ("s.arrow", pa.ipc.new_stream, 3)):
        with pa.OSFile(str(tmp_path / name), "wb") as sink, new(sink, table.schema) as w:
            w.write_table(table, max_chunksize=chunk)
    assert read_all(tmp_path / "f.arrow")[0] == texts
    assert read_all(tmp_path / "s.arrow")[0] == texts
    (tmp_path / "bad.arrow").write_bytes(b"not arrow at all")
    assert_fails(tmp_path, "bad.arrow: corrupt", tmp_path / "bad.arrow")


# --- folders, empty streams -----------------------------------------------------------------

def test_unreadable_subfolder_is_an_error(tmp_path, monkeypatch):
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    write_jsonl(root / "a.jsonl", [{"text": "a"}])
    write_jsonl(root / "sub" / "b.jsonl", [{"text": "b"}])
    real_scandir = os.scandir

    def scandir(path="."):
        if Path(path) == root / "sub":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PacktoolError, match="sub.*Permission denied"):
        expand_inputs([str(root)])


def test_unreadable_subfolder_real_chmod(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads every folder whatever its mode; the monkeypatched test covers it")
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    write_jsonl(root / "a.jsonl", [{"text": "a"}])
    write_jsonl(root / "sub" / "b.jsonl", [{"text": "b"}])
    (root / "sub").chmod(0)
    try:
        assert_fails(tmp_path, "sub", root)
    finally:
        (root / "sub").chmod(0o755)


@pytest.mark.parametrize("name", ["a.jsonl.gz", "a.jsonl.zst"])
def test_zero_byte_compressed_file(tmp_path, name):
    (tmp_path / name).write_bytes(b"")
    assert_fails(tmp_path, f"{name}: 0 bytes", tmp_path / name)
    (tmp_path / "e.jsonl").write_bytes(b"")  # plain JSONL: an empty file is an empty corpus
    assert read_all(tmp_path / "e.jsonl")[0] == []


def test_empty_but_valid_gzip_is_fine(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b""))
    assert read_all(tmp_path / "a.jsonl.gz")[0] == []


# --- histogram CSVs -------------------------------------------------------------------------

def test_headerless_histogram_keeps_first_row(tmp_path):
    (tmp_path / "h.csv").write_text("5,2\n7,1\n")
    assert load_histogram_csv(tmp_path / "h.csv").tolist() == [5, 5, 7]
    (tmp_path / "g.csv").write_text("length,count\n5,2\n7,1\n")
    assert load_histogram_csv(tmp_path / "g.csv").tolist() == [5, 5, 7]


def test_histogram_count_checked_before_allocating(tmp_path):
    (tmp_path / "h.csv").write_text("length,count\n5,1000000000000\n")
    with pytest.raises(PacktoolError, match="1,000,000,000,000 documents"):
        load_histogram_csv(tmp_path / "h.csv")
    result = CliRunner().invoke(cli, ["stats", "--lengths", str(tmp_path / "h.csv"), "-L", "64"])
    assert result.exit_code != 0 and "limit" in result.output and "Traceback" not in result.output


# --- numba's cache --------------------------------------------------------------------------

def test_numba_cache_falls_back_when_no_location_is_writable(tmp_path):
    # Every numba cache locator refuses (as for an unprivileged user with a read-only install
    # and $HOME): packtool must import and run, uncached. Made root-proof by failing the
    # locators' own writability probe.
    code = (
        "import numba.core.caching as c\n"
        "def refuse(self): raise PermissionError(13, 'Permission denied', 'cache')\n"
        "c._CacheLocator.ensure_cache_path = refuse\n"
        "import numpy as np\n"
        "from packtool import _numba\n"
        "from packtool.packers import PACKERS\n"
        "from packtool.cli import cli\n"
        "f = _numba.njit(lambda x: x + 1)\n"
        "print(f(41), _numba.CACHE)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
           "NUMBA_CACHE_DIR": str(tmp_path / "nocache")}
    env.pop("PACKTOOL_NUMBA_CACHE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["42", "False"]


# --- progress -------------------------------------------------------------------------------

def test_progress_advances_per_record_and_sums_to_file_size(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = ["x" * (1000 * (i + 1)) for i in range(20)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet")
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    for name in ("a.parquet", "a.jsonl"):
        path = tmp_path / name
        steps = []
        stats = InputStats(path=str(path), kind="")
        seen = []
        for _ in iter_documents(path, ReadOptions(), stats, steps.append):
            seen.append(len(steps))
        assert len(set(seen)) == len(texts), f"{name}: progress must move with every record"
        assert sum(steps) == pytest.approx(path.stat().st_size)


# --- SentencePiece models -------------------------------------------------------------------

def test_a_corrupt_sentencepiece_model_is_refused(tmp_path):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.model").write_bytes(b"\x0a\x05hello")  # a protobuf, not JSON
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    result = CliRunner().invoke(cli, ["tokenize", str(tmp_path / "a.jsonl"), "-t",
                                      str(tmp_path / "tok"), "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code != 0
    assert "SentencePiece" in result.output and "tokenizer.json" in result.output
    assert "Traceback" not in result.output


# --- very long documents --------------------------------------------------------------------

def test_long_record_warns_with_the_memory_figure(tmp_path, tokenizer, capsys):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "word " * 300_000}])  # 1.5 MB
    tokenize_files([str(p)], TOKENIZER, tmp_path / "out",
                   TokenizeOptions(long_record_warn_bytes=1 << 20))
    err = capsys.readouterr().err
    assert "a.jsonl line 1" in err and "1.5 MB" in err and "memory" in err
    expect = encode_all(tokenizer, ["word " * 300_000])[0]
    assert np.array_equal(corpus_docs(tmp_path / "out")[0], expect)


def test_tokenize_bar_moves_with_each_batch(tmp_path, monkeypatch):

    seen = []

    class Bar:
        n = 0

        def update(self, k):
            self.n += k
            seen.append(self.n)

        def set_postfix_str(self, *a, **k):
            pass

        def close(self):
            pass

    import packtool.executors as executors  # the executor makes the one bar over every job

    monkeypatch.setattr(executors, "progress_bar", lambda *args, **kwargs: Bar())
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "word " * (200 * (i + 1))} for i in range(30)])
    tokenize_files([str(p)], TOKENIZER, tmp_path / "out", TokenizeOptions(batch_size=1, workers=1),
                   progress=True)
    assert len(set(seen)) == 30, "the bar must advance with every batch written"
    assert seen == sorted(seen) and seen[-1] == p.stat().st_size


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst", "skipped tail"])
def test_the_hash_taken_while_reading_is_the_files_crc32(tmp_path, kind, monkeypatch):
    """The JSONL reader hashes a local input as it reads it instead of reading it again: what
    it records must be the crc32 of every byte of the file (a gzip member's trailing zero
    padding, a record skipped for its size included), the hash a resume recomputes, so an
    unchanged input's part is skipped and an edited one redone."""
    import zlib

    import zstandard

    lines = b"".join(json.dumps({"text": f"document {i} " * (i % 7)}).encode() + b"\n"
                     for i in range(3000))
    if kind == "skipped tail":
        lines += json.dumps({"text": "x" * 5000}).encode() + b"\n"
    data = {"jsonl.gz": lambda b: gzip.compress(b) + bytes(512),
            "jsonl.zst": lambda b: zstandard.ZstdCompressor().compress(b)}.get(kind, bytes)(lines)
    path = tmp_path / ("in." + ("jsonl" if kind == "skipped tail" else kind))
    path.write_bytes(data)
    out = tmp_path / "c"
    opts = TokenizeOptions(max_record_bytes=4096, skip_bad_records=kind == "skipped tail")
    with monkeypatch.context() as m:  # read once: never again to hash it
        m.setattr("packtool._io.crc32_file", lambda p: pytest.fail(f"{p} read again"))
        tokenize_files([str(path)], TOKENIZER, out, opts)
    entry = json.loads(out.with_suffix(".json").read_text())["parts"][0]["inputs"][0]
    assert entry["content"] == {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}
    again = tokenize_files([str(path)], TOKENIZER, out,
                           TokenizeOptions(**{**opts.__dict__, "overwrite": True}))
    assert again.n_parts_skipped == 1


# --------------------------------------------- a folder that is more than a corpus (item 3)
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "spm.model"])
def test_a_tokenizer_file_in_an_input_folder_is_refused_by_name(tmp_path, name):
    """`tokenize data/ -t data/tokenizer.json` read the tokenizer as JSONL and suggested
    --skip-bad-records: a model's files in an input folder are refused before anything runs,
    named, with both ways out; the --tokenizer itself is refused even when listed."""
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", [{"text": "hello"}])
    (data / name).write_bytes(Path(TOKENIZER).read_bytes())
    out = assert_fails(tmp_path, f"{data / name} is a tokenizer file, not a corpus", data)
    assert "move it out of that folder, or list the input files instead" in out
    assert "--skip-bad-records" not in out
    if name == "tokenizer.json":  # the same through a glob, and the --tokenizer listed
        assert_fails(tmp_path, "is a tokenizer file", f"{data}/*")
        r = CliRunner().invoke(cli, ["tokenize", str(data / "a.jsonl"), str(data / name), "-t",
                                     str(data / name), "-o", str(tmp_path / "out"), "-q"])
        assert r.exit_code == 1 and f"{data / name} is the --tokenizer itself" in r.output
    (data / name).unlink()
    assert run_tokenize(tmp_path, data).exit_code == 0


def test_copies_of_one_corpus_in_a_folder_are_refused_unless_listed(tmp_path):
    """a.jsonl, a.jsonl.gz and a.parquet in one folder were all tokenized, the corpus three
    times over: refused by name; listed one by one they are taken as asked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", [{"text": "hello"}])
    write_jsonl(data / "a.jsonl.gz", [{"text": "hello"}], compress="gz")
    pq.write_table(pa.table({"text": ["hello"]}), data / "a.parquet")
    write_jsonl(data / "b.jsonl", [{"text": "world"}])
    out = assert_fails(tmp_path, "a.jsonl, a.jsonl.gz and a.parquet in", data)
    assert "look like copies of one corpus" in out and "pass the one you mean" in out
    assert "b.jsonl" not in out
    assert_fails(tmp_path, "look like copies of one corpus", f"{data}/a.*")
    assert run_tokenize(tmp_path, data / "a.jsonl", data / "a.parquet").exit_code == 0
