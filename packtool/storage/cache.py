"""A local cache of remote files, bounded and shared by the processes of a node.

Each remote data file (a shard's array, a corpus part's ``.bin``) is fetched whole, the first
time a reader needs it, into ``cache_dir`` under a name made of its URL and its recorded
checksum, hashed as it streams in and renamed into place only when the hash matches: a file
in the cache has been verified, so readers memory-map it without reading it again, and a file
rewritten at the source (another checksum) is another cache entry. Files are bounded in size
by the formats (a corpus part: ``--part-bytes`` of input; a shard: ``--shard-size`` tokens).

- **Bounded**: after each fetch the least recently used entries (by mtime, refreshed on use)
  are removed until the cache holds at most ``cache_limit`` bytes; a file still memory-mapped
  by a reader stays readable (the kernel keeps an unlinked file's pages).
- **Shared**: ranks on one node give the same ``cache_dir``; a file is fetched once (the others
  wait on its lock, then find it), eviction holds the cache's lock.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from .. import _locks
from .._crc import hasher
from ..errors import FormatError, PacktoolError

DEFAULT_LIMIT = 64 << 30
CHUNK = 1 << 22


def default_dir() -> Path:
    return Path(os.environ.get("PACKTOOL_CACHE_DIR")
                or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "packtool")


class _Hash:
    """A fetched file's check as it streams in: its crc32 where the manifest records one
    (~10x faster than sha256; packtool verify checks sha256 too), else its sha256."""

    def __init__(self, expect: dict):
        self.kind = "crc32" if "crc32" in expect else "sha256" if "sha256" in expect else None
        self.want = expect.get(self.kind)
        self._h = hasher(self.kind) if self.kind else None

    def update(self, data) -> None:
        if self._h is not None:
            self._h.update(data)

    def ok(self) -> bool:
        return self._h is None or self._h.hexdigest() == self.want


class Cache:
    """``cache_dir`` (default ``$PACKTOOL_CACHE_DIR`` or ``~/.cache/packtool``), at most
    ``cache_limit`` bytes (default 64 GiB)."""

    def __init__(self, cache_dir: str | Path | None = None, cache_limit: int | None = None):
        self.dir = Path(cache_dir) if cache_dir is not None else default_dir()
        self.limit = DEFAULT_LIMIT if cache_limit is None else int(cache_limit)
        if self.limit < 1:
            raise PacktoolError(f"cache_limit {cache_limit!r}: must be a positive number of "
                                "bytes")
        (self.dir / "objects").mkdir(parents=True, exist_ok=True)
        (self.dir / "locks").mkdir(exist_ok=True)

    def _key(self, url: str, expect: dict) -> str:
        digest = expect.get("sha256") or expect.get("crc32") or ""
        h = hashlib.sha256(f"{url}\0{digest}".encode()).hexdigest()[:32]
        name = "".join(c if c.isalnum() or c in "._-" else "_" for c in url.rsplit("/", 1)[-1])
        return f"{h}-{name[-80:]}"

    def get(self, fs, path: str, url: str, expect: dict) -> Path:
        """The local, verified copy of ``url`` (``path`` within ``fs``): from the cache, or
        fetched now. ``expect``: ``bytes`` and ``sha256`` or ``crc32`` from a manifest."""
        key = self._key(url, expect)
        local = self.dir / "objects" / key
        if local.is_file():
            os.utime(local)  # most recently used
            return local
        with _locks.waiting(self.dir / "locks" / f".{key}.lock", f"cache entry {url}"):
            if local.is_file():
                return local
            self._fetch(fs, path, url, expect, local)
        self._evict(keep=local)
        return local

    def _fetch(self, fs, path: str, url: str, expect: dict, local: Path) -> None:
        from .._io import create

        tmp = local.with_name(f".{local.name}.tmp-{os.getpid()}")
        h, size = _Hash(expect), 0
        try:
            with fs.open(path, "rb") as src, create(tmp) as dst:
                while block := src.read(CHUNK):
                    h.update(block)
                    dst.write(block)
                    size += len(block)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise FormatError(f"{url} is missing (its manifest lists it)") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if "bytes" in expect and size != expect["bytes"]:
            tmp.unlink()
            raise FormatError(f"{url}: {size:,} bytes, its manifest says {expect['bytes']:,}; "
                              "the object is truncated or replaced: write it again")
        if not h.ok():
            tmp.unlink()
            raise FormatError(f"{url}: {h.kind} does not match its manifest; the object is "
                              "corrupt: write it again (packtool verify names every one)")
        os.replace(tmp, local)

    def _evict(self, keep: Path) -> None:
        with _locks.hold(self.dir / ".cache.lock", "wait", f"cache {self.dir}"):
            entries = []
            for p in (self.dir / "objects").iterdir():
                if p.name.startswith("."):
                    continue
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime_ns, st.st_size, p))
            total = sum(e[1] for e in entries)
            for _, size, p in sorted(entries):
                if total <= self.limit:
                    break
                if p == keep:
                    continue
                p.unlink(missing_ok=True)
                total -= size

    def clear(self) -> None:
        shutil.rmtree(self.dir / "objects", ignore_errors=True)
        (self.dir / "objects").mkdir(parents=True, exist_ok=True)
