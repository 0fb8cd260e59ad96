"""Every numba option in one place: kernels use ``@njit`` from here.

``cache=True`` stores compiled kernels beside the modules (first call in a fresh install
compiles, ~1-2 s per kernel; later processes load in milliseconds). ``PACKTOOL_NUMBA_CACHE=0``
turns the cache off. Where numba finds no writable cache location (a read-only install and a
read-only ``$HOME``, as for an unprivileged user of a system-wide install), it refuses a
``cache=True`` function with a RuntimeError at import; packtool then compiles without the cache
(``CACHE`` becomes False) instead of failing every command, ``--version`` included.
"""

import os
import sys
import threading
import time
from contextlib import contextmanager

import numba
from numba.core import event as _event

CACHE = os.environ.get("PACKTOOL_NUMBA_CACHE", "1") != "0"


def _jit(fn, opts):
    global CACHE
    if CACHE:
        try:
            return numba.njit(**{**opts, "cache": True})(fn)
        except RuntimeError as e:
            if "cannot cache" not in str(e):
                raise
            CACHE = False  # no locator could write; numba probed each one
    return numba.njit(**{**opts, "cache": False})(fn)


def njit(fn=None, **kw):
    opts = {"nogil": True, **kw}
    if fn is None:
        return lambda f: _jit(f, opts)
    return _jit(fn, opts)


class _CompileWatch(_event.Listener):
    """Says once per process, on stderr, that kernels are being compiled (the first run after
    an install compiles for seconds with no other sign of life), and adds up compile time
    (outermost compilations only: a kernel compiles the kernels it calls inside its own)."""

    def __init__(self):
        self.depth, self.started, self.total, self.told = 0, 0.0, 0.0, False
        self.lock = threading.Lock()

    def on_start(self, event):
        with self.lock:
            if self.depth == 0:
                self.started = time.perf_counter()
                if not self.told and os.environ.get("PACKTOOL_QUIET_COMPILE") != "1":
                    self.told = True
                    print("packtool: compiling numba kernels on first use (cached for later "
                          "runs)...", file=sys.stderr, flush=True)
            self.depth += 1

    def on_end(self, event):
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.total += time.perf_counter() - self.started


class _SignalsHeld(_event.Listener):
    """Ctrl-C (and SIGTERM) wait while the main thread holds numba's compiler lock, then stop
    the run as they would have: compiling and loading cached kernels run Python inside
    llvmlite's ctypes callbacks, where a KeyboardInterrupt is printed as an "Exception
    ignored on calling ctypes callback function" traceback and dropped (1 Ctrl-C in 60
    landed there) before the run stopped with the right message. Held for at most one
    compilation (~1-2 s a kernel, milliseconds from the cache)."""

    def __init__(self):
        self.depth, self.seen, self.held = 0, 0, None

    def on_start(self, event):
        if threading.current_thread() is not threading.main_thread():
            return  # a signal is handled in the main thread: elsewhere nothing to hold
        self.depth += 1
        if self.depth == 1:
            from . import _signals

            self.seen = len(_signals.received)
            self.held = _signals.deferred()
            self.held.__enter__()

    def on_end(self, event):
        if threading.current_thread() is not threading.main_thread() or not self.depth:
            return
        self.depth -= 1
        if self.depth == 0:
            from . import _signals

            self.held.__exit__(None, None, None)
            self.held = None
            if len(_signals.received) > self.seen:
                _signals.check()  # the signal that arrived meanwhile, raised here


_WATCH = _CompileWatch()
_event.register("numba:compile", _WATCH)
_event.register("numba:compiler_lock", _SignalsHeld())


@contextmanager
def compile_seconds():
    """``with compile_seconds() as spent: ...``; ``spent()`` is the compile time inside."""
    start = _WATCH.total
    yield lambda: _WATCH.total - start
