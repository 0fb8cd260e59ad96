"""The packed format (``packtool.packed``, version 1): what ``pack`` writes and
``open_packed`` reads. See docs/FORMAT.md.

One pack of seq_len 16 holding three segments (documents or pieces of one)::

    input_ids     a0 a1 a2 a3 a4 | b0 b1 b2 | c0 c1 c2 c3 c4 c5 c6 c7
    position_ids   0  1  2  3  4 |  0  1  2 |  0  1  2  3  4  5  6  7
    doc_ids        0  0  0  0  0 |  1  1  1 |  2  2  2  2  2  2  2  2
    labels       -100 a1 a2 a3 a4|-100 b1 b2|-100 c1 c2 c3 c4 c5 c6 c7
    cu_seqlens    [0, 5, 8, 16]           max_seqlen 8

Attention must stay inside a segment (block-diagonal causal mask): flash-attention's varlen
kernels take ``cu_seqlens``; Hugging Face models derive it from ``position_ids`` restarting
at 0. ``labels`` hide each segment's first token, so no token is trained to predict across a
boundary (the ``DataCollatorWithFlattening`` convention); with SFT/chat sources they are also
-100 wherever the loss mask is 0 (prompts, user turns).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__
from .._io import NpyMap, NpyWriter, check_once, crc32_file
from ..errors import FormatError, PacktoolError
from .tokens import read_manifest

FORMAT = "packtool.packed"
VERSION = 1
INDEX = "index.json"
MASK = "loss_mask"  # optional per-token uint8 (SFT/chat sources): 1 = trained on
IGNORE_INDEX = -100
CHUNK_TOKENS = 1 << 23  # per-token arrays are filled and hashed this many tokens at a time


@dataclass(frozen=True)
class Array:
    """One array of a shard: ``shard-KKKKK.<name>.npy``, 1-D, little-endian."""

    name: str
    per: str          # "token", "pack+1", "segment+pack" or "segment": sets its length
    dtype: str        # a numpy dtype string; "tokens" and "positions" depend on the index
    doc: str
    optional: str | None = None  # present only when index.json has this key true


SCHEMA = (
    Array("tokens", "token", "tokens", "token ids (the sources' dtype: <u2 or <u4)"),
    Array("position_ids", "token", "positions", "position in its segment, restarting at 0"),
    Array("doc_ids", "token", "positions", "index of its segment within its pack (0, 1, ...)"),
    Array("pack_offsets", "pack+1", "<i8", "pack j is tokens[po[j]:po[j+1]]"),
    Array("seg_offsets", "pack+1", "<i8", "pack j's segments are so[j]:so[j+1]"),
    Array("cu_seqlens", "segment+pack", "<i4",
          "each pack's cu_seqlens back to back: pack j's are cu[so[j]+j : so[j+1]+j+1]"),
    Array("source_docs", "segment", "<i8", "source document (global over the packed sources)"),
    Array("source_offsets", "segment", "<i8", "token offset of the segment in that document"),
    Array(MASK, "token", "|u1", "1 = trained on (SFT/chat sources only)", optional="loss_mask"),
)
ARRAYS = tuple(a.name for a in SCHEMA if a.optional is None)

INDEX_KEYS = {  # every key of index.json, documented in docs/FORMAT.md (a test checks it)
    "format": '"packtool.packed"', "version": "1",
    "seq_len": "tokens per pack at most", "algo": "the packer", "algo_options":
    "the packer's options in effect", "seed": "shuffle/packer seed", "shuffle":
    "packs in shuffled order", "overflow": "split, truncate or drop",
    "token_dtype": "uint16 or uint32", "loss_mask": "shards carry loss_mask",
    "dtypes": "numpy dtype string per array",
    "group_docs": "documents per independently packed group (--group-docs), or null",
    "n_packs": "packs", "n_docs": "source documents", "n_empty": "zero-length documents",
    "n_overlong": "documents longer than seq_len", "n_split": "documents split",
    "n_split_pieces": "pieces they became", "n_truncated": "documents truncated",
    "n_truncated_tokens": "tokens cut by truncation", "n_dropped": "documents dropped",
    "n_dropped_tokens": "tokens dropped", "n_segments": "segments in all packs",
    "n_tokens": "tokens in all packs",
    "efficiency": "n_tokens / (n_packs * seq_len)", "lower_bound_packs": "L1: ceil(n_tokens / L)",
    "gap_percent": "packs above L1, %", "l2_bound_packs": "Martello-Toth L2",
    "lp_bound_packs": "LP bound when optimal ran, else null",
    "lp_converged": "whether that LP converged (else it is Farley's bound), or null",
    "best_bound_packs": "max of the valid bounds", "gap_to_best_bound_percent":
    "packs above the best bound, %", "packing_factor": "segments per pack",
    "solver": "the packer's report (PackerReport.to_json())", "sources": "per source prefix",
    "split": '"train", or "valid" for the held-out packs in DIR/valid',
    "held_out": "the held-out split (path, how chosen, counts), or null",
    "shards": "per shard: name, counts, files", "created_by": '"packtool X.Y.Z"',
    "index_sha256": "sha256 of the index without this key",
}


def position_dtype(seq_len: int) -> np.dtype:
    """Positions and in-pack segment ids are < seq_len: uint16 up to 65,536, else uint32."""
    return np.dtype("<u2") if seq_len <= 65_536 else np.dtype("<u4")


def array_dtypes(seq_len: int, token_dtype: np.dtype) -> dict[str, np.dtype]:
    special = {"tokens": np.dtype(token_dtype).newbyteorder("<"),
               "positions": position_dtype(seq_len)}
    return {a.name: special.get(a.dtype) or np.dtype(a.dtype) for a in SCHEMA}


def array_length(array: Array, n_tokens: int, n_packs: int, n_segments: int) -> int:
    return {"token": n_tokens, "pack+1": n_packs + 1, "segment+pack": n_segments + n_packs,
            "segment": n_segments}[array.per]


def shard_arrays(index: dict) -> tuple[Array, ...]:
    """The arrays a shard of this dataset holds."""
    return tuple(a for a in SCHEMA if a.optional is None or index.get(a.optional))


def index_digest(index: dict) -> str:
    """sha256 of the index without its own digest: a flipped byte in index.json is caught."""
    import hashlib

    body = {k: v for k, v in index.items() if k != "index_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------- writer


def shard_offsets(seg_len: np.ndarray, pack_nseg: np.ndarray) -> dict[str, np.ndarray]:
    """pack_offsets, seg_offsets and cu_seqlens of a shard, from its segment lengths (in
    output order) and segments per pack: everything but the tokens follows from these."""
    n_packs = pack_nseg.size
    seg_in_shard = np.concatenate([[0], np.cumsum(pack_nseg)]).astype(np.int64)
    tok_ends = np.concatenate([[0], np.cumsum(seg_len)]).astype(np.int64)
    pack_offsets = tok_ends[seg_in_shard]
    cu = np.empty(seg_len.size + n_packs, np.int64)
    idx = np.arange(seg_len.size) + np.repeat(np.arange(n_packs), pack_nseg) + 1
    cu[idx] = tok_ends[1:] - np.repeat(pack_offsets[:-1], pack_nseg)
    cu[seg_in_shard[:-1] + np.arange(n_packs)] = 0
    return {"pack_offsets": pack_offsets, "seg_offsets": seg_in_shard, "cu_seqlens": cu,
            "tok_ends": tok_ends}


class PackedWriter:
    """Writes shards into a (temporary) directory, then ``index.json`` with the format's own
    keys (format, version, dtypes, shards) around the caller's metadata.

    Per-token arrays are filled in place through memory maps whose space is reserved first
    (``posix_fallocate``), so a full disk is an error before any page is written, never a
    SIGBUS. Two threads per chunk: the caller's ``fill_tokens`` gathers tokens (and the loss
    mask) while the writer derives positions and segment ids (numba and crc32 release the GIL).
    """

    def __init__(self, directory: Path, seq_len: int, token_dtype: np.dtype, loss_mask: bool):
        self.directory, self.seq_len, self.loss_mask = Path(directory), seq_len, loss_mask
        self.dtypes = array_dtypes(seq_len, token_dtype)
        self.arrays = shard_arrays({"loss_mask": loss_mask})
        self.shards: list[dict] = []

    def write_shard(self, seg_len, pack_nseg, source_docs, source_offsets, fill_tokens,
                    progress=None, k: int | None = None) -> dict:
        """One shard from its segments (output order). ``fill_tokens(tokens, mask, a, b, t_a,
        t_b)`` writes segments a..b-1 into tokens[t_a:t_b] (and mask, when there is one).
        ``k`` numbers the shard (default: the next one; given when shards are written apart,
        see packtool.scale)."""
        name = f"shard-{len(self.shards) if k is None else k:05d}"
        off = shard_offsets(seg_len, pack_nseg)
        n_tok, n_seg, n_packs = int(off["tok_ends"][-1]), int(seg_len.size), int(pack_nseg.size)
        small = {"pack_offsets": off["pack_offsets"], "seg_offsets": off["seg_offsets"],
                 "cu_seqlens": off["cu_seqlens"], "source_docs": source_docs,
                 "source_offsets": source_offsets}
        files = {}
        for a, arr in small.items():
            w = NpyWriter(self.directory / f"{name}.{a}.npy", self.dtypes[a], arr.size)
            w.write(arr)
            files[a] = {"name": f"{name}.{a}.npy", **w.close()}
        per_token = [a.name for a in self.arrays if a.per == "token"]
        maps = {}
        try:
            for a in per_token:
                maps[a] = NpyMap(self.directory / f"{name}.{a}.npy", self.dtypes[a], n_tok)
            self._fill(maps, off, seg_len, pack_nseg, fill_tokens, progress)
            for a, m in maps.items():
                files[a] = {"name": f"{name}.{a}.npy", **m.close()}
        except BaseException:
            for m in maps.values():
                m.abort()
            raise
        entry = {"name": name, "n_packs": n_packs, "n_tokens": n_tok, "n_segments": n_seg,
                 "files": {a.name: files[a.name] for a in self.arrays}}
        self.shards.append(entry)
        return entry

    def _fill(self, maps, off, seg_len, pack_nseg, fill_tokens, progress) -> None:
        from ._kernels import _fill_sidecars

        po, so = off["pack_offsets"], off["seg_offsets"]
        mask = maps.get(MASK)

        def tokens_part(a, b, t_a, t_b):
            fill_tokens(maps["tokens"].array, None if mask is None else mask.array,
                        a, b, t_a, t_b)
            maps["tokens"].hash_upto(t_b)
            if mask is not None:
                mask.hash_upto(t_b)

        def sidecars_part(j, j1, a, b, t_a, t_b):
            _fill_sidecars(seg_len[a:b], pack_nseg[j:j1], maps["position_ids"].array[t_a:t_b],
                           maps["doc_ids"].array[t_a:t_b])
            maps["position_ids"].hash_upto(t_b)
            maps["doc_ids"].hash_upto(t_b)

        with ThreadPoolExecutor(2, "packtool-shard") as pool:
            j, n_packs = 0, pack_nseg.size
            while j < n_packs:
                j1 = int(np.searchsorted(po, po[j] + CHUNK_TOKENS, side="right")) - 1
                j1 = min(max(j1, j + 1), n_packs)
                a, b = int(so[j]), int(so[j1])
                t_a, t_b = int(po[j]), int(po[j1])
                jobs = [pool.submit(tokens_part, a, b, t_a, t_b),
                        pool.submit(sidecars_part, j, j1, a, b, t_a, t_b)]
                for f in jobs:
                    f.result()
                if progress is not None:
                    progress(t_b - t_a)
                j = j1

    def finish(self, meta: dict) -> dict:
        """Write ``index.json``: the format's keys, then ``meta`` (the caller's counts,
        options and metrics), the shards, and the index's own digest."""
        index = {"format": FORMAT, "version": VERSION, "seq_len": self.seq_len,
                 **meta, "token_dtype": self.dtypes["tokens"].name,
                 "loss_mask": self.loss_mask,
                 "dtypes": {a.name: self.dtypes[a.name].str for a in self.arrays},
                 "shards": self.shards, "created_by": f"packtool {__version__}"}
        unknown = set(index) - set(INDEX_KEYS)
        if unknown:  # a key must be documented in INDEX_KEYS (and so in FORMAT.md)
            raise RuntimeError(f"index.json keys not in the schema: {sorted(unknown)}")
        index["index_sha256"] = index_digest(index)
        (self.directory / INDEX).write_text(json.dumps(index, indent=1) + "\n")
        return index


