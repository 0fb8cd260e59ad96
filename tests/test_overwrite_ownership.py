"""Issue 18, 2.1 and 2.2 (what the audit found still open): --overwrite replaces only what is
provably packtool's own output, and nothing is written through a planted link.

- an export of single files (Megatron ``m.bin``/``m.idx``, one ``x.parquet``) carries a
  hidden sidecar ``.KEY.export.json`` listing them; without it (or with them changed) a
  user's files at those names are refused, by name, and left as they were;
- ``tokenize --overwrite`` replaces ``c.json`` only when it is a valid token manifest;
- a hidden ``.X.lock`` or ``.X.tmp-PID-HEX`` in a packed output is ours only when shaped as
  packtool's own (an empty lock file; a temporary of a dead pid);
- an array task's staging folder that is a symbolic link is refused before any write.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TOKENIZER, run, write_jsonl
from synth import make_documents


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A corpus ``c`` and its packed dataset ``p``."""
    d = tmp_path_factory.mktemp("owned")
    docs = make_documents(120, seed=5, median_words=30, max_words=200)
    write_jsonl(d / "in.jsonl", [{"text": t} for t in docs])
    assert run("tokenize", d / "in.jsonl", "-t", TOKENIZER, "-o", d / "c", "-q").exit_code == 0
    assert run("pack", d / "c", "-L", 128, "-o", d / "p", "-q").exit_code == 0
    return d


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


EXPORTS = {  # format, source, --out, the files it writes
    "megatron": ("megatron", "c", "u/m", ["m.bin", "m.idx"]),
    "megatron-packed": ("megatron", "p", "u/m", ["m.bin", "m.idx"]),
    "parquet": ("parquet", "p", "u/x.parquet", ["x.parquet"]),
    "parquet-packed": ("parquet-packed", "p", "u/x.parquet", ["x.parquet"]),
}


@pytest.mark.parametrize("case", sorted(EXPORTS))
def test_export_overwrite_never_replaces_a_users_files(tmp_path, built, case):
    fmt, src, out, names = EXPORTS[case]
    (tmp_path / "u").mkdir()
    for n in names:  # the user's own files at the export's names
        (tmp_path / "u" / n).write_text("mine\n")
    r = run("export", built / src, "--format", fmt, "-o", tmp_path / out, "--overwrite", "-q")
    assert r.exit_code == 1, r.output
    assert "--overwrite refused" in r.output and names[0] in r.output
    assert "Traceback" not in r.output
    for n in names:
        assert (tmp_path / "u" / n).read_text() == "mine\n"


@pytest.mark.parametrize("case", sorted(EXPORTS))
def test_export_overwrite_replaces_its_own_export_only_while_unchanged(tmp_path, built, case):
    fmt, src, out, names = EXPORTS[case]
    args = ["export", built / src, "--format", fmt, "-o", tmp_path / out, "-q"]
    assert run(*args).exit_code == 0
    key = names[0] if fmt.startswith("parquet") else "m"
    assert (tmp_path / "u" / f".{key}.export.json").is_file()
    assert run(*args, "--overwrite").exit_code == 0, "its own export is replaced"
    victim = tmp_path / "u" / names[-1]
    victim.unlink()
    victim.write_text("mine now\n")  # the user's file where the export was
    r = run(*args, "--overwrite")
    assert r.exit_code == 1 and "changed since packtool exported it" in r.output, r.output
    assert victim.read_text() == "mine now\n"


def test_tokenize_overwrite_replaces_only_a_token_manifest(tmp_path, built):
    (tmp_path / "c.json").write_text('{"mine":1}')
    args = ["tokenize", built / "in.jsonl", "-t", TOKENIZER, "-o", tmp_path / "c", "-q"]
    r = run(*args, "--overwrite")
    assert r.exit_code == 1 and "not a packtool token manifest" in r.output, r.output
    assert (tmp_path / "c.json").read_text() == '{"mine":1}'
    assert not (tmp_path / "c.bin").exists()
    # a token manifest whose digest no longer matches is not provably ours either
    (tmp_path / "c.json").unlink()
    assert run(*args).exit_code == 0
    text = (tmp_path / "c.json").read_text().replace('"n_empty": 0', '"n_empty": 0 ', 1)
    (tmp_path / "c.json").write_text(text.replace('"created_by": "', '"created_by": "x', 1))
    r = run(*args, "--overwrite")
    assert r.exit_code == 1 and "manifest_sha256" in r.output, r.output
    (tmp_path / "c.json").unlink()
    assert run(*args).exit_code == 0
    assert run(*args, "--overwrite").exit_code == 0  # its own manifest: replaced


@pytest.mark.parametrize("name,content,refused", [
    (".notes.lock", "my notes\n", True),      # a user's file with content: not a lock of ours
    (".notes.lock", "", False),               # an empty regular file: shaped as our locks
    (".shard-00000.tmp-{live}-abcdef", "x", True),   # a live process's: not a leftover
    (".shard-00000.tmp-{dead}-abcdef", "x", False),  # a dead run's temporary: reclaimed
    (".notes.tmp", "x", True),                # not of packtool's naming
])
def test_pack_overwrite_hidden_files_are_ours_only_with_proof(tmp_path, built, name, content,
                                                               refused):
    out = tmp_path / "p"
    assert run("pack", built / "c", "-L", 128, "-o", out, "-q").exit_code == 0
    name = name.format(live=os.getppid(), dead=_dead_pid())
    (out / name).write_text(content)
    r = run("pack", built / "c", "-L", 128, "-o", out, "-q", "--overwrite")
    if refused:
        assert r.exit_code == 1 and name in r.output, r.output
        assert (out / name).read_text() == content
    else:
        assert r.exit_code == 0, r.output
        assert not (out / name).exists()


def test_pack_overwrite_refuses_a_lock_name_that_is_a_link(tmp_path, built):
    out = tmp_path / "p"
    assert run("pack", built / "c", "-L", 128, "-o", out, "-q").exit_code == 0
    (tmp_path / "victim.lock").write_text("")
    (out / ".v.lock").symlink_to(tmp_path / "victim.lock")
    r = run("pack", built / "c", "-L", 128, "-o", out, "-q", "--overwrite")
    assert r.exit_code == 1 and ".v.lock" in r.output, r.output
    assert (out / ".v.lock").is_symlink()


def test_array_task_refuses_a_symlinked_staging_folder(tmp_path, built):
    """``pack --tasks 2 --task 0`` wrote its shards into the target of a staging folder that
    was a symbolic link."""
    out = tmp_path / "q"
    args = ["pack", built / "c", "-L", 128, "-o", out, "-q", "--tasks", 2, "--task", 0]
    assert run(*args).exit_code == 0
    staging = next(tmp_path.glob(".q.staging-*"))
    for p in staging.iterdir():
        p.unlink()
    staging.rmdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    staging.symlink_to(victim)
    r = run(*args)
    assert r.exit_code == 1 and "symbolic link" in r.output and staging.name in r.output
    assert list(victim.iterdir()) == []
    r = run("pack", built / "c", "-L", 128, "-o", out, "-q", "--finalize")
    assert r.exit_code == 1 and "symbolic link" in r.output
    assert list(victim.iterdir()) == [] and not Path(out).exists()
