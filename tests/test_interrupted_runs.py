"""Faults (issue 10, items 4-7): full disks, kills at every step of a commit, concurrent runs,
leftovers of dead runs, signals with a busy worker; and a small fault-injection campaign
(scripts/fault_inject.py runs the full one)."""

import errno
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from conftest import ROOT, TOKENIZER, run, slow, write_jsonl
from synth import make_documents
from warm import SUBPROCESS, python

from packtool import _signals
from packtool.storage import atomic as _atomic

_cli = partial(run, catch_exceptions=False)


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    docs = make_documents(3000, seed=5, median_words=60, max_words=800)
    src = write_jsonl(d / "c.jsonl", [{"text": t} for t in docs])
    r = _cli("tokenize", src, "-t", TOKENIZER, "-o", d / "tok", "-q")
    assert r.exit_code == 0, r.output
    return {"jsonl": src, "tok": d / "tok"}


def _tokenize_args(corpus, out):
    return ["tokenize", corpus["jsonl"], "-t", TOKENIZER, "-o", out, "-q"]


def _pack_args(corpus, out):
    return ["pack", corpus["tok"], "-L", "256", "--shard-size", "30000", "-o", out, "-q"]


def _hidden(d: Path) -> list[str]:
    """Hidden files other than the parts' own manifests (``.NAME.part.json``, kept beside a
    finished part so that a re-run can skip it: see docs/SCALE.md)."""
    return sorted(p.name for p in d.iterdir()
                  if p.name.startswith(".") and not p.name.endswith(".part.json"))


def _verified(path) -> bool:
    return _cli("verify", path).exit_code == 0


# ------------------------------------------------------------------------ 4: full disk
@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.parametrize("command", ["tokenize", "pack"])
def test_full_tmpfs_names_the_output_and_leaves_nothing(small_disk, corpus, command):
    out = small_disk / "out"
    args = _tokenize_args(corpus, out) if command == "tokenize" else _pack_args(corpus, out)
    r = _cli(*args)
    assert r.exit_code == 1, r.output
    assert f"no space left on device for {out}: it needs" in r.output, r.output
    assert "bytes are free on its file system" in r.output and ".tmp-" not in r.output
    assert list(small_disk.iterdir()) == []


@pytest.mark.parametrize(("command", "where"),
                         [("tokenize", "write"), ("pack", "write"), ("pack", "space-check")])
def test_enospc_from_write_or_space_check(tmp_path, corpus, monkeypatch, command, where):
    """ENOSPC from a plain write() (token files, pack's small arrays) or from the look before
    a large streamed file (the tokens layout's token files): the same clear error, naming
    the output, and nothing left."""
    from packtool import _io

    if where == "space-check":
        real_usage = shutil.disk_usage

        def usage(path):  # a full disk
            u = real_usage(path)
            return type(u)(u.total, u.total, 0)
        monkeypatch.setattr(_io.shutil, "disk_usage", usage)
    else:
        real, calls = _io.HashingWriter.write, []

        def write(self, array):
            calls.append(1)
            if len(calls) == 3:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(self, array)
        monkeypatch.setattr(_io.HashingWriter, "write", write)
    out = tmp_path / "out"
    args = _tokenize_args(corpus, out) if command == "tokenize" else _pack_args(corpus, out)
    if where == "space-check":  # the tokens layout streams whole token files
        args.append("--layout=tokens")
    r = _cli(*args)
    assert r.exit_code == 1
    assert f"no space left on device for {out}: it needs" in r.output, r.output
    assert ".tmp-" not in r.output
    assert os.listdir(tmp_path) == []


