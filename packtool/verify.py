"""``packtool verify``: prove a packed dataset is intact and loses or mixes nothing.

Checks, in order, stopping at the first violation (named with shard, pack and token):

1. ``index.json``: known format/version, its own sha256 (``index_sha256``).
2. Every shard file: present, crc32 and size as recorded (a flipped byte anywhere fails
   here), ``.npy`` dtype and shape as documented.
3. Invariants: packs non-empty and <= seq_len; ``cu_seqlens`` start at 0, strictly increase
   and end at the pack's length; ``doc_ids`` number the segments of each pack 0, 1, ...;
   ``position_ids`` restart at 0 in every segment; totals match the index.
4. With sources (``--source PREFIX...``): the source manifests are the ones packed and the
   source files match their own checksums; the
   segments are exactly what the overflow policy makes of the source documents (every
   document, piece and token once; truncated/dropped ones as counted); every segment's tokens
   equal the source tokens at its document and offset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._numba import njit
from .errors import PacktoolError
from .pack import _gather, make_segments, open_sources
from ._io import crc32_file, sha256_file
from .formats.packed import INDEX, MASK, array_dtypes, read_index, shard_arrays
from .formats.tokens import prefix_paths


class VerifyError(PacktoolError):
    """The first violation found in a packed dataset."""


@njit
def _check_shard(pack_offsets, seg_offsets, cu, pos, doc, seq_len):
    """Return (code, pack, token) of the first violation, or (0, -1, -1)."""
    n_packs = pack_offsets.shape[0] - 1
    if pack_offsets[0] != 0 or seg_offsets[0] != 0:
        return 1, 0, 0
    for p in range(n_packs):
        t0, t1 = pack_offsets[p], pack_offsets[p + 1]
        if t1 <= t0:
            return 2, p, t0
        if t1 - t0 > seq_len:
            return 3, p, t0
        s0, s1 = seg_offsets[p], seg_offsets[p + 1]
        if s1 <= s0:
            return 4, p, t0
        c0 = s0 + p
        if cu[c0] != 0:
            return 5, p, t0
        if cu[s1 + p] != t1 - t0:
            return 6, p, t0
        for k in range(s1 - s0):
            a, b = cu[c0 + k], cu[c0 + k + 1]
            if b <= a:
                return 7, p, t0 + a
            for j in range(a, b):
                if doc[t0 + j] != k:
                    return 8, p, t0 + j
                if pos[t0 + j] != j - a:
                    return 9, p, t0 + j
    return 0, -1, -1


_MESSAGES = {
    1: "offsets do not start at 0",
    2: "a pack is empty",
    3: "a pack is longer than seq_len",
    4: "a pack has no segments",
    5: "cu_seqlens does not start at 0",
    6: "cu_seqlens does not end at the pack's length",
    7: "cu_seqlens does not strictly increase (empty segment)",
    8: "doc_ids do not number the pack's segments 0, 1, ...",
    9: "position_ids do not restart at 0 in the segment",
}


def _load(path: Path, dtype: np.dtype, n: int) -> np.ndarray:
    try:
        arr = np.load(path, mmap_mode="r") if path.stat().st_size else None
    except (OSError, ValueError) as e:
        raise VerifyError(f"{path}: not a readable .npy ({e})") from None
    if arr is None or arr.dtype != dtype or arr.shape != (n,):
        got = "nothing" if arr is None else f"{arr.dtype} {arr.shape}"
        raise VerifyError(f"{path}: holds {got}, expected {dtype} ({n},)")
    return arr


def verify_packed(directory: str | Path, sources: list[str | Path] | None = None,
                  progress: bool = False) -> str:
    """Run every check; return a one-line OK summary or raise :class:`VerifyError`."""
    directory = Path(directory)
    index = read_index(directory)
    seq_len = int(index["seq_len"])
    dtypes = array_dtypes(seq_len, np.dtype(index["token_dtype"]))
    totals = {"n_packs": 0, "n_tokens": 0, "n_segments": 0}
    shards = []
    for sh in index["shards"]:
        names = shard_arrays(index)
        if set(sh["files"]) != set(names):
            raise VerifyError(f"{sh['name']}: files {sorted(sh['files'])} do not match the format's {sorted(names)}")
        for name in names:
            f = sh["files"][name]
            path = directory / f["name"]
            if not path.is_file():
                raise VerifyError(f"{path} is missing (listed in {INDEX})")
            if path.stat().st_size != f["bytes"]:
                raise VerifyError(f"{path}: {path.stat().st_size:,} bytes, index says {f['bytes']:,}")
            if crc32_file(path) != f["crc32"]:
                raise VerifyError(f"{path}: crc32 does not match {INDEX}; the file is corrupt")
        n_p, n_t, n_s = sh["n_packs"], sh["n_tokens"], sh["n_segments"]
        sizes = {"tokens": n_t, "position_ids": n_t, "doc_ids": n_t, "pack_offsets": n_p + 1,
                 "seg_offsets": n_p + 1, "cu_seqlens": n_s + n_p, "source_docs": n_s,
                 "source_offsets": n_s, MASK: n_t}
        arrays = {a: _load(directory / sh["files"][a]["name"], dtypes[a], sizes[a]) for a in names}
        code, p, t = _check_shard(arrays["pack_offsets"], arrays["seg_offsets"], arrays["cu_seqlens"],
                                  arrays["position_ids"], arrays["doc_ids"], seq_len)
        if code:
            raise VerifyError(f"{sh['name']} pack {p} (token {t}): {_MESSAGES[code]}")
        if int(arrays["pack_offsets"][-1]) != n_t or int(arrays["seg_offsets"][-1]) != n_s:
            raise VerifyError(f"{sh['name']}: offsets do not end at the shard's token/segment counts")
        for key, n in (("n_packs", n_p), ("n_tokens", n_t), ("n_segments", n_s)):
            totals[key] += n
        shards.append(arrays)
    for key, n in totals.items():
        if index[key] != n:
            raise VerifyError(f"{INDEX}: {key} is {index[key]:,} but the shards hold {n:,}")
    if sources:
        _verify_sources(index, shards, sources, seq_len)
    what = "; every source token accounted for" if sources else ""
    return (f"OK {directory}: {totals['n_packs']:,} packs, {totals['n_tokens']:,} tokens, "
            f"{totals['n_segments']:,} segments in {len(shards)} shard(s); checksums and "
            f"invariants hold{what}")


def _verify_sources(index: dict, shards: list[dict], sources, seq_len: int) -> None:
    corpora = open_sources(list(sources))
    recorded = index["sources"]
    if len(corpora) != len(recorded):
        raise VerifyError(f"{len(corpora)} --source prefixes given, the dataset was packed from "
                          f"{len(recorded)}: {', '.join(s['prefix'] for s in recorded)}")
    for c, rec in zip(corpora, recorded):
        if sha256_file(prefix_paths(c.prefix)["json"]) != rec["manifest_sha256"]:
            raise VerifyError(f"--source {c.prefix} is not the corpus that was packed "
                              f"(manifest sha256 differs from {rec['prefix']}'s)")
        c.verify_checksums()  # a corrupt source must not vouch for the packs
    lengths = np.concatenate([c.lengths for c in corpora])
    want = make_segments(lengths, seq_len, index["overflow"])
    doc = np.concatenate([np.asarray(s["source_docs"]) for s in shards]) if shards else np.empty(0, np.int64)
    off = np.concatenate([np.asarray(s["source_offsets"]) for s in shards]) if shards else np.empty(0, np.int64)
    lens = np.concatenate([np.diff(np.asarray(s["cu_seqlens"]).astype(np.int64))[
        np.asarray(s["cu_seqlens"])[1:] != 0] for s in shards]) if shards else np.empty(0, np.int64)
    order = np.lexsort((off, doc))
    for name, got, exp in (("document", doc[order], want.doc), ("offset", off[order], want.offset),
                           ("length", lens[order], want.length)):
        if got.shape != exp.shape:
            raise VerifyError(f"the shards hold {got.size:,} segments, the sources under "
                              f"--overflow {index['overflow']} make {exp.size:,}")
        bad = np.flatnonzero(got != exp)
        if bad.size:
            i = int(bad[0])
            raise VerifyError(
                f"segment {name} mismatch for source document {int(want.doc[i]):,} (offset "
                f"{int(want.offset[i]):,}): tokens lost, duplicated or moved")
    doc_base = np.cumsum([0] + [len(c) for c in corpora])
    starts = [np.asarray(c.starts) for c in corpora]
    for k, s in enumerate(shards):
        cu = np.asarray(s["cu_seqlens"]).astype(np.int64)
        seg_len = np.diff(cu)[cu[1:] != 0]
        dst = np.concatenate([[0], np.cumsum(seg_len)[:-1]]).astype(np.int64)
        sdoc, soff = np.asarray(s["source_docs"]), np.asarray(s["source_offsets"])
        expect = np.empty(int(seg_len.sum()), s["tokens"].dtype)
        expect_mask = np.ones(expect.size, np.uint8) if MASK in s else None
        which = np.searchsorted(doc_base, sdoc, side="right") - 1
        for c, corpus in enumerate(corpora):
            m = which == c
            if m.any():
                src = starts[c][sdoc[m] - doc_base[c]] + soff[m]
                _gather(corpus.tokens, src, seg_len[m], expect, dst[m])
                if expect_mask is not None and corpus.mask is not None:
                    _gather(corpus.mask, src, seg_len[m], expect_mask, dst[m])
        if expect_mask is not None:
            bad = np.flatnonzero(expect_mask != np.asarray(s[MASK]))
            if bad.size:
                raise VerifyError(f"{index['shards'][k]['name']} token {int(bad[0]):,}: loss_mask "
                                  "differs from the source's mask")
        bad = np.flatnonzero(expect != np.asarray(s["tokens"]))
        if bad.size:
            t = int(bad[0])
            seg = int(np.searchsorted(dst, t, side="right") - 1)
            raise VerifyError(f"{index['shards'][k]['name']} token {t:,}: differs from source "
                              f"document {int(sdoc[seg]):,} at offset {int(soff[seg]) + t - int(dst[seg]):,}")
