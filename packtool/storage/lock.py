"""The lock object that keeps two writers of one output apart on a store without rename or
locks (:mod:`.publish` step 1): ``.NAME.lock``, created with a conditional put (``If-None-Match:
*``, which S3, GCS and R2 honour), holding its writer's host, pid, start and a random token.

A second writer is refused, naming the holder. A lock left by a dead run of this host (its
pid gone) is taken over by a conditional replace (``If-Match:`` the ETag read with the stale
body), so of two writers that both judged it stale exactly one gets it; where the backend
cannot replace conditionally it is named, for the user to delete. One of another host is
named (delete it if no run is writing). A store that cannot put conditionally is refused
with that reason unless ``PACKTOOL_UNSAFE_STORE_LOCK=1`` (then one writer at a time is the
user's business).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time

from .. import _signals
from ..errors import PacktoolError
from . import put
from .atomic import pid_alive
from .place import protocols

LOCK_ENV = "PACKTOOL_UNSAFE_STORE_LOCK"

_HELD: set[str] = set()   # tokens of the store locks this process holds now


def _stale(lock: dict) -> bool:
    """A lock left by a run of this host that is over: its process is gone, or it is this
    process and the run that took it has ended (its release failed: the store was down)."""
    if lock.get("host") != socket.gethostname() or not isinstance(lock.get("pid"), int):
        return False
    if lock["pid"] == os.getpid():
        return lock.get("token") not in _HELD
    return not pid_alive(lock["pid"])


# backends whose pipe_file(mode="create") is a conditional put, atomic on the server: s3fs
# (If-None-Match: *; AWS S3, R2, MinIO) and gcsfs (ifGenerationMatch=0). fsspec's default
# checks that the object is absent, then writes: two writers can both pass.
ATOMIC_CREATE = {"s3", "s3a", "gs", "gcs"}


# backends whose pipe_file passes If-Match to the put (s3fs: put_object's IfMatch; AWS S3,
# R2, MinIO and moto honour it), so a dead run's lock is replaced only if unchanged. gcsfs's
# ifGenerationMatch for a replace is not reachable through pipe_file as far as tested here:
# there a dead run's lock is named, for the user to delete.
CONDITIONAL_REPLACE = {"s3", "s3a"}


def _lost_race(e: OSError) -> bool:
    """The conditional replace failed because the object changed (S3 answers 412
    PreconditionFailed, or 409 ConditionalRequestConflict for a concurrent one)."""
    response = getattr(e.__cause__, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


def _holder(held: dict) -> str:
    if not held:
        return "another run"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(held.get("time", 0)))
    return f"pid {held.get('pid')} on {held.get('host')} since {when}"


class _Held(PacktoolError):
    """The lock object is another live run's."""


