"""A bucket output's uploads overlapped with the next job's work (issue 34 item 4): the local
executor runs a job's tail (upload, verify, record) in a thread while the next job computes,
one tail at a time; a tail's failure is raised in the run, by its own message, and nothing
is committed; a re-run resumes. The bytes are the local run's (test_storage_tokenize.py,
test_storage_pack.py)."""

from __future__ import annotations

import contextlib
import json
import threading

import pytest
from conftest import CORPUS, TOKENIZER, run

from packtool.executors import Jobs, PendingUpload, RunOptions, run_jobs

WAIT = 10.0  # seconds a job waits for the tail before it (long: a loaded machine)


def overlapping_jobs(events: list, n: int = 3) -> tuple[Jobs, list]:
    """``n`` jobs whose tails record when they start and end; job k > 0 waits (up to WAIT
    s) for tail k - 1 to start, which only happens if the tail runs while job k computes."""
    started = [threading.Event() for _ in range(n)]
    released = []

    def job(k, tick):
        if k:
            events.append((f"job {k} saw tail {k - 1}", started[k - 1].wait(WAIT)))

        def then():
            started[k].set()
            events.append((f"tail {k}", threading.current_thread().name))
            return k * 10, False

        held = contextlib.ExitStack()
        held.callback(released.append, k)
        return PendingUpload(then, held)

    return Jobs(list(range(n)), job, [1] * n, str, "test"), released


def test_a_tail_runs_while_the_next_job_computes():
    events: list = []
    jobs, released = overlapping_jobs(events)
    results, skipped = run_jobs(jobs, RunOptions())
    assert results == {0: 0, 1: 10, 2: 20} and skipped == 0
    saw = dict(e for e in events if e[0].startswith("job"))
    assert saw == {"job 1 saw tail 0": True, "job 2 saw tail 1": True}
    tails = [name for what, name in events if what.startswith("tail")]
    assert len(tails) == 3 and all(t.startswith("packtool-tail-") for t in tails)
    assert sorted(released) == [0, 1, 2]  # every job's lock and scratch released


def test_a_failing_tail_is_raised_and_the_next_job_is_dropped():
    """The tail's exception reaches the run as itself; the job computed meanwhile is never
    published (its tail dropped: its lock and scratch released); no later job starts."""
    ran, released = [], []

    def job(k, tick):
        ran.append(k)

        def then():
            if k == 0:
                raise OSError("the store went away")
            return k, False

        held = contextlib.ExitStack()
        held.callback(released.append, k)
        return PendingUpload(then, held)

    with pytest.raises(OSError, match="the store went away"):
        run_jobs(Jobs(list(range(4)), job, [1] * 4, str, "test"), RunOptions())
    assert ran == [0, 1] and sorted(released) == [0, 1]


def _ray_part(item, tick):
    return item * 10, False


@pytest.mark.ray
@pytest.mark.slow
def test_a_ray_run_records_the_jobs_that_came_back(ray_instance):
    """What a Ctrl-C message names as staying (packtool._signals.kept): a Ray driver recorded
    no finished job, so a bucket run on Ray stopped after parts were published said "no
    output was written"; now every job whose result came back is named."""
    from packtool.executors import finished_jobs

    jobs = Jobs([0, 1, 2], _ray_part, [1] * 3, lambda k: f"part {k}", "test")
    assert run_jobs(jobs, RunOptions(executor="ray")) == ({0: 0, 1: 10, 2: 20}, 0)
    said = finished_jobs("part")
    assert said.startswith("3 finished part(s) of it (") and all(
        f"part {k}" in said for k in range(3)), said


# ------------------------------------------------------------------- against a real S3
@pytest.fixture()
def bucket(s3, monkeypatch, tmp_path):
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKTOOL_STORAGE_OPTIONS", json.dumps(
        {**s3.options, "config_kwargs": {"retries": {"max_attempts": 1}}}))
    return s3.bucket()