# ---------------------------------------------------------------------------- validator


def read_index(directory: Path) -> dict:
    path = Path(directory) / INDEX
    if not Path(directory).is_dir():
        raise FormatError(f"{directory} is not a directory; pass the --out of packtool pack")
    index = read_manifest(path, FORMAT, VERSION)
    if index.get("index_sha256") != index_digest(index):
        raise FormatError(f"{path}: content does not match its index_sha256; the file was modified")
    _check_index(index, path)
    return index


def _check_index(index: dict, path: Path) -> None:
    """Types and names of what the reader trusts: counts are integers, file names are plain
    names inside the directory (no separators, no '..', no absolute paths)."""
    try:
        seq_len = index["seq_len"]
        shards = index["shards"]
        if not (isinstance(seq_len, int) and 1 <= seq_len < 2**31 and isinstance(shards, list)):
            raise TypeError("seq_len or shards")
        for sh in shards:
            for key in ("n_packs", "n_tokens", "n_segments"):
                if not isinstance(sh[key], int) or sh[key] < 0:
                    raise TypeError(f"{key} of shard {sh.get('name')!r}")
            for a in shard_arrays(index):
                confined_name(sh["files"][a.name]["name"], path)
    except (KeyError, TypeError) as e:
        raise FormatError(f"{path}: malformed index ({e}); re-run packtool pack") from None


