"""SIGTERM handled like Ctrl-C, and a record of it that no library can swallow.

The handler raises in the main thread; an exception raised inside a foreign callback (numba
loading its cache runs Python through ctypes) can be printed and dropped there, so the
signal is also recorded, and every commit (:mod:`packtool._atomic`) checks the record before
renaming anything into place: a received signal always ends the run with nothing written.
During a commit the handler only records (:func:`deferred`): the commit then undoes itself
instead of stopping half-way between two renames.
"""

from __future__ import annotations

import contextlib
import signal

received: list[int] = []
_deferring = False
_committed = False  # a commit became final (its output is in place)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that temporary files are removed on the way out."""


def _on_sigterm(signum, frame):
    received.append(signum)
    if not _deferring:
        raise Terminated()


def _on_sigint(signum, frame):
    received.append(signum)
    if not _deferring:
        raise KeyboardInterrupt()


def install() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise if a signal arrived, even one whose exception was swallowed on the way."""
    if received:
        raise Terminated() if received[-1] == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def deferred():
    """Record signals without raising; the caller calls :func:`check` where it can stop."""
    global _deferring
    prev, _deferring = _deferring, True
    try:
        yield
    finally:
        _deferring = prev


def hold() -> None:
    """From now on only record signals: the process is exiting with a code already chosen."""
    global _deferring
    _deferring = True


def committed() -> None:
    """Mark the point of no return of a commit: a signal after it finds the output written."""
    global _committed
    _committed = True


def after_commit() -> bool:
    """Whether the received signal came after a commit had become final."""
    return _committed and bool(received)  # commits proceed only while none was received
