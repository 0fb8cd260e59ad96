"""The one reader of packed datasets, every version and layout: ``open_packed(DIR)[i]`` is a
pack as the trainer takes it (input_ids, labels, position_ids, doc_ids, cu_seqlens,
max_seqlen, source_docs, source_offsets), derived from the pack's segments
(:mod:`.layout`) and its tokens: stored in the shard (``tokens`` layout, version 1) or read
from the source corpus (``index`` layout).

What is checked, always and cheaply: at open, index.json against its schema and digest, every
file name; when a shard is first used, every file's size, dtype and shape, its offsets
(monotonic, in range) and, with ``checksums``, each file's crc32 once per process; for the
index layout, each source's manifest against the sha256 the index recorded (a source that
changed, moved without its manifest, or is missing is refused by name), and its files'
sha256 on first read, as :func:`packtool.open_tokens` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..._io import check_once, crc32_file
from ...errors import FormatError, PacktoolError
from ...storage import is_url
from .._manifest import check, check_digest, confined_file, confined_name, read_manifest
from .layout import derive, fold_shift, pack_offsets, unpack_mask, v1_segments
from .schema import (
    DIGEST_KEY,
    FIX,
    FORMAT,
    INDEX,
    READABLE,
    SHARD_FILE,
    SPECS,
    array_dtype,
    array_length,
    shard_arrays,
)

OPEN_SHARDS = 64  # shards whose memory maps stay open at once


class ValidationError(FormatError):
    """The first violation found in a packed dataset (names shard, pack and token)."""


def read_index(directory, place=None) -> dict:
    """index.json, checked: schema of its version, digest, every file name confined
    (``place``: a :class:`packtool.storage.place.Place` of a remote ``directory``)."""
    if place is not None and place.remote:
        path = place.path(INDEX)
        index = read_manifest(path, FORMAT, READABLE, place.read_bytes)
    else:
        directory = Path(directory)
        if not directory.is_dir():
            raise FormatError(f"{directory} is not a directory; pass the --out of packtool "
                              "pack")
        path = directory / INDEX
        index = read_manifest(path, FORMAT, READABLE)
    check_digest(index, DIGEST_KEY, path, FIX)
    check(index, SPECS[index["version"]], path, FIX)
    want = {a.name for a in shard_arrays(index)}
    for sh in index["shards"]:
        if set(sh["files"]) != want:
            raise FormatError(f"{path}: shard {sh['name']!r} lists files {sorted(sh['files'])}, "
                              f"the format has {sorted(want)}; {FIX}")
        for f in sh["files"].values():
            check(f, SHARD_FILE, path, FIX)
            name = confined_name(f["name"], path)
            if place is None or not place.remote:
                confined_file(Path(directory) / name, path)
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
    return arr


def check_crc(path: Path, want: str) -> None:
    """crc32 of ``path`` against the index, once per file per process."""
    def check_now():
        if crc32_file(path) != want:
            raise ValidationError(f"{path}: crc32 does not match {INDEX}; the file is corrupt "
                                  f"({FIX}, or packtool verify for details)")

    check_once(path, want, check_now)


def open_shard_arrays(directory, index: dict, k: int, checksums: bool, place=None) -> dict:
    """Shard ``k``'s arrays as memory maps, checked: names, sizes, dtypes, shapes, crc32 (a
    remote shard's files are fetched into the cache, their size and crc32 checked then)."""
    sh = index["shards"][k]
    arrays = {}
    for a in shard_arrays(index):
        f = sh["files"][a.name]
        n = array_length(a, sh["n_tokens"], sh["n_packs"], sh["n_segments"])
        if place is not None and place.remote:
            local = place.local(f["name"], {"bytes": f["bytes"], "crc32": f["crc32"]})
            arrays[a.name] = load_array(local, array_dtype(a, index), n, place.path(f["name"]))
            continue
        path = confined_file(Path(directory) / f["name"], Path(directory) / INDEX)
        size = path.stat().st_size if path.is_file() else None
        if size == 0:
            raise ValidationError(f"{path} is empty (0 bytes): the shard is damaged; {FIX}")
        if size is not None and size != f["bytes"]:
            raise ValidationError(f"{path}: {size:,} bytes, {INDEX} says {f['bytes']:,}; the "
                                  f"file is truncated or replaced, {FIX}")
        arrays[a.name] = load_array(path, array_dtype(a, index), n)
        if checksums:
            check_crc(path, f["crc32"])
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
    po: np.ndarray = field(init=False)

    def __post_init__(self):
        self.po = pack_offsets(np.asarray(self.seg_length, np.int64), self.pack_seg)

    @property
    def n_packs(self) -> int:
        return int(self.pack_seg.size) - 1