# --------------------------------------------------- 5: lock, commits, concurrent runs
def _hold_lock(out: Path) -> subprocess.Popen:
    code = ("import sys, time\nfrom packtool.storage.atomic import output_lock\n"
            "with output_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], env=_env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("command", ["tokenize", "pack"])
def test_second_run_fails_at_once_naming_the_holder(tmp_path, corpus, command):
    out = tmp_path / "out"
    args = _tokenize_args(corpus, out) if command == "tokenize" else _pack_args(corpus, out)
    holder = _hold_lock(out)
    try:
        r = _cli(*args)
        assert r.exit_code == 1
        assert f"being written by another packtool run (pid {holder.pid}" in r.output, r.output
    finally:
        holder.kill()
        holder.wait()
    assert not out.exists() and not Path(f"{out}.json").exists()
    r = _cli(*args)  # a lock left by a killed holder is free again
    assert r.exit_code == 0, r.output
    assert _hidden(tmp_path) == []


def test_two_concurrent_runs_one_wins_nothing_mixed(tmp_path, corpus):
    out = tmp_path / "out"
    procs = [subprocess.Popen([sys.executable, "-m", "packtool",
                               *map(str, _tokenize_args(corpus, out))], env=_env(),
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.communicate()[1], p.returncode)[::-1] for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 1], results
    err = next(e for rc, e in results if rc == 1)
    assert "being written by another packtool run" in err or "already exists" in err, err
    assert _verified(out) and _hidden(tmp_path) == []


_KILL_AT = """
import os, sys
k, real, n = int(sys.argv[1]), os.replace, [0]
out = os.path.basename(sys.argv[sys.argv.index("-o") + 1])
def replace(a, b):
    # the output's own renames (its files, their asides, a folder's swap), not the renames
    # of the shards into the folder being assembled
    if os.path.basename(str(b)).lstrip(".").startswith(out):
        n[0] += 1
        if n[0] == k:
            os._exit(9)  # SIGKILL-like: no cleanup of any kind
    real(a, b)
os.replace = replace
import packtool.storage.atomic as atomic
if sys.argv[2] == "noexchange":
    atomic.EXCHANGE = False
else:
    real_exchange = atomic._exchange
    def exchange(a, b):
        real_exchange(a, b)
        os._exit(9)  # right after the swap: the old output is under the temporary name
    atomic._exchange = exchange
sys.argv = ["packtool"] + sys.argv[3:]
from packtool.cli import main
main()
"""


def _killed_at(k: int, args, exchange=True) -> int:
    """The exit code of a run killed at its k-th rename (a process forked warm: see
    tests/warm.py; up to 9 a test)."""
    return python(["-c", _KILL_AT, k, "exchange" if exchange else "noexchange", *args],
                  env=_env()).returncode


def _digest(paths) -> list[bytes]:
    return [p.read_bytes() if p.exists() else None for p in paths]


@pytest.mark.parametrize("overwrite", [*slow(False), True])
def test_tokenize_killed_at_every_rename_recovers(tmp_path, corpus, overwrite):
    """A kill at each rename of the commit: a manifest, when there is one, names complete data
    (the old or the new); the re-run succeeds without cleanup and leaves nothing behind."""
    out = tmp_path / "out"
    files = [Path(f"{out}{s}") for s in (".bin", ".boundaries", ".json")]
    args = _tokenize_args(corpus, out) + (["--overwrite"] if overwrite else [])
    for k in range(1, 10):
        if overwrite:
            assert _cli(*_tokenize_args(corpus, out), "--overwrite").exit_code == 0
        rc = _killed_at(k, args)
        if rc == 0:
            break  # past the last rename
        assert rc == 9
        if files[2].exists():
            assert _verified(out)
        again = overwrite or files[2].exists()  # an interrupted --overwrite puts the old back
        r = _cli(*_tokenize_args(corpus, out), *(["--overwrite"] if again else []))
        assert r.exit_code == 0, (k, r.output)
        assert _verified(out) and _hidden(tmp_path) == [], k
        if not overwrite:
            for p in files:
                p.unlink()
    # killed at every rename of the part's commit and the manifest's, until a run completes
    assert rc == 0 and k > 2


@pytest.mark.slow
@pytest.mark.parametrize("exchange", [True, False])
def test_pack_overwrite_killed_mid_commit_never_loses_both(tmp_path, corpus, exchange):
    """Killed at the swap (RENAME_EXCHANGE) or at each rename of the fallback: the old or the
    new output is in place, or the old one is aside and the next run puts it back."""
    out = tmp_path / "p"
    assert _cli(*_pack_args(corpus, out)).exit_code == 0
    old = _digest(sorted(out.iterdir()))
    for k in range(1, 5):
        rc = _killed_at(k, [*_pack_args(corpus, out), "-L", "128", "--overwrite"], exchange)
        if rc == 0:
            break
        assert rc == 9
        r = _cli(*_pack_args(corpus, out))  # no --overwrite: recovers, then refuses
        assert "is not empty" in r.output, r.output
        assert _verified(out), k
        seq_len = json.loads((out / "index.json").read_text())["seq_len"]
        assert seq_len == (128 if exchange else 256)  # the new one after the swap, else old
        assert _hidden(tmp_path) == [], k
        if seq_len == 256:
            assert _digest(sorted(out.iterdir())) == old
        if exchange:
            break
    # exchange: one swap; fallback: the journal, old aside, new in (then it finishes)
    assert k == (1 if exchange else 4)


# ---------------------------------------------------------------- 6: stale temporaries
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_runs_are_reclaimed(tmp_path, corpus):
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / f".out.bin.tmp-{dead}-a1b2c3").write_bytes(b"x" * 1000)
        (tmp_path / f".out.json.tmp-{dead}-a1b2c3").write_bytes(b"y" * 234)
        (tmp_path / f".p.tmp-{dead}-0d0e0f").mkdir()
        (tmp_path / f".p.tmp-{dead}-0d0e0f" / "shard-00000.tokens.npy").write_bytes(b"z" * 5000)
        kept = tmp_path / f".out.bin.tmp-{live.pid}-ffffff"
        kept.write_bytes(b"w")
        r = _cli(*_tokenize_args(corpus, tmp_path / "out")[:-1])  # not -q: the summary
        assert r.exit_code == 0
        res = _cli(*_pack_args(corpus, tmp_path / "p")[:-1], "--json")
        assert f"reclaimed 1,234 bytes of temporary files beside {tmp_path / 'out'}" \
            in r.output, r.output
        assert f"(pid {dead})" in r.output
        warnings = json.loads(res.stdout)["warnings"]  # stderr repeats them, one a line
        assert any("reclaimed 5,000 bytes" in w for w in warnings), warnings
        assert _hidden(tmp_path) == [kept.name]  # a live process's file is not touched
    finally:
        live.kill()
        live.wait()