def confined_name(name, manifest: Path) -> str:
    """A file name from a manifest, refused unless it is a plain name in the same folder."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name or os.path.isabs(name)):
        raise FormatError(f"{manifest}: file name {name!r} is not a plain name inside "
                          f"{manifest.parent}; refusing to open it")
    target = manifest.parent / name
    if target.is_symlink() and manifest.parent.resolve() not in target.resolve().parents:
        raise FormatError(f"{manifest}: {name!r} is a symbolic link out of {manifest.parent}; "
                          "refusing to open it")
    return name


class ValidationError(FormatError):
    """The first violation found in a packed dataset (names shard, pack and token)."""


_MESSAGES = {
    1: "offsets do not start at 0",
    2: "a pack is empty",
    3: "a pack is longer than seq_len",
    4: "a pack has no segments",
    5: "cu_seqlens does not start at 0",
    6: "cu_seqlens does not end at the pack's length",
    7: "cu_seqlens does not strictly increase within the pack (empty or overlong segment)",
    8: "doc_ids do not number the pack's segments 0, 1, ...",
    9: "position_ids do not restart at 0 in the segment",
    10: "offsets point past the end of the shard's arrays",
}


def load_array(path: Path, dtype: np.dtype, n: int) -> np.ndarray:
    """Memory-map a 1-D .npy, refusing anything but ``dtype`` and shape ``(n,)``."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ValidationError(f"{path} is missing (listed in {INDEX})") from None
    if size == 0:
        raise ValidationError(f"{path} is empty (0 bytes): the shard is damaged; re-run "
                              "packtool pack")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # numpy's header parser raises anything from a damaged header
        # (ValueError, SyntaxError, tokenize.TokenError, EOFError...): all mean "not an .npy"
        raise ValidationError(f"{path}: not a readable .npy ({e})") from None
    if arr.dtype != dtype or arr.shape != (n,):
        raise ValidationError(f"{path}: holds {arr.dtype} {arr.shape}, expected {dtype} ({n},)")
    return arr


