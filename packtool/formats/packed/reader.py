"""The one reader of packed datasets, every version and layout: ``open_packed(DIR)[i]`` is a
pack as the trainer takes it (input_ids, labels, position_ids, doc_ids, cu_seqlens,
max_seqlen, source_docs, source_offsets), derived from the pack's segments
(:mod:`.layout`) and its tokens: stored in the shard (``tokens`` layout, version 1) or read
from the source corpus (``index`` layout). Rows of a corpus tokenized with ``--vision`` also
carry their images' ``image_refs``, ``image_grid_thw`` and mRoPE ``position_ids_3d`` [3, N]
(:mod:`.images`).

What is checked, always and cheaply: at open, index.json against its schema and digest, every
file name; when a shard is first used, every file's size, dtype and shape, its offsets
(monotonic, in range) and, with ``checksums``, each file's crc32 once per process; for the
index layout, each source's manifest against the sha256 the index recorded (a source that
changed, moved without its manifest, or is missing is refused by name), and its files'
sha256 on first read, as :func:`packtool.open_tokens` does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import PacktoolError
from .files import (
    Shard,
    open_shard_arrays,
    open_sources_of,
    read_index,
    shard_table,
)
from .layout import derive, fold_shift, unpack_mask
from .schema import alignment, vsl_bounds

OPEN_SHARDS = 64  # shards whose memory maps stay open at once


class PackedReader:
    """A packed dataset on disk: ``len(ds)`` packs; ``ds[i]`` a dict of numpy arrays (an
    aligned dataset's, ``align`` > 1, with each segment's pads and ``cu_seqlens_padded``:
    :func:`packtool.formats.packed.layout.derive_aligned`).

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
        # first global pack of each shard, then the pack count
        self.pack_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        mask = self.index.get("mask_storage")
        self._shift = fold_shift(self.token_dtype) if mask == "folded" else 0
        self.align, self.pad_id = alignment(self.index)  # (1, 0): rows without pads
        self.vsl = vsl_bounds(self.index)  # (MIN, MAX) of a --vsl dataset, else None
        self._row_lengths = None
        self._image_table = None
        self._images = None

    def __len__(self) -> int:
        return int(self.pack_starts[-1])

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
            sh = self._shards[k] = shard_table(self.index, self.index["shards"][k], arrays)
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

    @property
    def images(self) -> tuple[bool, bool]:
        """(rows hold images, and mRoPE ids): whether a source corpus was tokenized with
        ``--vision`` (an index-layout dataset's; ``pack`` refuses ``--layout tokens``
        for them, whose rows would outlive their images' references)."""
        if self._images is None:
            from .images import has_images

            self._images = (False, False) if self.layout != "index" else has_images(
                self.sources())
        return self._images

    def locate(self, i: int) -> tuple[int, int]:
        """(shard, pack within it) of pack ``i``."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise PacktoolError(f"a pack index must be an integer, got {i!r} "
                                f"({type(i).__name__}); use int(i)")
        lo, hi, k = self._span
        if lo <= i < hi:
            return k, i - lo
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"pack {i} out of range for a dataset of {n:,} packs")
        i %= n
        k = int(np.searchsorted(self.pack_starts, i, side="right") - 1)
        lo = int(self.pack_starts[k])
        self._span = (lo, int(self.pack_starts[k + 1]), k)
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

    def read_range(self, k: int, lo: int, hi: int, pads: bool = False) -> dict:
        """Packs lo..hi-1 of shard k at once, for the exports: ``ids`` (int64, no mask bit),
        ``mask`` (or None), ``seg_length`` and ``seg_start`` (in its pack) per segment,
        ``pack_seg`` and ``pack_tok`` (offsets of each pack's segments and tokens, from 0),
        ``positions`` and ``labels`` per token: the stored tokens, or with ``pads`` an
        aligned dataset's rows as a trainer takes them (:func:`.layout.pad_range`); a grouped
        dataset's ``seg_group``, ``seg_role`` and ``seg_up`` per segment."""
        from .layout import labels_from, pad_range, positions, segment_starts, token_ends

        sh = self.shard(k)
        s0, s1 = int(sh.pack_seg[lo]), int(sh.pack_seg[hi])
        ids, mask = self._read(sh, lo, hi)
        ids = np.asarray(ids, np.int64)
        if self._shift:
            mask = ((ids >> self._shift) & 1).astype(np.uint8)
            ids &= (1 << self._shift) - 1
        seg_length = np.asarray(sh.seg_length[s0:s1], np.int64)
        pack_seg = np.asarray(sh.pack_seg[lo:hi + 1], np.int64) - s0
        r = {"ids": ids, "mask": mask, "seg_length": seg_length,
             "seg_start": segment_starts(seg_length, pack_seg), "pack_seg": pack_seg,
             "pack_tok": sh.po[lo:hi + 1] - sh.po[lo], "positions": positions(seg_length),
             "labels": labels_from(ids, token_ends(seg_length), mask)}
        if "seg_group" in sh.arrays:  # pairs and groups: each segment's group and role
            r["seg_group"] = np.asarray(sh.arrays["seg_group"][s0:s1], np.int64)
            r["seg_role"] = np.asarray(sh.arrays["seg_role"][s0:s1], np.int32)
            r["seg_up"] = self.seg_ups(sh, lo, hi)
        return pad_range(r, self.align, self.pad_id) if pads and self.align > 1 else r

    def __getitem__(self, i: int) -> dict:
        k, j = self.locate(i)
        sh = self.shard(k)
        s0, s1 = sh.pack_seg[j], sh.pack_seg[j + 1]
        ids, mask = self._read(sh, j)
        ex = derive(sh.seg_length[s0:s1], ids, mask, self._shift, self.align, self.pad_id)
        ex["source_docs"] = sh.seg_doc[s0:s1].astype(np.int64)
        ex["source_offsets"] = sh.seg_offset[s0:s1].astype(np.int64)
        if self.images[0]:  # a corpus tokenized with --vision: packtool.formats.packed.images
            from .images import row_images

            ex.update(row_images(self.sources(), ex["source_docs"], ex["source_offsets"],
                                 sh.seg_length[s0:s1], self.images[1]))
        if "seg_group" in sh.arrays:  # pairs and groups: packtool.formats.packed.groups
            from .groups import group_fields

            if self._shift:
                mask = (np.asarray(ids) >> self._shift) & 1
            up = sh.arrays["seg_up"][s0:s1] if "seg_up" in sh.arrays else None
            ex = group_fields(ex, sh.arrays["seg_group"][s0:s1], sh.arrays["seg_role"][s0:s1],
                              mask, up)
        return ex

    def seg_ups(self, sh: Shard, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """``seg_up`` (int64) of packs lo..hi-1 of a grouped shard: stored (version 6), or a
        version-5 shared prompt's from the roles (0 everywhere without one)."""
        hi = sh.n_packs if hi is None else hi
        s0, s1 = int(sh.pack_seg[lo]), int(sh.pack_seg[hi])
        if "seg_up" in sh.arrays:
            return np.asarray(sh.arrays["seg_up"][s0:s1], np.int64)
        if not (self.index.get("groups") or {}).get("share_prompt"):
            return np.zeros(s1 - s0, np.int64)
        from .groups import ups_from_roles

        ps = np.asarray(sh.pack_seg[lo:hi + 1], np.int64)
        return np.concatenate([np.zeros(0, np.int64)] + [ups_from_roles(
            sh.arrays["seg_group"][a:b], sh.arrays["seg_role"][a:b])
            for a, b in zip(ps[:-1], ps[1:], strict=True)])

    def shard_costs(self, k: int, linear: float = 0.0, vision: float = 1.0) -> np.ndarray:
        """Per pack of shard ``k``: the sum of its squared segment lengths (plus ``linear`` x
        its tokens, and in a tree each segment's attention to its ancestors), from its segment
        table alone; where the rows hold images, plus ``vision`` x its images' encoder cost
        (:meth:`image_sums`; 1.0: what the index's ``cost_classes`` count)."""
        from .layout import attention_costs

        sh = self.shard(k)
        costs = attention_costs(np.asarray(sh.seg_length), sh.pack_seg, linear,
                                seg_up=self.seg_ups(sh) if "seg_group" in sh.arrays else None)
        if vision and self.images[0]:
            costs = costs + vision * self._image_sums(sh)["cost"]
        return costs

    def row_lengths(self) -> np.ndarray:
        """Every row's slot length (int64): seq_len for a fixed-length dataset; for a --vsl
        one its chunk's 2**k, or MIN for a remnant row (max(MIN, its tokens)), from the
        shards' pack tables (8 bytes a row, made once), never from their tokens."""
        if self._row_lengths is None:
            if self.vsl is None:
                self._row_lengths = np.full(len(self), self.seq_len, np.int64)
            else:
                parts = [np.diff(self.shard(k).po) for k in range(self.n_shards)]
                tokens = np.concatenate(parts) if parts else np.zeros(0, np.int64)
                self._row_lengths = np.maximum(tokens, self.vsl[0])
        return self._row_lengths

    def row_length(self, i: int) -> int:
        """Row ``i``'s slot length: seq_len, or for a --vsl dataset 2**k (a chunk) or MIN (a
        remnant row of at most MIN tokens)."""
        if self.vsl is None:
            self.locate(i)  # the range check
            return self.seq_len
        k, j = self.locate(i)
        po = self.shard(k).po
        return max(int(po[j + 1] - po[j]), self.vsl[0])

    def attention_costs(self, linear: float = 0.0, vision: float | None = None) -> np.ndarray:
        """Per pack, the sum of its squared segment lengths (plus ``linear`` x its tokens),
        from the segment tables alone; for a dataset with images plus ``vision`` (default
        1.0, 0 for the language term alone) x its images' encoder cost (:meth:`image_sums`):
        what ``balance="attention"`` balances."""
        vision = 1.0 if vision is None else vision
        out = [self.shard_costs(k, linear, vision) for k in range(self.n_shards)]
        return np.concatenate(out) if out else np.zeros(0)

    def image_sums(self) -> dict:
        """Per pack of a dataset with images: ``images``, ``tokens`` (image tokens) and
        ``cost`` (the vision encoder's attention cost, sum over images of t (h w)^2 patches:
        :mod:`.images`), from the segment tables and the sources' image tables, no reference
        parsed."""
        sums = [self._image_sums(self.shard(k)) for k in range(self.n_shards)]
        return {k: np.concatenate([s[k] for s in sums]) if sums else np.zeros(0)
                for k in ("images", "tokens", "cost")}

    def _image_sums(self, sh) -> dict:
        if self._image_table is None:
            from .images import ImageTable

            self._image_table = ImageTable(self.sources())
        return self._image_table.pack_sums(sh.pack_seg, sh.seg_doc, sh.seg_offset,
                                           sh.seg_length)

    def costs_fingerprint(self) -> str:
        """The attention costs' fingerprint a sampler state records: from the shards'
        digests (the index's where it stores them)."""
        from .costs import dataset_digest, digest

        if self.images[0] and not self.index.get("cost_vision"):  # stored before the vision
            return digest(self.attention_costs())                     # term was: language
        return dataset_digest([sh.get("costs_sha256") or digest(self.shard_costs(k))
                               for k, sh in enumerate(self.index["shards"])])

    def cost_classes(self, ratio: float):
        """The attention-cost classes the index stores (pack-time counts per shard:
        :mod:`packtool.formats.packed.costs`), for ``ratio`` its ``cost_ratio``; else None
        (the sampler computes them from every pack's segments)."""
        from .balance import CostClasses
        from .costs import StoredClasses

        shards = self.index["shards"]
        if self.index.get("cost_ratio") != ratio or not shards or not all(
                "cost_classes" in sh for sh in shards) or (
                self.images[0] and self.index.get("cost_vision") != 1.0):
            return None  # rows with images packed before cost_vision: language alone
        st = StoredClasses(self, ratio)
        return CostClasses(float(ratio), st.sizes, st, st.class_of, st.costs_of, st.fingerprint)

    def get(self, i: int, pad_to: int | None = None, pad_id: int = 0,
            pad_multiple: int | None = None, per_segment: bool = False) -> dict:
        """``ds[i]``, padded to ``pad_to`` tokens (default: the row's slot length, seq_len
        or a --vsl row's :meth:`row_length`; with ``pad_multiple=k`` the next multiple of k);
        ``per_segment=True`` first pads every segment to a multiple of k (context
        parallelism). See ``packtool.formats.packed.batching.pad_example``."""
        from .batching import pad_example

        if pad_to is None and pad_multiple is None:
            pad_to = self.row_length(i)
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
