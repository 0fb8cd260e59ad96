"""``packtool export``: a packed dataset as Parquet for the rest of the ecosystem.

One row per pack with list columns ``input_ids`` (int32), ``labels`` (int32, -100 where not
trained on), ``position_ids`` (int32) and ``seq_lengths`` (int32: the segment lengths, so
``cu_seqlens = [0, *cumsum(seq_lengths)]``). ``datasets.load_dataset("parquet", data_files=...)``
and ``pyarrow.parquet.read_table`` read it directly. OUT ending in ``.parquet`` is one file;
anything else a directory with one file per shard. Written under a temporary name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._atomic import atomic_dir, atomic_files
from .errors import PacktoolError
from .formats.packed import IGNORE_INDEX, MASK, open_packed

ROWS_PER_GROUP = 1024


def _shard_table(arrays: dict, lo: int, hi: int):
    """Packs lo..hi-1 of a shard as a pyarrow table."""
    import pyarrow as pa

    po = np.asarray(arrays["pack_offsets"][lo:hi + 1], dtype=np.int64)
    so = np.asarray(arrays["seg_offsets"][lo:hi + 1], dtype=np.int64)
    t0, t1 = int(po[0]), int(po[-1])
    tokens = np.asarray(arrays["tokens"][t0:t1]).astype(np.int32)
    labels = tokens.copy()
    if arrays.get(MASK) is not None:
        labels[np.asarray(arrays[MASK][t0:t1]) == 0] = IGNORE_INDEX
    cu = np.asarray(arrays["cu_seqlens"][so[0] + lo: so[-1] + hi + 1], dtype=np.int64)
    is_end = cu != 0                    # drop each pack's leading 0
    seq_ends = cu[is_end]
    pack_of_seg = np.repeat(np.arange(hi - lo), np.diff(so))
    seg_starts_in_pack = np.concatenate([[0], seq_ends[:-1]])
    seg_starts_in_pack[np.concatenate([[True], np.diff(pack_of_seg) != 0])] = 0
    labels[po[pack_of_seg] - t0 + seg_starts_in_pack] = IGNORE_INDEX
    seq_lengths = (seq_ends - seg_starts_in_pack).astype(np.int32)
    tok_off = pa.array((po - t0).astype(np.int32))
    seg_off = pa.array((so - so[0]).astype(np.int32))
    return pa.table({
        "input_ids": pa.ListArray.from_arrays(tok_off, pa.array(tokens)),
        "labels": pa.ListArray.from_arrays(tok_off, pa.array(labels)),
        "position_ids": pa.ListArray.from_arrays(
            tok_off, pa.array(np.asarray(arrays["position_ids"][t0:t1]).astype(np.int32))),
        "seq_lengths": pa.ListArray.from_arrays(seg_off, pa.array(seq_lengths)),
    })


def _write_shard(ds, k: int, writer) -> None:
    arrays = ds.shard(k).arrays
    n = ds.index["shards"][k]["n_packs"]
    for lo in range(0, n, ROWS_PER_GROUP):
        writer.write_table(_shard_table(arrays, lo, min(n, lo + ROWS_PER_GROUP)))


def export_parquet(directory: str | Path, out: str | Path, overwrite: bool = False) -> str:
    import pyarrow.parquet as pq

    ds = open_packed(directory)
    out = Path(out)
    schema = _shard_table(ds.shard(0).arrays, 0, 0).schema if ds.index["shards"] else None
    if schema is None:
        raise PacktoolError(f"{directory} holds no packs; nothing to export")
    if out.suffix == ".parquet":
        with atomic_files([out], overwrite) as (tmp,):
            with pq.ParquetWriter(tmp, schema) as w:
                for k in range(len(ds.index["shards"])):
                    _write_shard(ds, k, w)
        files = 1
    else:
        with atomic_dir(out, overwrite, owned_marker="shard-00000.parquet") as tmp:
            for k, sh in enumerate(ds.index["shards"]):
                with pq.ParquetWriter(tmp / f"{sh['name']}.parquet", schema) as w:
                    _write_shard(ds, k, w)
        files = len(ds.index["shards"])
    return f"{out}: {len(ds):,} packs in {files} Parquet file(s)"
