"""SIGTERM handled like Ctrl-C, and a record of it that no library can swallow.

The handler raises in the main thread; an exception raised inside a foreign callback (numba
loading its cache runs Python through ctypes) can be printed and dropped there, so the
signal is also recorded, and every commit (:mod:`packtool.storage.atomic`) checks the record before
renaming anything into place: a received signal always ends the run with nothing written.
During a commit the handler only records (:func:`deferred`): the commit then undoes itself
instead of stopping half-way between two renames.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

received: list[int] = []
_deferring = 0  # blocks (of any thread) inside deferred(), plus 1 for good after hold()
_guard = threading.Lock()
_committed = False  # a commit became final (its output is in place)
_commits_to = None  # (manifest, kept) of an output committed in several steps (parts)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that temporary files are removed on the way out."""


def _on_signal(signum, frame):
    received.append(signum)
    if not _deferring:
        check()  # Terminated for SIGTERM, KeyboardInterrupt for Ctrl-C


def install() -> None:
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def check() -> None:
    """Raise if a signal arrived, even one whose exception was swallowed on the way."""
    if received:
        raise Terminated() if received[-1] == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def deferred():
    """Record signals without raising; the caller calls :func:`check` where it can stop."""
    global _deferring
    with _guard:  # a count, not a flag: threads entering and leaving in any order
        _deferring += 1
    try:
        yield
    finally:
        with _guard:
            _deferring -= 1


def hold() -> None:
    """From now on only record signals: the process is exiting with a code already chosen."""
    global _deferring
    with _guard:
        _deferring += 1


def committed() -> None:
    """Mark the point of no return of a commit: a signal after it finds the output written."""
    global _committed
    _committed = True


def commits_to(manifest, kept, exists=None) -> None:
    """The run's output is made of several commits (a tokenize's parts) and is complete only
    once ``manifest`` is in place; ``kept()`` says what a stopped run leaves for the next to
    resume from ("3 finished part(s) of it (...)"), or None. ``exists()``: whether the
    manifest is in place, for an output in a bucket (its URL in ``manifest``), where no
    local commit marks the point of no return."""
    global _commits_to
    _commits_to = (manifest if exists else Path(manifest), kept, exists)


def after_commit() -> bool:
    """Whether the received signal came after the output's commit had become final (for an
    output of several commits: its manifest's)."""
    if not received:
        return False
    if _commits_to is not None and _commits_to[2] is not None:  # a bucket's: its own word
        return bool(_commits_to[2]())
    if not _committed:  # commits proceed only while none was received
        return False
    return _commits_to is None or _commits_to[0].exists()


def kept() -> tuple[Path | str, str, bool] | None:
    """For a run stopped before its output was complete: (the manifest that would have
    committed it, what of it stays for a re-run, whether it is in a bucket), or None when
    nothing does."""
    if _commits_to is None:
        return None
    manifest, what, exists = _commits_to
    left = what()
    return (manifest, left, exists is not None) if left else None
