"""The files of a packed dataset, opened and checked: ``index.json`` (schema, digest, names),
a shard's arrays (size, dtype, shape, offsets; crc32 once per process), its segment table
(:class:`Shard`), and, for the index layout, the source corpora (their manifests against the
sha256 the index recorded)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..._io import check_once, crc32_file
from ...errors import FormatError, PacktoolError
from ...storage import is_url
from .._manifest import check, check_digest, confined_file, confined_name, read_manifest
from .layout import align_up, scan_packs, v1_segments
from .schema import (
    DIGEST_KEY,
    FIX,
    FORMAT,
    INDEX,
    READABLE,
    SHARD_FILE,
    SPECS,
    alignment,
    array_dtype,
    array_length,
    disagreement,
    shard_arrays,
)


class ValidationError(FormatError):
    """The first violation found in a packed dataset (names shard, pack and token)."""


def read_index(directory, place=None) -> dict:
    """index.json, checked: schema of its version, digest, every file name confined
    (``place``: a :class:`packtool.storage.place.Place` of a remote ``directory``)."""
    from ...storage.place import Place

    place = Place(directory) if place is None else place
    path = place.path(INDEX)
    if place.file_here(INDEX) is not None and not place.folder.is_dir():
        raise FormatError(f"{place.folder} is not a directory; pass the --out of packtool pack")
    index = read_manifest(path, FORMAT, READABLE, place.reader)
    check_digest(index, DIGEST_KEY, path, FIX)
    check(index, SPECS[index["version"]], path, FIX)
    if (why := disagreement(index)) is not None:
        raise FormatError(f"{path}: {why}; {FIX}")
    want = {a.name for a in shard_arrays(index)}
    for sh in index["shards"]:
        if set(sh["files"]) != want:
            raise FormatError(f"{path}: shard {sh['name']!r} lists files {sorted(sh['files'])}, "
                              f"the format has {sorted(want)}; {FIX}")
        for f in sh["files"].values():
            check(f, SHARD_FILE, path, FIX)
            if (here := place.file_here(confined_name(f["name"], path))) is not None:
                confined_file(here, path)
    return index


def load_array(path: Path, dtype: np.dtype, n: int, name=None) -> np.ndarray:
    """Memory-map a 1-D .npy, refusing anything but ``dtype`` and shape ``(n,)`` (``name``:
    the file as a user knows it, when ``path`` is a cached copy)."""
    name = path if name is None else name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ValidationError(f"{path} is missing (listed in {INDEX})") from None
    if size == 0:
        raise ValidationError(f"{path} is empty (0 bytes): the shard is damaged; {FIX}")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # numpy's header parser raises anything from a damaged header
        raise ValidationError(f"{name}: not a readable .npy ({e})") from None
    if arr.dtype != dtype or arr.shape != (n,):
        raise ValidationError(f"{name}: holds {arr.dtype} {arr.shape}, expected {dtype} ({n},)")
    return arr.view(np.ndarray)  # a plain view: slicing a np.memmap costs ~2 us in Python


def check_crc(path: Path, want: str) -> None:
    """crc32 of ``path`` against the index, once per file per process."""
    def check_now():
        if crc32_file(path) != want:
            raise ValidationError(f"{path}: crc32 does not match {INDEX}; the file is corrupt "
                                  f"({FIX}, or packtool verify for details)")

    check_once(path, want, check_now)


def _check_size(path: Path, want: dict) -> None:
    """A shard file read in place: confined to its folder, and of the size the index says."""
    confined_file(path, path.parent / INDEX)
    size = path.stat().st_size if path.is_file() else None
    if size == 0:
        raise ValidationError(f"{path} is empty (0 bytes): the shard is damaged; {FIX}")
    if size is not None and size != want["bytes"]:
        raise ValidationError(f"{path}: {size:,} bytes, {INDEX} says {want['bytes']:,}; the "
                              f"file is truncated or replaced, {FIX}")


def open_shard_arrays(directory, index: dict, k: int, checksums: bool, place=None) -> dict:
    """Shard ``k``'s arrays as memory maps, checked: names, sizes, dtypes, shapes, crc32 (a
    remote shard's files are fetched into the cache, their size and crc32 checked then)."""
    from ...storage.place import Place

    place = Place(directory) if place is None else place
    sh = index["shards"][k]
    arrays = {}
    for a in shard_arrays(index):
        f = sh["files"][a.name]
        n = array_length(a, sh["n_tokens"], sh["n_packs"], sh["n_segments"])
        local = place.local(f["name"], {"bytes": f["bytes"], "crc32": f["crc32"]}, _check_size)
        arrays[a.name] = load_array(local, array_dtype(a, index), n, place.path(f["name"]))
        if checksums and place.file_here(f["name"]) is not None:  # a store's: when fetched
            check_crc(local, f["crc32"])
    return arrays


