"""A folder of packtool files, local or remote, as the readers see it: manifests read as text,
data files as local paths to memory-map (remote ones fetched into the cache, verified).

    place = Place("s3://bucket/corpora", storage_options, cache)
    meta = json.loads(place.read_text("web.json"))
    path = place.local("web.bin", {"bytes": ..., "sha256": ...})   # a verified local copy

For a local folder ``local`` is the file itself (its checksum is checked by the reader, once
per process, as before); nothing is copied. A tokenizer at a URL is fetched once into the
cache too (:func:`fetch_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path

from ..errors import PacktoolError
from . import basename, filesystem, is_url, join, local_path, normalize, parent
from .atomic import left_by_us, temp_name
from .cache import Cache, default_dir

# backends whose find() filters names by a prefix on the server (s3fs, gcsfs): the objects of
# one job, named alike, are looked up in one listing request
PREFIX_LISTING = {"s3", "s3a", "gs", "gcs"}


def protocols(fs) -> set[str]:
    return set(fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,))


def _state(info: dict | None) -> tuple[int, str | None] | None:
    if info is None:
        return None
    etag = info.get("ETag") or info.get("etag")
    return int(info.get("size", -1)), (str(etag).strip('"') if etag else None)


def object_states(fs, rpaths: list[str]) -> dict[str, tuple[int, str | None] | None]:
    """(size, ETag or None) of each object of ``rpaths``, None for one that is absent. Where
    the backend lists by prefix on the server and the names share a stem (a shard's or a
    part's files), one listing request; else a lookup each (a missing object cost s3fs a
    HEAD and a LIST)."""
    folder, _, stem = os.path.commonprefix(list(rpaths)).rpartition("/")
    if rpaths and folder and stem and protocols(fs) & PREFIX_LISTING:
        found = fs.find(folder, prefix=stem, detail=True)
        return {r: _state(found.get(r)) for r in rpaths}
    out = {}
    for r in rpaths:
        try:
            out[r] = _state(fs.info(r))
        except FileNotFoundError:
            out[r] = None
    return out


class Place:
    def __init__(self, folder, storage_options: dict | None = None, cache=None):
        folder = local_path(folder)
        self.remote = is_url(folder)
        self.folder = str(folder).rstrip("/") if self.remote else Path(folder)
        self.storage_options = storage_options  # None: the defaults (--storage-options)
        self._cache = cache
        if self.remote:
            self.fs, self.root = filesystem(self.folder, self.storage_options)

    def __repr__(self) -> str:
        return f"Place({self.folder!s})"

    @property
    def cache(self):
        if self._cache is None:
            self._cache = Cache()
        return self._cache

    def cache_if_any(self):
        """The cache given or made so far (None: none yet; a local place never makes one)."""
        return self._cache

    def path(self, name: str):
        """The file's name as a user sees it (a Path, or the URL)."""
        return join(self.folder, name)

    def sub(self, name: str) -> Place:
        return Place(join(self.folder, name), self.storage_options, self._cache)

    def at(self, relative: str) -> Place:
        """The place of a path a manifest recorded relative to this folder (``../corpus``'s
        folder)."""
        return Place(parent(normalize(self.folder, relative)), self.storage_options,
                     self._cache)

    def _remote(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _info(self, name: str) -> dict | None:
        """A remote object's info, None if there is none. Any other failure (no credentials,
        a store that does not answer) is raised: fsspec's exists() and isfile() answered
        False for it, and a command then said the dataset was not there."""
        try:
            return self.fs.info(self._remote(name))
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        if self.remote:
            return self._info(name) is not None
        p = self.path(name)
        return p.exists() or p.is_symlink()

    def is_file(self, name: str) -> bool:
        if self.remote:
            info = self._info(name)
            return info is not None and info.get("type") == "file"
        return self.path(name).is_file()

    def read_bytes(self, name: str) -> bytes:
        if self.remote:
            return self.fs.cat_file(self._remote(name))
        return self.path(name).read_bytes()

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def sizes(self, names: list[str]) -> dict[str, int | None]:
        """Bytes of each of ``names``, None where there is no such file: for a store, in one
        listing where it can."""
        if not self.remote:
            return {n: self._local_size(n) for n in names}
        states = object_states(self.fs, [self._remote(n) for n in names])
        return {n: None if (s := states[self._remote(n)]) is None else s[0] for n in names}

    def _local_size(self, name: str) -> int | None:
        try:  # one stat: a file removed meanwhile is missing, a path under a file an error
            return self.path(name).stat().st_size
        except FileNotFoundError:
            return None

    def file_states(self, names: list[str]) -> dict[str, tuple[int, int | None] | None]:
        """(bytes, modification time in ns) of each regular file of ``names`` (a store's
        object: its size, no time), None where there is none (or, locally, a link or
        something other than a regular file)."""
        if self.remote:
            return {n: None if s is None else (s, None) for n, s in self.sizes(names).items()}
        out = {}
        for n in names:
            try:
                st = os.lstat(self.path(n))
            except FileNotFoundError:
                out[n] = None
                continue
            out[n] = (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None
        return out

    def unlisted(self, listed: set[str], ours, there: set[str] | None = None) -> list[str]:
        """The files under the folder (``there``, else listed now) that are neither in
        ``listed`` (what a manifest names) nor packtool's own (``ours(place, name)``): the
        second half of every ownership proof, a folder's and a bucket's alike."""
        there = self.names() if there is None else there
        return sorted(n for n in there if n not in listed and not ours(self, n))

    def names(self, sub: str = "") -> set[str]:
        """Every file under the folder (or its ``sub`` folder), by its path relative to the
        folder: what an ownership proof compares with what a manifest lists. A local
        listing follows no link (a link is listed as a name, never entered)."""
        if self.remote:
            root = f"{self.root}/{sub}".rstrip("/")
            try:  # not fs.exists: it answers False for a store that does not answer at all
                found = self.fs.find(root)
            except FileNotFoundError:
                return set()
            return {p[len(self.root) + 1:] for p in found}
        top = self.path(sub) if sub else self.folder
        if not os.path.isdir(top) or os.path.islink(top):
            return set()
        out = set()
        for root, dirs, files in os.walk(top):
            rel = os.path.relpath(root, self.folder)
            for n in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                out.add(n if rel == "." else f"{rel}/{n}".replace(os.sep, "/"))
        return out

    def hidden_ours(self, name: str, bucket_pattern: str) -> bool:
        """Whether ``name`` is a hidden file packtool leaves: locally a lock or a dead run's
        temporary, shaped as packtool's are (packtool.storage.atomic.left_by_us); in a bucket,
        a name ``bucket_pattern`` matches (a format's locks, markers and job entries)."""
        if not self.remote:
            return left_by_us(self.path(name))
        return re.fullmatch(bucket_pattern, name) is not None

    @property
    def reader(self):
        """How a manifest here is read (formats._manifest.read_json_bytes): None, directly,
        for a local folder; through the store otherwise."""
        return self.read_bytes if self.remote else None

    def is_link(self, name: str) -> bool:
        """A symbolic link (never in a bucket): no file packtool wrote."""
        return not self.remote and self.path(name).is_symlink()

    def file_here(self, name: str) -> Path | None:
        """The local file to read and checksum directly; None for an object (its content
        is checked when it is fetched)."""
        return None if self.remote else self.path(name)

    def in_place(self, names: list[str]) -> dict[str, Path]:
        """The files of ``names`` a reader reads where they are, so checks itself before use
        (a folder's: each, by its path); a store's none: each is checked (size, digest) as
        :meth:`local` fetches it into the cache."""
        return {} if self.remote else {n: self.path(n) for n in names}

    def local(self, name: str, expect: dict, check=None) -> Path:
        """A local path to the file, checked against ``expect`` (a manifest's ``bytes``
        and digests): a folder's file itself, ``check(path, expect)`` run on it when given
        (the reader's once-per-process check); a store's object, its copy in the cache,
        verified when fetched."""
        if not self.remote:
            if check is not None:
                check(self.path(name), expect)
            return self.path(name)
        return self.cache.get(self.fs, self._remote(name), str(self.path(name)), expect)


def place_of(path, storage_options: dict | None = None, cache=None) -> tuple[Place, str]:
    """(the folder's place, the file or prefix name) of a path or URL."""
    path = local_path(path)
    return Place(parent(path), storage_options, cache), basename(path)


def fetch_tokenizer(url: str) -> Path:
    """A tokenizer at a URL (a ``tokenizer.json``, a ``.model``, or a model folder holding
    one, with its ``tokenizer_config.json``: the chat template), copied into
    ``CACHE_DIR/tokenizers/<hash of URL and ETags>/`` once, and its local path. Each Ray
    worker or array task fetches its own copy: no shared file system is needed."""
    fs, path = filesystem(url)
    path = path.rstrip("/")
    wanted = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if fs.isdir(path):
        files = {n: f"{path}/{n}" for n in wanted if fs.isfile(f"{path}/{n}")}
        if not ({"tokenizer.json", "tokenizer.model"} & set(files)):
            raise PacktoolError(f"tokenizer {url}: holds no tokenizer.json or tokenizer.model")
    elif fs.isfile(path):
        folder = path.rsplit("/", 1)[0]
        files = {basename(path): path}
        if fs.isfile(f"{folder}/tokenizer_config.json"):
            files["tokenizer_config.json"] = f"{folder}/tokenizer_config.json"
    else:
        raise PacktoolError(f"tokenizer {url}: no such object or prefix")
    tags = [str(info.get("ETag") or info.get("size"))
            for info in (fs.info(p) for p in files.values())]
    key = hashlib.sha256(json.dumps([url, sorted(files), tags]).encode()).hexdigest()[:20]
    dest = default_dir() / "tokenizers" / key
    if not dest.is_dir():
        tmp = temp_name(dest)
        tmp.mkdir(parents=True)
        try:
            for name, rpath in files.items():
                fs.get_file(rpath, str(tmp / name))
            os.replace(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    main = next(n for n in ("tokenizer.json", "tokenizer.model", *files) if n in files)
    return dest / main
