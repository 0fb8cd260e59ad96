"""Issue 10, format side: every reader validates what it trusts. Each test reproduces a case
that passed silently, crashed or read outside a file before."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TOKENIZER, write_jsonl

import packtool
from packtool.cli import cli
from packtool.formats.packed import index_digest, open_packed
from packtool.pack import pack_corpus
from packtool.verify import VerifyError, verify_packed


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from synth import make_documents

    d = tmp_path_factory.mktemp("hard")
    docs = make_documents(80, seed=5, median_words=30, max_words=300)
    write_jsonl(d / "a.jsonl", [{"text": t} for t in docs])
    r = CliRunner().invoke(cli, ["tokenize", str(d / "a.jsonl"), "-t", str(TOKENIZER),
                                 "-o", str(d / "c"), "-q"])
    assert r.exit_code == 0, r.output
    pack_corpus([d / "c"], d / "p", 128, "bfd", shard_size=3000, layout="tokens")
    return d


def copy_corpus(built, dst):
    """The corpus's files and its part's own (hidden) manifest, which a corpus requires."""
    for suffix in (".bin", ".boundaries", ".json"):
        shutil.copy(str(built / "c") + suffix, str(dst) + suffix)
    shutil.copy(built / ".c.part.json", dst.parent / ".c.part.json")
    return dst


def test_corrupt_boundaries_never_read_past_the_file(tmp_path, built):
    """10.1: an end offset past the token count made pack copy 5M tokens of process memory
    into a shard (and segfault with a larger one), and stats printed negative packs."""
    p = copy_corpus(built, tmp_path / "c")
    n_tokens = packtool.open_tokens(p).n_tokens
    ends = np.fromfile(str(p) + ".boundaries", "<i8")
    ends[-2] = n_tokens + 5_000_000
    ends.tofile(str(p) + ".boundaries")
    runner = CliRunner()
    r = runner.invoke(cli, ["pack", str(p), "-L", "8000000", "-o", str(tmp_path / "o")])
    assert r.exit_code == 1 and "c.boundaries" in r.output and "corrupt" in r.output, r.output
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.*"))
    r = runner.invoke(cli, ["stats", str(p), "-L", "512"])
    assert r.exit_code == 1 and "corrupt" in r.output
    # without checksums the structural check alone still refuses it, by document
    with pytest.raises(packtool.FormatError, match="before the previous document's end"):
        packtool.open_tokens(p, checksums=False)
    ends[-2], ends[0] = ends[-3], -4  # a negative start
    ends.tofile(str(p) + ".boundaries")
    with pytest.raises(packtool.FormatError, match="document 0"):
        packtool.open_tokens(p, checksums=False)


def test_pack_refuses_a_corrupted_bin(tmp_path, built):
    """10.2: pack packed a .bin with a flipped byte and exited 0. The tokens layout copies
    the tokens, so pack refuses; the index layout copies none and its reader refuses the
    corrupt source on first read (and verify names it)."""
    p = copy_corpus(built, tmp_path / "c")
    bin_path = Path(str(p) + ".bin")
    data = bytearray(bin_path.read_bytes())
    data[len(data) // 2] ^= 0x40
    bin_path.write_bytes(bytes(data))
    r = CliRunner().invoke(cli, ["pack", str(p), "-L", "128", "-o", str(tmp_path / "o"),
                                 "--layout", "tokens"])
    assert r.exit_code == 1 and "does not match the manifest" in r.output and "c.bin" in r.output
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(cli, ["pack", str(p), "-L", "128", "-o", str(tmp_path / "i"), "-q"])
    assert r.exit_code == 0, r.output
    with pytest.raises(packtool.FormatError, match=r"c\.bin: crc32 .* does not match"):
        packtool.open_packed(tmp_path / "i")[0]
    r = CliRunner().invoke(cli, ["verify", str(tmp_path / "i"), "--source", str(p)])
    assert r.exit_code == 1 and "sha256" in r.output
    r = CliRunner().invoke(cli, ["verify", str(p)])  # the standalone corpus check
    assert r.exit_code == 1 and "sha256" in r.output
    r = CliRunner().invoke(cli, ["verify", str(built / "c")])
    assert r.exit_code == 0 and r.output.startswith("OK") and "documents" in r.output


def _part(built, **change):
    part = json.loads((built / "c.json").read_text())["parts"][0]
    return [{**part, **change}]


@pytest.mark.parametrize("edit,match", [
    ({"dtype": "float32"}, "dtype is 'float32', not one of 'uint16', 'uint32'"),
    ({"n_tokens": "many"}, "n_tokens is 'many', not a count"),
    ({"n_docs": None}, "missing key 'n_docs'"),
    ({"parts": None}, "missing key 'parts'"),
    ({"parts": "name:../c"}, "not a plain name"),
    ({"parts": "drop:checksums"}, "missing key 'checksums'"),
])
def test_malformed_token_manifest_is_named(tmp_path, built, edit, match):
    """10.10: a bad dtype, a non-numeric n_tokens or missing keys gave tracebacks; with the
    manifest's digest recomputed after the edit, the schema still refuses each by name."""
    from packtool.formats import tokens

    p = copy_corpus(built, tmp_path / "c")
    meta = json.loads((tmp_path / "c.json").read_text())
    for k, v in edit.items():
        if v is None:
            meta.pop(k)
        elif isinstance(v, str) and v.startswith("name:"):
            meta[k] = _part(built, name=v[5:])
        elif isinstance(v, str) and v.startswith("drop:"):
            part = _part(built)
            part[0].pop(v[5:])
            meta[k] = part
        else:
            meta[k] = v
    meta[tokens.DIGEST_KEY] = _digest(meta, tokens.DIGEST_KEY)
    (tmp_path / "c.json").write_text(json.dumps(meta))
    with pytest.raises(packtool.FormatError, match=match):
        packtool.open_tokens(p)


