"""The packed format's writer (version 2): one shard's segment table, and for the
``tokens`` layout its tokens gathered from the sources; :func:`index` assembles
``index.json`` from the shards' entries, refusing a key the schema does not document.

Per-token arrays are filled in place through memory maps whose space is reserved first
(``posix_fallocate``), so a full disk is an error before any page is written, never a SIGBUS;
chunks of ``CHUNK_TOKENS`` are gathered and hashed in order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ... import __version__
from ..._io import NpyMap, NpyWriter
from .._manifest import digest
from .layout import pack_offsets
from .schema import DIGEST_KEY, FORMAT, INDEX_KEYS, VERSION, array_length, shard_arrays

CHUNK_TOKENS = 1 << 23


def shard_name(k: int) -> str:
    return f"shard-{k:05d}"


class ShardWriter:
    """Writes shards of one dataset into ``directory``.

    ``dtypes``: role -> dtype (:func:`packtool.formats.packed.schema.v2_dtypes`);
    ``gather(doc, offset, length, dst, dst_start, dst_mask)`` copies segments' tokens (and
    masks) from the sources: only the ``tokens`` layout calls it."""

    def __init__(self, directory: Path, dtypes: dict, layout: str, mask_storage: str | None,
                 gather: Callable | None = None):
        self.directory, self.dtypes, self.layout = Path(directory), dtypes, layout
        self.mask_storage, self.gather = mask_storage, gather
        self.arrays = shard_arrays({"version": VERSION, "layout": layout,
                                    "mask_storage": mask_storage})

    def write(self, k: int, pack_seg, seg_doc, seg_offset, seg_length, tick=None) -> dict:
        """Shard ``k`` from its segments in output order and each pack's first segment."""
        name = shard_name(k)
        n_seg, n_packs = int(seg_length.size), int(pack_seg.size) - 1
        po = pack_offsets(seg_length, pack_seg)
        n_tok = int(po[-1])
        table = {"pack_seg": pack_seg, "seg_doc": seg_doc, "seg_offset": seg_offset,
                 "seg_length": seg_length}
        files = {}
        for a in self.arrays:
            if a.name in table:
                files[a.name] = self._small(name, a, table[a.name], n_tok, n_packs, n_seg)
        if self.layout == "tokens":
            files.update(self._tokens(name, po, table, tick))
        elif tick is not None:
            tick(n_tok)
        return {"name": name, "n_packs": n_packs, "n_segments": n_seg, "n_tokens": n_tok,
                "files": {a.name: files[a.name] for a in self.arrays}}

    def _small(self, name, array, values, n_tok, n_packs, n_seg) -> dict:
        dtype = np.dtype(self.dtypes[array.dtype])
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
        """The packs' tokens (and loss mask), a chunk of packs at a time."""
        dtype = np.dtype(self.dtypes["token"])
        n_tok = int(po[-1])
        ps = np.asarray(table["pack_seg"], np.int64)
        seg_len = np.asarray(table["seg_length"], np.int64)
        starts = np.concatenate([[0], np.cumsum(seg_len)]).astype(np.int64)
        tokens = NpyMap(self.directory / f"{name}.tokens.npy", dtype, n_tok)
        bits = (NpyWriter(self.directory / f"{name}.loss_mask.npy", np.dtype("u1"),
                          -(-n_tok // 8)) if self.mask_storage == "bits" else None)
        carry = np.zeros(0, np.uint8)
        try:
            j, n_packs = 0, ps.size - 1
            while j < n_packs:
                j1 = int(np.searchsorted(po, po[j] + CHUNK_TOKENS, side="right")) - 1
                j1 = min(max(j1, j + 1), n_packs)
                a, b, t_a, t_b = int(ps[j]), int(ps[j1]), int(po[j]), int(po[j1])
                mask = np.empty(t_b - t_a, np.uint8) if self.mask_storage else None
                dst = tokens.array[t_a:t_b]
                self.gather(np.asarray(table["seg_doc"][a:b], np.int64),
                            np.asarray(table["seg_offset"][a:b], np.int64), seg_len[a:b], dst,
                            starts[a:b] - t_a, mask)
                if self.mask_storage == "folded":
                    shift = dtype.itemsize * 8 - 1
                    dst |= (mask.astype(dtype) << dtype.type(shift))
                elif bits is not None:
                    carry = np.concatenate([carry, mask])
                    whole = carry.size // 8 * 8
                    bits.write(np.packbits(carry[:whole], bitorder="little"))
                    carry = carry[whole:]
                tokens.hash_upto(t_b)
                if tick is not None:
                    tick(t_b - t_a)
                j = j1
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


def index(meta: dict, shards: list[dict]) -> dict:
    """``index.json``: the format's keys, the caller's ``meta`` (layout, options, counts,
    metrics, sources...), the shards, and the index's own digest."""
    body = {"format": FORMAT, "version": VERSION, **meta, "shards": shards,
            "created_by": f"packtool {__version__}"}
    unknown = set(body) - set(INDEX_KEYS)
    if unknown:  # a key must be documented in INDEX_KEYS (and so in FORMAT.md)
        raise RuntimeError(f"index.json keys not in the schema: {sorted(unknown)}")
    body[DIGEST_KEY] = digest(body, DIGEST_KEY)
    return body
