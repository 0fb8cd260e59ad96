"""Issue 18, items 2.1-2.7: what a user owns is never replaced, written through or mixed.

Each test reproduces a report of the issue (the command it quotes, or the same situation from
Python) and checks the behaviour: refused, named, and nothing of the user's changed."""

import json
import os
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, TOKENIZER, run, slow, write_jsonl
from synth import make_documents
from warm import python

import packtool
from packtool.export import MARKER
from packtool.storage import flock as _locks


def snapshot(folder: Path) -> dict:
    """Every entry under ``folder`` (hidden ones too): name -> bytes, link target or 'dir'."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Inputs (3 files), a one-part corpus ``c``, a 3-part corpus ``m``, and packed datasets
    of ``c`` in both layouts (``p``: index, ``pt``: tokens)."""
    d = tmp_path_factory.mktemp("edges")
    docs = make_documents(600, seed=11, median_words=40, max_words=400)
    (d / "in").mkdir()
    for k in range(3):
        write_jsonl(d / "in" / f"f{k}.jsonl", [{"text": t} for t in docs[k * 200:(k + 1) * 200]])
    assert run("tokenize", d / "in" / "f0.jsonl", "-t", TOKENIZER, "-o", d / "c", "-q"
               ).exit_code == 0
    assert run("tokenize", d / "in", "-t", TOKENIZER, "-o", d / "m", "--part-bytes", 1, "-q"
               ).exit_code == 0
    for name, layout in (("p", "index"), ("pt", "tokens")):
        r = run("pack", d / "c", "-L", 128, "--shard-size", 4000, "--layout", layout, "-o",
                d / name, "-q")
        assert r.exit_code == 0, r.output
    return d


def copy_corpus(src: Path, dst: Path) -> Path:
    """A corpus's files (hidden part manifests too) under the prefix ``dst``."""
    meta = json.loads(Path(f"{src}.json").read_text())
    names = [q["name"] for q in meta["parts"]]
    stem = src.name
    for n in names:
        new = dst.name + n[len(stem):]
        for s in (".bin", ".boundaries", ".mask"):
            if Path(src.parent / f"{n}{s}").exists():
                shutil.copy(src.parent / f"{n}{s}", dst.parent / f"{new}{s}")
        hidden = src.parent / f".{n}.part.json"
        if hidden.exists():
            shutil.copy(hidden, dst.parent / f".{new}.part.json")
    shutil.copy(f"{src}.json", f"{dst}.json")
    return dst


def flip(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF  # same size: only a checksum can tell
    path.write_bytes(bytes(data))


# ---------------------------------------------------- 2.1: --overwrite only what is ours
def _site(tmp_path: Path, index: str | None) -> Path:
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "sub" / "a.txt").write_text("mine")
    (site / "page.html").write_text("keep")
    if index is not None:
        (site / "index.json").write_text(index)
    return site


@pytest.mark.parametrize("index", ["{}", "not json", None, "ours"])
def test_pack_overwrite_refuses_a_folder_that_is_not_ours(tmp_path, built, index):
    """The issue's command: ``mkdir -p site/sub; echo '{}' > site/index.json; echo keep >
    site/page.html; packtool pack c -L 64 -o site --overwrite`` removed page.html and sub/.
    ``ours``: a valid index.json of a real packed dataset, with its shards, beside the user's
    files: the index is ours, the other files are not."""
    site = _site(tmp_path, None if index == "ours" else index)
    if index == "ours":
        for f in (built / "p").iterdir():
            shutil.copy(f, site / f.name)
    before = snapshot(site)
    r = run("pack", built / "c", "-L", 64, "-o", site, "--overwrite")
    assert r.exit_code == 1, r.output
    assert "only replaces a previous packtool output" in r.output, r.output
    assert "page.html" in r.output and "sub" in r.output, r.output  # what is not ours
    assert snapshot(site) == before
    assert sorted(os.listdir(tmp_path)) == ["site"]  # no lock, staging or temporary left