# -------------------------------------------------------------------------- 7: signals
_SLOW_WORKER = """
import sys, time
import packtool.tokenize.prepare as t
real = t.make_encoder
def make_encoder(*a, **k):
    def encode(texts, *rest):
        time.sleep(60)  # a runaway tokenizer call or template
    return encode
t.make_encoder = make_encoder
sys.argv = ["packtool"] + sys.argv[1:]
from packtool.cli import main
main()
"""


@pytest.mark.parametrize("sig", [*slow(signal.SIGTERM), signal.SIGINT])
def test_busy_worker_does_not_delay_shutdown(tmp_path, corpus, sig):
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WORKER,
                             *map(str, _tokenize_args(corpus, tmp_path / "out")), "-j", "1"],
                            env=_env(), stderr=subprocess.PIPE, text=True)
    while not list(tmp_path.glob(".out.tmp-*/out.bin")):  # the part being written
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    time.sleep(0.5)  # the worker is asleep inside "encode"
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        err = proc.communicate(timeout=30)[1]  # the worker sleeps 60 s
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the run waited for its busy worker thread")
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), err
    assert time.monotonic() - t0 < 30
    assert "no output was written" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("step", [1, 2])  # a re-run reuses the verified part: only the
def test_signal_during_commit_undoes_it(tmp_path, corpus, monkeypatch, step):
    """A signal that arrives between two renames of a commit is deferred, the commit undone,
    then the run ends: the previous output is intact and nothing else is left."""
    from packtool.tokenize import TokenizeOptions, tokenize_files

    out = tmp_path / "out"
    assert _cli(*_tokenize_args(corpus, out)).exit_code == 0
    before = _digest([Path(f"{out}{s}") for s in (".bin", ".boundaries", ".json")])
    monkeypatch.setattr(_signals, "received", [])
    real, n = os.replace, [0]

    def replace(a, b):
        n[0] += 1
        if n[0] == step:
            with _signals.deferred():
                _signals._on_signal(signal.SIGTERM, None)  # as if delivered right here
        real(a, b)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(_signals.Terminated):
        tokenize_files([str(corpus["jsonl"])], TOKENIZER, out,
                       TokenizeOptions(overwrite=True, batch_size=16))
    assert n[0] > step
    assert _digest([Path(f"{out}{s}") for s in (".bin", ".boundaries", ".json")]) == before
    assert _hidden(tmp_path) == []


