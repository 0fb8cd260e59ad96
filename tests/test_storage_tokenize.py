"""Tokenize from and to object storage against a real S3 server (moto's ThreadedMotoServer on
127.0.0.1, the ``s3`` fixture): the same bytes as a local run, resume after the server went
down mid-upload, a lock object keeping two writers apart, a Ray task killed mid-upload."""

from __future__ import annotations

import json
import os
import signal

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from conftest import CORPUS, TOKENIZER, server_dies_during_uploads
from conftest import packtool_process as cli

from packtool import open_tokens
from packtool.executors import RunOptions
from packtool.options import TokenizeOptions
from packtool.tokenize import tokenize_files

PART_BYTES = 200_000  # the bundled corpus in 4 parts




@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The corpus tokenized from local files to a local prefix."""
    d = tmp_path_factory.mktemp("ref")
    cli("tokenize", CORPUS, "-t", TOKENIZER, "--eos", "<|eos|>", "--part-bytes", PART_BYTES,
        "-o", d / "c", "-q")
    return d


@pytest.fixture()
def bucket(s3):
    b = s3.bucket()
    s3.fs.put(str(CORPUS), f"{b}/in", recursive=True)
    return b


def data_objects(s3, bucket: str, folder: str) -> dict[str, bytes]:
    s3.fs.invalidate_cache()
    return {p.rsplit("/", 1)[-1]: s3.fs.cat_file(p) for p in s3.fs.find(f"{bucket}/{folder}")
            if p.endswith((".bin", ".boundaries", ".mask"))}


def local_files(folder, stem="c") -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.name.split(".")[0] == stem and p.suffix in (".bin", ".boundaries", ".mask")}


def expected_objects(s3, bucket: str, folder: str, stem: str = "c") -> set[str]:
    """What a finished corpus is on the store: its manifest, the parts' files and records."""
    meta = json.loads(s3.fs.cat_file(f"{bucket}/{folder}/{stem}.json"))
    names = {f"{stem}.json"}
    for q in meta["parts"]:
        names |= {f"{q['name']}.{k}" for k in q["checksums"]} | {f".{q['name']}.part.json"}
    return names


def listing(s3, bucket: str, folder: str) -> set[str]:
    s3.fs.invalidate_cache()
    return {p[len(f"{bucket}/{folder}/"):] for p in s3.fs.find(f"{bucket}/{folder}")}


@pytest.mark.slow
def test_tokenize_from_and_to_a_bucket_make_the_local_bytes(s3, bucket, reference, tmp_path):
    env = {**s3.env, "PACKTOOL_CACHE_DIR": str(tmp_path / "cache")}
    common = ["-t", TOKENIZER, "--eos", "<|eos|>", "--part-bytes", PART_BYTES, "-q"]
    # inputs in the bucket (a prefix: JSONL, .gz, .zst, Parquet, text), output local
    cli("tokenize", f"s3://{bucket}/in", *common, "-o", tmp_path / "c", env=env)
    assert local_files(tmp_path) == local_files(reference)
    # output in the bucket too: every part published, the manifest last, nothing else left
    r = cli("tokenize", f"s3://{bucket}/in", *common[:-1], "-o", f"s3://{bucket}/out/c",
            env=env)
    assert "published" in r.stdout and "verified" in r.stdout
    assert data_objects(s3, bucket, "out") == local_files(reference)
    assert listing(s3, bucket, "out") == expected_objects(s3, bucket, "out")
    remote = open_tokens(f"s3://{bucket}/out/c", storage_options=s3.options)
    local = open_tokens(reference / "c")
    assert len(remote) == len(local) and all(
        (remote[i] == local[i]).all() for i in range(0, len(local), 7))
    assert not list((tmp_path / "cache" / "staging").rglob("*.bin"))  # scratch removed
    # a glob over the bucket reads only what it matches
    cli("tokenize", f"s3://{bucket}/in/*.parquet", *common, "-o", tmp_path / "pq", env=env)
    cli("tokenize", CORPUS / "part-3.parquet", *common, "-o", tmp_path / "pq-local")
    assert local_files(tmp_path, "pq") == {k.replace("pq-local", "pq"): v for k, v in
                                            local_files(tmp_path, "pq-local").items()}
    # the same command again needs --overwrite; with it, every part is found finished
    r = cli("tokenize", f"s3://{bucket}/in", *common, "-o", f"s3://{bucket}/out/c", env=env,
            check=False)
    assert r.returncode == 1 and "--overwrite" in r.stderr
    r = cli("tokenize", f"s3://{bucket}/in", *common[:-1], "--overwrite", "-o",
            f"s3://{bucket}/out/c", "--json", env=env)
    out = json.loads(r.stdout)
    assert out["n_parts_skipped"] == 4 and "0 objects uploaded" in out["published"]
    # a tokenizer at a URL works as a local one does
    s3.fs.put(str(TOKENIZER.parent), f"{bucket}/tok", recursive=True)
    cli("tokenize", f"s3://{bucket}/in", "-t", f"s3://{bucket}/tok", *common[2:], "-o",
        tmp_path / "t", env=env)
    assert local_files(tmp_path, "t") == {k.replace("c.", "t.", 1): v for k, v in
                                           local_files(reference).items()}