def test_an_upload_failing_in_the_background_is_named_and_nothing_is_committed(
        s3, bucket, tmp_path, monkeypatch):
    """Part 1's upload fails in its tail thread as a store that stopped answering fails:
    the run ends with the CLI's message for it (no traceback), no manifest and no record of
    part 1 or later on the store, no lock objects and no scratch files left; the same
    command then resumes from part 0 and makes the local run's bytes."""
    pytest.importorskip("s3fs")
    from botocore.exceptions import EndpointConnectionError

    from packtool.storage import publish

    real, threads = publish.upload, []

    def upload(fs, files, result):
        threads.append(threading.current_thread().name)
        if any(".part-00001." in r for _, r in files):
            real(fs, files[:1], result)  # one object sent, then the link is gone
            raise EndpointConnectionError(endpoint_url=s3.endpoint)
        real(fs, files, result)

    monkeypatch.setattr(publish, "upload", upload)
    url = f"s3://{bucket}/out/c"
    args = ["tokenize", CORPUS, "-t", TOKENIZER, "--eos", "<|eos|>", "--part-bytes", 200_000]
    r = run(*args, "-o", url, "-q")
    assert r.exit_code == 1 and "cannot reach the store at" in r.output, r.output
    assert "Traceback" not in r.output
    assert threads and all(t.startswith("packtool-tail-") for t in threads)  # overlapped
    s3.fs.invalidate_cache()
    names = {p.rsplit("/", 1)[-1] for p in s3.fs.find(f"{bucket}/out")}
    assert ".c.part-00000.part.json" in names  # published before part 1 failed
    assert any(n.startswith("c.part-00001.") for n in names)  # part 1 only began
    assert not {"c.json", ".c.part-00001.part.json", ".c.part-00002.part.json"} & names
    assert not [n for n in names if n.endswith(".lock")]
    assert not [p for p in (tmp_path / "cache" / "staging").rglob("*") if p.is_file()]

    monkeypatch.setattr(publish, "upload", real)
    r = run(*args, "-o", url, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_parts_skipped"] == 1
    run(*args, "-o", tmp_path / "c", "-q")
    s3.fs.invalidate_cache()
    for p in tmp_path.glob("c.part-*"):
        assert s3.fs.cat_file(f"{bucket}/out/{p.name}") == p.read_bytes(), p.name


_SLOW_UPLOAD = """
import sys, time
ready, when = sys.argv[1], sys.argv[2]
from packtool.storage import publish
real, calls, put_object = publish.upload, [], publish.put_object
def upload(fs, files, result):
    calls.append(1)
    if when.isdigit() and len(calls) == int(when):  # the jobs before are published: say
        open(ready, "w").close()                    # so, then take a while
        time.sleep(1.0)
    real(fs, files, result)
def put(fs, rpath, data, url):
    put_object(fs, rpath, data, url)
    if rpath.endswith("/" + when):  # just put (a manifest): say so, then take a while
        open(ready, "w").close()
        time.sleep(1.0)
publish.upload, publish.put_object = upload, put
sys.argv = ["packtool"] + sys.argv[3:]
from packtool.cli import main
main()
"""


def _interrupt_upload(s3, tmp_path, args: list, when: int | str) -> str:
    """Run the CLI with ``args``, SIGINT it while its ``when``-th job uploads (or just after
    the object named ``when`` was put); its stderr."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    ready = tmp_path / "ready"
    ready.unlink(missing_ok=True)
    env = {**os.environ, **s3.env, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_UPLOAD, str(ready), str(when),
                             *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    return err


@pytest.mark.slow
def test_ctrl_c_while_a_tail_uploads_leaves_nothing_half_published(s3, bucket, tmp_path):
    """SIGINT while part 0's tail uploads (and part 1 is tokenized): the tail stops at its
    next object and releases its lock and scratch folder before the run's lock; the run
    says it was interrupted (exit 130); no manifest, no lock object, no scratch file is
    left; the same command then completes, and the message says no output was written
    (nothing was published yet)."""
    url = f"s3://{bucket}/out/c"
    args = ["tokenize", CORPUS, "-t", TOKENIZER, "--eos", "<|eos|>", "--part-bytes", 200_000,
            "-o", url, "-q"]
    err = _interrupt_upload(s3, tmp_path, args, 1)
    assert "Interrupted: no output was written" in err, err
    s3.fs.invalidate_cache()
    names = {p.rsplit("/", 1)[-1] for p in s3.fs.find(f"{bucket}/out")}
    assert "c.json" not in names and not [n for n in names if n.endswith(".lock")], names
    assert not [p for p in (tmp_path / "cache" / "staging").rglob("*") if p.is_file()]
    r = run(*args[:-1], "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_parts"] == 4


@pytest.mark.slow
def test_ctrl_c_after_a_job_was_published_names_what_stays_in_the_bucket(s3, bucket, tmp_path):
    """Ctrl-C once a bucket tokenize had published part 0 (or a pack shard 0) said "no
    output was written" though the part stays and a re-run skips it: the message now names
    the manifest not written, the finished jobs that stay and the resume, and the same
    command then completes from them."""
    url = f"s3://{bucket}/out/c"
    args = ["tokenize", CORPUS, "-t", TOKENIZER, "--eos", "<|eos|>", "--part-bytes", 200_000,
            "-o", url, "-q"]
    err = _interrupt_upload(s3, tmp_path, args, 2)
    assert f"({url}.json was not written)" in err, err
    assert "1 finished part(s) of it (part 0 (c.part-00000)) stay" in err, err
    assert "run again resumes from them" in err and "no output was written" not in err, err
    r = run(*args[:-1], "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_parts_skipped"] >= 1

    packed = f"s3://{bucket}/out/packed"
    args = ["pack", url, "-L", 256, "--layout", "tokens", "--shard-size", 20_000, "-o", packed,
            "-q"]
    err = _interrupt_upload(s3, tmp_path, args, 2)
    assert f"({packed}/index.json was not written)" in err, err
    assert "1 finished shard(s) of it (train shard 0 (shard-00000)) stay" in err, err
    r = run(*args)
    assert r.exit_code == 0, r.output
    s3.fs.invalidate_cache()
    assert s3.fs.exists(f"{bucket}/out/packed/index.json")


@pytest.mark.slow
def test_ctrl_c_once_the_manifest_was_put_says_the_output_is_in_place(s3, bucket, tmp_path):
    """Ctrl-C just after a bucket tokenize put c.json (or a pack its index.json), during the
    clean-up of leftovers, said the manifest "was not written" though readers already saw
    the dataset: the manifest's put is the commit; the clean-up still finishes, and a
    re-run finds the output there."""
    url = f"s3://{bucket}/out/c"
    args = ["tokenize", CORPUS, "-t", TOKENIZER, "--eos", "<|eos|>", "--part-bytes", 200_000,
            "-o", url, "-q"]
    err = _interrupt_upload(s3, tmp_path, args, "c.json")
    assert "Interrupted after the output was complete: it is in place." in err, err
    assert "was not written" not in err, err
    s3.fs.invalidate_cache()
    names = {p.rsplit("/", 1)[-1] for p in s3.fs.find(f"{bucket}/out")}
    assert "c.json" in names and ".c.plan.json" not in names, names  # cleaned up after it
    r = run(*args)
    assert r.exit_code == 1 and "output already exists" in r.output, r.output

    packed = f"s3://{bucket}/out/packed"
    args = ["pack", url, "-L", 256, "--layout", "tokens", "--shard-size", 20_000, "-o", packed,
            "-q"]
    err = _interrupt_upload(s3, tmp_path, args, "packed/index.json")
    assert "Interrupted after the output was complete: it is in place." in err, err
    s3.fs.invalidate_cache()
    names = {p.rsplit("/", 1)[-1] for p in s3.fs.find(f"{bucket}/out/packed")}
    assert "index.json" in names and ".packtool-plan.json" not in names, names
    assert not [n for n in names if n.endswith(".entry.json")], names  # cleaned up after it
    r = run("verify", packed)
    assert r.exit_code == 0, r.output
