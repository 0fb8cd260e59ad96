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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FormatError, PacktoolError
from .tokens import read_manifest

FORMAT = "packtool.packed"
VERSION = 1
INDEX = "index.json"
PER_TOKEN = ("tokens", "position_ids", "doc_ids")
PER_PACK = ("pack_offsets", "seg_offsets", "cu_seqlens")
PER_SEGMENT = ("source_docs", "source_offsets")
ARRAYS = PER_TOKEN + PER_PACK + PER_SEGMENT
MASK = "loss_mask"  # optional per-token uint8 (SFT/chat sources): 1 = trained on


def shard_arrays(index: dict) -> tuple[str, ...]:
    return ARRAYS + ((MASK,) if index.get("loss_mask") else ())
IGNORE_INDEX = -100


def position_dtype(seq_len: int) -> np.dtype:
    """Positions and in-pack segment ids are < seq_len: uint16 up to 65,536, else uint32."""
    return np.dtype("<u2") if seq_len <= 65_536 else np.dtype("<u4")


def array_dtypes(seq_len: int, token_dtype: np.dtype) -> dict[str, np.dtype]:
    small = position_dtype(seq_len)
    return {
        "tokens": np.dtype(token_dtype).newbyteorder("<"),
        "position_ids": small,
        "doc_ids": small,
        "pack_offsets": np.dtype("<i8"),
        "seg_offsets": np.dtype("<i8"),
        "cu_seqlens": np.dtype("<i4"),
        "source_docs": np.dtype("<i8"),
        "source_offsets": np.dtype("<i8"),
        MASK: np.dtype("u1"),
    }


def index_digest(index: dict) -> str:
    """sha256 of the index without its own digest: a flipped byte in index.json is caught."""
    import hashlib

    body = {k: v for k, v in index.items() if k != "index_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_index(directory: Path) -> dict:
    path = Path(directory) / INDEX
    if not Path(directory).is_dir():
        raise FormatError(f"{directory} is not a directory; pass the --out of packtool pack")
    index = read_manifest(path, FORMAT, VERSION)
    if index.get("index_sha256") != index_digest(index):
        raise FormatError(f"{path}: content does not match its index_sha256; the file was modified")
    return index


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

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
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
        if self._shards[k] is None:
            info = self.index["shards"][k]
            arrays = {}
            for name in shard_arrays(self.index):
                path = self.directory / info["files"][name]["name"]
                try:
                    arrays[name] = np.load(path, mmap_mode="r") if path.stat().st_size else None
                except (OSError, ValueError) as e:
                    raise FormatError(f"{path}: unreadable ({e}); run packtool verify") from None
            self._shards[k] = _Shard(arrays, info["n_packs"])
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


def open_packed(directory: str | Path) -> PackedReader:
    """Open a directory written by ``packtool pack`` (refuses unknown format versions)."""
    return PackedReader(directory)
