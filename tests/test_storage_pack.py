"""Pack to object storage against a real S3 server (moto's ThreadedMotoServer on 127.0.0.1, the
``s3`` fixture): both layouts, grouped or not, the same objects as a local run's files;
--overwrite of our own dataset only; the server down mid-upload, then the same command
completes; a lock object keeping two writers apart; array tasks and Ray publishing their
own shards, the driver (or --finalize) writing the index last."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from conftest import CORPUS, TOKENIZER, server_dies_during_uploads
from conftest import packtool_process as cli

from packtool import open_packed
from packtool.executors import RunOptions
from packtool.options import PackOptions
from packtool.storage.cache import Cache

PACK = ["-L", 128, "--valid-docs", 3, "--shard-size", 20_000, "-q"]




@pytest.fixture(scope="module")
def local(tmp_path_factory):
    d = tmp_path_factory.mktemp("local")
    cli("tokenize", CORPUS, "-t", TOKENIZER, "--eos", "<|eos|>", "-o", d / "c", "-q")
    return d


@pytest.fixture()
def bucket(s3, local):
    """A bucket holding the corpus under data/ (tokenized locally, uploaded)."""
    b = s3.bucket()
    for p in local.iterdir():
        if p.name.split(".")[0] == "c" or p.name.startswith(".c."):
            s3.fs.put_file(str(p), f"{b}/data/{p.name}")
    return b


def env_of(s3, tmp_path) -> dict:
    return {**s3.env, "PACKTOOL_CACHE_DIR": str(tmp_path / "cache")}


def objects(s3, prefix: str) -> dict[str, bytes]:
    s3.fs.invalidate_cache()
    return {p[len(prefix) + 1:]: s3.fs.cat_file(p) for p in s3.fs.find(prefix)}


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}


def same_dataset(remote: dict[str, bytes], folder: Path) -> None:
    """The objects are the local dataset's files: the same names, the same bytes (index.json
    differs only where it names its sources)."""
    mine = files(folder)
    assert set(remote) == set(mine)
    for name, data in mine.items():
        if not name.endswith("index.json"):
            assert remote[name] == data, name


@pytest.mark.slow
@pytest.mark.parametrize("layout,group", [("index", []), ("tokens", []),
                                          ("index", ["--group-docs", 300]),
                                          ("tokens", ["--group-docs", 300])])
def test_pack_to_a_bucket_makes_the_local_files(s3, local, bucket, tmp_path, layout, group):
    env = env_of(s3, tmp_path)
    url = f"s3://{bucket}/data/p"
    r = cli("pack", f"s3://{bucket}/data/c", "--layout", layout, *group, *PACK[:-1], "-o", url,
            env=env)
    assert "published" in r.stdout
    assert "another process" not in r.stderr  # its own threads share a cache entry quietly
    fetched = {p.name.split("-", 1)[1] for p in (tmp_path / "cache" / "objects").iterdir()}
    assert "c.boundaries" in fetched  # an index pack reads the boundaries, never the tokens
    assert ("c.bin" in fetched) is (layout == "tokens")
    cli("pack", local / "c", "--layout", layout, *group, *PACK, "-o", tmp_path / "p")
    same_dataset(objects(s3, f"{bucket}/data/p"), tmp_path / "p")  # no entry, lock, marker
    if layout == "index":  # the source beside it in the bucket, found by the relative path
        index = json.loads(s3.fs.cat_file(f"{bucket}/data/p/index.json"))
        assert index["sources"][0]["path"] == "../c"
    r = cli("verify", url, "--source", f"s3://{bucket}/data/c", "--json", env=env)
    assert json.loads(r.stdout)["sources_checked"]
    if not group:  # an object the index does not list: verify names it, as in a folder
        s3.fs.pipe_file(f"{bucket}/data/p/ex/stray.bin", b"x")
        r = cli("verify", url, env=env, check=False)
        assert r.returncode == 1 and "ex/stray.bin" in r.stderr, r.stderr
        s3.fs.rm_file(f"{bucket}/data/p/ex/stray.bin")
    ds = open_packed(url, storage_options=s3.options, cache=Cache(tmp_path / "c2"))
    ref = open_packed(tmp_path / "p")
    assert len(ds) == len(ref)
    for i in range(0, len(ds), 11):
        assert np.array_equal(ds[i]["input_ids"], ref[i]["input_ids"])
    assert not list((tmp_path / "cache" / "staging").rglob("*.npy"))  # scratch removed


@pytest.mark.slow
def test_overwrite_replaces_only_our_own_dataset(s3, bucket, tmp_path):
    env = env_of(s3, tmp_path)
    src, url = f"s3://{bucket}/data/c", f"s3://{bucket}/data/p"
    cli("pack", src, *PACK, "-o", url, env=env)
    r = cli("pack", src, *PACK, "-o", url, env=env, check=False)
    assert r.returncode == 1 and "--overwrite" in r.stderr
    # --overwrite with fewer shards: none of the old ones stays
    cli("pack", src, "-L", 256, "--shard-size", 60_000, "-q", "--overwrite", "-o", url, env=env)
    index = json.loads(s3.fs.cat_file(f"{bucket}/data/p/index.json"))
    listed = {f["name"] for sh in index["shards"] for f in sh["files"].values()}
    assert set(objects(s3, f"{bucket}/data/p")) == listed | {"index.json"}
    # a folder holding objects that are not a dataset's is never written into
    s3.fs.pipe_file(f"{bucket}/site/page.html", b"<html/>")
    r = cli("pack", src, *PACK, "--overwrite", "-o", f"s3://{bucket}/site", env=env,
            check=False)
    assert r.returncode == 1 and "page.html" in r.stderr
    assert objects(s3, f"{bucket}/site") == {"page.html": b"<html/>"}
    # an index.json that is not ours is not replaced
    s3.fs.pipe_file(f"{bucket}/other/index.json", b'{"format": "mine"}')
    r = cli("pack", src, *PACK, "--overwrite", "-o", f"s3://{bucket}/other", env=env,
            check=False)
    assert r.returncode == 1 and "not a packtool packed dataset" in r.stderr
    assert objects(s3, f"{bucket}/other") == {"index.json": b'{"format": "mine"}'}


@pytest.mark.slow
def test_a_second_writer_is_refused_by_the_lock_object(s3, bucket, tmp_path):
    from packtool.storage.lock import StoreLock

    env = env_of(s3, tmp_path)
    with StoreLock(s3.fs, f"{bucket}/p/.packtool.lock", f"s3://{bucket}/p/.packtool.lock"):
        r = cli("pack", f"s3://{bucket}/data/c", *PACK, "-o", f"s3://{bucket}/p", env=env,
                check=False)
        assert r.returncode == 1 and "held by pid" in r.stderr
        assert not s3.fs.exists(f"{bucket}/p/index.json")
    cli("pack", f"s3://{bucket}/data/c", *PACK, "-o", f"s3://{bucket}/p", env=env)
    assert not s3.fs.exists(f"{bucket}/p/.packtool.lock")


@pytest.mark.slow
def test_server_down_mid_upload_then_the_same_command_completes(s3, bucket, local, tmp_path,
                                                                monkeypatch):
    from packtool.pack import pack
    from packtool.storage import publish

    real = server_dies_during_uploads(monkeypatch, tmp_path, s3, publish, 5)
    url = f"s3://{bucket}/p"
    opts = PackOptions(seq_len=128, valid_docs=3, shard_size=20_000)
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises, the run fails
        pack([f"s3://{bucket}/data/c"], url, opts)
    s3.restart()
    left = objects(s3, f"{bucket}/p")
    assert left and "index.json" not in left  # objects, but no commit
    monkeypatch.setattr(publish, "upload", real)
    pack([f"s3://{bucket}/data/c"], url, opts)
    pack([str(local / "c")], tmp_path / "p", opts)
    same_dataset(objects(s3, f"{bucket}/p"), tmp_path / "p")


@pytest.mark.slow
def test_array_tasks_publish_their_shards_and_finalize_writes_the_index(s3, bucket, local,
                                                                         tmp_path):
    env = env_of(s3, tmp_path)
    url = f"s3://{bucket}/p"
    for k in range(3):
        cli("pack", f"s3://{bucket}/data/c", *PACK, "--tasks", 3, "--task", k, "-o", url,
            env=env)
        assert not s3.fs.exists(f"{bucket}/p/index.json")
    cli("pack", f"s3://{bucket}/data/c", *PACK, "--finalize", "-o", url, env=env)
    cli("pack", local / "c", *PACK, "-o", tmp_path / "p")
    same_dataset(objects(s3, f"{bucket}/p"), tmp_path / "p")


@pytest.mark.ray
@pytest.mark.slow
def test_ray_publishes_every_shard_without_a_shared_file_system(ray_instance, s3, bucket,
                                                                local, tmp_path, monkeypatch):
    from packtool.pack import pack

    monkeypatch.setenv("PACKTOOL_STORAGE_OPTIONS", json.dumps(s3.options))
    opts = PackOptions(seq_len=128, valid_docs=3, shard_size=20_000, layout="tokens")
    pack([f"s3://{bucket}/data/c"], f"s3://{bucket}/p", opts, run=RunOptions(executor="ray"))
    pack([str(local / "c")], tmp_path / "p", opts)
    same_dataset(objects(s3, f"{bucket}/p"), tmp_path / "p")


@pytest.mark.slow
@pytest.mark.parametrize("fmt,src,out", [("megatron", "c", "m/corpus"), ("llmc", "c", "llmc"),
                                         ("parquet", "p", "pq")])
def test_export_to_a_bucket_makes_the_local_files(s3, bucket, local, tmp_path, fmt, src, out):
    """Single files (megatron's .bin/.idx beside their hidden sidecar) or a directory (its
    marker last): the objects are a local export's files; a second export needs
    --overwrite, and objects not ours are never replaced."""
    env = env_of(s3, tmp_path)
    cli("pack", local / "c", *PACK, "-o", tmp_path / "p")
    cli("pack", f"s3://{bucket}/data/c", *PACK, "-o", f"s3://{bucket}/data/p", env=env)
    extra: list = []
    url = f"s3://{bucket}/x/{out}"
    r = cli("export", f"s3://{bucket}/data/{src}", "--format", fmt, *extra, "-o", url, env=env)
    assert "published" in r.stdout
    (tmp_path / "l" / out).parent.mkdir(parents=True, exist_ok=True)
    cli("export", (local if src == "c" else tmp_path) / src, "--format", fmt, *extra, "-o",
        tmp_path / "l" / out, "-q")
    remote = objects(s3, f"{bucket}/x")
    mine = files(tmp_path / "l")
    assert set(remote) == set(mine)
    for name, data in mine.items():
        if "export.json" not in name:  # the markers name their source
            assert remote[name] == data, name
    r = cli("export", f"s3://{bucket}/data/{src}", "--format", fmt, *extra, "-o", url, env=env,
            check=False)
    assert r.returncode == 1 and "--overwrite" in r.stderr
    cli("export", f"s3://{bucket}/data/{src}", "--format", fmt, *extra, "-o", url,
        "--overwrite", "-q", env=env)
    assert set(objects(s3, f"{bucket}/x")) == set(mine)
    s3.fs.pipe_file(f"{bucket}/y/{out}.bin" if fmt == "megatron" else f"{bucket}/y/{out}/a.txt",
                    b"mine")
    r = cli("export", f"s3://{bucket}/data/{src}", "--format", fmt, *extra, "-o",
            f"s3://{bucket}/y/{out}", "--overwrite", "-q", env=env, check=False)
    assert r.returncode == 1 and ("a.txt" in r.stderr or ".bin" in r.stderr), r.stderr
    assert set(objects(s3, f"{bucket}/y").values()) == {b"mine"}


@pytest.mark.slow
def test_stats_and_which_read_a_bucket(s3, bucket, local, tmp_path):
    env = env_of(s3, tmp_path)
    cli("pack", f"s3://{bucket}/data/c", *PACK, "-o", f"s3://{bucket}/p", env=env)
    cli("pack", local / "c", *PACK, "-o", tmp_path / "p")
    remote = json.loads(cli("stats", f"s3://{bucket}/p", "--json", env=env).stdout)
    mine = json.loads(cli("stats", tmp_path / "p", "--json").stdout)
    assert {k: v for k, v in remote.items() if k not in ("source", "sources")} == {
        k: v for k, v in mine.items() if k not in ("source", "sources")}
    step = ["--epoch", 0, "--step", 3, "--world-size", 2, "--batch-size", 2, "--json"]
    remote = json.loads(cli("which", f"s3://{bucket}/p", *step, env=env).stdout)
    mine = json.loads(cli("which", tmp_path / "p", *step).stdout)
    strip = [{**s, "document": {k: v for k, v in s["document"].items() if k != "source"}}
             for s in mine["segments"]]
    assert [{**s, "document": {k: v for k, v in s["document"].items() if k != "source"}}
            for s in remote["segments"]] == strip and strip
    assert all(s["document"]["input"] for s in remote["segments"])  # manifests read remotely


def test_upload_verifies_single_and_multipart_etags_and_resends_what_differs(s3, tmp_path,
                                                                            monkeypatch):
    """A job's objects, put and then checked against the server's ETags (a single put's MD5,
    a multipart upload's MD5 of part MD5s); a second upload of the same bytes sends nothing;
    an object of the same size but other bytes is sent again, never taken as done."""
    import os

    from packtool.storage import publish

    monkeypatch.setattr(publish, "CHUNK", 5 << 20)  # S3's smallest part: multipart past 10 MiB
    name = s3.bucket()
    sizes = {"empty": 0, "small": 1000, "one-part": 5 << 20, "multipart": (10 << 20) + 7}
    files = []
    for label, size in sizes.items():
        (tmp_path / label).write_bytes(os.urandom(size))
        files.append((tmp_path / label, f"{name}/job/{label}.npy"))
    first = publish.Published("s3://x")
    publish.upload(s3.fs, files, first)
    assert (first.uploaded, first.skipped, first.bytes_sent) == (4, 0, sum(sizes.values()))
    assert s3.fs.info(f"{name}/job/multipart.npy")["ETag"].strip('"').endswith("-3")
    for path, rpath in files:
        assert s3.fs.cat_file(rpath) == path.read_bytes()
    again = publish.Published("s3://x")
    publish.upload(s3.fs, files, again)
    assert (again.uploaded, again.skipped) == (0, 4)
    s3.fs.pipe_file(f"{name}/job/small.npy", os.urandom(1000))  # same size, other bytes
    s3.fs.invalidate_cache()
    third = publish.Published("s3://x")
    publish.upload(s3.fs, files, third)
    assert (third.uploaded, third.skipped) == (1, 3)
    assert s3.fs.cat_file(f"{name}/job/small.npy") == (tmp_path / "small").read_bytes()