def test_pack_array_task_overwrite_never_touches_a_foreign_folder(tmp_path, built):
    """``pack --tasks 2 --task 0 --overwrite`` deleted a user's index.json: a task refuses
    at once what --finalize would refuse, and writes nothing."""
    site = _site(tmp_path, '{"mine": 1}')
    before = snapshot(site)
    for args in (["--tasks", 2, "--task", 0], ["--tasks", 2, "--task", 1], ["--finalize"]):
        r = run("pack", built / "c", "-L", 64, "-o", site, "--overwrite", *args)
        assert r.exit_code == 1 and "only replaces a previous packtool output" in r.output, (
            args, r.output)
        assert snapshot(site) == before
    assert sorted(os.listdir(tmp_path)) == ["site"]


def test_pack_overwrite_replaces_our_own_dataset(tmp_path, built):
    """The positive case: a dataset of ours (its index lists every file) is replaced."""
    out = tmp_path / "p"
    shutil.copytree(built / "p", out)
    r = run("pack", built / "c", "-L", 64, "-o", out, "--overwrite", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "index.json").read_text())["seq_len"] == 64
    assert run("verify", out, "--source", built / "c").exit_code == 0


@pytest.mark.parametrize("marker", ["{}", "edited", "ours"])
def test_export_overwrite_refuses_a_folder_that_is_not_ours(tmp_path, built, marker):
    """``export --overwrite`` deleted a directory whose _packtool-export.json is ``{}``; an
    edited marker (digest no longer matches) or a real one beside the user's files is
    refused too, naming what is not ours."""
    out = tmp_path / "o"
    assert run("export", built / "c", "--format", "llmc", "--eos-id", 0, "-o", out, "-q"
               ).exit_code == 0
    path = out / MARKER
    if marker == "{}":
        path.write_text("{}")
    elif marker == "edited":
        body = json.loads(path.read_text())
        body["files"].append("page.html")
        path.write_text(json.dumps(body))
    (out / "page.html").write_text("keep")
    before = snapshot(out)
    r = run("export", built / "c", "--format", "llmc", "--eos-id", 0, "-o", out, "--overwrite")
    assert r.exit_code == 1 and "--overwrite" in r.output, r.output
    assert "refused" in r.output or "only replaces a previous packtool output" in r.output
    if marker == "ours":
        assert "page.html" in r.output
    assert snapshot(out) == before


def test_tokenize_overwrite_never_replaces_files_no_manifest_lists(tmp_path):
    """A user's c.bin (no packtool manifest vouches for it) is not replaced by --overwrite."""
    src = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello world"}])
    (tmp_path / "c.bin").write_bytes(b"mine")
    for extra in ([], ["--overwrite"]):
        r = run("tokenize", src, "-t", TOKENIZER, "-o", tmp_path / "c", *extra)
        assert r.exit_code == 1 and "no packtool manifest lists" in r.output, r.output
    assert (tmp_path / "c.bin").read_bytes() == b"mine"
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "c.bin"]


# ------------------------------------------------- 2.2: never through a symbolic link
def _record_locks(monkeypatch) -> list[Path]:
    seen: list[Path] = []
    real = _locks._open

    def spy(lock):
        seen.append(Path(lock))
        return real(lock)

    monkeypatch.setattr(_locks, "_open", spy)
    return seen


def _commands(built, out: Path) -> dict:
    return {
        "tokenize": ["tokenize", built / "in" / "f0.jsonl", "-t", TOKENIZER, "-o", out, "-q"],
        "tokenize-parts": ["tokenize", built / "in", "-t", TOKENIZER, "-o", out,
                           "--part-bytes", 1, "-q"],
        "tokenize-task": ["tokenize", built / "in", "-t", TOKENIZER, "-o", out,
                          "--part-bytes", 1, "-q", "--tasks", 2, "--task", 0],
        "pack": ["pack", built / "c", "-L", 128, "-o", out, "-q"],
        "pack-task": ["pack", built / "c", "-L", 128, "-o", out, "-q", "--tasks", 2,
                      "--task", 0],
        "export": ["export", built / "c", "--format", "llmc", "--eos-id", 0, "-o", out, "-q"],
    }


@pytest.mark.parametrize("command", ["tokenize", "tokenize-parts", "tokenize-task", "pack",
                                     "pack-task", "export"])