def open_shard(directory: Path, index: dict, k: int, checksums: bool) -> dict[str, np.ndarray]:
    """Shard ``k``'s arrays, checked: sizes, dtypes, offsets in range and monotonic (and,
    with ``checksums``, every file's crc32): a reader never indexes memory with an
    unchecked value from a file."""
    sh = index["shards"][k]
    dtypes = array_dtypes(int(index["seq_len"]), np.dtype(index["token_dtype"]))
    n_t, n_p, n_s = sh["n_tokens"], sh["n_packs"], sh["n_segments"]
    arrays = {}
    for a in shard_arrays(index):
        f = sh["files"][a.name]
        path = directory / f["name"]
        size = path.stat().st_size if path.is_file() else None
        if size == 0:
            raise ValidationError(f"{path} is empty (0 bytes): the shard is damaged; re-run "
                                  "packtool pack")
        if size is not None and size != f["bytes"]:
            raise ValidationError(f"{path}: {size:,} bytes, {INDEX} says {f['bytes']:,}; the "
                                  "file is truncated or replaced, re-run packtool pack")
        arrays[a.name] = load_array(path, dtypes[a.name], array_length(a, n_t, n_p, n_s))
        if checksums:
            check_crc(path, f["crc32"])
    po, so = arrays["pack_offsets"], arrays["seg_offsets"]
    if n_p and (po[0] != 0 or po[-1] != n_t or so[0] != 0 or so[-1] != n_s
                or (np.diff(po) <= 0).any() or (np.diff(so) <= 0).any()):
        raise ValidationError(f"{sh['name']}: pack/segment offsets are not increasing from 0 "
                              "to the shard's counts; the shard is damaged, re-run packtool pack")
    return arrays


