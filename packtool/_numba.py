"""Every numba option in one place: kernels use ``@njit`` from here.

``cache=True`` stores compiled kernels beside the modules (first call in a fresh install
compiles, ~1-2 s per kernel; later processes load in milliseconds). ``PACKTOOL_NUMBA_CACHE=0``
turns the cache off. Where numba finds no writable cache location (a read-only install and a
read-only ``$HOME``, as for an unprivileged user of a system-wide install), it refuses a
``cache=True`` function with a RuntimeError at import; packtool then compiles without the cache
(``CACHE`` becomes False) instead of failing every command, ``--version`` included.
"""

import os

import numba

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
