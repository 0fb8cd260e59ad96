"""The store lock (packtool.storage.lock) against a real S3 server (moto's, the ``s3``
fixture): a lock left by a dead run is taken over by exactly one of two writers racing for
it, however long each waits between judging it stale and taking it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from packtool.errors import PacktoolError
from packtool.storage.lock import StoreLock


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def stale_lock(s3, rpath: str) -> bytes:
    """A lock object of a run of this host that died."""
    body = json.dumps({"host": socket.gethostname(), "pid": dead_pid(), "time": time.time(),
                       "token": os.urandom(8).hex()}).encode()
    s3.fs.pipe_file(rpath, body)
    return body


def test_two_writers_taking_over_a_dead_runs_lock_one_holds_it(s3):
    """Writer B judges the dead run's lock stale, then waits (the latency between the check
    and the take-over) while writer A judges it stale and takes it; then B goes on. Before,
    B deleted A's fresh lock and put its own: both held the output."""
    rpath = f"{s3.bucket()}/out/.packtool.lock"
    stale_lock(s3, rpath)
    b_checked, a_done = threading.Event(), threading.Event()
    held, refused = [], []

    def writer(name, hook):
        lock = StoreLock(s3.client(), rpath, f"s3://{rpath}", before_takeover=hook)
        try:
            lock.__enter__()
        except PacktoolError as e:
            refused.append((name, str(e)))
        else:
            held.append((name, lock))
        finally:
            if name == "A":
                a_done.set()

    b = threading.Thread(target=writer, args=("B", lambda: (b_checked.set(), a_done.wait())))
    b.start()
    b_checked.wait(60)
    a = threading.Thread(target=writer, args=("A", None))
    a.start()
    a.join(60)
    b.join(60)
    assert [n for n, _ in held] == ["A"], (held, refused)
    assert [n for n, _ in refused] == ["B"] and rpath in refused[0][1]
    owner = json.loads(s3.client().cat_file(rpath))
    assert owner["token"] == held[0][1].token
    held[0][1].__exit__(None, None, None)
    assert not s3.client().exists(rpath)


def test_a_lock_taken_over_meanwhile_is_not_removed_by_the_run_that_lost_it(s3):
    """A release removed the lock object whoever held it by then: a run whose lock another
    took over (as stale: a reused pid) took the new holder's lock away on its way out."""
    rpath = f"{s3.bucket()}/out/.packtool.lock"
    lock = StoreLock(s3.client(), rpath, f"s3://{rpath}").__enter__()
    theirs = stale_lock(s3, rpath)  # another run's lock object now
    lock.__exit__(None, None, None)
    assert s3.client().cat_file(rpath) == theirs
    s3.client().rm_file(rpath)
    mine = StoreLock(s3.client(), rpath, f"s3://{rpath}").__enter__()
    mine.__exit__(None, None, None)
    assert not s3.client().exists(rpath)


def test_an_upload_that_does_not_arrive_whole_is_named_by_its_own_scheme(tmp_path):
    """Before, the error said s3:// whatever the store."""
    from fsspec.implementations.memory import MemoryFileSystem

    from packtool.storage.publish import Published, upload

    class Lossy(MemoryFileSystem):
        """A store that keeps half of what it is sent."""

        def put_file(self, lpath, rpath, **kwargs):
            with open(lpath, "rb") as f:
                self.pipe_file(rpath, f.read()[:5])

    (tmp_path / "a.npy").write_bytes(b"0123456789")
    with pytest.raises(PacktoolError, match=r"^memory://b/job/a.npy: the uploaded object"):
        upload(Lossy(skip_instance_cache=True), [(tmp_path / "a.npy", "b/job/a.npy")],
               Published("memory://b/job"))