@pytest.mark.parametrize("plant", ["symlink", *slow("dangling", "hardlink", "file")])
def test_no_lock_is_ever_followed_or_truncated(tmp_path, built, monkeypatch, command, plant):
    """``ln -s ../victim.txt o/.C.lock; packtool tokenize ... -o o/C`` overwrote victim.txt;
    a dangling link created its target. Every lock a run takes (found by running it once),
    planted as a link to a user's file (or a user's own file at that name), is refused by
    name; the file is unchanged (never written, truncated or removed), a dangling link's
    target is never created."""
    first = tmp_path / "first"
    first.mkdir()
    seen = _record_locks(monkeypatch)
    r = run(*_commands(built, first / "C")[command])
    assert r.exit_code == 0, r.output
    names = sorted({p.name for p in seen if p.parent == first})
    assert names and all(n.startswith(".") and n.endswith(".lock") for n in names), names
    for name in names:
        d = tmp_path / f"t{names.index(name)}"
        (d / "o").mkdir(parents=True)
        victim = d / "victim.txt"
        victim.write_text("the user's data\n")
        lock = d / "o" / name
        if plant == "symlink":
            lock.symlink_to("../victim.txt")
        elif plant == "dangling":
            lock.symlink_to("../created.txt")
        elif plant == "hardlink":
            os.link(victim, lock)
        else:  # a user's own file at the name: it has content, packtool's locks never do
            lock.write_text("the user's data\n")
        r = run(*_commands(built, d / "o" / "C")[command])
        assert r.exit_code == 1, (name, r.output)
        assert name in r.output and ("symbolic link" in r.output
                                     or "not packtool's lock file" in r.output), r.output
        assert victim.read_text() == "the user's data\n", name
        assert not (d / "created.txt").exists(), name
        assert lock.is_symlink() == (plant in ("symlink", "dangling"))
        if plant == "file":
            assert lock.read_text() == "the user's data\n"


def test_a_lock_removed_by_its_holder_while_opened_is_opened_anew(tmp_path, monkeypatch):
    """The race CI hit with four ranks sharing a cache: a waiter opens the lock file, its
    holder releases (unlinks) it before the waiter looks at it; the waiter then sees a file of
    no link. That is a lock gone, not a user's file: it opens the name anew and waits on
    that."""
    lock = tmp_path / ".entry.lock"
    lock.touch()
    real = os.open
    calls = []

    def open_then_unlinked(path, flags, *mode):
        fd = real(path, flags, *mode)
        calls.append(path)
        if len(calls) == 1:
            os.unlink(path)  # the holder's release, between our open and our fstat
        return fd

    monkeypatch.setattr(_locks.os, "open", open_then_unlinked)
    with _locks.waiting(lock, "cache entry x"):
        monkeypatch.setattr(_locks.os, "open", real)
        assert lock.exists()
    assert len(calls) == 2 and not lock.exists()


def test_a_wait_on_another_thread_of_this_process_is_not_called_another_process(tmp_path,
                                                                                  capfd):
    """A cache entry fetched by one thread (a tokens-layout pack's source check) and wanted
    by another (its shard's copy) is waited for quietly; a holder in another process is
    named as one, and waited for too."""
    import threading

    lock = tmp_path / ".entry.lock"
    inside, done = threading.Event(), threading.Event()

    def first():
        with _locks.waiting(lock, "cache entry x"):
            inside.set()
            time.sleep(0.3)

    t = threading.Thread(target=first)
    t.start()
    inside.wait()
    with _locks.waiting(lock, "cache entry x"):  # waits for the thread, silently
        assert not t.is_alive()
    t.join()
    assert "another process" not in capfd.readouterr().err
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; "
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(0.5)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with _locks.waiting(lock, "cache entry x"):
            done.set()
    finally:
        holder.wait()
    assert done.is_set()
    assert "cache entry x is being written by another process" in capfd.readouterr().err


def test_temporaries_are_never_opened_through_a_link(tmp_path):
    """Files packtool creates (temporaries, journals, manifests) are opened O_EXCL |
    O_NOFOLLOW: a link planted at the name is an error, never written through."""
    from packtool._io import create

    victim = tmp_path / "victim.txt"
    victim.write_text("x")
    (tmp_path / ".o.bin.tmp-1-aaaaaa").symlink_to(victim)
    with pytest.raises(FileExistsError):
        create(tmp_path / ".o.bin.tmp-1-aaaaaa")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        create(tmp_path / "dangling")
    assert victim.read_text() == "x" and not (tmp_path / "nowhere").exists()


# -------------------------------------------------- 2.3: exports verify their sources
@pytest.mark.parametrize("args", [["--format", "megatron"], ["--format", "megatron", "--copy"],
                                  ["--format", "llmc", "--eos-id", "0"]])
