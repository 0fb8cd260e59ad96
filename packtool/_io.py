"""Generic file utilities: running checksums, writers that hash what they write, streamed
``.npy`` files. Format modules (``packtool.formats``) build on these; nothing here knows a
packtool format.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ._crc import hasher

if TYPE_CHECKING:  # numpy loads with the first writer, not with `packtool --help`
    import numpy as np


def create(path: Path, mode: str = "wb"):
    """A new file opened for writing: refused if anything (a file, a symbolic link) is already
    at ``path`` (``O_EXCL | O_NOFOLLOW``), so packtool never writes through a planted link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    return os.fdopen(fd, mode)


def write_new(path: Path, text: str) -> None:
    """``text`` (UTF-8) into a new file at ``path`` (see :func:`create`)."""
    with create(path) as f:
        f.write(text.encode("utf-8"))


def file_digests(path: Path, algorithms=("sha256",), chunk: int = 1 << 23,
                 follow: bool = True) -> dict:
    """{algorithm: hex digest} of ``path``'s bytes, every algorithm in one read through one
    reused buffer (no allocation per chunk: on this VM fresh memory costs a host fault a
    page). ``follow=False``: a symbolic link at ``path`` is an OSError (``O_NOFOLLOW``)."""
    hs = {a: hasher(a) for a in algorithms}
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    with open(fd, "rb", buffering=0) as f:
        # no larger than the file needs: zeroing 8 MB for each of 2,000 small parts took 0.65 s
        st = os.fstat(f.fileno())
        need = st.st_size + 1 if stat.S_ISREG(st.st_mode) else chunk
        buf = bytearray(min(chunk, max(1 << 16, need)))
        view = memoryview(buf)
        while n := f.readinto(buf):
            for h in hs.values():
                h.update(view[:n])
    return {a: h.hexdigest() for a, h in hs.items()}


def crc32_file(path: Path, chunk: int = 1 << 23) -> str:
    return file_digests(path, ("crc32",), chunk)["crc32"]


class HashingWriter:
    """A binary file writer that hashes what it writes (no second pass over the data) with
    each of ``algorithms``: ``close()`` returns {algorithm: hex digest, ..., "bytes": n}."""

    def __init__(self, path: Path, algorithms=("sha256",)):
        # the writer outlives this call: close() (or the caller's cleanup) closes the file
        self._f = create(path)
        self._hs = [hasher(a) for a in algorithms]
        self._names = tuple(algorithms)
        self.nbytes = 0

    def write(self, array: np.ndarray) -> None:
        self.put(self.hash(array))

    def hash(self, array: np.ndarray) -> memoryview:
        """Hash ``array``'s bytes, to be :meth:`put` next, in the order hashed: a thread
        that fills buffers hashes each while it is still in cache and leaves the writing
        thread only the write (see packtool.formats.packed.writer)."""
        import numpy as np

        buf = memoryview(np.ascontiguousarray(array)).cast("B")
        for h in self._hs:
            h.update(buf)
        return buf

    def put(self, buf: memoryview) -> None:
        """Write bytes :meth:`hash` returned."""
        self._f.write(buf)
        self.nbytes += buf.nbytes

    def close(self) -> dict:
        self._f.flush()
        self._f.close()
        return {**{a: h.hexdigest() for a, h in zip(self._names, self._hs, strict=True)},
                "bytes": self.nbytes}

    def abort(self) -> None:
        self._f.close()


def sha256_file(path: Path, chunk: int = 1 << 23) -> str:
    return file_digests(path, ("sha256",), chunk)["sha256"]


def npy_header(dtype: np.dtype, n: int) -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)}
    )
    return buf.getvalue()


class NpyWriter(HashingWriter):
    """Stream a 1-D .npy of known length in chunks, hashing (crc32) as it goes; with
    ``reserve_space`` the file system is first asked whether its whole size fits
    (:func:`check_space`), so a full disk is an error naming the bytes needed before any is
    written (a disk filled meanwhile still fails the write(), by name). Not
    ``posix_fallocate``: streaming into allocated-but-unwritten extents ran 8x slower here
    (1.6 GB: 6.4 s against 0.8 s); that guarantee is for memory-mapped writes only."""

    def __init__(self, path: Path, dtype: np.dtype, n: int, reserve_space: bool = False,
                 label: str | Path | None = None):
        import numpy as np

        super().__init__(path, ("crc32",))
        self.dtype, self.n, self.written = dtype, n, 0
        header = np.frombuffer(npy_header(dtype, n), dtype=np.uint8)
        if reserve_space:
            try:
                check_space(path, header.size + n * np.dtype(dtype).itemsize, label)
            except BaseException:
                self.abort()
                raise
        self.put(HashingWriter.hash(self, header))  # not counted as elements

    def hash(self, array: np.ndarray) -> memoryview:
        import numpy as np

        array = np.asarray(array)
        if array.dtype != self.dtype:
            array = array.astype(self.dtype)
        self.written += array.size
        return super().hash(array)

    def close(self) -> dict:
        if self.written != self.n:
            raise RuntimeError(f"{self.n} elements announced, {self.written} written")
        return super().close()


class NoSpaceError(OSError):
    """Not enough disk space for an output; ``str()`` names it, the bytes needed and free."""


def check_space(path: Path, nbytes: int, label: str | Path | None = None) -> None:
    """Refuse now, naming the bytes needed and free, an output that cannot fit on its file
    system (statvfs: a look, not a reservation)."""
    free = shutil.disk_usage(Path(path).parent).free
    if nbytes > free:
        err = NoSpaceError(errno.ENOSPC, f"no space left for {label or path}: it needs "
                           f"{nbytes:,} bytes, {free:,} are free on its file system; free "
                           "space or write elsewhere")
        err.needed = nbytes
        raise err


_CHECKED: set = set()
_CHECKED_LOCK = threading.Lock()


def check_once(path: Path, digest: str, check, also: tuple = ()) -> None:
    """Run ``check()`` (which raises on a bad file) once per file per process: keyed by the
    path, its size and mtime and the expected ``digest``, so a reader pays one sequential
    read per file however often it is opened, and a rewritten file is checked again. ``also``:
    weaker checks of the same file that this one settles (marked done with it)."""
    st = path.stat()
    base = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _CHECKED_LOCK:
        if (*base, digest) in _CHECKED:
            return
    check()
    with _CHECKED_LOCK:
        _CHECKED.update((*base, d) for d in (digest, *also))
