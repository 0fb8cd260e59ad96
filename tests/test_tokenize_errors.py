"""Every bad input: a clear message naming file/record/fix, non-zero exit, no files at PREFIX."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TOKENIZER, write_jsonl

import packtool
from packtool.cli import cli
from packtool.tokenize import TokenizeOptions, tokenize_files


def cli_tokenize(tmp_path, *args):
    result = CliRunner().invoke(
        cli,
        ["tokenize", *map(str, args), "-t", str(TOKENIZER), "--out", str(tmp_path / "out"), "-q"],
    )
    return result


def assert_fails(tmp_path, match, *args):
    result = cli_tokenize(tmp_path, *args)
    assert result.exit_code != 0, result.output
    assert match in result.output, result.output
    assert not list(tmp_path.glob("out*")), "nothing may be written at PREFIX"
    assert not list(tmp_path.glob(".out*")), "temporary files must be removed"
    return result.output


def test_missing_file(tmp_path):
    assert_fails(tmp_path, "no such file or directory", tmp_path / "nope.jsonl")


def test_unsupported_extension(tmp_path):
    (tmp_path / "a.csv").write_text("text\nhello\n")
    assert_fails(tmp_path, "unsupported file type", tmp_path / "a.csv")


def test_unreadable_file(tmp_path, monkeypatch):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    if os.geteuid() != 0:
        p.chmod(0)
    else:  # root opens every file whatever its mode: fail the open as EACCES would
        import errno

        real_open = os.open

        def deny(file, *args, **kwargs):
            if str(file) == str(p):
                raise PermissionError(errno.EACCES, "Permission denied", str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(os, "open", deny)
    assert_fails(tmp_path, "cannot open", p)



@pytest.mark.parametrize("given", ["file", "folder", "glob"])
def test_a_fifo_input_is_refused_by_name_at_once(tmp_path, given):
    """A named pipe blocks its first reader until something writes to it (a run given one
    waited for ever; one in a folder was skipped without a word), and tokenize reads an input
    more than once. Run in a process of its own with a timeout: a regression fails, not hangs."""
    from conftest import ROOT

    d = tmp_path / "in"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"text": "x"}])
    os.mkfifo(d / "b.jsonl")
    arg = {"file": d / "b.jsonl", "folder": d, "glob": d / "*.jsonl"}[given]
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "packtool", "tokenize", str(arg), "-t",
                        str(TOKENIZER), "-o", str(tmp_path / "out"), "-q"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{d / 'b.jsonl'} is a FIFO (named pipe)" in r.stderr, r.stderr
    assert "copy it to a regular file" in r.stderr
    assert time.monotonic() - t0 < 30 and not list(tmp_path.glob("*out*"))


@pytest.mark.parametrize("given", ["file", "folder"])
def test_a_device_input_is_refused_by_name(tmp_path, given):
    d = tmp_path / "in"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"text": "x"}])
    (d / "null.jsonl").symlink_to(os.devnull)  # reads as an empty file; never one to tokenize
    arg = d / "null.jsonl" if given == "file" else d
    assert_fails(tmp_path, f"{d / 'null.jsonl'} is a character device", arg)


def test_corrupt_gzip(tmp_path):
    data = gzip.compress(b'{"text": "hello"}\n' * 1000)
    (tmp_path / "a.jsonl.gz").write_bytes(data[: len(data) // 2])
    assert_fails(tmp_path, "a.jsonl.gz: corrupt or truncated jsonl.gz", tmp_path / "a.jsonl.gz")
    (tmp_path / "b.jsonl.gz").write_bytes(b"not gzip at all")
    assert_fails(tmp_path, "b.jsonl.gz: corrupt", tmp_path / "b.jsonl.gz")


def test_corrupt_zstd(tmp_path):
    import zstandard

    data = zstandard.ZstdCompressor().compress(b'{"text": "hello"}\n' * 1000)
    (tmp_path / "a.jsonl.zst").write_bytes(data[:-10])
    assert_fails(tmp_path, "a.jsonl.zst: corrupt or truncated", tmp_path / "a.jsonl.zst")


def test_corrupt_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a"] * 100}), tmp_path / "a.parquet")
    data = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "a.parquet").write_bytes(data[:40] + data[-100:])
    assert_fails(tmp_path, "a.parquet: corrupt", tmp_path / "a.parquet")


def test_invalid_json_names_file_and_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "ok"}\n\n{"text": "fine"}\n{"text": broken}\n{"text": "after"}\n')
    out = assert_fails(tmp_path, "a.jsonl line 4: invalid JSON", p)
    assert "--skip-bad-records" in out


def test_skip_bad_records_counts_them(tmp_path, tokenizer):
    p = tmp_path / "a.jsonl"
    p.write_bytes(
        b'{"text": "ok"}\n{"text": broken}\n{"body": "x"}\n{"text": 3}\n{"text": "\xff\xfe"}\n'
        b'\xff{"text": "bad utf8"}\n{"text": "last"}\n'
    )
    res = tokenize_files([str(p)], TOKENIZER, tmp_path / "out",
                         TokenizeOptions(skip_bad_records=True))
    assert res.n_docs == 2 and res.n_skipped == 5
    meta = json.loads((tmp_path / "out.json").read_text())["inputs"][0]
    assert meta["skipped_records"] == [2, 3, 4, 5, 6]
    assert meta["skipped"] == {"invalid_json": 1, "missing_field": 1, "not_a_string": 1,
                               "invalid_utf8": 2}
    c = packtool.open_tokens(tmp_path / "out")
    assert c[1].tolist() == tokenizer.encode("last", add_special_tokens=False).ids


def test_missing_field_lists_keys(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "ok"}, {"content": "x", "id": 1}])
    assert_fails(tmp_path,
                 "a.jsonl line 2: no field 'text' (keys in the record: 'content', 'id')", p)
    assert_fails(tmp_path, "keys in meta: 'title'", "--text-field", "meta.body",
                 write_jsonl(tmp_path / "b.jsonl", [{"meta": {"title": "t"}}]))


def test_non_string_field(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": ["a", "b"]}])
    assert_fails(tmp_path, "a.jsonl line 1: field 'text' is array, expected a string", p)
    p = write_jsonl(tmp_path / "b.jsonl", [{"text": None}])
    assert_fails(tmp_path, "b.jsonl line 1: field 'text' is null", p)


def test_parquet_missing_column_and_null(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a"]}), tmp_path / "a.parquet")
    assert_fails(tmp_path, "no column 'text' (columns: body)", tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["a", None]}), tmp_path / "b.parquet")
    assert_fails(tmp_path, "b.parquet row 2: 'text' is null", tmp_path / "b.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "c.parquet")
    assert_fails(tmp_path, "has type int64, expected text", tmp_path / "c.parquet")


def test_invalid_utf8(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    assert_fails(tmp_path, "a.jsonl line 2: invalid UTF-8", p)
    (tmp_path / "b.txt").write_bytes(b"line one\nline two \xc3\x28 here\n")
    out = assert_fails(tmp_path, "b.txt line 2: invalid UTF-8", tmp_path / "b.txt")
    assert "fix the file or pass --skip-bad-records" in out  # the option by its real name


def test_unreadable_tokenizer(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    (tmp_path / "tok.json").write_text('{"not": "a tokenizer"}')
    r = CliRunner().invoke(cli, ["tokenize", str(p), "-t", str(tmp_path / "tok.json"),
                                 "-o", str(tmp_path / "out")])
    assert r.exit_code == 1 and "cannot read tokenizer" in r.output
    r = CliRunner().invoke(cli, ["tokenize", str(p), "-t", str(tmp_path),
                                 "-o", str(tmp_path / "out")])
    assert r.exit_code == 1 and "holds no tokenizer.json" in r.output
    assert not list(tmp_path.glob("out*"))


def _tiny_tokenizer(kind: str):
    """Tokenizers valid as JSON but unusable (issue 18 2.11 / 4), built in-process."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = {
        "bpe-dropout": lambda: models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")],
                                          dropout=0.5),
        "bpe-empty": lambda: models.BPE(vocab={}, merges=[]),
        "wordlevel-no-unk": lambda: models.WordLevel(vocab={"a": 0, "b": 1},
                                                     unk_token="[UNK]"),
        "wordpiece-no-unk": lambda: models.WordPiece(vocab={"a": 0, "b": 1},
                                                     unk_token="[UNK]"),
    }[kind]()
    t = Tokenizer(model)
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return t