@pytest.mark.parametrize("corpus", ["c", "m"])
def test_export_of_a_corrupt_corpus_fails_and_writes_nothing(tmp_path, built, args, corpus):
    src = copy_corpus(built / corpus, tmp_path / "src")
    part = json.loads(Path(f"{src}.json").read_text())["parts"][-1]["name"]
    flip(tmp_path / f"{'src' + part[len(corpus):]}.bin")
    before = set(os.listdir(tmp_path))
    r = run("export", src, *args, "-o", tmp_path / "out")
    assert r.exit_code == 1 and "sha256" in r.output and "corrupt" in r.output, r.output
    assert set(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("fmt", ["megatron", "mds", "parquet", "parquet-packed"])
@pytest.mark.parametrize("where", ["shard", "source"])
def test_export_of_a_corrupt_packed_dataset_fails(tmp_path, built, fmt, where):
    """A flipped byte in a shard (tokens layout) or in the source corpus an index-layout
    dataset reads its tokens from: the export fails before its output is committed."""
    if where == "shard":
        shutil.copytree(built / "pt", tmp_path / "d")
        flip(next((tmp_path / "d").glob("shard-00000.tokens.npy")), 300)
    else:
        (tmp_path / "d").mkdir()
        for f in built.iterdir():
            if f.is_file() and (f.name.startswith("c.") or f.name == ".c.part.json"):
                shutil.copy(f, tmp_path / f.name)
        for f in (built / "p").iterdir():
            shutil.copy(f, tmp_path / "d" / f.name)
        flip(tmp_path / "c.bin", 1000)
    before = set(os.listdir(tmp_path))
    r = run("export", tmp_path / "d", "--format", fmt, "-o", tmp_path / "out")
    assert r.exit_code == 1 and ("crc32" in r.output or "sha256" in r.output), r.output
    assert set(os.listdir(tmp_path)) == before


# ------------------------------------- 2.4: a multi-part corpus cannot be edited unseen
def _warm_packtool(root: Path, *args, check=True):
    """The probe's ``packtool`` (its set-up commands), forked warm (tests/warm.py)."""
    r = python(["-m", "packtool", *args], cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    if check and r.returncode:
        raise SystemExit(f"setup failed: packtool {' '.join(map(str, args))}\n{r.stderr}")
    return r


def _warm_judge(probe, root: Path, kind: str, path: Path, source: Path | None) -> dict:
    """The probe's ``judge``: the same checks, each a process of its own, forked warm one
    after the other instead of three fresh interpreters side by side (126 processes, ~1 s
    of CPU less each)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmds = {"load": ["-c", probe._READ[kind], root, path],
            "verify": ["-m", "packtool", "verify", path]}
    if source is not None:
        cmds["verify --source"] = [*cmds["verify"], "--source", source]
    return {k: python(c, cwd=root, env=env).returncode == 0 for k, c in cmds.items()}


def _probe():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tamper_probe",
                                                  ROOT / "scripts" / "tamper_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """Corpus A (4 parts) and B (4 other files, the same part names), as the probe builds
    them."""
    d = tmp_path_factory.mktemp("tamper")
    for name, seed in (("a", 1), ("b", 2)):
        docs = make_documents(160, seed=seed, median_words=30, max_words=200)
        (d / f"in-{name}").mkdir()
        for k in range(4):
            write_jsonl(d / f"in-{name}" / f"f{k}.jsonl",
                        [{"text": t} for t in docs[k * 40:(k + 1) * 40]])
        (d / name).mkdir()
        assert run("tokenize", d / f"in-{name}", "-t", TOKENIZER, "-o", d / name / "c",
                   "--part-bytes", 1, "-q").exit_code == 0
    return d


def _judge(prefix: Path) -> tuple[bool, bool]:
    """(loads and reads every document, passes packtool verify)."""
    try:
        c = packtool.open_tokens(prefix)
        for i in range(len(c)):
            np.asarray(c[i])
        loaded = True
    except packtool.PacktoolError:
        loaded = False
    return loaded, run("verify", prefix).exit_code == 0


@pytest.mark.parametrize("hidden", ["left", "edited", "removed"])
@pytest.mark.parametrize("tamper", ["zero-docs", "reorder", "duplicate", "drop", "swap",
                                    "counts", "vocab", "tokenizer"])
def test_tampered_corpus_is_refused(tmp_path, two_corpora, tamper, hidden):
    """Each tamper of scripts/tamper_probe.py with the totals, file checksums and the
    manifest's digest recomputed: reading refuses it, and so does verify, whatever was done
    to the parts' own manifests: left (they disagree), edited to agree (the corpus manifest
    records their digests), removed (a version-3 corpus requires them: the tokenizer's
    sha256 replaced passed with them removed or edited)."""
    tp = _probe()
    shutil.copytree(two_corpora / "a", tmp_path / "a")
    c, b = tp.Corpus(tmp_path / "a"), tp.Corpus(two_corpora / "b")
    original = json.loads(c.hidden(c.parts[0]["name"]).read_text())
    tp.TOKEN_TAMPERS[tamper](c, b)
    c.save(False, hidden, original)
    loaded, verified = _judge(tmp_path / "a" / "c")
    assert not loaded and not verified


def test_a_missing_part_manifest_is_refused_by_name(tmp_path, two_corpora):
    shutil.copytree(two_corpora / "a", tmp_path / "a")
    (tmp_path / "a" / ".c.part-00002.part.json").unlink()
    r = run("verify", tmp_path / "a" / "c")
    assert r.exit_code == 1 and ".c.part-00002.part.json is missing" in r.output, r.output
    assert "incomplete" in r.output


@pytest.mark.parametrize("tamper", ["reorder", "duplicate", "drop", "swap"])
def test_forged_parts_are_refused_while_their_own_manifests_remain(tmp_path, two_corpora,
                                                                    tamper):
    """Parts renumbered and renamed to their new positions and the plan digest recomputed:
    the parts' own manifests, written by the runs that made them, still refuse them, and
    with them removed the corpus is incomplete; only with them edited to agree and their
    digests recomputed in the corpus manifest (every digest of every file) does a different
    corpus pass: see the probe's docstring."""
    tp = _probe()
    for hidden in ("left", "removed", "edited"):
        d = tmp_path / hidden
        shutil.copytree(two_corpora / "a", d)
        c, b = tp.Corpus(d), tp.Corpus(two_corpora / "b")
        original = json.loads(c.hidden(c.parts[0]["name"]).read_text())
        tp.TOKEN_TAMPERS[tamper](c, b)
        c.save(True, hidden, original)
        loaded, verified = _judge(d / "c")
        if hidden != "edited" or tamper == "duplicate":
            assert not loaded and not verified, hidden
        else:  # a consistent corpus of other parts: the forgery the probe reports apart
            assert loaded and verified


@pytest.mark.slow
def test_tamper_probe_campaign(tmp_path):
    probe = _probe()
    probe.packtool = _warm_packtool
    probe.judge = partial(_warm_judge, probe)
    rows = probe.campaign(ROOT, tmp_path, log=lambda s: None)
    accepted = [(r["tamper"], r["hidden"]) for r in rows if r["accepted"] and not r["forgery"]]
    assert accepted == [], accepted


# ------------------------------------------- 2.5 / 2.6: inputs edited in place or mid-read
def _inputs(tmp_path: Path, n: int = 3) -> Path:
    d = tmp_path / "in"
    d.mkdir()
    docs = make_documents(60 * n, seed=21, median_words=30, max_words=200)
    for k in range(n):
        write_jsonl(d / f"f{k}.jsonl", [{"text": t} for t in docs[k * 60:(k + 1) * 60]])
    return d


def _edit_in_place(path: Path) -> None:
    """Same size, same modification time, other content: only the content hash can tell."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    i = data.index(b'"text": "') + 9
    data[i] = ord("Z") if data[i] != ord("Z") else ord("Y")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("how", ["killed before its manifest", *slow("--overwrite")])
def test_resume_redoes_a_part_whose_input_was_edited_in_place(tmp_path, how):
    """Resume treated an input edited in place as unchanged: a part is trusted only while its
    inputs' content hash (inputs[].content.crc32) still matches."""
    src = _inputs(tmp_path)
    out = tmp_path / "c"
    args = ["tokenize", src, "-t", TOKENIZER, "-o", out, "--part-bytes", 1, "--json"]
    assert run(*args).exit_code == 0
    _edit_in_place(src / "f1.jsonl")
    if how == "--overwrite":
        args.append("--overwrite")
    else:
        Path(f"{out}.json").unlink()
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_parts_skipped"] == 2  # f0 and f2: unchanged
    fresh = tmp_path / "fresh"
    assert run("tokenize", src, "-t", TOKENIZER, "-o", fresh, "--part-bytes", 1, "-q"
               ).exit_code == 0
    assert [np.asarray(d).tolist() for d in packtool.open_tokens(out)] == \
        [np.asarray(d).tolist() for d in packtool.open_tokens(fresh)]


@pytest.mark.parametrize("change", ["rewrite", *slow("append", "garbage", "replace", "remove")])
def test_input_changed_while_it_is_read_fails_naming_it(tmp_path, monkeypatch, change):
    """An input rewritten while it was tokenized gave a silent mix of old and new records:
    appended to, rewritten in place (same size; valid records, or bytes that are not), replaced
    by a rename or removed after its first record was read, the run fails naming the file as
    changed (not a bad record of it) and writes nothing."""
    from packtool.tokenize import pipeline

    src = _inputs(tmp_path)
    victim = src / "f1.jsonl"
    real = pipeline.iter_documents

    def reading(path, *a, **k):
        for i, record in enumerate(real(path, *a, **k)):
            if i == 1 and Path(path) == victim:
                if change == "append":
                    with open(victim, "a") as f:
                        f.write(json.dumps({"text": "late"}) + "\n")
                elif change in ("rewrite", "garbage"):
                    data = victim.read_bytes()
                    time.sleep(0.01)  # a coarse clock still ticks
                    victim.write_bytes(data.replace(b"e", b"o") if change == "rewrite"
                                       else data[::-1])
                elif change == "remove":
                    victim.unlink()
                else:
                    (src / "new").write_bytes(victim.read_bytes())
                    os.replace(src / "new", victim)
            yield record

    monkeypatch.setattr(pipeline, "iter_documents", reading)
    r = run("tokenize", src, "-t", TOKENIZER, "-o", tmp_path / "out" / "c", "--batch-size", 4)
    assert r.exit_code == 1, r.output
    assert f"{victim} changed while it was being tokenized" in r.output, r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_input_appended_by_another_process_mid_run(tmp_path):
    """The same with a real writer: a process appends to an input while a slowed tokenize
    reads it."""
    src = _inputs(tmp_path, 1)
    victim = src / "f0.jsonl"
    slow = ("import sys, time\nfrom packtool.tokenize import pipeline\n"
            "real, marker = pipeline.iter_documents, sys.argv[1] + '.reading'\n"
            "def slow(*a, **k):\n"
            "    for i, r in enumerate(real(*a, **k)):\n"
            "        if i == 2:\n"
            "            open(marker, 'w').close()\n"
            "            time.sleep(3)\n"
            "        yield r\n"
            "pipeline.iter_documents = slow\n"
            "sys.argv = ['packtool'] + sys.argv[2:]\n"
            "from packtool.cli import main\nmain()\n")
    proc = subprocess.Popen([sys.executable, "-c", slow, str(victim), "tokenize", str(victim),
                             "-t", str(TOKENIZER), "-o", str(tmp_path / "c"), "--batch-size",
                             "2"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stderr=subprocess.PIPE, text=True)
    while not Path(f"{victim}.reading").exists():
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.01)
    writer = subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1], 'a')"
                             ".write('{\"text\": \"appended\"}\\n')", str(victim)])
    assert writer.returncode == 0
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 1 and f"{victim} changed while it was being tokenized" in err, err
    assert not list(tmp_path.glob("c*")) and not list(tmp_path.glob(".c*"))
    Path(f"{victim}.reading").unlink()


