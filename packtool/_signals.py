"""SIGTERM handled like Ctrl-C, and a record of it that no library can swallow.

The handler raises in the main thread; an exception raised inside a foreign callback (numba
loading its cache runs Python through ctypes) can be printed and dropped there, so the
signal is also recorded, and every commit (:mod:`packtool._atomic`) checks the record before
renaming anything into place: a received signal always ends the run with nothing written.
"""

from __future__ import annotations

import signal

received: list[int] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that temporary files are removed on the way out."""


def _on_sigterm(signum, frame):
    received.append(signum)
    raise Terminated()


def _on_sigint(signum, frame):
    received.append(signum)
    raise KeyboardInterrupt()


def install() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise if a signal arrived, even one whose exception was swallowed on the way."""
    if received:
        raise Terminated() if received[-1] == signal.SIGTERM else KeyboardInterrupt()
