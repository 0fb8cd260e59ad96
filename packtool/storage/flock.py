"""File locks, one mechanism for every lock packtool takes (an output's, a part's, a shard's).

A lock is an empty regular file ``.NAME.lock`` held with ``flock``: released by the kernel
when its process dies, so a killed run never blocks the next one. packtool never writes into
a lock file, never truncates one and never follows a symbolic link to one (``O_NOFOLLOW``):
a planted link or a hard link to a user's file is refused by name, never written through.
Who holds a lock is read from ``/proc/locks`` (Linux), not from the file.

- **exclusive** (a whole run: ``tokenize``, ``pack``, ``--finalize``): a second run fails at
  once, naming the holder;
- **shared** (array tasks, ``--tasks N --task K``): tasks of one run hold it together; a whole
  run and a task never run at once;
- **wait** (a part or a shard): a second writer waits, then finds the work done.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import threading
import time
from pathlib import Path

from .. import _signals
from ..errors import PacktoolError

_POLL_S = 0.05  # how often a waiter looks whether the holder is done

_held: dict[Path, list] = {}  # lock path -> [fd, depth]: re-entrant within a process
_waiting: dict[Path, int] = {}  # lock path -> threads of this process in waiting() on it
_waiting_guard = threading.Lock()


def lock_path(output: Path) -> Path:
    return output.with_name(f".{output.name}.lock")


def holders(fd: int) -> list[int]:
    """Pids holding a flock on the file behind ``fd`` (Linux /proc/locks; [] elsewhere)."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and f[5] == key and f[4].isdigit():
            pids.append(int(f[4]))
    return sorted(set(pids) - {os.getpid()})


def lock_like(st: os.stat_result) -> bool:
    """What a lock file of packtool's is: an empty regular file of one link (it never
    writes into one, so a file with content, a link or a folder is someone else's)."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and not st.st_size


def _open(lock: Path) -> int:
    """Open (or create) a lock file: never through a symbolic link, only a regular file of
    one link, never truncated."""
    while True:
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise PacktoolError(f"{lock} is a symbolic link; packtool's lock files are its "
                                    "own regular files: remove the link") from None
            raise
        st = os.fstat(fd)
        if st.st_nlink or not stat.S_ISREG(st.st_mode):
            break
        os.close(fd)  # its holder removed it between our open and our look: open anew
    if not lock_like(st):
        os.close(fd)
        raise PacktoolError(f"{lock} is not packtool's lock file (an empty regular file of one "
                            "link); move it away if it is yours, remove it if no packtool run is "
                            "using it")
    return fd


def _same_file(fd: int, lock: Path) -> bool:
    """The holder before us may have removed the file between our open and our flock."""
    try:
        return os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def acquire(lock: Path, mode: str, what: str, into: list, quiet: bool = False) -> None:
    """Take ``lock`` ("exclusive", "shared": fail at once if taken the other way; "wait":
    exclusive, waiting for the holder) and append its file descriptor to ``into``.

    Each attempt runs with signals deferred and ends with the descriptor either closed or
    in ``into``, so a Ctrl-C at any moment leaves no lock file held by nobody's record; the
    caller releases what ``into`` holds. A waiter polls, staying interruptible."""
    op = fcntl.LOCK_SH if mode == "shared" else fcntl.LOCK_EX
    told = quiet or mode != "wait"
    while True:
        with _signals.deferred():
            pids = _attempt(lock, op, into)
        if pids is None:
            return
        if mode != "wait":
            who = f"pid {', '.join(map(str, pids))}" if pids else "another process"
            raise PacktoolError(
                f"{what} is being written by another packtool run ({who}; lock {lock}); wait "
                "for it to finish or choose another --out")
        if not told:
            told = True
            print(f"packtool: {what} is being written by another process; waiting for it",
                  file=sys.stderr)
        time.sleep(_POLL_S)
        _signals.check()


def _attempt(lock: Path, op: int, into: list) -> list[int] | None:
    """One non-blocking try: None once the descriptor is in ``into``, else the holders."""
    while True:
        fd = _open(lock)
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            pids = holders(fd)
            os.close(fd)
            return pids
        if _same_file(fd, lock):
            into.append(fd)
            return None
        os.close(fd)  # its holder removed it between our open and our flock: open anew


def release(lock: Path, fd: int, remove: bool = True) -> None:
    """Release; an exclusive holder removes the file, a shared one closes its descriptor and
    then removes the file if nobody holds it any more (:func:`remove_if_free`): of several
    tasks releasing at once, the last to close removes it."""
    if remove:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
    os.close(fd)
    if not remove:
        remove_if_free(lock)


def remove_if_free(lock: Path) -> bool:
    """Remove a lock file nobody holds (left by a killed process: the kernel released its
    flock, the file stays); True if removed. A lock held by anyone, this process included,
    is left alone; so is anything that is not a regular file of one link."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if lock in _held or not lock_like(os.fstat(fd)):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(fd, lock):  # one that opens it meanwhile retries on its own file
            lock.unlink()
            return True
        return False
    except OSError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold(lock: Path, mode: str, what: str):
    """Hold ``lock`` for the block (re-entrant in a process: an inner hold is free)."""
    if lock in _held:
        _held[lock][1] += 1
        try:
            yield
        finally:
            _held[lock][1] -= 1
        return
    fds: list[int] = []
    try:
        acquire(lock, mode, what, fds)
        _held[lock] = [fds[0], 1]
        yield
    finally:
        with _signals.deferred():
            _held.pop(lock, None)
            if fds:
                release(lock, fds[0], remove=mode != "shared")


@contextlib.contextmanager
def waiting(lock: Path, label: str):
    """An exclusive lock on one part or shard, waiting for another writer (who, when it
    finishes, has made the work a skip for us)."""
    with _waiting_guard:
        ours = _waiting.get(lock, 0)  # another thread of this process is on it
        _waiting[lock] = ours + 1
    fds: list[int] = []
    try:
        # a thread of ours (a prefetch, a check) waiting is not worth a line
        acquire(lock, "wait", label, fds, quiet=bool(ours))
        yield
    finally:
        with _signals.deferred():
            if fds:
                release(lock, fds[0])
        with _waiting_guard:
            _waiting[lock] -= 1
            if not _waiting[lock]:
                del _waiting[lock]
