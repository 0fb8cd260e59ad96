"""Object storage against a real S3 server (moto's ThreadedMotoServer on 127.0.0.1, started
here): reading corpora and packed datasets (both layouts) from a bucket through the verified
cache, the CLI with --storage-options, corrupted and missing objects refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from conftest import CORPUS, ROOT, TOKENIZER, run
from conftest import packtool_process as cli

from packtool import open_packed, open_tokens
from packtool.errors import FormatError, PacktoolError
from packtool.storage.cache import Cache


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A corpus and both packed layouts of it, made locally (in this process: fresh ones
    would start Python three times): what the bucket must equal."""
    d = tmp_path_factory.mktemp("local")
    r = run("tokenize", CORPUS, "-t", TOKENIZER, "--eos", "<|eos|>", "-o", d / "data" / "c",
            "-q")
    assert r.exit_code == 0, r.output
    for layout in ("tokens", "index"):
        r = run("pack", d / "data" / "c", "-L", 128, "--layout", layout, "--valid-docs", 3,
                "-o", d / "data" / layout, "-q")
        assert r.exit_code == 0, r.output
    return d


def upload(s3, local_dir, bucket: str) -> str:
    s3.fs.put(str(local_dir / "data"), f"{bucket}/", recursive=True)
    return f"s3://{bucket}/data"


def same_packs(a, b) -> None:
    assert len(a) == len(b) and len(a) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), (i, k)


def test_corpus_and_both_layouts_read_from_a_bucket_equal_local(s3, local, tmp_path):
    url = upload(s3, local, s3.bucket())
    cache = Cache(tmp_path / "cache")
    c_local, c_remote = open_tokens(local / "data" / "c"), open_tokens(
        f"{url}/c", storage_options=s3.options, cache=cache)
    assert len(c_local) == len(c_remote)
    for i in range(len(c_local)):
        assert np.array_equal(c_local[i], c_remote[i])
    for layout in ("tokens", "index"):
        remote = open_packed(f"{url}/{layout}", storage_options=s3.options, cache=cache)
        same_packs(open_packed(local / "data" / layout), remote)
        same_packs(open_packed(local / "data" / layout / "valid"),
                   open_packed(f"{url}/{layout}/valid", storage_options=s3.options, cache=cache))
    fetched = sorted(p.name for p in (tmp_path / "cache" / "objects").iterdir())
    assert fetched and all(not n.startswith(".") for n in fetched)  # no temporaries left


@pytest.mark.slow
def test_torch_dataset_reads_a_bucket_through_its_cache(s3, local, tmp_path):
    torch = pytest.importorskip("torch")
    from packtool.torch import TorchPackedDataset

    url = upload(s3, local, s3.bucket())
    ds = TorchPackedDataset(f"{url}/index", storage_options=s3.options,
                            cache_dir=tmp_path / "cache")
    ref = open_packed(local / "data" / "index")
    for i in range(len(ds)):
        assert torch.equal(ds[i]["input_ids"], torch.from_numpy(ref[i]["input_ids"]))
    assert any((tmp_path / "cache" / "objects").iterdir())


