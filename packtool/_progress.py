"""The one progress bar every command shows; no heavy import (the CLI loads it at start).

Two kinds: :func:`progress_bar` for work with a known total (tokens, bytes), and
:func:`activity` for work deep inside the library that reports few or no steps (the optimal
packer's LP, one NNLS solve of 15-36 s): it shows only where the caller asked for progress
(:func:`shown`, set by ``pack(progress=True)`` and the CLI), only once the work has lasted
``delay`` seconds, and its clock moves even when no step is reported. Both write to stderr:
stdout stays the command's answer (``--json``)."""

from __future__ import annotations

import contextlib
import contextvars
import threading

_SHOWN = contextvars.ContextVar("packtool_progress_shown", default=False)
LOG_INTERVAL = 30.0  # seconds between a bar's lines when stderr is not a terminal


class _Lines:
    """stderr when it is not a terminal (a log file, a pipe, CI): every redraw a line of its
    own, not ``\r``-joined onto one line (~60 redraws a minute made one log line of them)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").replace("\x1b[A", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _where() -> dict:
    """tqdm's output and redraw interval: stderr redrawn twice a second on a terminal; else
    a line when the bar starts, one every ``LOG_INTERVAL`` seconds, and one when it ends."""
    import sys

    err = sys.stderr
    if getattr(err, "isatty", lambda: False)():
        return {"file": err, "mininterval": 0.5}
    return {"file": _Lines(err), "mininterval": LOG_INTERVAL, "maxinterval": LOG_INTERVAL}


def progress_bar(total: int, desc: str, unit: str = "tok", enabled: bool = True):
    """The one progress bar every command shows (tqdm on stderr), or None when disabled.
    ``unit="B"`` counts bytes in KiB/MiB."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc, dynamic_ncols=True,
                **_where(), **({"unit_divisor": 1024} if unit == "B" else {}))


@contextlib.contextmanager
def shown(enabled: bool = True):
    """Let :func:`activity` bars show meanwhile (in this thread / context only)."""
    token = _SHOWN.set(bool(enabled))
    try:
        yield
    finally:
        _SHOWN.reset(token)


def no_step(n: int = 1, **postfix) -> None:
    """The step (or tick) callback of work nobody watches: an activity not shown, a job run
    without a bar."""


@contextlib.contextmanager
def activity(desc: str, unit: str | None = None, delay: float = 1.0):
    """Yields ``step(n=1, **postfix)``. Under :func:`shown` a line (``desc``, the steps
    counted in ``unit`` if given, elapsed time, the last postfix) appears once the work has
    lasted ``delay`` seconds; a daemon thread redraws it every half second, so a long solve
    that reports no step still shows its clock moving (while the solver releases the GIL, as
    packtool's numba kernels and HiGHS do; for one that holds it, as scipy's NNLS does, pass
    ``delay=0`` so the line says what is running before it starts). Elsewhere nothing is
    shown and ``step`` costs a call."""
    if not _SHOWN.get():
        yield no_step
        return
    from tqdm import tqdm

    counted = "{n_fmt} " + unit + "s, " if unit else ""
    bar = tqdm(total=None, desc=desc, unit=unit or "it", delay=delay, **_where(),
               miniters=0, dynamic_ncols=True,
               bar_format="{desc}: " + counted + "{elapsed} elapsed{postfix}")
    lock, done = threading.Lock(), threading.Event()

    def step(n: int = 1, **postfix) -> None:
        with lock:
            if postfix:
                bar.set_postfix(postfix, refresh=False)
            bar.update(n)

    def clock() -> None:
        while not done.wait(0.5):
            with lock:
                bar.update(0)  # redraws past `delay` and `mininterval`, like any update

    ticker = threading.Thread(target=clock, name="packtool-progress", daemon=True)
    ticker.start()
    try:
        yield step
    finally:
        done.set()
        ticker.join()
        bar.close()  # a bar never shown (under `delay`) leaves nothing behind