def _table(index: dict, sh: dict, arrays: dict) -> Shard:
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
    bad = (ps.size != n_packs + 1 or (n_packs and (int(ps[0]) != 0 or int(ps[-1]) != n_seg))
           or (np.diff(ps.astype(np.int64)) <= 0).any() or seg_len.size != n_seg
           or (n_seg and int(seg_len.min()) <= 0) or int(seg_len.sum(dtype=np.int64))
           != sh["n_tokens"])
    if bad:
        raise ValidationError(f"{sh['name']}: pack/segment offsets are not increasing from 0 to "
                              f"the shard's counts (or a segment is empty); the shard is "
                              f"damaged, {FIX}")
    shard = Shard(sh["name"], arrays, ps, doc, off, seg_len)
    if n_packs and int(np.diff(shard.po).max()) > int(index["seq_len"]):
        raise ValidationError(f"{sh['name']}: a pack is longer than seq_len "
                              f"{index['seq_len']:,}; the shard is damaged, {FIX}")
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


class PackedReader:
    """A packed dataset on disk: ``len(ds)`` packs; ``ds[i]`` a dict of numpy arrays.

    >>> ds = open_packed("out/packed")         # doctest: +SKIP
    >>> ex = ds[0]; ex["input_ids"], ex["cu_seqlens"], ex["max_seqlen"]
    >>> batch = collate_numpy([ds[0], ds[1]])         # one [1, N] row for flash-attention varlen

    ``sources``: for an index-layout dataset whose source corpora moved, their prefixes now
    (in the order the dataset was packed from). ``directory`` may be a URL (``s3://...``;
    ``storage_options`` for its filesystem, ``cache`` a :class:`packtool.storage.cache.Cache`
    for its fetched files: see :mod:`packtool.storage`).
    """

    def __init__(self, directory: str | Path, checksums: bool = True, sources=None,
                 storage_options: dict | None = None, cache=None):
        from ...storage.place import Place

        self.place = Place(directory, storage_options, cache)
        self.directory = self.place.folder
        self.checksums = checksums
        self.index = read_index(self.directory, self.place)
        self.version = int(self.index["version"])
        self.layout = self.index.get("layout", "tokens")  # version 1 stores tokens
        self.seq_len = int(self.index["seq_len"])
        self._override = sources
        self._sources = None
        self._shards: list[Shard | None] = [None] * len(self.index["shards"])
        self._lru: dict[int, None] = {}
        self._last = -1           # the shard used last (the common case: the same again)
        self._span = (0, 0, -1)   # its packs' global range, for locate
        counts = [s["n_packs"] for s in self.index["shards"]]
        self._pack_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        mask = self.index.get("mask_storage")
        self._shift = fold_shift(self.token_dtype) if mask == "folded" else 0

    def __len__(self) -> int:
        return int(self._pack_starts[-1])

    @property
    def token_dtype(self) -> np.dtype:
        return np.dtype(self.index["token_dtype"]).newbyteorder("<")

    @property
    def n_shards(self) -> int:
        return len(self._shards)

    def shard(self, k: int) -> Shard:
        """Shard k's segment table and arrays, opened (and checked) on first use; at most
        ``OPEN_SHARDS`` stay open (each memory map holds a file descriptor)."""
        sh = self._shards[k]
        if sh is not None and self._last == k:
            return sh
        if sh is None:
            arrays = open_shard_arrays(self.directory, self.index, k, self.checksums,
                                       self.place)
            sh = self._shards[k] = _table(self.index, self.index["shards"][k], arrays)
        self._lru.pop(k, None)
        self._lru[k] = None
        self._last = k
        while len(self._lru) > OPEN_SHARDS:
            self._shards[next(iter(self._lru))] = None
            del self._lru[next(iter(self._lru))]
        return sh

    def sources(self) -> list:
        """The source corpora (the index layout reads its tokens from them)."""
        if self._sources is None:
            self._sources = open_sources_of(self.directory, self.index, self._override,
                                            self.checksums, self.place.storage_options,
                                            self.place.cache_if_any())
        return self._sources

    def locate(self, i: int) -> tuple[int, int]:
        """(shard, pack within it) of pack ``i``."""
        lo, hi, k = self._span
        if lo <= i < hi:
            return k, i - lo
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"pack {i} out of range for a dataset of {n:,} packs")
        i %= n
        k = int(np.searchsorted(self._pack_starts, i, side="right") - 1)
        lo = int(self._pack_starts[k])
        self._span = (lo, int(self._pack_starts[k + 1]), k)
        return k, i - lo

    def segments(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source document, offset, length) of each segment of pack ``i``: no token read."""
        k, j = self.locate(i)
        sh = self.shard(k)
        s0, s1 = int(sh.pack_seg[j]), int(sh.pack_seg[j + 1])
        return sh.seg_doc[s0:s1], sh.seg_offset[s0:s1], sh.seg_length[s0:s1]

    def tokens(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Pack ``i``'s tokens and loss mask (None without one), as stored."""
        k, j = self.locate(i)
        return self._read(self.shard(k), j)

    def _read(self, sh: Shard, j: int, j1: int | None = None):
        """Tokens and mask of packs j..j1-1 (default: pack j), as stored (a folded mask
        still in the ids)."""
        j1 = j + 1 if j1 is None else j1
        a = sh.arrays
        t0, t1 = sh.po[j], sh.po[j1]
        if self.layout == "tokens":
            ids = a["tokens"][t0:t1]
            mask = None
            if "loss_mask" in a:
                mask = (np.asarray(a["loss_mask"][t0:t1]) if self.version == 1
                        else unpack_mask(a["loss_mask"], t0, t1))
            return ids, mask
        s0, s1 = int(sh.pack_seg[j]), int(sh.pack_seg[j1])
        from ..tokens import gather

        ids = np.empty(t1 - t0, self.token_dtype)
        mask = np.empty(t1 - t0, np.uint8) if self.index["loss_mask"] else None
        lens = np.asarray(sh.seg_length[s0:s1], np.int64)
        dst = np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.int64)
        gather(self.sources(), np.asarray(sh.seg_doc[s0:s1], np.int64),
               np.asarray(sh.seg_offset[s0:s1], np.int64), lens, ids, dst, mask)
        return ids, mask

    def read_range(self, k: int, lo: int, hi: int) -> dict:
        """Packs lo..hi-1 of shard k at once, for the exports: ``ids`` (int64, no mask bit),
        ``mask`` (or None), ``seg_length`` and ``seg_start`` (in its pack) per segment,
        ``pack_seg`` and ``pack_tok`` (offsets of each pack's segments and tokens, from 0),
        ``positions`` and ``labels`` per token."""
        from .layout import positions, range_labels, segment_starts

        sh = self.shard(k)
        s0, s1 = int(sh.pack_seg[lo]), int(sh.pack_seg[hi])
        ids, mask = self._read(sh, lo, hi)
        ids = np.asarray(ids, np.int64)
        if self._shift:
            mask = ((ids >> self._shift) & 1).astype(np.uint8)
            ids &= (1 << self._shift) - 1
        seg_length = np.asarray(sh.seg_length[s0:s1], np.int64)
        pack_seg = np.asarray(sh.pack_seg[lo:hi + 1], np.int64) - s0
        return {"ids": ids, "mask": mask, "seg_length": seg_length,
                "seg_start": segment_starts(seg_length, pack_seg), "pack_seg": pack_seg,
                "pack_tok": sh.po[lo:hi + 1] - sh.po[lo], "positions": positions(seg_length),
                "labels": range_labels(ids, seg_length, mask)}

    def __getitem__(self, i: int) -> dict:
        k, j = self.locate(i)
        sh = self.shard(k)
        s0, s1 = sh.pack_seg[j], sh.pack_seg[j + 1]
        ids, mask = self._read(sh, j)
        ex = derive(sh.seg_length[s0:s1], ids, mask, self._shift)
        ex["source_docs"] = sh.seg_doc[s0:s1].astype(np.int64)
        ex["source_offsets"] = sh.seg_offset[s0:s1].astype(np.int64)
        return ex

    def attention_costs(self, linear: float = 0.0) -> np.ndarray:
        """Per pack, the sum of its squared segment lengths (plus ``linear`` x its tokens),
        from the segment tables alone."""
        from .layout import attention_costs

        out = []
        for k in range(self.n_shards):
            sh = self.shard(k)
            out.append(attention_costs(np.asarray(sh.seg_length), sh.pack_seg, linear))
        return np.concatenate(out) if out else np.zeros(0)

    def get(self, i: int, pad_to: int | None = None, pad_id: int = 0,
            pad_multiple: int | None = None, per_segment: bool = False) -> dict:
        """``ds[i]``, padded to ``pad_to`` tokens (default: seq_len, or with ``pad_multiple=k``
        the next multiple of k) for fixed shapes; ``per_segment=True`` first pads every segment
        to a multiple of k (context parallelism). See ``packtool.batching.pad_example``."""
        from ...batching import pad_example

        if pad_to is None and pad_multiple is None:
            pad_to = self.seq_len
        try:
            return pad_example(self[i], pad_to=pad_to, multiple=pad_multiple,
                               per_segment=per_segment, pad_id=pad_id)
        except PacktoolError as e:
            raise PacktoolError(f"pack {i}: {e}") from None

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def open_packed(directory: str | Path, checksums: bool = True, sources=None,
                storage_options: dict | None = None, cache=None) -> PackedReader:
    """Open a directory written by ``packtool pack`` (refuses unknown format versions).

    The index is checked at once (digest, keys, file names); each shard when first used
    (sizes, dtypes, offsets) and, with ``checksums``, its files' crc32, once per process.
    An index-layout dataset opens its source corpora on the first token read. A URL
    (``s3://bucket/packed``) reads through :mod:`packtool.storage`."""
    return PackedReader(directory, checksums, sources, storage_options, cache)