@pytest.mark.slow
def test_cli_verify_and_export_from_a_bucket(s3, local, tmp_path):
    url = upload(s3, local, s3.bucket())
    env = {**s3.env, "PACKTOOL_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("PACKTOOL_STORAGE_OPTIONS")
    opts = ["--storage-options", json.dumps(s3.options)]
    for layout in ("tokens", "index"):
        r = cli(*opts, "verify", f"{url}/{layout}", "--source", f"{url}/c", "--json", env=env)
        assert json.loads(r.stdout)["sources_checked"]
    assert json.loads(cli(*opts, "verify", f"{url}/c", "--json", env=env).stdout)["n_docs"]
    for layout in ("tokens", "index"):
        cli(*opts, "export", f"{url}/{layout}", "--format", "parquet", "-o",
            tmp_path / f"remote-{layout}.parquet", "-q", env=env)
        cli("export", local / "data" / layout, "--format", "parquet", "-o",
            tmp_path / f"local-{layout}.parquet", "-q")
        import pyarrow.parquet as pq

        assert pq.read_table(tmp_path / f"remote-{layout}.parquet").equals(
            pq.read_table(tmp_path / f"local-{layout}.parquet"))


@pytest.mark.slow
def test_a_corrupted_object_is_refused_at_load_and_by_verify(s3, local, tmp_path):
    bucket = s3.bucket()
    url = upload(s3, local, bucket)
    index = json.loads(s3.fs.cat_file(f"{bucket}/data/tokens/index.json"))
    name = index["shards"][0]["files"]["seg_length"]["name"]
    data = bytearray(s3.fs.cat_file(f"{bucket}/data/tokens/{name}"))
    data[-1] ^= 0xFF
    s3.fs.pipe_file(f"{bucket}/data/tokens/{name}", bytes(data))
    with pytest.raises(FormatError, match=name):
        open_packed(f"{url}/tokens", storage_options=s3.options,
                    cache=Cache(tmp_path / "cache"))[0]
    r = cli("verify", f"{url}/tokens", env={**s3.env, "PACKTOOL_CACHE_DIR": str(
        tmp_path / "cache2")}, check=False)
    assert r.returncode == 1 and name in r.stderr
    assert not [p for p in (tmp_path / "cache2" / "objects").iterdir() if name in p.name]

    bin_name = "c.bin" if s3.fs.exists(f"{bucket}/data/c.bin") else None
    bin_name = bin_name or next(p.rsplit("/", 1)[-1] for p in s3.fs.ls(f"{bucket}/data")
                                if p.endswith(".bin"))
    data = bytearray(s3.fs.cat_file(f"{bucket}/data/{bin_name}"))
    data[0] ^= 0x01
    s3.fs.pipe_file(f"{bucket}/data/{bin_name}", bytes(data))
    with pytest.raises(FormatError, match=bin_name):
        open_packed(f"{url}/index", storage_options=s3.options,
                    cache=Cache(tmp_path / "cache3"))[0]


def test_a_missing_object_and_a_missing_backend_are_named(s3, local, tmp_path):
    bucket = s3.bucket()
    url = upload(s3, local, bucket)
    index = json.loads(s3.fs.cat_file(f"{bucket}/data/tokens/index.json"))
    name = index["shards"][0]["files"]["seg_doc"]["name"]
    s3.fs.rm(f"{bucket}/data/tokens/{name}")
    with pytest.raises(FormatError, match="missing"):
        open_packed(f"{url}/tokens", storage_options=s3.options,
                    cache=Cache(tmp_path / "cache"))[0]
    with pytest.raises(PacktoolError, match="no filesystem|pip install"):
        open_tokens("nosuchproto://bucket/c")
    with pytest.raises(PacktoolError, match="storage-options"):
        from packtool.storage import parse_options

        parse_options("[1, 2]")


def test_cache_is_bounded_and_shared(s3, local, tmp_path):
    url = upload(s3, local, s3.bucket())
    one = Cache(tmp_path / "cache", cache_limit=1)  # keeps only the file just fetched
    ds = open_packed(f"{url}/tokens", storage_options=s3.options, cache=one)
    for i in range(len(ds)):
        ds[i]
    left = list((tmp_path / "cache" / "objects").iterdir())
    assert len(left) == 1
    # a second reader on the node (another rank) finds the file already there: no fetch
    other = Cache(tmp_path / "cache")
    before = {p.name: p.stat().st_mtime_ns for p in left}
    ds2 = open_packed(f"{url}/tokens", storage_options=s3.options, cache=other)
    ds2[len(ds2) - 1]
    assert {p.name for p in (tmp_path / "cache" / "objects").iterdir()} >= set(before)
    assert os.environ.get("AWS_ACCESS_KEY_ID") == "testing"


RANK = """
import json, sys
import numpy as np
from packtool import open_packed
from packtool.storage.cache import Cache
url, cache, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ds = open_packed(url, storage_options=options, cache=Cache(cache))
print(json.dumps([int(np.asarray(ds[i]["input_ids"]).sum()) for i in range(len(ds))]))
"""


@pytest.mark.slow
def test_ranks_on_one_node_share_the_cache_safely(s3, local, tmp_path):
    """Four processes read one remote dataset through one cache folder at once: each file is
    fetched once (no temporary left, one entry per object), every rank reads the same data."""
    url = upload(s3, local, s3.bucket())
    procs = [subprocess.Popen([sys.executable, "-c", RANK, f"{url}/tokens",
                               str(tmp_path / "cache"), json.dumps(s3.options)], cwd=ROOT,
                              env=s3.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    sums = {o for o, _ in outs}
    ref = open_packed(local / "data" / "tokens")
    assert sums == {json.dumps([int(np.asarray(ref[i]["input_ids"]).sum())
                                for i in range(len(ref))]) + "\n"}
    entries = sorted((tmp_path / "cache" / "objects").iterdir())
    index = json.loads(s3.fs.cat_file(url.removeprefix("s3://") + "/tokens/index.json"))
    n_files = sum(len(sh["files"]) for sh in index["shards"])
    assert len(entries) == n_files and not [p for p in entries if p.name.startswith(".")]



def cached(s3, cache_dir: Path, url: str, folder: str, key: str) -> tuple[Path, str]:
    """The cache entry of shard 0's ``key`` file (tokens, seg_doc...) of the dataset
    ``url/folder``, and the file's name."""
    index = json.loads(s3.fs.cat_file(f"{url.removeprefix('s3://')}/{folder}/index.json"))
    f = index["shards"][0]["files"][key]
    return cache_dir / "objects" / Cache(cache_dir)._key(f"{url}/{folder}/{f['name']}", f), \
        f["name"]


def flip(path: Path) -> None:
    """One bit in the middle of ``path`` flipped in place (the same inode and size: what a
    disk or another program does to a file, not a new file)."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))


def test_a_changed_cache_entry_is_fetched_again_never_served(s3, local, tmp_path, capfd):
    """A bit flipped in a cached shard file: the next process to open it (a reader, verify)
    finds it, says so, fetches it again and reads the store's bytes."""
    url = upload(s3, local, s3.bucket())
    cache_dir = tmp_path / "cache"
    env = {**s3.env, "PACKTOOL_CACHE_DIR": str(cache_dir)}
    cli("verify", f"{url}/tokens", env=env)  # another process fills the cache
    entry, name = cached(s3, cache_dir, url, "tokens", "tokens")
    good = entry.read_bytes()
    flip(entry)
    capfd.readouterr()
    remote = open_packed(f"{url}/tokens", storage_options=s3.options, cache=Cache(cache_dir))
    same_packs(open_packed(local / "data" / "tokens"), remote)
    err = capfd.readouterr().err
    assert "warning" in err and entry.name in err and name in err
    assert entry.read_bytes() == good

    flip(entry)
    r = cli("verify", f"{url}/tokens", env=env)
    assert entry.name in r.stderr and "fetching it again" in r.stderr
    assert entry.read_bytes() == good


def test_verify_hashes_a_cache_entry_this_process_checked_before(s3, local, tmp_path,
                                                                  monkeypatch, capfd):
    """A reader checks an entry's crc32 once per process; verify, in the same process after
    it, does not trust that check: it hashes the bytes it verifies again."""
    from packtool.verify import verify

    url = upload(s3, local, s3.bucket())
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("PACKTOOL_STORAGE_OPTIONS", json.dumps(s3.options))
    ds = open_packed(f"{url}/tokens")
    for i in range(len(ds)):
        ds[i]
    entry, _ = cached(s3, cache_dir, url, "tokens", "tokens")
    good = entry.read_bytes()
    flip(entry)
    capfd.readouterr()
    verify(f"{url}/tokens")
    assert entry.name in capfd.readouterr().err
    assert entry.read_bytes() == good


@pytest.mark.slow  # 3.5-9 s: the fast tier keeps its 3 minutes
def test_a_cached_source_file_symlink_or_truncation_is_repaired(s3, local, tmp_path):
    """Under the index layout the tokens are the corpus's .bin: a bit flipped in its cached
    copy is found by verify --source and by a reader; an entry swapped for a symbolic link
    (even to the right bytes) is refused; a truncated one is fetched again, not blamed on
    the store."""
    url = upload(s3, local, s3.bucket())
    cache_dir = tmp_path / "cache"
    env = {**s3.env, "PACKTOOL_CACHE_DIR": str(cache_dir)}
    cli("verify", f"{url}/index", "--source", f"{url}/c", env=env)
    meta = json.loads(s3.fs.cat_file(f"{url.removeprefix('s3://')}/c.json"))
    part = meta["parts"][0]
    entry = cache_dir / "objects" / Cache(cache_dir)._key(
        f"{url}/{part['name']}.bin", part["checksums"]["bin"])
    good = entry.read_bytes()
    flip(entry)
    r = cli("verify", f"{url}/index", "--source", f"{url}/c", env=env)
    assert entry.name in r.stderr and entry.read_bytes() == good

    ref = open_packed(local / "data" / "index")
    for damage in ("symlink", "truncate", "flip"):
        if damage == "symlink":
            (tmp_path / "elsewhere").write_bytes(good)
            entry.unlink()
            entry.symlink_to(tmp_path / "elsewhere")
        elif damage == "truncate":
            os.truncate(entry, len(good) // 2)
        else:
            flip(entry)
        r = subprocess.run([sys.executable, "-c", RANK, f"{url}/index", str(cache_dir),
                            json.dumps(s3.options)], cwd=ROOT, env=s3.env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (damage, r.stderr)
        assert json.loads(r.stdout) == [int(np.asarray(ref[i]["input_ids"]).sum())
                                        for i in range(len(ref))], damage
        assert entry.name in r.stderr, damage
        assert not entry.is_symlink() and entry.read_bytes() == good, damage