# ------------------------------------------------ 2.7: one writer per output, real processes
_PAUSED = """
import os, sys, time
ready, go = sys.argv[1], sys.argv[2]
def pause():
    if not os.path.exists(ready):
        open(ready, "w").close()
        while not os.path.exists(go):
            time.sleep(0.01)
import packtool.pack.shards as pj
import packtool.tokenize.stage as stage
write_shard, run_part = pj.write_shard, stage.run_task
def shard(job, tick):
    pause()
    return write_shard(job, tick)
def part(job, tick):
    pause()
    return run_part(job, tick)
pj.write_shard, stage.run_task = shard, part
sys.argv = ["packtool"] + sys.argv[3:]
from packtool.cli import main
main()
"""


class Paused:
    """``packtool ARGS`` in another process, held inside its first job (a shard or a part)
    until :meth:`release`: the lock it holds then is what other writers meet."""

    def __init__(self, tmp_path: Path, *args):
        self.ready, self.go = tmp_path / f"ready-{id(self)}", tmp_path / f"go-{id(self)}"
        self.proc = subprocess.Popen([sys.executable, "-c", _PAUSED, str(self.ready),
                                      str(self.go), *map(str, args)],
                                     env={**os.environ, "PYTHONPATH": str(ROOT)},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not self.ready.exists():
            assert self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.01)

    def release(self) -> tuple[int, str]:
        self.go.touch()
        err = self.proc.communicate(timeout=300)[1]
        self.ready.unlink()
        self.go.unlink()
        return self.proc.returncode, err