def test_objects_not_ours_are_never_replaced(s3, bucket, tmp_path):
    env = {**s3.env, "PACKTOOL_CACHE_DIR": str(tmp_path / "cache")}
    s3.fs.pipe_file(f"{bucket}/site/c.bin", b"mine")
    r = cli("tokenize", f"s3://{bucket}/in", "-t", TOKENIZER, "-o", f"s3://{bucket}/site/c",
            "--overwrite", "-q", env=env, check=False)
    assert r.returncode == 1 and "c.bin" in r.stderr and "not a packtool output" in r.stderr
    assert s3.fs.cat_file(f"{bucket}/site/c.bin") == b"mine"
    s3.fs.pipe_file(f"{bucket}/site/d.json", b'{"mine": 1}')
    r = cli("tokenize", f"s3://{bucket}/in", "-t", TOKENIZER, "-o", f"s3://{bucket}/site/d",
            "--overwrite", "-q", env=env, check=False)
    assert r.returncode == 1 and "not a packtool token manifest" in r.stderr
    assert s3.fs.cat_file(f"{bucket}/site/d.json") == b'{"mine": 1}'


@pytest.mark.slow
def test_a_second_writer_is_refused_by_the_lock_object(s3, bucket, tmp_path):
    from packtool.storage.lock import StoreLock

    env = {**s3.env, "PACKTOOL_CACHE_DIR": str(tmp_path / "cache")}
    lock = f"{bucket}/out/.c.lock"
    with StoreLock(s3.fs, lock, f"s3://{lock}"):  # another run, alive, holds the output
        r = cli("tokenize", f"s3://{bucket}/in", "-t", TOKENIZER, "-o",
                f"s3://{bucket}/out/c", "-q", env=env, check=False)
        assert r.returncode == 1 and "held by pid" in r.stderr
        assert not s3.fs.exists(f"{bucket}/out/c.json")
    cli("tokenize", f"s3://{bucket}/in", "-t", TOKENIZER, "-o", f"s3://{bucket}/out/c", "-q",
        env=env)
    assert not s3.fs.exists(lock)