def check_crc(path: Path, want: str) -> None:
    """crc32 of ``path`` against the index, once per file per process: a reader pays one
    sequential read per file (~3 GB/s) on first use."""
    def check():
        if crc32_file(path) != want:
            raise ValidationError(f"{path}: crc32 does not match {INDEX}; the file is corrupt "
                                  "(re-run packtool pack, or packtool verify for details)")

    check_once(path, want, check)


def validate_packed(directory: str | Path, checksums: bool = True):
    """Check a packed directory against the schema: index digest and keys, file names,
    sizes, dtypes, crc32, and every invariant of every pack. Returns (index, shards' arrays)
    or raises :class:`ValidationError` naming shard, pack and token."""
    directory = Path(directory)
    index = read_index(directory)
    seq_len = int(index["seq_len"])
    totals = {"n_packs": 0, "n_tokens": 0, "n_segments": 0}
    shards = []
    for k, sh in enumerate(index["shards"]):
        want = {a.name for a in shard_arrays(index)}
        if set(sh["files"]) != want:
            raise ValidationError(f"{sh['name']}: files {sorted(sh['files'])} do not match the "
                                  f"format's {sorted(want)}")
        arrays = open_shard(directory, index, k, checksums)
        from ._kernels import _check_shard

        code, p, t = _check_shard(arrays["pack_offsets"], arrays["seg_offsets"],
                                  arrays["cu_seqlens"], arrays["position_ids"],
                                  arrays["doc_ids"], seq_len)
        if code:
            raise ValidationError(f"{sh['name']} pack {p} (token {t}): {_MESSAGES[code]}")
        for key in totals:
            totals[key] += sh[key]
        shards.append(arrays)
    for key, n in totals.items():
        if index[key] != n:
            raise ValidationError(f"{INDEX}: {key} is {index[key]:,} but the shards hold {n:,}")
    return index, shards


# ------------------------------------------------------------------------------- reader


