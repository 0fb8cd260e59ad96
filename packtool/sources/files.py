"""An input file, local (a ``Path``) or in an object store (a :class:`RemoteInput`): the one
place the readers open, size and identify what they read, so that every reader takes both.

A remote object is streamed, never downloaded first: JSONL (compressed or not) and text
through fsspec's buffered file (sequential reads of ``BLOCK`` bytes), Parquet and Arrow by
their own range reads (footer, then the row groups' column chunks). What identifies an
object's content is its store's own fingerprint, read from a metadata request: the ETag
(an MD5 of the bytes, or of its parts' MD5s for a multipart upload) or the version id, and
the size; a local file is identified by size, mtime, inode and device, and its content by
a crc32 of its bytes (``content_hash``), since a local mtime can stay while bytes change.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

from .._crc import Crc32
from ..errors import PacktoolError

BLOCK = 8 << 20  # bytes per read from a store: few requests, bounded memory


@dataclass(frozen=True)
class RemoteInput:
    """An object at ``url`` (``s3://bucket/key``), opened through fsspec."""

    url: str

    def __str__(self) -> str:
        return self.url

    def __fspath__(self):  # never a local path: a reader that forgets to ask fails loudly
        raise TypeError(f"{self.url} is an object in a store, not a local file")

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def _fs(self):
        from ..storage import filesystem

        return filesystem(self.url)

    def info(self) -> dict:
        fs, path = self._fs()
        try:
            return fs.info(path)
        except FileNotFoundError:
            raise PacktoolError(f"{self.url}: no such object") from None

    def open(self):
        fs, path = self._fs()
        try:
            return fs.open(path, "rb", block_size=BLOCK)
        except FileNotFoundError:
            raise PacktoolError(f"{self.url}: no such object") from None


def as_input(name: str):
    """A recorded input name (a manifest's ``path``, a plan's) as what the readers take."""
    from ..storage import is_url

    return RemoteInput(str(name)) if is_url(name) else Path(name)


def is_remote(path) -> bool:
    return isinstance(path, RemoteInput)


def open_input(path, ranges: bool = False):
    """A binary file object of ``path`` at its start (the caller closes it). A remote one
    is buffered for line reads, or, with ``ranges``, the store's own seekable file for a
    reader that reads ranges itself (pyarrow)."""
    if not is_remote(path):
        return open(path, "rb")
    f = path.open()
    return f if ranges else io.BufferedReader(f, BLOCK)


class _HashedFile(io.RawIOBase):
    """A local file read front to back, the crc32 of its bytes taken as they are read."""

    def __init__(self, path):
        self._f = io.FileIO(path, "r")
        self._crc, self.nbytes = Crc32(), 0

    def readable(self) -> bool:
        return True

    def _take(self, data) -> None:
        self._crc.update(data)
        self.nbytes += len(data)

    def readinto(self, b) -> int:
        n = self._f.readinto(b)
        if n:
            self._take(memoryview(b)[:n])
        return n

    def tell(self) -> int:
        return self.nbytes

    def close(self) -> None:
        self._f.close()
        super().close()

    def finish(self) -> dict:
        """Read what is left: the content hash (:func:`content_hash`) of every byte. (No
        zeroed buffer for the usual nothing left: a 1 MB bytearray a file cost 2,000 small
        files 0.1 s.)"""
        while chunk := self._f.read(1 << 20):
            self._take(chunk)
        return {"bytes": self.nbytes, "crc32": self._crc.hexdigest()}


def open_hashed(path):
    """``(file, finish)``: a buffered binary file of ``path`` and ``finish()``, which reads
    what is left and returns the file's content hash (:func:`content_hash`), taken as it was
    read: a local input is read once, not a second time to hash it (a corpus larger than the
    page cache came twice from the disk). For an object in a store ``finish()`` gives None:
    its store's fingerprint is its hash."""
    if is_remote(path):
        return open_input(path), lambda: None
    raw = _HashedFile(path)
    return io.BufferedReader(raw, 1 << 20), raw.finish


def input_size(path) -> int:
    if is_remote(path):
        return int(path.info()["size"])
    return os.stat(path).st_size


def read_all(path) -> bytes:
    with open_input(path) as f:
        return f.read()


def _fingerprint(info: dict) -> str | None:
    for key in ("VersionId", "version_id", "generation", "ETag", "etag", "md5Hash", "sha"):
        v = info.get(key)
        if v:
            return f"{key}:{str(v).strip(chr(34))}"
    return None


def identity(path) -> tuple:
    """What changes when the file's content changes: (size, mtime_ns, inode, device) of a
    local file; (size, the store's fingerprint) of an object. A store that gives no
    fingerprint is refused: a change of content could not be seen."""
    if not is_remote(path):
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev
    info = path.info()
    tag = _fingerprint(info)
    if tag is None:
        raise PacktoolError(f"{path}: the store gives no ETag, version or checksum for it, so "
                            "a change of its content could not be detected; copy the inputs "
                            "to a store or disk that does")
    return int(info["size"]), tag


def content_hash(path, before: tuple) -> dict:
    """What a resume compares to trust a finished part: for a local file its bytes and crc32
    (read again, ~3 GB/s from the page cache; the JSONL reader takes it as it reads,
    :func:`open_hashed`), for an object its size and the store's own
    fingerprint of the bytes (``before``, from :func:`identity`: no second download)."""
    if is_remote(path):
        return {"bytes": before[0], "fingerprint": before[1]}
    from .._io import crc32_file

    return {"bytes": before[0], "crc32": crc32_file(Path(path))}


def content_unchanged(path, content: dict) -> bool:
    """``path`` still has the content recorded by :func:`content_hash` (a local file of
    another size is not read again)."""
    try:
        now = identity(path)
        return now[0] == content.get("bytes") and content_hash(path, now) == content
    except (OSError, PacktoolError):
        return False
