import gzip
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
TOKENIZER = FIXTURES / "tokenizer" / "tokenizer.json"
CORPUS = FIXTURES / "corpus"


def packtool_process(*args, env=None, check=True, cwd=ROOT):
    """``python -m packtool ARGS`` in a fresh process from the repository root (or ``cwd``,
    this checkout's packtool imported): its exit code and output (a failure with ``check``,
    and never a traceback)."""
    import os
    import subprocess
    import sys

    if Path(cwd) != ROOT:
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH")] if p)
    r = subprocess.run([sys.executable, "-m", "packtool", *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r


def stop_server_after(s3, n: int, real):
    """An upload function that stops the S3 server before its (n+1)th upload (the fault
    tests of a store that goes down mid-run)."""
    sent = []

    def upload(fs, files, result):
        for local, rpath in files:  # one object at a time, so the server dies between two
            if len(sent) == n:
                s3.stop()
            sent.append(rpath)
            real(fs, [(local, rpath)], result)

    return upload


def server_dies_during_uploads(monkeypatch, tmp_path, s3, module, n: int):
    """A run's cache, storage options of one attempt per request, and ``module.upload``
    stopping the server before its (n+1)th upload; returns the real upload, to put back."""
    import json

    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKTOOL_STORAGE_OPTIONS", json.dumps(
        {**s3.options, "config_kwargs": {"retries": {"max_attempts": 1}}}))
    real = module.upload
    monkeypatch.setattr(module, "upload", stop_server_after(s3, n, real))
    return real


@pytest.fixture(scope="session")
def ray_instance():
    """A local Ray instance of 2 CPUs for the session; its workers import this checkout's
    packtool, and the tests' own modules (stand-in jobs of the fault tests)."""
    import os

    ray = pytest.importorskip("ray")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    workers = os.pathsep.join([os.environ["PYTHONPATH"], str(ROOT / "tests")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": workers}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3():
    """A real S3 server for the session (moto's ThreadedMotoServer on 127.0.0.1, a free
    port): see storage_server.py."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from storage_server import S3

    server = S3()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))


@pytest.fixture(scope="session")
def docs():
    from synth import make_documents

    d = make_documents(60, seed=3, median_words=40, max_words=400)
    d[5] = ""  # an empty record stays a (zero-length) document
    d[9] = "  café 日本語 🚀 naïve\n\nsecond paragraph  "
    return d


def _line(r) -> str:
    line = json.dumps(r, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: keep them as JSON \ud800 escapes
        line = json.dumps(r)
    return line + "\n"


def write_jsonl(path: Path, records, compress=None) -> Path:
    data = "".join(_line(r) for r in records).encode()
    if compress == "gz":
        data = gzip.compress(data)
    elif compress == "zst":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def encode_all(tokenizer, texts, add_special_tokens=False):
    return [tokenizer.encode(t, add_special_tokens=add_special_tokens).ids for t in texts]


def corpus_docs(prefix):
    import packtool

    c = packtool.open_tokens(prefix)
    return [c[i].tolist() for i in range(len(c))]