@pytest.mark.parametrize("where", ["_retire", "_remove_stale_parts"])
def test_signal_beside_an_overwrite_leaves_nothing(tmp_path, corpus, monkeypatch, where):
    """fault_inject.py found it: a SIGTERM just after an --overwrite wrote
    ``.out.retired.json`` (before the run's clean-up handler was in force) ended the run
    with it left. A signal right after the retired manifest is written, or right after the
    new manifest is in place (while the old parts, the plan and the retired manifest are
    being removed): the run ends by it, the output is whole and verifies, nothing else is
    left."""
    from packtool.tokenize import TokenizeOptions, stage, tokenize_files

    out = tmp_path / "out"
    assert _cli(*_tokenize_args(corpus, out)).exit_code == 0
    monkeypatch.setattr(_signals, "received", [])
    real = getattr(stage, where)

    def then_signal(*args):
        if where == "_retire":
            real(*args)
        assert (tmp_path / ".out.retired.json").exists()  # what the run must not leave
        _signals._on_signal(signal.SIGTERM, None)  # delivered right here
        if where != "_retire":
            return real(*args)
        return None
    monkeypatch.setattr(stage, where, then_signal)
    with pytest.raises(_signals.Terminated):
        tokenize_files([str(corpus["jsonl"])], TOKENIZER, out,
                       TokenizeOptions(overwrite=True, batch_size=16))
    assert _hidden(tmp_path) == []
    assert _cli("verify", out).exit_code == 0


def test_final_name_maps_temporaries_to_outputs(tmp_path):
    assert _atomic.final_name(tmp_path / ".out.bin.tmp-12-a1b2c3") == tmp_path / "out.bin"
    assert _atomic.final_name(tmp_path / ".p.tmp-9-00ff00" / "shard-00000.tokens.npy") == \
        tmp_path / "p" / "shard-00000.tokens.npy"
    assert _atomic.final_name(tmp_path / "plain") == tmp_path / "plain"


# ------------------------------------------------------------------ fault injection
@pytest.mark.slow
def test_fault_injection_campaign(tmp_path):
    spec = importlib.util.spec_from_file_location("fault_inject",
                                                  ROOT / "scripts" / "fault_inject.py")
    fi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fi)
    # the killed runs are fresh interpreters (a kill can land in start-up); the checks after
    # each (verify, the same command again) are forked warm (tests/warm.py), ~1 s of CPU
    # less each of the ~50
    fi.subprocess = SUBPROCESS
    results = fi.campaign(ROOT, tmp_path, kills=2, seed=7, n_docs=3000, log=lambda s: None)
    assert len(results) == 9  # tokenize, pack (index layout), pack-tokens x 3 signals
    failures = {k: [r for r in rows if r] for k, rows in results.items()}
    assert not any(failures.values()), failures


