"""``file://`` URLs name local paths, wherever a path comes in: the inputs, --tokenizer and
--out of tokenize, the sources and --out of pack, verify and its --source, export, and the
readers. Before, ``-o file:///abs/out`` wrote ``./file:/abs/out`` under the current folder
and exited 0, and an input ``file:///abs/in.jsonl`` was "no such file"."""

from __future__ import annotations

import pytest
from conftest import CORPUS, TOKENIZER
from conftest import packtool_process as cli

from packtool import open_packed, open_tokens
from packtool.errors import PacktoolError


def url(path, host: str = "") -> str:
    return f"file://{host}{path.as_posix().replace(' ', '%20')}"


def test_every_command_reads_and_writes_file_urls(tmp_path):
    out = tmp_path / "out dir"  # a space: %20 in the URL
    here = tmp_path / "cwd"
    here.mkdir()
    inputs = sorted(CORPUS.iterdir())[:2]
    cli("tokenize", *map(url, inputs), "-t", url(TOKENIZER), "--eos", "<|eos|>",
        "-o", url(out / "c"), "-q", cwd=here)
    cli("pack", url(out / "c", "localhost"), "-L", 128, "-o", url(out / "p"), "-q", cwd=here)
    r = cli("verify", url(out / "p"), "--source", url(out / "c"), cwd=here)
    assert "every source token accounted for" in r.stdout
    cli("export", url(out / "p"), "--format", "parquet", "-o", url(out / "p.parquet"), "-q",
        cwd=here)
    assert not list(here.iterdir())  # nothing under ./file:
    assert (out / "c.json").is_file() and (out / "p" / "index.json").is_file()
    assert (out / "p.parquet").exists()

    ds, corpus = open_packed(url(out / "p")), open_tokens(url(out / "c", "localhost"))
    assert len(ds) and len(corpus) and ds.directory == out / "p"


def test_a_file_url_of_another_host_is_refused_by_name(tmp_path):
    r = cli("pack", f"file://server{tmp_path}/c", "-L", 128, "-o", tmp_path / "p",
            check=False, cwd=tmp_path)
    assert r.returncode == 1 and "'server'" in r.stderr and "file:///" in r.stderr
    assert not list(tmp_path.iterdir())
    from packtool.storage import local_path

    with pytest.raises(PacktoolError, match="'server'"):
        open_tokens("file://server/data/c")
    assert local_path("file:///a%20b/c") == "/a b/c"
    assert local_path("file://localhost/a") == "/a"
    assert local_path("s3://b/c") == "s3://b/c"


@pytest.mark.parametrize("where", ["s3://bkt", "s3://bkt/", "gs://bkt"])
def test_a_bucket_without_a_name_in_it_is_refused_by_name(tmp_path, where):
    """``-o s3://bkt`` said "no filesystem for s3::// (Protocol not known: s3:)": a corpus
    prefix or an output is a name inside a bucket, and the message says so (nothing is
    asked of the store, so no backend or network is needed)."""
    from conftest import run

    for args in (("tokenize", CORPUS / "part-0.jsonl", "-t", TOKENIZER, "-o", where),
                 ("pack", where, "-L", 128, "-o", tmp_path / "p")):
        r = run(*args, catch_exceptions=False)
        assert r.exit_code == 1 and "names a whole bucket" in r.output, r.output
        assert "s3://bkt/NAME" in r.output or "gs://bkt/NAME" in r.output
    assert not list(tmp_path.iterdir())