@dataclass
class Shard:
    """One shard's segment table (the stored arrays, memory-mapped) and its pack offsets
    (int64, 8 bytes a pack, in memory)."""

    name: str
    arrays: dict
    pack_seg: np.ndarray
    seg_doc: np.ndarray
    seg_offset: np.ndarray
    seg_length: np.ndarray
    po: np.ndarray

    @property
    def n_packs(self) -> int:
        return int(self.pack_seg.size) - 1


def shard_table(index: dict, sh: dict, arrays: dict) -> Shard:
    """The segment table of a shard (memory maps as stored; version 1's lengths derived),
    checked so that no later index leaves an array."""
    if index["version"] == 1:
        ps = np.asarray(arrays["seg_offsets"], np.int64)
        seg_len = v1_segments(arrays["cu_seqlens"], ps) if ps.size > 1 else np.zeros(0, np.int64)
        doc, off = arrays["source_docs"], arrays["source_offsets"]
    else:
        ps, seg_len = arrays["pack_seg"], arrays["seg_length"]
        doc, off = arrays["seg_doc"], arrays["seg_offset"]
    n_seg, n_packs = sh["n_segments"], sh["n_packs"]
    po, bad = scan_packs(seg_len, ps)
    if bad or ps.size != n_packs + 1 or seg_len.size != n_seg or int(po[-1]) != sh["n_tokens"]:
        raise ValidationError(f"{sh['name']}: pack/segment offsets are not increasing from 0 to "
                              f"the shard's counts (or a segment is empty); the shard is "
                              f"damaged, {FIX}")
    shard = Shard(sh["name"], arrays, ps, doc, off, seg_len, po)
    k = alignment(index)[0]
    rows = np.diff(shard.po) if k == 1 else np.diff(scan_packs(align_up(seg_len, k), ps)[0])
    if n_packs and int(rows.max()) > int(index["seq_len"]):
        raise ValidationError(f"{sh['name']}: a pack is longer than seq_len "
                              f"{index['seq_len']:,}" + (f" with its segments aligned to {k}"
                                                         if k > 1 else "")
                              + f"; the shard is damaged, {FIX}")
    if index["version"] == 1 and n_packs and not np.array_equal(
            np.asarray(arrays["pack_offsets"], np.int64), shard.po):
        raise ValidationError(f"{sh['name']}: pack_offsets disagree with cu_seqlens; the shard "
                              f"is damaged, {FIX}")
    return shard


def source_location(directory, entry: dict) -> list:
    """Where a source corpus may be: beside the dataset as it was (its path relative to the
    dataset), then where it was given at pack time (Paths, or URLs)."""
    from ...storage import normalize

    out = []
    if entry.get("path"):
        out.append(normalize(directory, entry["path"]))
    out.append(entry["prefix"] if is_url(entry["prefix"]) else Path(entry["prefix"]))
    return out


def open_sources_of(directory, index: dict, override=None, checksums: bool = True,
                    storage_options: dict | None = None, cache=None):
    """The source corpora an index-layout dataset reads its tokens from, each checked
    against the manifest sha256 the index recorded."""
    from ...storage.place import place_of
    from ..tokens import open_tokens

    recorded = index["sources"]
    if override is not None and len(override) != len(recorded):
        raise PacktoolError(f"{len(override)} sources given, the dataset was packed from "
                            f"{len(recorded)}: {', '.join(s['prefix'] for s in recorded)}")
    corpora = []
    for k, src in enumerate(recorded):
        places = [override[k]] if override is not None else source_location(directory, src)
        found = None
        for p in places:
            where, stem = place_of(p, storage_options, cache)
            if where.is_file(f"{stem}.json"):
                found = p
                break
        if found is None:
            raise FormatError(
                f"{directory}: its source {src['prefix']} is missing (looked for "
                f"{' and '.join(f'{p}.json' for p in places)}); an index-layout "
                "dataset reads its tokens from it: put it back, pass its new place "
                "(open_packed(dir, sources=[...]) or --source), or pack with --layout tokens")
        corpus = open_tokens(found, checksums=checksums, storage_options=storage_options,
                             cache=cache)
        if corpus.file_sha256 != src["manifest_sha256"]:
            raise FormatError(
                f"{directory}: its source {found} is not the corpus it was packed from (the "
                f"manifest's sha256 differs from the one recorded); re-pack it, or restore "
                "that corpus")
        corpora.append(corpus)
    return corpora
