"""The packed format's job entries: the hidden files a pack leaves in its staging folder, one
per finished job, renamed in after the job's shard files, so that a job is finished when its
entry is there, readable, of this plan, and every file it lists has its size and crc32::

    .shard-KKKKK.entry.json  packtool.packed.shard v2  one shard of a global plan: the shard's
                                                       index.json entry and the job's digest
    .group-GGGGG.entry.json  packtool.packed.group v1  one group of --group-docs: per split its
                                                       shards' entries and the figures finalize
                                                       adds up (counts, length histogram, ...)

Like index.json they are versioned and checked against their schema on read (a test checks
docs/FORMAT.md against ``SHARD_ENTRY_KEYS``, ``GROUP_ENTRY_KEYS`` and ``SPLIT_KEYS``); an entry
that is not one (another format or version, a missing key, a file name that is not a plain
name) counts as not written, named, so the job is done again.
"""

from __future__ import annotations

import json

from ..errors import FormatError
from ..formats._manifest import (
    Key,
    check,
    confined_name,
    count,
    dict_of,
    hexstr,
    list_of,
    number,
    obj,
    one_of,
)
from ..formats.packed.files import check_crc
from ..formats.packed.schema import SHARD_FILE, SHARD_KEYS

SHARD_ENTRY = "packtool.packed.shard"
SHARD_ENTRY_VERSION = 2
GROUP_ENTRY = "packtool.packed.group"
GROUP_ENTRY_VERSION = 1
FIX = "the job is written again"

_SHARD = obj({**SHARD_KEYS, "files": Key(dict_of(SHARD_FILE), "per array: {name, crc32, bytes}")})
SHARD_ENTRY_KEYS = {  # .shard-KKKKK.entry.json
    "format": Key(one_of(SHARD_ENTRY), '"packtool.packed.shard"'),
    "version": Key(one_of(SHARD_ENTRY_VERSION), "2"),
    "digest": Key(hexstr(64), "sha256 of the job: the plan's options and sources, the split, "
                  "the shard's number and its segments"),
    "entry": Key(_SHARD, "the shard's entry in index.json's shards (name, counts, files)"),
}
SPLIT_KEYS = {  # one split of a group entry
    "shards": Key(list_of(_SHARD), "the group's shards of this split, as index.json lists them"),
    "n_packs": Key(count(), "packs"),
    "counts": Key(dict_of(count()), "the plan's counts (n_docs, n_segments, n_tokens, ...)"),
    "hist": Key(dict_of(count()), "segments per length, {length: count}, lengths with any"),
    "report": Key(obj({}), "the packer's report (PackerReport.to_json())"),
    "imbalance": Key(list_of(number(0)), "[sum over blocks of max/mean attention cost, "
                     "blocks counted]"),
    "tokens_used": Key(list_of(count()), "per source: tokens in this split's packs"),
    "docs_used": Key(list_of(count()), "per source: document copies in this split's packs"),
}
GROUP_ENTRY_KEYS = {  # .group-GGGGG.entry.json
    "format": Key(one_of(GROUP_ENTRY), '"packtool.packed.group"'),
    "version": Key(one_of(GROUP_ENTRY_VERSION), "1"),
    "digest": Key(hexstr(64), "sha256 of the plan (options, sources, factors, version)"),
    "g": Key(count(), "the group's number: documents g*G .. (g+1)*G-1"),
    "splits": Key(dict_of(obj(SPLIT_KEYS)), '"train" and, with a held-out split, "valid"'),
}
_SPECS = {SHARD_ENTRY: (SHARD_ENTRY_VERSION, SHARD_ENTRY_KEYS),
          GROUP_ENTRY: (GROUP_ENTRY_VERSION, GROUP_ENTRY_KEYS)}


def shard_entry_name(k: int) -> str:
    return f".shard-{k:05d}.entry.json"


def group_entry_name(g: int) -> str:
    return f".group-{g:05d}.entry.json"


def shard_entry(digest: str, entry: dict) -> dict:
    """The entry of a finished shard job (``entry``: the writer's index entry)."""
    return _made(SHARD_ENTRY, {"format": SHARD_ENTRY, "version": SHARD_ENTRY_VERSION,
                               "digest": digest, "entry": entry})


def group_entry(digest: str, g: int, splits: dict) -> dict:
    """The entry of a finished group job: per split, :data:`SPLIT_KEYS`."""
    return _made(GROUP_ENTRY, {"format": GROUP_ENTRY, "version": GROUP_ENTRY_VERSION,
                               "digest": digest, "g": g, "splits": splits})


def _made(kind: str, body: dict) -> dict:
    """A writer's entry checked against its schema (a key the schema lacks is a bug here)."""
    keys = _SPECS[kind][1]
    unknown = set(body) - set(keys)
    if kind == GROUP_ENTRY:
        unknown |= {k for s in body["splits"].values() for k in s} - set(SPLIT_KEYS)
    if unknown:
        raise RuntimeError(f"{kind} entry keys not in the schema: {sorted(unknown)}")
    check(json.loads(json.dumps(body)), obj(keys), kind, "a bug in packtool")
    return body


def read_entry(name: str, kind: str, place) -> tuple[dict | None, str]:
    """(the entry, "") of the job entry ``name`` of ``kind`` in ``place`` (a
    :class:`packtool.storage.place.Place`) that is readable and fits its schema, else
    (None, why): "missing", or what is wrong with it."""
    version, keys = _SPECS[kind]
    path = place.path(name)
    try:
        if place.is_link(name):
            return None, f"{path} is a symbolic link, not an entry packtool wrote"
        m = json.loads(place.read_bytes(name))
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable entry ({e})"
    if not isinstance(m, dict) or m.get("format") != kind:
        got = m.get("format") if isinstance(m, dict) else type(m).__name__
        return None, f"{path}: format {got!r}, not a {kind} entry"
    if m.get("version") != version or isinstance(m.get("version"), bool):
        return None, (f"{path}: {kind} version {m.get('version')!r}, this packtool reads "
                      f"version {version}")
    try:
        check(m, obj(keys), path, FIX)
        for sh in [m["entry"]] if kind == SHARD_ENTRY else [
                sh for s in m["splits"].values() for sh in s["shards"]]:
            for f in sh["files"].values():
                confined_name(f["name"], path)
    except FormatError as e:
        return None, str(e)
    return m, ""


def check_files(place, prefix: str, shards: list[dict], checksums: bool = True) -> str:
    """"" when every file of ``shards`` is in ``place`` (under ``prefix``: "" or "valid/")
    as listed, else why not: a regular file of its size and, with ``checksums``, its crc32
    in a local folder; an object of its size in a bucket (its content is checked when
    read)."""
    names = [prefix + f["name"] for sh in shards for f in sh["files"].values()]
    sizes = place.sizes(names)
    try:
        for sh in shards:
            for f in sh["files"].values():
                name = prefix + f["name"]
                size, where = sizes[name], place.path(name)
                if place.is_link(name):
                    return f"{where} is a symbolic link, not a file packtool wrote"
                if size != f["bytes"]:
                    return (f"{where} is missing" if size is None else
                            f"{where} has {size:,} bytes, its entry {f['bytes']:,}")
                if checksums and (path := place.file_here(name)) is not None:
                    check_crc(path, f["crc32"])
    except FormatError as e:
        return f"corrupt: {e}"
    return ""