# ------------------------------------------ issue 18 §5, §6: what the audit found untested
def test_small_files_are_grouped_into_parts_by_default(tmp_path):
    """No --part-bytes: 40 small files are one part (DEFAULT_PART_BYTES), not 40: the
    per-part costs are paid once."""
    from packtool.options import DEFAULT_PART_BYTES

    d = tmp_path / "in"
    d.mkdir()
    docs = make_documents(80, seed=2, median_words=20, max_words=60)
    for k in range(40):
        write_jsonl(d / f"f{k:02d}.jsonl", [{"text": t} for t in docs[2 * k:2 * k + 2]])
    r = _cli("tokenize", d, "-t", TOKENIZER, "-o", tmp_path / "c", "-q", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_parts"] == 1
    meta = json.loads((tmp_path / "c.json").read_text())
    assert meta["plan"]["n_parts"] == 1 and len(meta["parts"][0]["inputs"]) == 40
    assert f"{DEFAULT_PART_BYTES:,}" in meta["plan"]["policy"]


def _record_commit(monkeypatch):
    """Every fsync (by the path of its descriptor) and every rename, in order."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a, b, *args, **kw):
        events.append(("rename", str(a), str(b)))
        real_replace(a, b, *args, **kw)
    monkeypatch.setattr(_atomic, "FSYNC", True)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def _at(events, kind, pred) -> list[int]:
    return [i for i, e in enumerate(events) if e[0] == kind and pred(e)]


def test_commit_fsyncs_data_and_folder_before_the_manifest_then_the_folder(
        tmp_path, corpus, monkeypatch):
    """Durability (§5): the data files and their folder reach the disk before the manifest's
    rename (the commit point), and the folder again after it: a power cut never leaves a
    manifest naming data that is not on disk."""
    events = _record_commit(monkeypatch)
    out = tmp_path / "out"
    assert _cli(*_tokenize_args(corpus, out)).exit_code == 0
    manifest = _at(events, "rename", lambda e: e[2] == f"{out}.json")
    assert len(manifest) == 1, events
    m = manifest[0]
    for suffix in (".bin", ".boundaries"):
        renamed = _at(events, "rename", lambda e, s=suffix: e[2] == f"{out}{s}")
        temp = events[renamed[0]][1]
        synced = _at(events, "fsync", lambda e, t=temp: e[1] == t)
        assert synced and synced[0] < renamed[0] < m, (suffix, events)
    folder = _at(events, "fsync", lambda e: e[1] == str(tmp_path))
    assert any(i < m for i in folder) and any(i > m for i in folder), events
    # pack: the staged folder's files and the staged folder before it is renamed into place,
    # the parent after
    events.clear()
    assert _cli(*_pack_args(corpus, tmp_path / "p")).exit_code == 0
    swap = _at(events, "rename", lambda e: e[2] == str(tmp_path / "p"))[0]
    staged = events[swap][1]
    assert _at(events, "fsync", lambda e: e[1] == f"{staged}/index.json")[0] < swap
    assert _at(events, "fsync", lambda e: e[1] == staged)[-1] < swap
    assert _at(events, "fsync", lambda e: e[1] == str(tmp_path))[-1] > swap


def test_large_record_warning_gives_the_memory_it_takes(tmp_path):
    """The warning's figure is MEMORY_PER_RECORD_BYTE times the record (measured by
    scripts/bench_record_memory.py), once per run, naming file and line."""
    from packtool.sources import MEMORY_PER_RECORD_BYTE
    from packtool.tokenize import TokenizeOptions, tokenize_files

    text = "word " * 300_000  # 1.5 MB
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "short"}, {"text": text}, {"text": text}])
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        tokenize_files([str(p)], TOKENIZER, tmp_path / "out",
                       TokenizeOptions(long_record_warn_bytes=1 << 20))
    size = len(text.encode())
    want = (f"a.jsonl line 2: a {size / 1e6:.1f} MB record; tokenizing it takes up to about "
            f"{MEMORY_PER_RECORD_BYTE}x its size in memory "
            f"(~{size * MEMORY_PER_RECORD_BYTE / 1e9:.1f} GB)")
    assert want in err.getvalue() and err.getvalue().count("MB record") == 1, err.getvalue()


def test_full_disk_in_a_multi_part_tokenize_says_what_stays(tmp_path, monkeypatch):
    """§6: ENOSPC in part 2 of 3 said "(nothing was written)" and named c.part-00002 while
    parts 0 and 1 stayed: now it names the output, the finished parts, and that a re-run
    resumes from them (and it does)."""
    from packtool import _io

    d = tmp_path / "in"
    d.mkdir()
    docs = make_documents(90, seed=3, median_words=30, max_words=200)
    for k in range(3):
        write_jsonl(d / f"f{k}.jsonl", [{"text": t} for t in docs[30 * k:30 * (k + 1)]])
    real = _io.HashingWriter.write

    def write(self, array):
        if "part-00002" in os.readlink(f"/proc/self/fd/{self._f.fileno()}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, array)
    monkeypatch.setattr(_io.HashingWriter, "write", write)
    out = tmp_path / "c"
    args = ["tokenize", d, "-t", TOKENIZER, "-o", out, "--part-bytes", 1, "-q"]
    r = _cli(*args)
    assert r.exit_code == 1, r.output
    assert f"no space left on device for {out}:" in r.output, r.output
    assert "part-00002:" not in r.output and "nothing was written" not in r.output
    assert "2 finished part(s) of it (c.part-00000, c.part-00001) stay" in r.output
    assert "run again resumes" in r.output
    monkeypatch.setattr(_io.HashingWriter, "write", real)
    r = _cli(*args, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["n_parts_skipped"] == 2, r.output


# ------------------------------------------------------- a new user's Ctrl-C (item 1)
def _three_parts(tmp_path) -> Path:
    d = tmp_path / "in"
    d.mkdir()
    docs = make_documents(90, seed=3, median_words=30, max_words=200)
    for k in range(3):
        write_jsonl(d / f"f{k}.jsonl", [{"text": t} for t in docs[30 * k:30 * (k + 1)]])
    return d


_STUCK_SECOND_PART = """
import sys, time
import packtool.tokenize.pipeline as p
real, calls = p.run, []
def run(*a, **k):
    calls.append(1)
    if len(calls) == 2:  # part 1, its temporaries open: wait here for the signal
        time.sleep(60)
    return real(*a, **k)
