"""Every numba option in one place: kernels use ``@njit`` from here.

``cache=True`` stores compiled kernels beside the modules (first call in a fresh install
compiles, ~1-2 s per kernel; later processes load in milliseconds). ``PACKTOOL_NUMBA_CACHE=0``
turns the cache off (e.g. on read-only installs).
"""

import os

import numba

_CACHE = os.environ.get("PACKTOOL_NUMBA_CACHE", "1") != "0"


def njit(fn=None, **kw):
    opts = {"cache": _CACHE, "nogil": True, **kw}
    if fn is None:
        return lambda f: numba.njit(**opts)(f)
    return numba.njit(**opts)(fn)