@pytest.mark.parametrize("kind,setting", [
    ("bpe-dropout", "model.dropout is 0.5"), ("bpe-empty", "model.vocab is empty"),
    ("wordlevel-no-unk", "model.unk_token '[UNK]' is not in model.vocab"),
    ("wordpiece-no-unk", "model.unk_token '[UNK]' is not in model.vocab"),
])
def test_unusable_tokenizer_is_refused_at_load(tmp_path, kind, setting):
    """BPE dropout gave different tokens on two identical runs, an empty vocabulary 0 tokens
    for every document with exit 0, and a WordLevel tokenizer whose unk_token is not in its
    vocabulary a traceback from the Rust encoder at the first unknown word."""
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "ab ab ba c"}] * 3)
    _tiny_tokenizer(kind).save(str(tmp_path / "tok.json"))
    r = CliRunner().invoke(cli, ["tokenize", str(p), "-t", str(tmp_path / "tok.json"),
                                 "-o", str(tmp_path / "out"), "-q"])
    assert r.exit_code == 1 and setting in r.output and "tok.json" in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not list(tmp_path.glob("out*"))
    # the same tokenizer without the setting is usable
    if kind == "bpe-dropout":
        data = json.loads((tmp_path / "tok.json").read_text())
        data["model"]["dropout"] = None
        (tmp_path / "tok.json").write_text(json.dumps(data))
        r = CliRunner().invoke(cli, ["tokenize", str(p), "-t", str(tmp_path / "tok.json"),
                                     "-o", str(tmp_path / "out"), "-q"])
        assert r.exit_code == 0, r.output