def _digest(body, key):
    from packtool.formats._manifest import digest

    return digest(body, key)


def _rewrite_index(directory, edit):
    path = directory / "index.json"
    index = json.loads(path.read_text())
    edit(index)
    index["index_sha256"] = index_digest(index)
    path.write_text(json.dumps(index))


@pytest.mark.parametrize("name", ["/etc/passwd", "../../../../etc/passwd",
                                  "../outside/evil.tokens.npy", ".."])
def test_shard_names_are_confined(tmp_path, built, name):
    """10.3: shard names escaping the directory (with matching crc and index digest) were
    opened, verified OK and served."""
    d = tmp_path / "p"
    shutil.copytree(built / "p", d)

    def edit(index):
        index["shards"][0]["files"]["tokens"]["name"] = name

    _rewrite_index(d, edit)
    with pytest.raises(packtool.FormatError, match="not a plain name"):
        open_packed(d)
    r = CliRunner().invoke(cli, ["verify", str(d)])
    assert r.exit_code == 1 and "refusing to open it" in r.output


def test_symlink_out_of_the_directory_is_refused(tmp_path, built):
    d = tmp_path / "p"
    shutil.copytree(built / "p", d)
    target = d / "shard-00000.tokens.npy"
    outside = tmp_path / "elsewhere.npy"
    shutil.move(target, outside)
    target.symlink_to(outside)
    with pytest.raises(packtool.FormatError, match="symbolic link out of"):
        open_packed(d)


def test_open_packed_checks_checksums_once(tmp_path, built):
    """10.2: open_packed checked no checksum: 54% of random flips returned other data."""
    d = tmp_path / "p"
    shutil.copytree(built / "p", d)
    ds = open_packed(d)
    assert len(ds.index["shards"]) > 1
    path = d / ds.index["shards"][-1]["files"]["tokens"]["name"]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    ds[0]  # shard 0 is intact
    with pytest.raises(packtool.FormatError, match="crc32 does not match"):
        ds[len(ds) - 1]
    assert len(open_packed(d, checksums=False)[len(ds) - 1]["input_ids"]) > 0


def test_edited_offsets_cannot_make_export_allocate(tmp_path, built):
    """10.2: a 456-byte edit of seg_offsets.npy made export try to allocate 11 GiB. The
    offsets (version 2: pack_seg) are checked (monotonic, in range) when the shard opens."""
    d = tmp_path / "p"
    shutil.copytree(built / "p", d)
    path = d / "shard-00000.pack_seg.npy"
    arr = np.load(path)
    arr[1] = np.iinfo(arr.dtype).max
    np.save(path, arr)
    from packtool._io import crc32_file

    def edit(index):
        index["shards"][0]["files"]["pack_seg"]["crc32"] = crc32_file(path)

    _rewrite_index(d, edit)
    r = CliRunner().invoke(cli, ["export", str(d), "--format", "parquet", "-o",
                                 str(tmp_path / "x.parquet")])
    assert r.exit_code == 1 and "offsets" in r.output, r.output
    with pytest.raises(VerifyError, match="offsets"):
        verify_packed(d)


def test_zero_byte_shard_is_refused_clearly(tmp_path, built):
    d = tmp_path / "p"
    shutil.copytree(built / "p", d)
    (d / "shard-00000.seg_doc.npy").write_bytes(b"")
    with pytest.raises(packtool.FormatError, match="empty"):
        open_packed(d)[0]


def test_huge_seq_len_is_a_clean_error(built, tmp_path):
    """10.10: -L 99999999999999999999999 raised OverflowError."""
    r = CliRunner().invoke(cli, ["pack", str(built / "c"), "-L", "99999999999999999999999",
                                 "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--seq-len" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("key,value", [("cost_classes", [1, 1]),
                                       ("costs_sha256", "0123456789abcdef")])
def test_stored_cost_classes_that_are_not_the_packs_are_refused_by_verify(tmp_path, built,
                                                                        key, value):
    """The cost classes index.json stores (what a balanced sampler deals by, issue 32.4) are
    checked against the shards' pack tables, under a valid index digest."""
    d = tmp_path / "p"
    shutil.copytree(built / "p", d)
    assert verify_packed(d)
    _rewrite_index(d, lambda index: index["shards"][0].__setitem__(key, value))
    with pytest.raises(VerifyError, match=f"{key} is not its packs'"):
        verify_packed(d)