p.run = run
sys.argv = ["packtool"] + sys.argv[1:]
from packtool.cli import main
main()
"""


def test_ctrl_c_between_parts_says_what_stays(tmp_path):
    """Ctrl-C after part 0 of 3 said "Interrupted after the output was complete: it is in
    place." with no c.json: a part's commit is not the output's. It now names the manifest
    not written and the finished parts a re-run resumes from, and leaves no temporary."""
    inputs, out = _three_parts(tmp_path), tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _STUCK_SECOND_PART, "tokenize", str(inputs),
                             "-t", str(TOKENIZER), "-o", str(out / "c"), "--part-bytes", "1",
                             "-q", "-j", "1"], env=_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob(".c.part-00001.tmp-*/c.part-00001.bin")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    assert (out / ".c.part-00000.part.json").exists()
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    assert "after the output was complete" not in err and "in place" not in err, err
    assert f"({out / 'c.json'} was not written)" in err, err
    assert "1 finished part(s) of it (c.part-00000) stay" in err, err
    assert "run again resumes from them; nothing half-written is left" in err, err
    assert not [n for n in os.listdir(out) if ".tmp-" in n], os.listdir(out)
    assert not (out / "c.json").exists()


@pytest.mark.parametrize("where", ["cleanup", "before_commit"])
def test_signal_in_a_parts_cleanup_or_before_its_commit_leaves_no_temporary(
        tmp_path, monkeypatch, where):
    """A `.c.part-00001.boundaries.tmp-PID-X` survived a Ctrl-C: a second signal while a
    failed part's temporaries were being removed stopped the removal half-way, and one
    between the end of the part's writing and its commit found them unregistered. Both now
    leave nothing half-written (the signal still ends the run): the part's own folder
    (``.c.part-00001.tmp-PID-X``) is removed whole, its publish begun or not at all."""
    from packtool.tokenize import TokenizeOptions, pipeline, tokenize_files

    monkeypatch.setattr(_signals, "received", [])
    inputs, out = _three_parts(tmp_path), tmp_path / "out"
    if where == "cleanup":  # part 1 fails, and a second Ctrl-C comes during its clean-up
        real_docs, real_remove = pipeline.iter_documents, _atomic._remove

        def docs(path, *a, **kw):
            if path.name == "f1.jsonl":
                raise KeyboardInterrupt
            yield from real_docs(path, *a, **kw)

        def remove(path):
            if ".tmp-" in path.name and not _signals.received:
                _signals._on_signal(signal.SIGINT, None)
            real_remove(path)
        monkeypatch.setattr(pipeline, "iter_documents", docs)
        monkeypatch.setattr(_atomic, "_remove", remove)
    else:  # the signal arrives once part 1 is written, before its publish begins
        real_fsync = _atomic.fsync_tree

        def fsync_tree(folder):
            if "part-00001" in folder.name and not _signals.received:
                _signals._on_signal(signal.SIGINT, None)
            return real_fsync(folder)
        monkeypatch.setattr(_atomic, "fsync_tree", fsync_tree)
    with pytest.raises(KeyboardInterrupt):
        tokenize_files([str(inputs)], TOKENIZER, out, TokenizeOptions(part_bytes=1))
    assert _signals.received == [signal.SIGINT]
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n], os.listdir(tmp_path)


def test_a_swallowed_ctrl_c_while_the_reader_never_answers_still_ends_the_run(
        tmp_path, monkeypatch):
    """A fault-injection run hung 300 s: the Ctrl-C's exception was raised inside an import
    and swallowed there, leaving the module's lock held, and the reader thread, importing
    the same module, never answered the main thread waiting for its next batch. The wait
    now looks at the signals received and ends the run."""
    import threading

    from packtool.tokenize import TokenizeOptions, pipeline, tokenize_files

    never = threading.Event()

    def stuck(*a, **k):  # the reader, blocked as on a lock a dead import holds
        _signals.received.append(signal.SIGINT)  # its exception went nowhere
        never.wait(60)
        yield from ()

    monkeypatch.setattr(_signals, "received", [])
    monkeypatch.setattr(pipeline, "iter_documents", stuck)
    p = write_jsonl(tmp_path / "a.jsonl", [{"text": "one two three"}])
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        tokenize_files([str(p)], TOKENIZER, tmp_path / "out", TokenizeOptions())
    assert time.monotonic() - t0 < 30
    never.set()


NUMBA_INTERRUPTED = """
import os, signal
from numba.core import event
from packtool import _numba, _signals