@dataclass
class _Shard:
    arrays: dict
    n_packs: int


class PackedReader:
    """A packed dataset on disk: ``len(ds)`` packs; ``ds[i]`` a dict of numpy arrays.

    >>> ds = open_packed("out/packed")         # doctest: +SKIP
    >>> ex = ds[0]; ex["input_ids"], ex["cu_seqlens"], ex["max_seqlen"]
    >>> batch = collate_numpy([ds[0], ds[1]])         # one [1, N] row for flash-attention varlen
    """

    def __init__(self, directory: str | Path, checksums: bool = True):
        self.directory = Path(directory)
        self.checksums = checksums
        self.index = read_index(self.directory)
        self.seq_len = int(self.index["seq_len"])
        self._shards: list[_Shard | None] = [None] * len(self.index["shards"])
        counts = [s["n_packs"] for s in self.index["shards"]]
        self._pack_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._pack_starts[-1])

    @property
    def token_dtype(self) -> np.dtype:
        return np.dtype(self.index["token_dtype"])

    def shard(self, k: int) -> _Shard:
        """Shard k's arrays, opened (and checked) on first use."""
        if self._shards[k] is None:
            arrays = open_shard(self.directory, self.index, k, self.checksums)
            self._shards[k] = _Shard(arrays, self.index["shards"][k]["n_packs"])
        return self._shards[k]

    def _locate(self, i: int) -> tuple[_Shard, int]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"pack {i} out of range for a dataset of {n:,} packs")
        i %= n
        k = int(np.searchsorted(self._pack_starts, i, side="right") - 1)
        return self.shard(k), i - int(self._pack_starts[k])

    def __getitem__(self, i: int) -> dict:
        sh, j = self._locate(i)
        a = sh.arrays
        t0, t1 = int(a["pack_offsets"][j]), int(a["pack_offsets"][j + 1])
        s0, s1 = int(a["seg_offsets"][j]), int(a["seg_offsets"][j + 1])
        input_ids = np.array(a["tokens"][t0:t1], dtype=np.int64)
        cu = np.array(a["cu_seqlens"][s0 + j : s1 + j + 1], dtype=np.int32)
        labels = input_ids.copy()
        if MASK in a:
            labels[np.array(a[MASK][t0:t1]) == 0] = IGNORE_INDEX
        labels[cu[:-1]] = IGNORE_INDEX
        return {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": np.array(a["position_ids"][t0:t1], dtype=np.int64),
            "doc_ids": np.array(a["doc_ids"][t0:t1], dtype=np.int32),
            "cu_seqlens": cu,
            "max_seqlen": int(np.diff(cu).max()) if len(cu) > 1 else 0,
            "source_docs": np.array(a["source_docs"][s0:s1], dtype=np.int64),
            "source_offsets": np.array(a["source_offsets"][s0:s1], dtype=np.int64),
        }

    def get(self, i: int, pad_to: int | None = None, pad_id: int = 0,
            pad_multiple: int | None = None, per_segment: bool = False) -> dict:
        """``ds[i]``, padded to ``pad_to`` tokens (default: seq_len, or with ``pad_multiple=k``
        the next multiple of k) for fixed shapes; ``per_segment=True`` first pads every segment
        to a multiple of k (context parallelism).

        Pads get ``pad_id``, labels -100, doc_ids -1; a row pad is a segment of its own with
        positions 0, 1, 2, ... (the last entry of ``cu_seqlens`` becomes ``pad_to``), so neither
        a position-id nor a cu_seqlens based kernel lets a pad attend to, or be attended from,
        a real token. See ``packtool.batching.pad_example``.
        """
        from ..batching import pad_example

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


def open_packed(directory: str | Path, checksums: bool = True) -> PackedReader:
    """Open a directory written by ``packtool pack`` (refuses unknown format versions).

    The index is checked at once (digest, keys, file names); each shard when first used
    (sizes, dtypes, offsets) and, with ``checksums``, its files' crc32, once per process."""
    return PackedReader(directory, checksums)
