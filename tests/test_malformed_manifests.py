"""Issue 18 §3 and §4, as the audit left them: every manifest edit (digest recomputed) and every
odd --out is a clear error naming the file (or flag) and the fix, exit 1 or 2, never a
traceback, through every command that reads it; no path read from a manifest, and no data
file that is a link, leaves its folder."""

import json
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TOKENIZER, run, slow, slow_except, write_jsonl
from synth import make_documents
from warm import python

import packtool
from packtool.formats._manifest import digest
from packtool.formats.packed import index_digest


def cli_run(*args, cwd=None):
    """A fresh process (forked warm: tests/warm.py): what a user sees, traceback included if
    there is one."""
    return python(["-m", "packtool", *map(str, args)], cwd=cwd,
                  env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``c``: a corpus; ``s``: a chat corpus with a mask; ``p``: ``c`` packed with a held-out
    split."""
    d = tmp_path_factory.mktemp("manifests")
    docs = make_documents(80, seed=8, median_words=30, max_words=200)
    write_jsonl(d / "in.jsonl", [{"text": t} for t in docs])
    assert run("tokenize", d / "in.jsonl", "-t", TOKENIZER, "-o", d / "c", "-q").exit_code == 0
    conv = [{"role": "user", "content": t[:40]} for t in docs[:2]] + [
        {"role": "assistant", "content": docs[2][:60]}]
    write_jsonl(d / "chat.jsonl", [{"messages": conv}] * 4)
    assert run("tokenize", d / "chat.jsonl", "-t", TOKENIZER.parent, "-o", d / "s",
               "--messages-field", "messages", "-q").exit_code == 0
    assert run("pack", d / "c", "-L", 128, "-o", d / "p", "--valid-docs", 4, "-q"
               ).exit_code == 0
    return d


def _clear(r, name: str, code: int = 1) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == code, out
    assert "Traceback" not in out, out
    line = out.strip().splitlines()[-1]
    assert line.startswith("Error: ") and name in line, line


# ------------------------------------------------------------- token manifests (§4)
def _part(m):
    return m["parts"][0]


TOKEN_EDITS = {
    "mask true, no mask checksums": (lambda m: m.__setitem__("mask", True), "mask checksum"),
    "bytes a string": (lambda m: _part(m)["checksums"]["bin"].__setitem__("bytes", "x"),
                       "parts[0].checksums.bin.bytes"),
    "sha256 a number": (lambda m: _part(m)["checksums"]["bin"].__setitem__("sha256", 123),
                        "parts[0].checksums.bin.sha256"),
    "checksum a string": (lambda m: _part(m)["checksums"].__setitem__("bin", "abc"),
                          "parts[0].checksums.bin"),
    "tokenizer missing": (lambda m: m.pop("tokenizer"), "'tokenizer'"),
    "tokenizer null": (lambda m: m.__setitem__("tokenizer", None), "tokenizer is null"),
}


@pytest.mark.parametrize("case", slow_except(sorted(TOKEN_EDITS), "tokenizer null"))
def test_malformed_token_manifest_is_a_clear_error_everywhere(tmp_path, built, case):
    edit, where = TOKEN_EDITS[case]
    for f in list(built.glob("c.*")) + [built / ".c.part.json"]:
        shutil.copy(f, tmp_path / f.name)
    m = json.loads((tmp_path / "c.json").read_text())
    edit(m)
    m["manifest_sha256"] = digest(m, "manifest_sha256")
    (tmp_path / "c.json").write_text(json.dumps(m))
    for args in (["verify", "c"], ["stats", "c"], ["pack", "c", "-L", 64, "-o", "o", "-q"]):
        r = cli_run(*args, cwd=tmp_path)
        _clear(r, "c.json")
        assert where in r.stderr and "packtool tokenize" in r.stderr, r.stderr
    with pytest.raises(packtool.PacktoolError, match="c.json"):
        packtool.open_tokens(tmp_path / "c")


# ------------------------------------------------------------ index.json (§3, §4)
def _held(path: str) -> dict:
    return {"path": path, "valid_docs": 4, "valid_fraction": None, "n_docs_held_out": 4,
            "n_packs": 1, "n_tokens": 10}


def _files(i):
    return i["shards"][0]["files"]


INDEX_EDITS = {
    "held_out a string": (lambda i: i.__setitem__("held_out", "valid"), "held_out is 'valid'"),
    "held_out.path absolute": (lambda i: i.__setitem__("held_out", _held("/etc")),
                               "held_out.path is '/etc'"),
    "held_out.path ..": (lambda i: i.__setitem__("held_out", _held("../p")),
                         "held_out.path is '../p'"),
    "n_tokens a string": (lambda i: i.__setitem__("n_tokens", "5"), "n_tokens is '5'"),
    "crc32 missing": (lambda i: _files(i)["seg_doc"].pop("crc32"),
                      "shards[0].files.seg_doc.crc32"),
    "bytes a string": (lambda i: _files(i)["seg_doc"].__setitem__("bytes", "5"),
                       "shards[0].files.seg_doc.bytes is '5'"),
    "token_dtype nonsense": (lambda i: i.__setitem__("token_dtype", "nonsense"),
                             "token_dtype is 'nonsense'"),
}


@pytest.mark.parametrize("case", slow_except(sorted(INDEX_EDITS), "held_out.path .."))
def test_malformed_index_is_a_clear_error_everywhere(tmp_path, built, case):
    """verify, stats, export and open_packed: the file, the key path, the fix; an absolute
    or ``../`` held_out.path is never opened."""
    edit, where = INDEX_EDITS[case]
    shutil.copytree(built / "p", tmp_path / "p")
    i = json.loads((tmp_path / "p" / "index.json").read_text())
    edit(i)
    i["index_sha256"] = index_digest(i)
    (tmp_path / "p" / "index.json").write_text(json.dumps(i))
    for args in (["verify", "p"], ["stats", "p"],
                 ["export", "p", "--format", "parquet", "-o", "x.parquet", "-q"]):
        r = cli_run(*args, cwd=tmp_path)
        _clear(r, "index.json")
        assert where in r.stderr and "packtool pack" in r.stderr, r.stderr
    with pytest.raises(packtool.PacktoolError, match="index.json"):
        packtool.open_packed(tmp_path / "p")
    assert not (tmp_path / "x.parquet").exists()


# --------------------------------------------- a token part's files as links out (§3)
@pytest.mark.parametrize("suffix", [".bin", *slow(".boundaries", ".mask")])
def test_token_file_linked_out_of_its_folder_is_refused(tmp_path, built, suffix):
    (tmp_path / "c").mkdir()
    (tmp_path / "elsewhere").mkdir()
    for f in list(built.glob("s.*")) + [built / ".s.part.json"]:
        shutil.copy(f, tmp_path / "c" / f.name)
    moved = tmp_path / "elsewhere" / f"s{suffix}"
    (tmp_path / "c" / f"s{suffix}").rename(moved)
    (tmp_path / "c" / f"s{suffix}").symlink_to(moved)
    for args in (["verify", "c/s"], ["pack", "c/s", "-L", 64, "-o", "o", "-q"]):
        r = cli_run(*args, cwd=tmp_path)
        _clear(r, f"'s{suffix}' is a symbolic link out of")
    assert not (tmp_path / "o").exists()
    # a link inside the folder is the user's own business: still read
    (tmp_path / "c" / f"s{suffix}").unlink()
    shutil.move(moved, tmp_path / "c" / f"real{suffix}")
    (tmp_path / "c" / f"s{suffix}").symlink_to(f"real{suffix}")
    assert cli_run("verify", "c/s", cwd=tmp_path).returncode == 0


# ------------------------------------------------------------------- --out (§4)
OUTS = {
    "tokenize": ["tokenize", "in.jsonl", "-t", TOKENIZER, "-q", "-o"],
    "pack": ["pack", "c", "-L", 64, "-q", "-o"],
    "export megatron": ["export", "c", "--format", "megatron", "-q", "-o"],
    "export parquet": ["export", "p", "--format", "parquet", "-q", "-o"],
    "export parquet file": ["export", "p", "--format", "parquet", "-q", "-o", "{}.parquet"],
    "export mds": ["export", "p", "--format", "mds", "-q", "-o"],
}


@pytest.mark.parametrize("command", slow_except(sorted(OUTS), "tokenize", "pack"))
def test_non_utf8_out_is_refused_by_every_command(tmp_path, built, command):
    """``export -o $'x\\xff'`` crashed in pyarrow with UnicodeEncodeError."""
    for name in ("in.jsonl", "c.json", "c.bin", "c.boundaries", ".c.part.json"):
        shutil.copy(built / name, tmp_path / name)
    run("pack", tmp_path / "c", "-L", 128, "-o", tmp_path / "p", "-q")
    args = list(OUTS[command])
    bad = "x\udcff"  # the bytes b"x\xff" as Python hands a non-UTF-8 argument over
    args = args[:-1] + [args[-1].format(bad)] if "{}" in str(args[-1]) else args + [bad]
    r = subprocess.run([sys.executable, "-m", "packtool", *[
        a if isinstance(a, bytes) else str(a).encode("utf-8", "surrogateescape") for a in args]],
        cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)})
    _clear(r, "is not valid UTF-8")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("x", ".x"))]


def test_out_of_the_root_is_refused(tmp_path, built):
    """``pack -o /`` raised ValueError (an empty name)."""
    r = cli_run("pack", built / "c", "-L", 64, "-o", "/", "-q")
    _clear(r, "--out / names no file or folder of its own")


# ------------------------------------------------------- -L beyond memory (§4)
@pytest.mark.parametrize("args", [["pack", "c", "-o", "o", "--algo", "optimal"],
                                  ["pack", "c", "-o", "o", "--algo", "bfd"],
                                  ["stats", "c", "--algos", "optimal"], ["stats", "c"]])
def test_seq_len_beyond_memory_is_refused_up_front(tmp_path, built, monkeypatch, args):
    """``stats -L 2147483647 --algos optimal`` was OOM-killed at 22 GB: the memory -L needs
    is computed before any table is made and refused with the figure."""
    import packtool.packers as packers

    monkeypatch.setattr(packers, "available_memory", lambda: 8 * 2**30)
    args = [built / "c" if a == "c" else tmp_path / "o" if a == "o" else a for a in args]
    r = run(*args, "-L", 2147483647)
    assert r.exit_code == 1, r.output
    assert "-L/--seq-len 2,147,483,647 needs about 128" in r.output and "8.0 GiB" in r.output
    assert ("DP table" in r.output) == ("optimal" in args)
    assert not (tmp_path / "o").exists()
    r = run(*args, "-L", 4096)  # what fits runs as before
    assert r.exit_code == 0, r.output


def test_seq_len_memory_is_measured_from_the_machine():
    from packtool.packers import BYTES_PER_SEQ_LEN, available_memory, check_seq_len_memory

    avail = available_memory()
    assert avail is None or avail > 0
    check_seq_len_memory(1 << 20, ["optimal"], available=(1 << 20) * BYTES_PER_SEQ_LEN + 4e8)
    with pytest.raises(packtool.PacktoolError, match="at most about 1,048,576 here"):
        check_seq_len_memory(1 << 21, ["bfd"], available=(1 << 20) * BYTES_PER_SEQ_LEN)


# --------------------------------------------- seq_len edited, seen without the sources
@pytest.mark.parametrize("layout", ["index", "tokens"])
def test_plain_verify_catches_an_edited_seq_len(tmp_path, built, layout):
    """seq_len doubled in index.json (digest recomputed) passed plain verify, refused only
    by verify --source: the figures derived from it (efficiency, L1) give it away, and when
    they are recomputed too, the pieces of a split document (cut every seq_len tokens)."""
    out = tmp_path / "p"
    assert run("pack", built / "c", "-L", 64, "--layout", layout, "-o", out, "-q"
               ).exit_code == 0
    i = json.loads((out / "index.json").read_text())
    assert i["n_split"] > 0
    i["seq_len"] *= 2
    i["index_sha256"] = index_digest(i)
    (out / "index.json").write_text(json.dumps(i))
    r = run("verify", out)
    assert r.exit_code == 1 and "efficiency" in r.output and "seq_len 128" in r.output, r.output
    i["efficiency"] = i["n_tokens"] / (i["n_packs"] * i["seq_len"])
    i["lower_bound_packs"] = -(-i["n_tokens"] // i["seq_len"])
    i["index_sha256"] = index_digest(i)
    (out / "index.json").write_text(json.dumps(i))
    r = run("verify", out)
    assert r.exit_code == 1 and "not a multiple of seq_len 128" in r.output, r.output


def test_crc32_engine_is_zlibs_and_a_wrong_one_is_refused(monkeypatch):
    """The fast CRC-32 (ISA-L where installed) gives zlib's value on every length and start;
    an engine that disagrees is not used (zlib's serves)."""
    import sys
    import types
    import zlib

    import numpy as np

    from packtool import _crc

    data = np.random.default_rng(7).integers(0, 256, 100_003, dtype=np.uint8).tobytes()
    for n in (0, 1, 7, 64, 4099, len(data)):
        for start in (0, 1, 0xFFFFFFFF):
            assert _crc.crc32(data[:n], start) == zlib.crc32(data[:n], start)
    h = _crc.Crc32()
    for i in range(0, len(data), 999):
        h.update(data[i:i + 999])
    assert h.hexdigest() == f"{zlib.crc32(data):08x}"
    try:  # the test extra installs it: the real one is proven equal and taken
        from isal import isal_zlib
    except ImportError:
        isal_zlib = None
    if isal_zlib is not None:
        assert _crc._fast_crc32() is isal_zlib.crc32
    wrong = types.ModuleType("isal")
    wrong.isal_zlib = types.SimpleNamespace(crc32=lambda b, c=0: zlib.crc32(b, c) ^ 1)
    monkeypatch.setitem(sys.modules, "isal", wrong)
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", wrong.isal_zlib)
    assert _crc._fast_crc32() is zlib.crc32
    monkeypatch.setitem(sys.modules, "isal", None)  # not installed
    assert _crc._fast_crc32() is zlib.crc32


def test_manifest_text_reads_back_as_written_and_keeps_lists_of_objects_a_line_each():
    """The manifest writer (C encoder per element) gives JSON that parses back to the value,
    non-ASCII as asked, and a list of objects as one line per element."""
    from packtool.formats._manifest import manifest_text

    value = {"format": "x", "n": 3, "ratio": 0.5, "none": None, "flag": True, "empty": {},
             "ids": [1, 2, 3], "nested": {"deeper": {"name": "café 東京"}}, "nil": [],
             "inputs": [{"path": f"/d/{i}.jsonl", "stats": {"records": i, "bad": []}}
                        for i in range(3)], "pairs": [[1, 2], [3, 4]]}
    for ascii_only in (True, False):
        text = manifest_text(value, ensure_ascii=ascii_only)
        assert text.endswith("}\n") and json.loads(text) == value
        assert ("café" in text) is (not ascii_only)
    lines = manifest_text(value).splitlines()
    assert ' {"path": "/d/1.jsonl", "stats": {"records": 1, "bad": []}},' in [
        line[1:] for line in lines]
    assert ' "ids": [1, 2, 3],' in lines