_signals.install()
ended = []


class Kill(event.Listener):  # Ctrl-C as a compilation starts
    def on_start(self, ev):
        os.kill(os.getpid(), signal.SIGINT)

    def on_end(self, ev):
        ended.append(1)


event.register("numba:compile", Kill())
f = _numba.njit(lambda x: x + 1)
try:
    f(1)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted", "after" if ended else "during", "the compilation", len(f.signatures))
"""


@pytest.mark.slow  # a fresh interpreter that imports numba and compiles: ~2-4 s
def test_ctrl_c_during_numba_compilation_waits_for_its_end():
    """A Ctrl-C that lands while numba compiles (or loads a cached kernel) can be raised
    inside llvmlite's ctypes callbacks, which print "Exception ignored on calling ctypes
    callback function" and a traceback, then drop it (1 in 60). Now the signal is held
    while the main thread holds numba's compiler lock and raised as soon as it is let go:
    the kernel is compiled, the run stops with the one right message."""
    r = subprocess.run([sys.executable, "-c", NUMBA_INTERRUPTED], capture_output=True,
                       text=True, env={**_env(), "PACKTOOL_NUMBA_CACHE": "0",
                                       "PACKTOOL_QUIET_COMPILE": "1"}, timeout=120)
    assert r.stdout.split() == ["interrupted", "after", "the", "compilation", "1"], \
        r.stdout + r.stderr
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _files(d: Path) -> dict:
    return {p.name: p.read_text() for p in sorted(d.iterdir())}


def test_journals_of_older_packtools_are_undone_never_swept(tmp_path):
    """Journals an older packtool left when killed mid-commit: one with an "only remove"
    entry (no temporary: tokenize's stale parts) and one named by its pid
    (``.o.commit-PID-HEX``). Both are undone, the previous files back in place; neither
    raises, and the pid-named one's set-aside files are not swept as temporaries (the
    previous output would be lost)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    tag = f"{_dead_pid()}-abcdef"
    (a / f".o.stale.old-{tag}").write_text("old stale")
    (a / f".o.old-{tag}").write_text("old o")
    (a / f".o.tmp-{tag}").write_text("new o")
    (a / ".o.journal").write_text(json.dumps([
        [None, str(a / "o.stale"), str(a / f".o.stale.old-{tag}")],
        [str(a / f".o.tmp-{tag}"), str(a / "o"), str(a / f".o.old-{tag}")]]))
    (b / f".o.old-{tag}").write_text("old o")
    (b / f".o.tmp-{tag}").write_text("new o")
    (b / f".o.commit-{tag}").write_text(json.dumps([
        [str(b / f".o.tmp-{tag}"), str(b / "o"), str(b / f".o.old-{tag}")]]))
    for d, want in ((a, {"o": "old o", "o.stale": "old stale"}), (b, {"o": "old o"})):
        with _atomic.output_lock(d / "o") as notes:
            assert any("undid an interrupted commit" in n for n in notes), notes
        assert _files(d) == want
