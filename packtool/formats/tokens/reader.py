"""The token format's reader and validator: ``open_tokens`` checks everything cheap at open
(the manifest against its schema and digest, part names and positions, every file's size, every
part's boundaries) and each data file's crc32 (sha256 where none is recorded) on its first
read; ``validate_tokens`` hashes everything at once, sha256 and crc32 (what ``packtool verify
PREFIX`` runs)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ...errors import FormatError
from .._manifest import check, check_digest, confined_file, confined_name, load_json, read_manifest
from .corpus import TokenCorpus, TokenPart, check_file, check_size, memmap
from .schema import (
    DATA_KEYS,
    DIGEST_KEY,
    FIX,
    FORMAT,
    IMAGE_COUNTS,
    PART_MANIFEST,
    PARTS_KEY,
    READABLE,
    SPECS,
    part_manifest_digest,
    part_manifest_path,
    part_name,
    plan_digest,
    split_prefix,
)


# ------------------------------------------------------------------------------ opening
def _part_entries(meta: dict, path: Path) -> list[dict]:
    """The manifest's part entries (version 1: one part named after the prefix), checked
    against the schema of its version, its digest, and bound together: totals are the
    parts' sums, names follow positions, the plan's digest is its parts' digests'."""
    version = meta["version"]
    check(meta, SPECS[version], path, FIX)
    if version == 1:
        return [{"name": path.name[:-len(".json")], "n_docs": meta["n_docs"],
                 "n_tokens": meta["n_tokens"], "checksums": meta["checksums"]}]
    parts = meta["parts"]
    for key in ("n_docs", "n_tokens", "n_empty", "n_trained_tokens"):
        if key in meta and all(key in q for q in parts) and meta[key] != sum(
                q[key] for q in parts):
            raise FormatError(f"{path}: {key} {meta[key]:,} is not the sum of its parts' "
                              f"({sum(q[key] for q in parts):,}); {FIX}")
    for q in parts:
        unit = "n_groups" if "n_groups" in q else "n_docs"  # a group's record: n sequences
        if q.get("inputs") and sum(i["n_docs"] for i in q["inputs"]) != q[unit]:
            raise FormatError(f"{path}: part {q['name']!r} has {q[unit]:,} "
                              f"{'groups' if unit == 'n_groups' else 'documents'} but its "
                              f"inputs' add up to {sum(i['n_docs'] for i in q['inputs']):,}"
                              f"; {FIX}")
        if q.get("n_trained_tokens", 0) > q["n_tokens"] or q.get("n_empty", 0) > q["n_docs"]:
            raise FormatError(f"{path}: part {q['name']!r}: counts out of range; {FIX}")
    names = [q["name"] for q in parts]
    if len(set(names)) != len(names):
        raise FormatError(f"{path}: a part is listed twice; {FIX}")
    for q in parts:
        confined_name(q["name"], path)
    if version >= 3:
        _check_bound(meta, parts, path)
    return parts


def _check_bound(meta: dict, parts: list[dict], path: Path) -> None:
    check_digest(meta, DIGEST_KEY, path, FIX)
    plan = meta["plan"]
    if plan["n_parts"] != len(parts):
        raise FormatError(f"{path}: the plan has {plan['n_parts']:,} parts, the manifest lists "
                          f"{len(parts):,}; {FIX}")
    if len({q["digest"] for q in parts}) != len(parts):
        raise FormatError(f"{path}: two parts have the same digest (a part copied over "
                          f"another); {FIX}")
    for k, q in enumerate(parts):
        want = part_name(plan["prefix"], k, len(parts))
        if q["index"] != k or q["name"] != want:
            raise FormatError(f"{path}: part {k} is {q['name']!r} (index {q['index']}), "
                              f"expected {want!r}: parts reordered or replaced; {FIX}")
    if plan["digest"] != plan_digest([q["digest"] for q in parts]):
        raise FormatError(f"{path}: the plan digest does not match its parts' digests: a part "
                          f"comes from another run; {FIX}")


def _find_part_manifest(place, names: list[str]):
    """(path, found) of the first of ``names`` (the part's current name, then the name it was
    written under: a corpus renamed a.* -> b.* may leave its hidden files as they were)."""
    for name in names:
        hidden = part_manifest_path(Path("."), name).name
        if place.is_file(hidden) and not place.is_link(hidden):
            return place.path(hidden), True
    return place.path(part_manifest_path(Path("."), names[0]).name), False


def _check_part_manifest(place, names: list[str], k: int, entry: dict, meta: dict) -> None:
    """The part's own manifest (version 3): required, the run's record of this very entry,
    and (where the corpus manifest records it) of the digest the corpus manifest bound."""
    name = names[0]
    path, found = _find_part_manifest(place, names)
    if not found:
        raise FormatError(
            f"{path} is missing: the corpus is incomplete (each part's own manifest, hidden "
            f"beside its files, is part of it: copy the folder, or {name}.* with "
            f".{name}.part.json); restore it or re-run packtool tokenize")
    m = load_json(path, place.reader)
    check(m, PART_MANIFEST, path, FIX)
    same = (m["index"] == entry["index"] and m["digest"] == entry["digest"]
            and m["plan_digest"] == meta["plan"]["digest"] and m["part"] == entry)
    if not same:
        raise FormatError(f"{path} disagrees with its entry in the corpus manifest (position, "
                          f"digest, counts, inputs or checksums): the manifest was edited; "
                          f"{FIX}")
    bound = meta.get(PARTS_KEY)
    if bound is not None and (len(bound) != len(meta["parts"])
                              or bound[k] != part_manifest_digest(m, read=True)):
        raise FormatError(f"{path} is not the part manifest {meta['plan']['prefix']}.json "
                          f"records ({PARTS_KEY}[{k}]): it was edited or comes from another "
                          f"corpus; {FIX}")
    settings = {key: v for key, v in m["meta"].items() if key != "engine"}
    ours = dict(meta)
    if isinstance(ours.get("images"), dict):  # the corpus's adds the parts' totals
        ours["images"] = {k: v for k, v in ours["images"].items() if k not in IMAGE_COUNTS}
    differ = sorted(key for key, v in settings.items() if ours.get(key) != v)
    if differ:
        raise FormatError(f"{path}: the part was made with other settings than the corpus "
                          f"manifest says ({', '.join(differ)} differ): the manifest was edited "
                          f"or the part comes from another corpus; {FIX}")


def check_boundaries(ends: np.ndarray, n_tokens: int, path: Path, chunk: int = 1 << 20,
                     n_empty: int | None = None) -> None:
    """Document ends must start >= 0, never decrease and end at the token count (a part of
    no document holds no token), and (``n_empty``) so many documents be empty: every offset a
    kernel later indexes with is proven in range here (O(documents), ~0.1 s/10M)."""
    prev, empty = 0, 0
    for a in range(0, len(ends), chunk):
        e = np.asarray(ends[a:a + chunk])
        d = np.diff(e, prepend=np.int64(prev))
        if (d < 0).any():
            i = a + int(np.flatnonzero(d < 0)[0])
            raise FormatError(f"{path}: document {i:,} ends at {int(ends[i]):,}, before the "
                              f"previous document's end; the file is corrupt, {FIX}")
        empty += int(np.count_nonzero(d == 0))
        prev = int(e[-1])
    if prev != n_tokens:
        raise FormatError(f"{path}: the documents end at token {prev:,}, but the part holds "
                          f"{n_tokens:,} tokens; the file is corrupt, {FIX}")
    if n_empty is not None and empty != n_empty:
        raise FormatError(f"{path}: {empty:,} documents are empty, the manifest says "
                          f"{n_empty:,}; {FIX}")


def open_part(place, name: str, entry: dict, dtype: np.dtype, with_mask: bool,
              checksums: bool = True, manifest=None) -> TokenPart:
    """One part's files, checked: each a regular file or a link inside the folder, sizes
    against the entry, boundaries in range (read once, then unmapped). A remote part's files
    are checked when fetched (size, sha256), its boundaries on first use."""
    part = TokenPart(place=place, name=name, entry=entry, dtype=dtype, with_mask=with_mask,
                     checksums=checksums)
    if with_mask and "mask" not in entry["checksums"]:
        raise FormatError(f"{manifest}: the corpus has a mask but part {name!r} lists no mask "
                          f"checksum; {FIX}")
    n_docs, n_tokens = entry["n_docs"], entry["n_tokens"]
    sizes = {k: part.layout(k)[0].itemsize * part.layout(k)[1] for k in DATA_KEYS
             if k in entry["checksums"] and (k != "mask" or with_mask)}  # bin, boundaries: all
    # the files read in place, checked now (a store's: each as it is fetched, the
    # boundaries now, 8 bytes a document, the .bin on first use)
    for name_key, here in place.in_place([f"{name}.{k}" for k in sizes]).items():
        check_size(confined_file(here, manifest or place.path(f"{name}.json")),
                   sizes[name_key[len(name) + 1:]])
    # checked even without ``checksums``: 8 bytes a document, a shifted boundary never silent
    ends = part.file("boundaries", check_file if checksums else None)
    check_boundaries(memmap(ends, np.dtype("<i8"), n_docs), n_tokens,
                     part.path("boundaries"), n_empty=entry.get("n_empty"))
    return part


def _renamed(name: str, meta: dict, prefix_name: str) -> str:
    """A part's file stem for a corpus whose files were renamed together (``a.*`` ->
    ``b.*``, as version 1 allowed): names written under the prefix the plan records follow
    the manifest's current name."""
    was = (meta.get("plan") or {}).get("prefix")
    if isinstance(was, str) and was and was != prefix_name and (
            name == was or name.startswith(was + ".part-")):
        return prefix_name + name[len(was):]
    return name