@pytest.mark.slow
def test_server_down_mid_upload_then_the_same_command_resumes(s3, bucket, reference, tmp_path,
                                                              monkeypatch):
    """The server stops after the third data object: the run fails, no manifest is visible;
    once it is back, the same command skips the parts already published and completes,
    leaving exactly the corpus."""
    from packtool.storage import publish

    real = server_dies_during_uploads(monkeypatch, tmp_path, s3, publish, 3)
    url = f"s3://{bucket}/out/c"
    opts = TokenizeOptions(eos="<|eos|>", part_bytes=PART_BYTES)
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises, the run fails
        tokenize_files([f"s3://{bucket}/in"], str(TOKENIZER), url, opts)
    s3.restart()
    names = listing(s3, bucket, "out")
    assert names and "c.json" not in names  # objects, but no commit
    monkeypatch.setattr(publish, "upload", real)
    res = tokenize_files([f"s3://{bucket}/in"], str(TOKENIZER), url, opts)
    assert res.n_parts_skipped >= 1  # part 0 was published before the server went down
    assert data_objects(s3, bucket, "out") == local_files(reference)
    assert listing(s3, bucket, "out") == expected_objects(s3, bucket, "out")


def attempt_marker(url: str, k: int) -> str:
    """A file the first attempt of part ``k`` leaves (Ray's workers were started before
    this test's environment: they share only the file system's /tmp)."""
    import hashlib
    import tempfile

    key = hashlib.sha256(url.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"packtool-test-{key}-{k}")


def dies_mid_upload(job, tick):
    """A stand-in part job for Ray: its first attempt kills its own worker (SIGKILL) right
    after the part's first data object is uploaded; Ray retries the task."""
    from packtool.storage import publish
    from packtool.tokenize import stage

    marker = attempt_marker(job.path, job.k)
    if job.k == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        real = publish.upload

        def upload_then_die(fs, files, result):
            real(fs, files[:1], result)
            os.kill(os.getpid(), signal.SIGKILL)

        publish.upload = upload_then_die
    return stage.run_task(job, tick)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_without_a_shared_file_system_and_a_task_killed_mid_upload(
        ray_instance, s3, bucket, reference, tmp_path, monkeypatch):
    """Every Ray task reads its inputs from the bucket and publishes its part there (a
    scratch folder of its own process, never a shared one); the task killed mid-upload is
    retried by Ray, takes over its dead lock object, and the corpus is the local bytes."""
    from packtool.tokenize import stage

    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKTOOL_STORAGE_OPTIONS", json.dumps(s3.options))
    monkeypatch.setattr(stage, "run_task", dies_mid_upload)
    url = f"s3://{bucket}/out/c"
    res = tokenize_files([f"s3://{bucket}/in"], str(TOKENIZER), url,
                         TokenizeOptions(eos="<|eos|>", part_bytes=PART_BYTES),
                         run=RunOptions(executor="ray"))
    assert os.path.exists(attempt_marker(url, 1)), "the part's first attempt did not run"
    os.unlink(attempt_marker(url, 1))
    assert res.executor == "ray" and res.n_parts == 4
    assert data_objects(s3, bucket, "out") == local_files(reference)
    assert listing(s3, bucket, "out") == expected_objects(s3, bucket, "out")


def test_a_store_without_an_atomic_create_is_refused_unless_asked(tmp_path, monkeypatch):
    """fsspec's default create-if-absent checks, then writes: two writers could both pass.
    A backend without a conditional put (here fsspec's in-memory one) is refused by name
    unless PACKTOOL_UNSAFE_STORE_LOCK=1 makes one writer at a time the user's business."""
    from packtool.errors import PacktoolError

    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PACKTOOL_STORAGE_OPTIONS", raising=False)
    with pytest.raises(PacktoolError, match="no atomic create-if-absent.*UNSAFE_STORE_LOCK"):
        tokenize_files([str(CORPUS / "part-0.jsonl")], str(TOKENIZER), "memory://o/c")
    monkeypatch.setenv("PACKTOOL_UNSAFE_STORE_LOCK", "1")
    res = tokenize_files([str(CORPUS / "part-0.jsonl")], str(TOKENIZER), "memory://o/c")
    assert res.n_docs > 0 and open_tokens("memory://o/c").n_tokens == res.n_tokens