@pytest.mark.slow
def test_a_local_pack_and_array_tasks_never_write_one_output_at_once(tmp_path, built):
    """A local pack and an array-task pack both exited 0 and the result failed verify: each
    waits on the other's lock; tasks of one plan run together, a task of another plan is
    refused while one is in progress."""
    out, base = tmp_path / "p", ["pack", built / "c", "-L", 64, "--shard-size", 3000, "-q"]
    task0 = Paused(tmp_path, *base, "-o", out, "--tasks", 2, "--task", 0)
    r = run(*base, "-o", out)
    assert r.exit_code == 1 and f"another packtool run (pid {task0.proc.pid}" in r.output, \
        r.output
    r = run(*base, "-o", out, "--finalize")
    assert r.exit_code == 1 and f"pid {task0.proc.pid}" in r.output, r.output
    r = run("pack", built / "c", "-L", 128, "-q", "-o", out, "--tasks", 2, "--task", 1)
    assert r.exit_code == 1 and "being assembled from another plan" in r.output, r.output
    assert run(*base, "-o", out, "--tasks", 2, "--task", 1).exit_code == 0  # same plan: fine
    assert task0.release()[0] == 0
    assert run(*base, "-o", out, "--finalize").exit_code == 0
    assert run("verify", out, "--source", built / "c").exit_code == 0
    # the other way round: a local run in progress refuses every task and --finalize
    local = Paused(tmp_path, *base, "-o", out, "--overwrite", "-L", 128)
    for extra in (["--tasks", 2, "--task", 0], ["--finalize"]):
        r = run(*base, "-o", out, "--overwrite", *extra)
        assert r.exit_code == 1 and f"another packtool run (pid {local.proc.pid}" in r.output, \
            (extra, r.output)
    assert local.release()[0] == 0
    assert json.loads((out / "index.json").read_text())["seq_len"] == 128
    assert run("verify", out, "--source", built / "c").exit_code == 0
    assert sorted(os.listdir(tmp_path)) == ["p"]