def open_tokens(prefix, checksums: bool = True, storage_options: dict | None = None,
                cache=None) -> TokenCorpus:
    """Open the corpus ``PREFIX.json`` describes (written by ``packtool tokenize``): a local
    prefix, or a URL (``s3://bucket/corpus``; see :mod:`packtool.storage`: ``storage_options``
    for the filesystem, ``cache`` a :class:`packtool.storage.cache.Cache` for its files).

    Always checked at open (cheap): the manifest against its schema and (version 3) its
    digest, part names and positions, every file's size, and every part's boundaries
    (non-decreasing, from >= 0 to the part's token count), so no later read can leave a
    file. With ``checksums`` a part's ``.bin``/``.mask`` is re-hashed on its first read, once
    per process (see :class:`TokenPart`); :meth:`TokenCorpus.verify_checksums` hashes all.
    """
    from ...storage import local_path
    from ...storage.place import place_of

    prefix = split_prefix(local_path(prefix))
    place, stem = place_of(prefix, storage_options, cache)
    path = place.path(f"{stem}.json")
    raw: list = []
    meta = read_manifest(path, FORMAT, READABLE, place.reader, raw=raw)
    entries = _part_entries(meta, path)
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    parts = []
    for k, q in enumerate(entries):
        name = _renamed(q["name"], meta, stem)
        if meta["version"] >= 3:
            _check_part_manifest(place, list(dict.fromkeys([name, q["name"]])), k, q, meta)
        parts.append(open_part(place, name, q, dtype, bool(meta.get("mask")), checksums, path))
    return TokenCorpus(prefix=prefix, meta=meta, parts=parts,
                       file_sha256=hashlib.sha256(raw[0]).hexdigest())