class StoreLock:
    """A lock object created by a conditional put; removed on release. One left by a dead run
    of this host is taken over by a conditional replace (:meth:`_take_over`); one of another
    host is named (delete it if no run is writing). ``url``: the lock object's URL as the
    user gave its scheme, in every message."""

    def __init__(self, fs, rpath: str, url: str, wait: bool = False, before_takeover=None):
        self.fs, self.rpath, self.url, self.wait = fs, rpath, url, wait
        self.token = os.urandom(8).hex()
        # a test hook: called between judging a lock stale and taking it over (the window
        # in which two writers raced)
        self.before_takeover = before_takeover

    def _put(self, body: bytes) -> None:
        if not (ATOMIC_CREATE & protocols(self.fs)) and os.environ.get(LOCK_ENV) != "1":
            raise PacktoolError(
                f"{self.url}: this store's fsspec backend has no atomic create-if-absent "
                "(fsspec's default checks, then writes), so two writers could not be kept "
                f"apart; set {LOCK_ENV}=1 to write anyway (one writer at a time is then "
                "yours to ensure; docs/STORAGE.md)")
        try:
            put(self.fs, self.rpath, body, mode="create")
        except (TypeError, NotImplementedError, ValueError) as e:
            if os.environ.get(LOCK_ENV) != "1":
                raise PacktoolError(
                    f"{self.url}: this store cannot create an object conditionally ({e}), so "
                    f"two writers could not be kept apart; set {LOCK_ENV}=1 to write anyway "
                    "(one writer at a time is then yours to ensure)") from None
            put(self.fs, self.rpath, body)

    def __enter__(self):
        delay = 0.2
        while True:
            try:
                # a Ctrl-C raised while the put is answered would leave the object, taken,
                # with no one to release it: it is recorded, then the lock released here
                with _signals.deferred():
                    self._take()
                break
            except _Held:
                if not self.wait:
                    raise
            time.sleep(delay)  # another writer of the same job: it finishes, then we skip it
            delay = min(2 * delay, 5.0)
        if _signals.received:
            self.__exit__(None, None, None)
            _signals.check()
        return self

    def _take(self):
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "time": time.time(), "token": self.token}).encode()
        try:
            self._put(body)
        except FileExistsError:
            etag, held = self._read()
            if not _stale(held):
                raise _Held(f"{self.url} is held by {_holder(held)}: another run is writing "
                            "this output; wait for it, or delete that lock object if no run "
                            "is") from None
            if self.before_takeover is not None:
                self.before_takeover()
            self._take_over(etag, held, body)
        _HELD.add(self.token)
        return self

    def _read(self) -> tuple[str | None, dict]:
        """The lock object's ETag and body, the ETag first: a body changed in between is
        the newer one, judged on its own, and the ETag (the older one) then fails the
        conditional replace; never an older body with a newer ETag."""
        try:
            etag = self.fs.info(self.rpath).get("ETag")
            return etag, json.loads(self.fs.cat_file(self.rpath))
        except Exception:  # unreadable, or gone meanwhile: still not ours to take
            return None, {}

    def _take_over(self, etag: str | None, held: dict, body: bytes) -> None:
        """Replace a dead run's lock object with ours only if it is still the one judged
        stale (S3's ``If-Match: ETAG`` put: atomic on the server), then read it back. A
        delete then a create let two writers both hold it: B judged the lock stale, A took
        it, then B deleted A's fresh lock and put its own."""
        if not (CONDITIONAL_REPLACE & protocols(self.fs)) or not etag:
            if os.environ.get(LOCK_ENV) != "1":
                raise PacktoolError(
                    f"{self.url} was left by {_holder(held)}, a run of this host that is over; "
                    "this store cannot replace an object only if it is unchanged, so taking "
                    "it over could race another writer: delete that lock object if no run is "
                    "writing, then run again") from None
            self.fs.rm_file(self.rpath)  # PACKTOOL_UNSAFE_STORE_LOCK=1: one writer is ensured
            self._put(body)
            return
        try:
            put(self.fs, self.rpath, body, IfMatch=etag)
        except FileNotFoundError:  # released meanwhile: create it, as any writer would
            try:
                self._put(body)
            except FileExistsError:
                raise _Held(f"{self.url}: another run took the lock just now; wait for "
                            "it") from None
        except OSError as e:
            if not _lost_race(e):
                raise
        if not self._mine():  # the race lost, or a store that ignored If-Match
            raise _Held(f"{self.url}: another run took over the dead run's lock just now; "
                        "wait for it")

    def _mine(self) -> bool:
        """The lock object holds our token (one unreadable is not ours)."""
        try:
            return json.loads(self.fs.cat_file(self.rpath)).get("token") == self.token
        except Exception:
            return False

    def __exit__(self, *exc):
        _HELD.discard(self.token)
        with _signals.deferred(), contextlib.suppress(Exception):  # a store that is down
            # keeps it: stale, see above; a second Ctrl-C does not stop the release half-way
            # only our own: a lock object some other run holds now (taken over as stale,
            # wrongly, after a pid was reused) stays its holder's
            if self._mine():
                self.fs.rm_file(self.rpath)
        return False


