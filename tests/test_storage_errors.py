"""A store that fails becomes a message naming the URLs, the endpoint and the fix, never a
traceback nor a hang: a server that stops answering (SIGSTOP) fails the command within a
bounded time; no credentials, a closed endpoint, a server gone mid-run and an unknown
storage option are named; S3 options do not break an http:// input. Against moto's S3
server in a process of its own (storage_server.S3Process), which a test can stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from conftest import CORPUS, ROOT, TOKENIZER, server_dies_during_uploads
from conftest import packtool_process as cli
from storage_server import S3Process, free_port
from warm import shared

from packtool import open_tokens


@pytest.fixture(scope="module")
def server():
    s = S3Process()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    cli("tokenize", CORPUS / "part-0.jsonl", "-t", TOKENIZER, "--eos", "<|eos|>", "-o", d / "c",
        "-q")
    return d


def put_corpus(server, folder) -> str:
    bucket = server.bucket()
    for p in folder.iterdir():
        server.fs.put_file(str(p), f"{bucket}/{p.name}")
    return f"s3://{bucket}/c"


def env_of(server, tmp_path, options=None, **extra) -> dict:
    return {**server.env, "PACKTOOL_CACHE_DIR": str(tmp_path / "cache"),
            "PACKTOOL_STORAGE_OPTIONS": json.dumps(options or server.options), **extra}


@pytest.mark.slow
def test_a_store_that_stops_answering_fails_within_the_timeout(server, corpus, tmp_path):
    """A request to a stopped server fails within ~5 x PACKTOOL_STORAGE_TIMEOUT (3 attempts,
    docs/STORAGE.md), whatever the command: before, s3fs's retries multiplied botocore's
    (pack 41 s at T = 2: a put's deadline of 20 T; a read 5 x 5 x 2 attempts, so verify
    was still waiting after 900 s at the default 60 s), and the message ended in "()"."""
    url = put_corpus(server, corpus)
    cli("pack", url, "-L", 128, "-o", f"{url}-p", "-q", env=env_of(server, tmp_path))
    t = 2
    env = env_of(server, tmp_path / "stopped", PACKTOOL_STORAGE_TIMEOUT=str(t))
    runs = {"pack": ["pack", url, "-L", "128", "-o", f"{url}-q", "-q"],
            "verify": ["verify", f"{url}-p"], "stats": ["stats", url, "-L", "128"]}
    server.pause()
    try:  # the three at once, each waiting on the store alone: the test 38 s -> 19 s; forked
        # warm (tests/warm.py), so that start-up on a loaded machine is not what is timed
        started = time.monotonic()
        procs = {name: shared().start(["-m", "packtool", *args], cwd=ROOT, env=env)
                 for name, args in runs.items()}
        for name, proc in procs.items():
            try:
                r = proc.wait(timeout=max(1.0, started + 120 - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs.values():
                    p.send_signal(signal.SIGKILL)
                pytest.fail(f"{name} still waiting on a stopped store after 120 s")
            took, stderr = time.monotonic() - started, r.stderr
            assert r.returncode == 1 and "Traceback" not in stderr, stderr
            assert server.endpoint in stderr and "did not answer within 2 s" in stderr
            assert "PACKTOOL_STORAGE_TIMEOUT" in stderr and "()" not in stderr, stderr
            assert took < 5 * t + 12, f"{name}: {took:.1f} s"  # 12 s: start-up and back-off
    finally:
        server.resume()
    cli("pack", url, "-L", 128, "-o", f"{url}-p", "-q", "--overwrite",
        env=env_of(server, tmp_path))


@pytest.mark.slow  # 3.5-9 s: the fast tier keeps its 3 minutes
def test_store_failures_are_named_never_tracebacks(server, corpus, tmp_path):
    url = put_corpus(server, corpus)
    anonymous = {k: v for k, v in env_of(server, tmp_path).items() if not k.startswith("AWS_")}
    anonymous.update(AWS_EC2_METADATA_DISABLED="true",
                     AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
                     AWS_CONFIG_FILE=str(tmp_path / "none"),
                     PACKTOOL_STORAGE_OPTIONS=json.dumps({"endpoint_url": server.endpoint}))
    r = cli("verify", url, env=anonymous, check=False)
    assert r.returncode == 1 and "no credentials" in r.stderr and url in r.stderr
    assert server.endpoint in r.stderr

    closed = f"http://127.0.0.1:{free_port()}"
    r = cli("verify", url, env=env_of(server, tmp_path, {**server.options,
                                                          "endpoint_url": closed}),
            check=False)
    assert r.returncode == 1 and "cannot reach" in r.stderr and closed in r.stderr

    r = cli("verify", url, env=env_of(server, tmp_path, {**server.options,
                                                          "no_such_option": 1}),
            check=False)
    assert r.returncode == 1 and "no_such_option" in r.stderr and url in r.stderr


def test_s3_options_do_not_reach_an_http_input(server, tmp_path):
    """--storage-options for the store went to an http:// input's filesystem too, whose
    every read then failed with aiohttp's TypeError."""
    bucket = server.bucket()
    server.fs.put_file(str(CORPUS / "part-0.jsonl"), f"{bucket}/in.jsonl")
    server.fs.chmod(f"{bucket}/in.jsonl", acl="public-read")
    web = f"{server.endpoint}/{bucket}/in.jsonl"  # moto serves objects over plain HTTP
    cli("tokenize", web, "-t", TOKENIZER, "--eos", "<|eos|>", "-o", tmp_path / "web", "-q",
        env=env_of(server, tmp_path))
    cli("tokenize", CORPUS / "part-0.jsonl", "-t", TOKENIZER, "--eos", "<|eos|>", "-o",
        tmp_path / "local", "-q")
    assert open_tokens(tmp_path / "web").n_tokens == open_tokens(tmp_path / "local").n_tokens


def test_a_server_gone_mid_run_is_named(s3, tmp_path, monkeypatch, corpus):
    """The server stopped after the first upload of a pack (moto in this process): the
    CLI's boundary names the endpoint and says the run resumes."""
    import click

    from packtool.cli.app import run
    from packtool.options import PackOptions
    from packtool.pack import pack
    from packtool.storage import publish

    bucket = s3.bucket()
    for p in corpus.iterdir():
        s3.fs.put_file(str(p), f"{bucket}/{p.name}")
    server_dies_during_uploads(monkeypatch, tmp_path, s3, publish, 1)
    try:
        with pytest.raises(click.ClickException) as e:
            run(pack, [f"s3://{bucket}/c"], f"s3://{bucket}/p", PackOptions(seq_len=128))
    finally:
        s3.restart()
    assert "cannot reach" in e.value.message and s3.endpoint in e.value.message
    assert f"s3://{bucket}/p" in e.value.message and "resumes" in e.value.message
    assert os.environ["PACKTOOL_STORAGE_OPTIONS"]