def test_existing_output_refused_unless_overwrite(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    assert cli_tokenize(tmp_path, p).exit_code == 0
    before = (tmp_path / "out.bin").read_bytes()
    r = cli_tokenize(tmp_path, p)
    assert r.exit_code == 1 and "already exists" in r.output and "--overwrite" in r.output
    write_jsonl(p, [{"text": "y z w"}])
    assert (tmp_path / "out.bin").read_bytes() == before
    assert cli_tokenize(tmp_path, p, "--overwrite").exit_code == 0
    assert (tmp_path / "out.bin").read_bytes() != before


def test_interruption_in_process_leaves_nothing(tmp_path, monkeypatch, docs):
    import packtool.tokenize.pipeline as tk

    real = tk.iter_documents

    def interrupted(*a, **kw):
        for i, text in enumerate(real(*a, **kw)):
            if i == 30:
                raise KeyboardInterrupt
            yield text

    monkeypatch.setattr(tk, "iter_documents", interrupted)
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in docs])
    with pytest.raises(KeyboardInterrupt):
        tokenize_files([str(p)], TOKENIZER, tmp_path / "out", TokenizeOptions(batch_size=4))
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.jsonl"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_run_leaves_nothing(tmp_path, sig):
    from synth import iter_documents

    p = tmp_path / "big.jsonl"
    with open(p, "w") as f:
        for d in iter_documents(20_000, seed=1):
            f.write(json.dumps({"text": d}) + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "packtool", "tokenize", str(p), "-t", str(TOKENIZER),
         "-o", str(tmp_path / "out"), "--batch-size", "64", "-q", "--engine", "hf"],
        stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.tmp-*/out.bin")) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)
    proc.send_signal(sig)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
    assert "no output was written" in err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["big.jsonl"]


def test_reader_detects_truncation_and_mismatch(tmp_path, docs):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in docs])
    tokenize_files([str(p)], TOKENIZER, tmp_path / "out", TokenizeOptions())
    c = packtool.open_tokens(tmp_path / "out.json")  # any of the three names works
    assert len(c) == len(docs)
    data = (tmp_path / "out.bin").read_bytes()
    (tmp_path / "out.bin").write_bytes(data[:-2])
    with pytest.raises(packtool.FormatError, match=r"out.bin has .* bytes but the manifest says"):
        packtool.open_tokens(tmp_path / "out")
    (tmp_path / "out.bin").write_bytes(data[:-2] + b"\x01\x00")
    with pytest.raises(packtool.FormatError, match="sha256"):
        packtool.open_tokens(tmp_path / "out").verify_checksums()
    (tmp_path / "out.bin").write_bytes(data)
    ends = np.fromfile(tmp_path / "out.boundaries", dtype="<i8")
    ends[-1] -= 1
    ends.tofile(tmp_path / "out.boundaries")
    with pytest.raises(packtool.FormatError, match="out.boundaries: crc32 .* does not match"):
        packtool.open_tokens(tmp_path / "out")  # the boundaries' checksum, at open
    with pytest.raises(packtool.FormatError, match="the documents end at token"):
        packtool.open_tokens(tmp_path / "out", checksums=False)  # and the structure alone
    meta = json.loads((tmp_path / "out.json").read_text())
    meta["version"] = 99
    (tmp_path / "out.json").write_text(json.dumps(meta))
    with pytest.raises(packtool.FormatError, match="version 99 is not supported"):
        packtool.open_tokens(tmp_path / "out")