def test_tokenize_tasks_of_another_plan_are_refused(tmp_path, built):
    base = ["tokenize", built / "in", "-t", TOKENIZER, "-o", tmp_path / "c", "--part-bytes", 1,
            "-q"]
    assert run(*base, "--tasks", 2, "--task", 0).exit_code == 0
    r = run(*base, "--eos", "<|eos|>", "--tasks", 2, "--task", 1)
    assert r.exit_code == 1 and "being written from another plan" in r.output, r.output
    r = run(*base, "--eos", "<|eos|>", "--tasks", 2, "--task", 1, "--overwrite")
    assert r.exit_code == 1 and "another plan" in r.output  # only a whole run may discard it
    task = Paused(tmp_path, *base, "--tasks", 2, "--task", 1)
    r = run(*base)  # a whole run meets the task's shared lock
    assert r.exit_code == 1 and f"another packtool run (pid {task.proc.pid}" in r.output
    assert task.release()[0] == 0
    assert run(*base, "--finalize").exit_code == 0
    assert run("verify", tmp_path / "c").exit_code == 0


@pytest.mark.slow
def test_an_array_task_overwrite_retires_the_old_manifest_before_any_part(tmp_path):
    """An array task with --overwrite over a finished corpus left the old PREFIX.json over
    its new part files: the old manifest stays valid until the task's first part commit,
    which takes it away (journaled); --finalize writes the new one."""
    src = _inputs(tmp_path)
    out = tmp_path / "c"
    base = ["tokenize", src, "-t", TOKENIZER, "-o", out, "--part-bytes", 1, "-q"]
    assert run(*base).exit_code == 0
    with open(src / "f0.jsonl", "a") as f:  # part 0 (task 0's) changes
        f.write(json.dumps({"text": "one more record"}) + "\n")
    task = Paused(tmp_path, *base, "--tasks", 2, "--task", 0, "--overwrite")
    assert run("verify", out).exit_code == 0  # nothing committed yet: the old corpus holds
    assert task.release()[0] == 0
    assert not Path(f"{out}.json").exists()  # gone with the first new part, never beside it
    r = run("verify", out)
    assert r.exit_code == 1 and "c.json" in r.output
    assert run(*base, "--tasks", 2, "--task", 1, "--overwrite").exit_code == 0
    assert run(*base, "--finalize").exit_code == 0
    assert run("tokenize", src, "-t", TOKENIZER, "-o", tmp_path / "fresh", "--part-bytes", 1,
               "-q").exit_code == 0
    assert [np.asarray(d).tolist() for d in packtool.open_tokens(out)] == \
        [np.asarray(d).tolist() for d in packtool.open_tokens(tmp_path / "fresh")]


