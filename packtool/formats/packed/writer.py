"""The packed format's writer (version 2): one shard's segment table, and for the
``tokens`` layout its tokens gathered from the sources; :func:`index` assembles
``index.json`` from the shards' entries, refusing a key the schema does not document.

The tokens file is written as a copy is: the file system first asked whether it fits (a
full disk is an error before any byte is written; not ``posix_fallocate``, under which the
same writes ran 8x slower here), then chunks of ``CHUNK_TOKENS`` gathered
segment by segment from the sources into one buffer and written from it. Filling a memory
map instead cost a page fault per 4 KB written and left every page dirty at once
(bench_pack.py section 4: 0.29 GB/s for the gather, vs ~1 GB/s into a buffer).

The thread that gathers a chunk also takes its crc32, in order (one thread fills every
chunk), so the writing thread only writes: 381 MB in one shard, the writing thread's CPU
0.185 -> 0.095 s, the process's unchanged (~0.33 s; scripts/bench_tokens_layout.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ... import __version__
from ..._io import NpyWriter
from .._manifest import seal
from .costs import shard_entry
from .layout import attention_costs, pack_offsets, token_ends
from .schema import (
    ALIGNED_VERSION,
    DIGEST_KEY,
    FORMAT,
    GROUPED_VERSION,
    INDEX_KEYS,
    TREES_VERSION,
    VERSION,
    VSL_VERSION,
    array_length,
    shard_arrays,
)

CHUNK_TOKENS = 1 << 23


def shard_name(k: int) -> str:
    return f"shard-{k:05d}"


class ShardWriter:
    """Writes shards of one dataset into ``directory``.

    ``dtypes``: role -> dtype (:func:`packtool.formats.packed.schema.v2_dtypes`);
    ``gather(doc, offset, length, dst, dst_start, dst_mask)`` copies segments' tokens (and
    masks) from the sources: only the ``tokens`` layout calls it. ``images``: the sources'
    :class:`~packtool.formats.packed.images.ImageTable` where they hold images, whose vision
    term the stored cost classes then count (what ``balance="attention"`` balances)."""

    def __init__(self, directory: Path, dtypes: dict, layout: str, mask_storage: str | None,
                 gather: Callable | None = None, grouped: bool = False, trees: bool = False,
                 images=None):
        self.directory, self.dtypes, self.layout = Path(directory), dtypes, layout
        self.mask_storage, self.gather, self.images = mask_storage, gather, images
        self.arrays = shard_arrays({"version": VERSION, "layout": layout,
                                    "mask_storage": mask_storage,
                                    "groups": {} if grouped else None,
                                    "trees": {} if trees else None})

    def write(self, k: int, pack_seg, seg_doc, seg_offset, seg_length, tick=None,
              groups: dict | None = None) -> dict:
        """Shard ``k`` from its segments in output order and each pack's first segment
        (``groups``: a grouped dataset's seg_group and seg_role, and a tree's seg_up)."""
        name = shard_name(k)
        n_seg, n_packs = int(seg_length.size), int(pack_seg.size) - 1
        po = pack_offsets(seg_length, pack_seg)
        n_tok = int(po[-1])
        table = {"pack_seg": pack_seg, "seg_doc": seg_doc, "seg_offset": seg_offset,
                 "seg_length": seg_length, **(groups or {})}
        files = {}
        for a in self.arrays:
            if a.name in table:
                files[a.name] = self._small(name, a, table[a.name], n_tok, n_packs, n_seg)
        if self.layout == "tokens":
            files.update(self._tokens(name, po, table, tick))
        elif tick is not None:
            tick(n_tok)
        costs = attention_costs(np.asarray(seg_length), pack_seg,
                                seg_up=(groups or {}).get("seg_up"))
        if self.images is not None:  # + 1.0 x the vision term, as the reader adds it
            costs = costs + self.images.pack_sums(pack_seg, seg_doc, seg_offset,
                                                  seg_length)["cost"]
        return {"name": name, "n_packs": n_packs, "n_segments": n_seg, "n_tokens": n_tok,
                "files": {a.name: files[a.name] for a in self.arrays}, **shard_entry(costs)}

    def _small(self, name, array, values, n_tok, n_packs, n_seg) -> dict:
        dtype = np.dtype(self.dtypes.get(array.dtype, array.dtype))
        values = np.asarray(values)
        if values.size and (int(values.min()) < 0 or int(values.max()) > np.iinfo(dtype).max):
            raise RuntimeError(f"{array.name} value out of {dtype}'s range")  # a planner bug
        n = array_length(array, n_tok, n_packs, n_seg)
        w = NpyWriter(self.directory / f"{name}.{array.name}.npy", dtype, n)
        try:
            w.write(values)
            return {"name": f"{name}.{array.name}.npy", **w.close()}
        except BaseException:
            w.abort()
            raise

    def _tokens(self, name, po, table, tick) -> dict:
        """The packs' tokens (and loss mask), a chunk of packs at a time: a thread gathers
        chunk k+1 into one buffer and hashes it while this one writes chunk k from the
        other."""
        from concurrent.futures import ThreadPoolExecutor

        dtype = np.dtype(self.dtypes["token"])
        n_tok = int(po[-1])
        tokens = NpyWriter(self.directory / f"{name}.tokens.npy", dtype, n_tok,
                           reserve_space=True)
        bits = (NpyWriter(self.directory / f"{name}.loss_mask.npy", np.dtype("u1"),
                          -(-n_tok // 8)) if self.mask_storage == "bits" else None)
        fill = _Fill(self, po, table, dtype, tokens)
        carry = np.zeros(0, np.uint8)
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="packtool-gather") as pool:
                chunks = enumerate(fill.chunks())  # chunk k fills buffer k % 2
                ahead = [pool.submit(fill, c, k % 2) for k, c in (next(chunks, (0, None)),
                                                                  next(chunks, (1, None)))
                         if c is not None]
                while ahead:
                    dst, mask, hashed = ahead.pop(0).result()
                    if bits is not None:
                        carry = np.concatenate([carry, mask])
                        whole = carry.size // 8 * 8
                        bits.write(np.packbits(carry[:whole], bitorder="little"))
                        carry = carry[whole:]
                    tokens.put(hashed)  # then its buffer is free for the chunk after next
                    k, c = next(chunks, (0, None))
                    if c is not None:
                        ahead.append(pool.submit(fill, c, k % 2))
                    if tick is not None:
                        tick(dst.size)
            out = {"tokens": {"name": f"{name}.tokens.npy", **tokens.close()}}
            if bits is not None:
                if carry.size:
                    bits.write(np.packbits(carry, bitorder="little"))
                out["loss_mask"] = {"name": f"{name}.loss_mask.npy", **bits.close()}
            return out
        except BaseException:
            tokens.abort()
            if bits is not None:
                bits.abort()
            raise


class _Fill:
    """Chunks of packs of about CHUNK_TOKENS tokens, each gathered from the sources into one
    of two buffers (and the loss mask folded into the token word where it is stored so),
    then hashed into ``out`` (a :class:`packtool._io.NpyWriter`) for ``out.put`` to write."""

    def __init__(self, writer: ShardWriter, po, table, dtype, out):
        self.writer, self.po, self.table, self.dtype, self.out = writer, po, table, dtype, out
        self.ps = np.asarray(table["pack_seg"], np.int64)
        size = min(int(po[-1]), CHUNK_TOKENS + int(np.diff(po).max(initial=0)))
        self.bufs = [np.empty(size, dtype) for _ in range(2)]
        self.masks = [np.empty(size, np.uint8) if writer.mask_storage else None
                      for _ in range(2)]

    def chunks(self):
        """(first pack, end pack) of each chunk, in order."""
        j, n_packs, po = 0, self.ps.size - 1, self.po
        while j < n_packs:
            j1 = int(np.searchsorted(po, po[j] + CHUNK_TOKENS, side="right")) - 1
            j1 = min(max(j1, j + 1), n_packs)
            yield j, j1
            j = j1

    def __call__(self, chunk: tuple[int, int], k: int):
        j, j1 = chunk
        a, b, t_a, t_b = (int(x) for x in (self.ps[j], self.ps[j1], self.po[j], self.po[j1]))
        dst = self.bufs[k][:t_b - t_a]
        mask = None if self.masks[k] is None else self.masks[k][:t_b - t_a]
        lengths = np.asarray(self.table["seg_length"][a:b], np.int64)  # the chunk's only
        starts = token_ends(lengths)[:-1]
        doc = np.asarray(self.table["seg_doc"][a:b], np.int64)
        by_source = np.argsort(doc, kind="stable")  # read the sources in order: ~30% faster
        self.writer.gather(doc[by_source],
                           np.asarray(self.table["seg_offset"][a:b], np.int64)[by_source],
                           lengths[by_source], dst, starts[by_source], mask)
        if self.writer.mask_storage == "folded":
            dst |= mask.astype(self.dtype) << self.dtype.type(self.dtype.itemsize * 8 - 1)
        return dst, mask, self.out.hash(dst)  # chunks are filled in order, by one thread


def index(meta: dict, shards: list[dict]) -> dict:
    """``index.json``: the format's keys, the caller's ``meta`` (layout, options, counts,
    metrics, sources...), the shards, and the index's own digest."""
    version = (ALIGNED_VERSION if meta.get("align", 1) > 1 else
               TREES_VERSION if meta.get("trees") else
               GROUPED_VERSION if meta.get("groups") else
               VSL_VERSION if meta.get("vsl") else VERSION)
    body = {"format": FORMAT, "version": version, **meta, "shards": shards,
            "created_by": f"packtool {__version__}"}
    return seal(body, INDEX_KEYS, DIGEST_KEY, "index.json")