def test_cli_help_version_json(tmp_path):
    runner = CliRunner()
    assert "tokenize" in runner.invoke(cli, ["--help"]).output
    assert packtool.__version__ in runner.invoke(cli, ["--version"]).output
    for name in cli.commands:
        help_text = runner.invoke(cli, [name, "--help"]).output
        assert "Example:" in help_text, f"{name} --help needs an Example: block"
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello world"}, {"text": ""}])
    r = runner.invoke(cli, ["tokenize", str(p), "-t", str(TOKENIZER), "-o", str(tmp_path / "o"),
                            "--json", "-q"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["n_docs"] == 2 and summary["n_empty"] == 1 and summary["dtype"] == "uint16"


def test_outputs_never_clobber_inputs(tmp_path):
    """--overwrite must not turn an input into an output, nor read packtool's own files."""
    p = write_jsonl(tmp_path / "keep.json", [{"text": "precious"}])
    r = CliRunner().invoke(cli, ["tokenize", str(p), "-t", str(TOKENIZER),
                                 "-o", str(tmp_path / "keep"), "--overwrite", "-q"])
    assert r.exit_code == 1 and "also an output" in r.output
    assert json.loads(p.read_text()) == {"text": "precious"}
    d = tmp_path / "data"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"text": "x"}])
    for _ in range(2):  # the second run finds corpus.json in data/ and must skip it
        r = CliRunner().invoke(cli, ["tokenize", str(d), "-t", str(TOKENIZER),
                                     "-o", str(d / "corpus"), "--overwrite", "-q", "--json"])
        assert r.exit_code == 0, r.output
        assert [i["path"].rsplit("/", 1)[1] for i in json.loads(r.stdout)["inputs"]] == ["a.jsonl"]
    r = CliRunner().invoke(cli, ["tokenize", str(d / "a.jsonl"), str(d / "." / "a.jsonl"),
                                 "-t", str(TOKENIZER), "-o", str(tmp_path / "o")])
    assert r.exit_code == 1 and "given twice" in r.output
    r = CliRunner().invoke(cli, ["tokenize", str(d / "a.jsonl"), "-t", str(TOKENIZER),
                                 "-o", str(d) + "/"])
    assert r.exit_code == 1 and "is a directory" in r.output


def test_json_array_file_and_lone_surrogate(tmp_path):
    (tmp_path / "a.json").write_text('[\n {"text": "a"},\n {"text": "b"}\n]\n')
    out = assert_fails(tmp_path, "a.json line 1: the file is a JSON array, not JSON Lines",
                       tmp_path / "a.json")
    assert "jq -c" in out
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{"text": "a\\ud800b"}\n')
    assert_fails(tmp_path, "b.jsonl line 2: field 'text' holds a lone surrogate",
                 tmp_path / "b.jsonl")


def test_write_errors_are_clean(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    r = CliRunner().invoke(cli, ["tokenize", str(p), "-t", str(TOKENIZER), "-o", str(ro / "c"),
                                 "-q"])
    ro.chmod(0o700)
    if os.geteuid() == 0:
        return  # root writes anywhere
    assert r.exit_code == 1 and "Error:" in r.output and "Traceback" not in r.output


def test_missing_output_folders_are_created(tmp_path):
    """Issue 11.14: the README's own `--out out/corpus` failed on a fresh checkout because
    out/ did not exist. Missing folders are made; a failed run removes the ones it made."""
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello world"}] * 3)
    runner = CliRunner()
    out = tmp_path / "out" / "deep" / "corpus"
    r = runner.invoke(cli, ["tokenize", str(p), "-t", str(TOKENIZER), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["pack", str(out), "-L", "16", "-o", str(tmp_path / "p" / "q"), "-q"])
    assert r.exit_code == 0 and (tmp_path / "p" / "q" / "index.json").is_file(), r.output
    r = runner.invoke(cli, ["export", str(tmp_path / "p" / "q"), "--format", "parquet", "-o",
                            str(tmp_path / "e" / "f" / "x.parquet"), "-q"])
    assert r.exit_code == 0 and (tmp_path / "e" / "f" / "x.parquet").is_file(), r.output
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"nope": 1}])
    r = runner.invoke(cli, ["tokenize", str(bad), "-t", str(TOKENIZER), "-o",
                            str(tmp_path / "new" / "dir" / "c"), "-q"])
    assert r.exit_code == 1 and not (tmp_path / "new").exists()