_READER = """
import hashlib, json, os, sys
prefix, stop = sys.argv[1], sys.argv[2]
seen = {"consistent": 0, "changed while read": 0, "no manifest": 0, "inconsistent": 0}
def state():
    st = os.stat(prefix + ".json")
    with open(prefix + ".json", "rb") as f:
        return st.st_ino, st.st_mtime_ns, f.read()
while not os.path.exists(stop):
    try:
        before = state()
    except FileNotFoundError:
        seen["no manifest"] += 1
        continue
    part = json.loads(before[2])["parts"][0]
    good = True
    for key, want in part["checksums"].items():
        try:
            with open(f"{prefix}.{key}", "rb") as f:
                good &= hashlib.sha256(f.read()).hexdigest() == want["sha256"]
        except FileNotFoundError:
            good = False
    try:
        same = state() == before
    except FileNotFoundError:
        same = False
    seen["changed while read" if not same else "consistent" if good else "inconsistent"] += 1
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_a_reader_never_sees_new_data_under_the_old_manifest(tmp_path):
    """A one-part tokenize --overwrite let a concurrent reader see the new .bin with the old
    manifest. A reader process checks, as fast as it can, that whenever PREFIX.json stayed
    the same file while it hashed the data files, they are the files it names; a writer
    replaces the corpus back and forth meanwhile."""
    src = _inputs(tmp_path, 1)
    out = tmp_path / "c"
    base = ["tokenize", src / "f0.jsonl", "-t", TOKENIZER, "-o", out, "-q", "--overwrite"]
    assert run(*base).exit_code == 0
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(out), str(stop)],
                              stdout=subprocess.PIPE, text=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in range(6):  # two different corpora, in turn
        subprocess.run([sys.executable, "-m", "packtool", *map(str, base),
                        *(["--eos", "<|eos|>"] if k % 2 == 0 else [])], env=env, check=True)
    stop.touch()
    seen = json.loads(reader.communicate(timeout=60)[0])
    assert seen["inconsistent"] == 0 and seen["consistent"] > 0, seen


@pytest.mark.parametrize("change", ["added", *slow("removed")])
def test_parts_reused_by_a_new_plan_open(tmp_path, change):
    """An input added to (or removed from) a folder makes a new plan whose other parts are
    reused as they are: their own manifests named the old plan, and the corpus could not be
    opened. They move to the new plan with the commit of PREFIX.json."""
    src = _inputs(tmp_path)
    base = ["tokenize", src, "-t", TOKENIZER, "-o", tmp_path / "c", "--part-bytes", 1]
    assert run(*base, "-q").exit_code == 0
    if change == "added":
        write_jsonl(src / "f3.jsonl", [{"text": "a fourth file"}])
    else:
        (src / "f2.jsonl").unlink()
    r = run(*base, "--overwrite", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_parts_skipped"] == 2 + (change == "added")
    assert run("verify", tmp_path / "c").exit_code == 0
    assert len(packtool.open_tokens(tmp_path / "c").parts) == 3 + (change == "added") - (
        change == "removed")
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n or n.endswith(
        (".lock", ".journal"))]
