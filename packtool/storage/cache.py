"""A local cache of remote files, bounded and shared by the processes of a node.

Each remote data file (a shard's array, a corpus part's ``.bin``) is fetched whole, the first
time a reader needs it, into ``cache_dir/objects`` under a name made of its URL and its
recorded checksum, hashed as it streams in and renamed into place only when the hash matches
the manifest; a file rewritten at the source (another checksum) is another cache entry. Files
are bounded in size by the formats (a corpus part: ``--part-bytes`` of input; a shard:
``--shard-size`` tokens).

An entry is not trusted for having been verified once: a disk, a person or another program
can change it afterwards. Its size and crc32, computed as it was fetched, are kept beside it
(``cache_dir/checks/NAME``, 40 bytes of JSON), and every time it is opened:

- it must be a regular file (``os.lstat``: a symbolic link or anything else is refused);
- its size must be the recorded one (a stat: always);
- its crc32 must be the recorded one (a full read at ~4-13 GB/s, once per process per entry:
  the memory maps a reader makes of it are then trusted, as local files are);
- under :func:`rehashing` (``packtool verify``), every digest its manifest records (sha256
  too) is recomputed from the bytes, however often this process has checked it before.

An entry that fails is removed and fetched again, with a warning naming it: never served.

- **Bounded**: after each fetch the least recently used entries (by mtime, refreshed on use)
  are removed until the cache holds at most ``cache_limit`` bytes; a file still memory-mapped
  by a reader stays readable (the kernel keeps an unlinked file's pages).
- **Shared**: ranks on one node give the same ``cache_dir``; a file is fetched once (the others
  wait on its lock, then find it), eviction holds the cache's lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import sys
import threading
from pathlib import Path

from .._crc import hasher
from .._io import create, file_digests
from ..errors import FormatError, PacktoolError
from . import flock

DEFAULT_LIMIT = 64 << 30
CHUNK = 1 << 22


def default_dir() -> Path:
    return Path(os.environ.get("PACKTOOL_CACHE_DIR")
                or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "packtool")


_ABSENT = "absent"
_lock = threading.Lock()
_checked: set = set()      # (dev, inode, size, crc32) of entries this process has checked
_strict = {"depth": 0, "done": set()}  # rehashing(): entries re-hashed inside it


@contextlib.contextmanager
def rehashing():
    """Inside it, every cache entry opened is hashed again, with every digest its manifest
    records, however often this process has checked it: what ``packtool verify`` vouches for
    is the bytes it reads, not an entry it checked earlier (an entry is hashed once inside,
    however often it is opened there)."""
    with _lock:
        if not _strict["depth"]:
            _strict["done"] = set()
        _strict["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _strict["depth"] -= 1


def _warn(text: str) -> None:
    print(f"packtool: warning: {text}", file=sys.stderr, flush=True)


class Cache:
    """``cache_dir`` (default ``$PACKTOOL_CACHE_DIR`` or ``~/.cache/packtool``), at most
    ``cache_limit`` bytes (default 64 GiB)."""

    def __init__(self, cache_dir: str | Path | None = None, cache_limit: int | None = None):
        self.dir = Path(cache_dir) if cache_dir is not None else default_dir()
        self.limit = DEFAULT_LIMIT if cache_limit is None else int(cache_limit)
        if self.limit < 1:
            raise PacktoolError(f"cache_limit {cache_limit!r}: must be a positive number of "
                                "bytes")
        for sub in ("objects", "checks", "locks"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)

    def _key(self, url: str, expect: dict) -> str:
        digest = expect.get("sha256") or expect.get("crc32") or ""
        h = hashlib.sha256(f"{url}\0{digest}".encode()).hexdigest()[:32]
        name = "".join(c if c.isalnum() or c in "._-" else "_" for c in url.rsplit("/", 1)[-1])
        return f"{h}-{name[-80:]}"

    def get(self, fs, path: str, url: str, expect: dict) -> Path:
        """The local, checked copy of ``url`` (``path`` within ``fs``): from the cache, or
        fetched now. ``expect``: ``bytes`` and ``sha256`` or ``crc32`` from a manifest. An
        entry that fails its checks is removed and fetched again, with a warning."""
        key = self._key(url, expect)
        local = self.dir / "objects" / key
        if self._fault(key, expect) is None:
            os.utime(local, follow_symlinks=False)  # most recently used
            return local
        with flock.waiting(self.dir / "locks" / f".{key}.lock", f"cache entry {url}"):
            fault = self._fault(key, expect)  # another process may have fetched or fixed it
            if fault is None:
                return local
            if fault != _ABSENT:
                _warn(f"cache entry {local} (a copy of {url}) {fault}; removed, fetching it "
                      "again")
                self._drop(key)
            self._fetch(fs, path, url, expect, key)
        self._evict(keep=local)
        return local

    def _fault(self, key: str, expect: dict) -> str | None:
        """What is wrong with the entry ``key`` (:data:`_ABSENT` when there is none), or None
        when it is sound: a regular file of its recorded size, its crc32 the recorded one
        (read once per process; every manifest digest under :func:`rehashing`)."""
        local = self.dir / "objects" / key
        try:
            st = os.lstat(local)
        except FileNotFoundError:
            return _ABSENT
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file (a symbolic link or another kind of file)"
        try:
            record = json.loads((self.dir / "checks" / key).read_text())
            size, crc = int(record["bytes"]), str(record["crc32"])
        except (OSError, ValueError, KeyError, TypeError):
            return "has no record of the size and crc32 it was fetched with"
        if st.st_size != size or st.st_size != expect.get("bytes", size):
            return f"has {st.st_size:,} bytes, {size:,} were fetched"
        ident = (st.st_dev, st.st_ino, size, crc)
        with _lock:
            strict = _strict["depth"] > 0
            if ident in (_strict["done"] if strict else _checked):
                return None
        # crc32 always (the entry's record), under rehashing() each digest the manifest records
        algorithms = ["crc32", *(a for a in ("sha256",) if strict and a in expect)]
        try:
            got = file_digests(local, algorithms, follow=False)
        except OSError as e:
            return f"cannot be read ({e.strerror or e})"
        if got["crc32"] != crc or got["crc32"] != expect.get("crc32", crc):
            return "has another crc32 than it was fetched with: its bytes changed"
        bad = next((a for a in algorithms if a in expect and got[a] != expect[a]), None)
        if bad:
            return f"has another {bad} than its manifest records: its bytes changed"
        self._mark(ident, strict)
        return None

    @staticmethod
    def _mark(ident: tuple, strict: bool) -> None:
        with _lock:
            _checked.add(ident)
            if strict:
                _strict["done"].add(ident)

    def _drop(self, key: str) -> None:
        """Remove entry ``key``: its record first, so that no moment shows the entry with
        a record it does not match (a fetch of the same key meanwhile rewrites both)."""
        (self.dir / "checks" / key).unlink(missing_ok=True)
        (self.dir / "objects" / key).unlink(missing_ok=True)

    def _fetch(self, fs, path: str, url: str, expect: dict, key: str) -> None:
        local = self.dir / "objects" / key
        tmp = local.with_name(f".{local.name}.tmp-{os.getpid()}")
        with _lock:
            strict = _strict["depth"] > 0
        # crc32 (the entry's record, and the check where the manifest records one: ~10x
        # faster than sha256), sha256 where the manifest records only that one, or every
        # recorded digest under rehashing()
        want = {a: expect[a] for a in ("crc32", "sha256") if a in expect}
        if not strict and "crc32" in want:
            want = {"crc32": want["crc32"]}
        hashes, size = {a: hasher(a) for a in {"crc32", *want}}, 0
        try:
            with fs.open(path, "rb") as src, create(tmp) as dst:
                while block := src.read(CHUNK):
                    for h in hashes.values():
                        h.update(block)
                    dst.write(block)
                    size += len(block)
            if "bytes" in expect and size != expect["bytes"]:
                raise FormatError(f"{url}: {size:,} bytes, its manifest says "
                                  f"{expect['bytes']:,}; the object is truncated or replaced: "
                                  "write it again")
            got = {a: h.hexdigest() for a, h in hashes.items()}
            bad = next((a for a, v in want.items() if got[a] != v), None)
            if bad:
                raise FormatError(f"{url}: {bad} does not match its manifest; the object is "
                                  "corrupt: write it again (packtool verify names every one)")
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise FormatError(f"{url} is missing (its manifest lists it)") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        record = self.dir / "checks" / key
        rtmp = record.with_name(f".{key}.tmp-{os.getpid()}")
        try:
            with create(rtmp) as f:
                f.write(json.dumps({"bytes": size, "crc32": got["crc32"]}).encode())
            os.replace(rtmp, record)  # the record first: an entry never lacks its own
        finally:
            rtmp.unlink(missing_ok=True)
        os.replace(tmp, local)
        st = os.lstat(local)
        self._mark((st.st_dev, st.st_ino, size, got["crc32"]), strict)

    def _evict(self, keep: Path) -> None:
        with flock.hold(self.dir / ".cache.lock", "wait", f"cache {self.dir}"):
            entries = []
            for p in (self.dir / "objects").iterdir():
                if p.name.startswith("."):
                    continue
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime_ns, st.st_size, p))
            total = sum(e[1] for e in entries)
            for _, size, p in sorted(entries):
                if total <= self.limit:
                    break
                if p == keep:
                    continue
                self._drop(p.name)
                total -= size

    def clear(self) -> None:
        for sub in ("checks", "objects"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