def validate_tokens(prefix, storage_options: dict | None = None) -> TokenCorpus:
    """Everything :func:`open_tokens` checks, plus every file's sha256 (and crc32) and mask
    values in {0, 1}: what ``packtool verify PREFIX`` runs."""
    corpus = open_tokens(prefix, storage_options=storage_options)
    corpus.verify_checksums()
    vocab = int(corpus.meta.get("vocab_size") or 0)
    for q in corpus.parts:
        if q.mask is not None and len(q.tokens) and int(np.asarray(q.mask).max()) > 1:
            raise FormatError(f"{q.path('mask')}: values other than 0 and 1")
        trained = int(np.asarray(q.mask).sum(dtype=np.int64)) if q.mask is not None else len(
            q.tokens)
        if q.entry.get("n_trained_tokens", trained) != trained:
            raise FormatError(f"{corpus.prefix}: part {q.name!r} trains on {trained:,} tokens, "
                              f"the manifest says {q.entry['n_trained_tokens']:,}; {FIX}")
        if vocab and len(q.tokens):
            top = int(np.asarray(q.tokens).max())
            if top >= vocab:
                raise FormatError(f"{q.path('bin')}: token id {top:,} >= vocab_size {vocab:,}")
    if corpus.groups:  # roles in order, prompts within and equal across each group
        from .groups import check_prompts_equal, group_table

        table = group_table([corpus])
        if table.n_groups != corpus.groups["n_groups"]:
            raise FormatError(f"{corpus.prefix}: {table.n_groups:,} groups in .roles, the "
                              f"manifest says {corpus.groups['n_groups']:,}; {FIX}")
        check_prompts_equal(corpus, table)
    return corpus


def read_corpus_manifest(path, place=None) -> dict:
    """A corpus manifest ``PREFIX.json``, checked as :func:`open_tokens` checks it (format,
    version, schema, digest, parts bound together) without opening its data files: what
    proves a manifest packtool's before --overwrite replaces it, in a local folder or a
    bucket alike (``place``: a :class:`packtool.storage.place.Place`, ``path`` its name
    there)."""
    where = path if place is None else place.path(str(path))
    meta = read_manifest(where, FORMAT, READABLE, read=None if place is None else place.reader)
    _part_entries(meta, where)
    return meta


def read_part_manifest(path, place=None) -> dict | None:
    """A part's own manifest, checked against its schema; None when there is none
    (``place``: a :class:`packtool.storage.place.Place` it is read from, ``path`` its name
    there)."""
    from ...storage.place import place_of

    place, name = place_of(path) if place is None else (place, str(path))
    if not place.exists(name):
        return None
    where = place.path(name)
    m = load_json(where, place.reader)
    check(m, PART_MANIFEST, where, FIX)
    return m
