"""Megatron-LM / NeMo indexed dataset: ``PREFIX.bin`` + ``PREFIX.idx``, exactly as
``megatron.core.datasets.indexed_dataset`` writes and reads it (index version 1)::

    PREFIX.idx (little-endian)
      char[9]    b"MMIDIDX\\x00\\x00"
      uint64     1                       index version
      uint8      dtype code of PREFIX.bin: uint16 = 8, int32 = 4 (Megatron has no uint32)
      uint64     S                       number of sequences
      uint64     D                       len(document_indices) = documents + 1
      int32[S]   sequence lengths in tokens
      int64[S]   sequence pointers: byte offset of each sequence in PREFIX.bin
      int64[D]   document indices: [0, ..., S], document d = sequences [idx[d], idx[d+1])
    PREFIX.bin   the tokens of every sequence back to back, no header

From a token corpus: one sequence per document and one document per sequence (what
``GPTDataset`` expects). packtool's ``.bin`` is already that byte stream: uint16 as is, and
uint32 ids (all < 2**31) have the same bytes as int32, so only the ``.idx`` is written and
the ``.bin`` is hard-linked (no bytes copied; a copy where the file systems differ).

From a packed dataset: one sequence per segment and one Megatron *document* per pack, so
``document_indices`` keep the pack structure: pack p is ``sequences[idx[p]:idx[p+1]]``.

The index is written in chunks of 1M entries in two passes over the lengths (lengths, then
pointers), so memory stays ~16 MB however many documents the corpus holds.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np

from .._io import create
from ..errors import FormatError, PacktoolError

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {"uint16": 8, "int32": 4}  # Megatron's DType enum, for the dtypes we write
CHUNK = 1 << 20       # index entries per write
TOKEN_CHUNK = 1 << 24  # tokens per .bin write (32-64 MB)
PACKS_PER_READ = 4096  # packs read at once when a packed dataset is exported
INT32_MAX = 2**31 - 1


def out_paths(out: Path) -> tuple[Path, Path]:
    """OUT is a prefix; a trailing .bin or .idx is dropped (both name the same dataset)."""
    if out.suffix in (".bin", ".idx"):
        out = out.with_suffix("")
    return Path(f"{out}.bin"), Path(f"{out}.idx")


def bin_dtype(token_dtype: np.dtype) -> str:
    """uint16 stays uint16; uint32 is stored as int32, byte-identical while ids < 2**31."""
    return "uint16" if np.dtype(token_dtype).itemsize == 2 else "int32"


def write_index(path: Path, code: int, itemsize: int, n_seqs: int, lengths, doc_indices) -> int:
    """Write an .idx; ``lengths()`` yields int64 chunks (called twice), ``doc_indices`` yields
    int64 chunks once. Returns the bytes written."""
    n_docs_plus_one = 0
    with create(path) as f:
        f.write(HEADER + struct.pack("<Q", VERSION) + struct.pack("<B", code))
        count_pos = f.tell()
        f.write(struct.pack("<QQ", n_seqs, 0))
        seen = 0
        for chunk in lengths():
            if len(chunk) and int(chunk.max()) > INT32_MAX:
                raise PacktoolError(
                    f"a sequence of {int(chunk.max()):,} tokens exceeds Megatron's int32 length "
                    f"limit ({INT32_MAX:,}); pack or split the corpus first")
            f.write(chunk.astype("<i4").tobytes())
            seen += len(chunk)
        if seen != n_seqs:
            raise FormatError(f"expected {n_seqs:,} sequence lengths, found {seen:,}")
        offset = 0
        for chunk in lengths():
            ptr = (np.cumsum(chunk) - chunk) * itemsize + offset  # each sequence's byte offset
            f.write(ptr.astype("<i8").tobytes())
            offset += int(chunk.sum()) * itemsize
        for chunk in doc_indices:
            f.write(np.asarray(chunk, dtype="<i8").tobytes())
            n_docs_plus_one += len(chunk)
        f.seek(count_pos + 8)
        f.write(struct.pack("<Q", n_docs_plus_one))
        f.seek(0, 2)
        return f.tell()


def _link_or_copy(src: Path, dst: Path, link: bool) -> tuple[str, str]:
    """Hard-link src to dst, else copy it. Returns (mode, why)."""
    if link:
        try:
            os.link(src, dst)
            return "hardlink", ""
        except OSError as e:  # EXDEV across file systems, EPERM on some mounts
            why = f"hard link failed: {e.strerror or e}"
    else:
        why = "hard link not requested"
    shutil.copyfile(src, dst)  # sendfile: in-kernel, bounded memory
    return "copy", why


def _concatenate(srcs: list[Path], dst: Path) -> None:
    """The parts' .bin files back to back (a multi-part corpus: one Megatron .bin)."""
    with create(dst) as f:
        for src in srcs:
            with open(src, "rb") as s:
                shutil.copyfileobj(s, f, 1 << 24)


def _append_bytes(f, arr: np.ndarray, tick) -> None:
    """Append a memmapped .npy array's raw bytes to ``f``: sendfile from its file when it is
    one (in-kernel, copy speed), else chunked writes."""
    f.flush()
    path, offset = getattr(arr, "filename", None), getattr(arr, "offset", None)
    if path is not None and offset is not None and arr.flags.c_contiguous:
        left, pos = arr.nbytes, int(offset)
        with open(path, "rb") as src:
            while left:
                sent = os.sendfile(f.fileno(), src.fileno(), pos, min(left, 1 << 30))
                if sent == 0:
                    raise FormatError(f"{path}: shorter than its header says; run packtool verify")
                pos, left = pos + sent, left - sent
                tick(sent // arr.itemsize)
        f.seek(0, 2)
        return
    for lo in range(0, len(arr), TOKEN_CHUNK):
        chunk = np.ascontiguousarray(arr[lo:lo + TOKEN_CHUNK])
        f.write(chunk.data)
        tick(len(chunk))


# one line: the export is right, but Megatron sees no document end in its concatenated stream
NO_EOS_NOTE = ("{prefix} was tokenized without --eos: Megatron concatenates the sequences "
               "with no end-of-document token between them, so --reset-position-ids, "
               "--reset-attention-mask and --eod-mask-loss see no document ends (tokenize with "
               "--eos TOKEN for them)")


def export_corpus(corpus, out: Path, *, tick, link: bool = True, **_) -> dict:
    """A token corpus as a Megatron indexed dataset: one sequence per document."""

    if corpus.n_tokens == 0:
        raise PacktoolError(f"{corpus.prefix} holds no tokens; nothing to export")
    vocab = int(corpus.meta.get("vocab_size") or 0)
    if corpus.dtype.itemsize == 4 and not 0 < vocab <= INT32_MAX + 1:
        raise PacktoolError(
            f"{corpus.prefix}: vocab_size {vocab:,} does not fit Megatron's int32 tokens "
            f"(ids <= {INT32_MAX:,})")
    dt = bin_dtype(corpus.dtype)
    bin_path, idx_path = out_paths(out)
    ends = corpus.ends
    n = len(ends)

    def lengths():
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            prev = np.int64(ends[lo - 1]) if lo else np.int64(0)
            yield np.diff(np.asarray(ends[lo:hi], dtype=np.int64), prepend=prev)

    def doc_indices():
        for lo in range(0, n + 1, CHUNK):
            yield np.arange(lo, min(n + 1, lo + CHUNK), dtype=np.int64)

    bins = [q.file("bin") for q in corpus.parts]  # a remote part: its verified copy
    if len(bins) == 1:
        mode, why = _link_or_copy(bins[0], bin_path, link and not corpus.parts[0].cached)
    else:  # one .bin of all parts in order: the corpus's global document order
        _concatenate(bins, bin_path)
        mode, why = "copy", f"{len(bins)} parts concatenated"
    idx_bytes = write_index(idx_path, DTYPE_CODES[dt], corpus.dtype.itemsize, n, lengths,
                            doc_indices())
    tick(corpus.n_tokens)
    bin_bytes = corpus.n_tokens * corpus.dtype.itemsize
    notes = [f"{bin_path.name} " + (
        f"hard-linked to {bins[0]} (0 bytes copied)" if mode == "hardlink"
        else f"copied from {bins[0]} ({why})" if len(bins) == 1
        else f"the {len(bins)} parts' .bin files concatenated in order ({why})")]
    if corpus.meta.get("eos_id") is None:  # docs/EXPORT.md: the reset flags look for EOD
        notes.append(NO_EOS_NOTE.format(prefix=corpus.prefix))
    if corpus.has_mask:
        notes.append("loss mask not exported: a Megatron indexed dataset holds tokens only "
                     f"({corpus.prefix}.mask stays beside the corpus)")
    return {
        "files": [bin_path, idx_path],
        "bytes_written": idx_bytes + (bin_bytes if mode == "copy" else 0),
        "notes": notes,
        "details": {"bin": mode, "dtype": dt, "n_sequences": n, "n_documents": n},
    }


def export_packed(ds, out: Path, *, tick, **_) -> dict:
    """A packed dataset as a Megatron indexed dataset: sequence = segment, document = pack."""
    if int(ds.index["n_tokens"]) == 0:
        raise PacktoolError(f"{ds.directory} holds no tokens; nothing to export")
    if ds.align > 1:
        raise PacktoolError(
            f"{ds.directory} is aligned to {ds.align} (pack --align): a Megatron indexed "
            "dataset has no loss mask, so its pads would be trained on; export it as "
            "parquet-packed (Megatron-Bridge's packed THD rows, pads masked), or export the "
            "corpus (megatron from the token files) and let Megatron pad for context "
            "parallelism")
    dt = bin_dtype(ds.token_dtype)
    itemsize = ds.token_dtype.itemsize
    bin_path, idx_path = out_paths(out)
    shards = ds.index["shards"]
    n_seqs = sum(int(s["n_segments"]) for s in shards)

    def lengths():  # the segment tables, checked against index.json when the shard opened
        for k in range(len(shards)):
            yield np.asarray(ds.shard(k).seg_length, np.int64)

    def doc_indices():
        base = 0
        for k, s in enumerate(shards):
            ps = np.asarray(ds.shard(k).pack_seg, dtype=np.int64)
            yield (ps[:-1] if k < len(shards) - 1 else ps) + base
            base += int(s["n_segments"])

    with create(bin_path) as f:
        for k, s in enumerate(shards):
            stored = ds.shard(k).arrays.get("tokens")
            if stored is not None and ds.index.get("mask_storage") != "folded" \
                    and itemsize == 2:  # the shard's tokens as they are: sendfile
                _append_bytes(f, stored, tick)
                continue
            for lo in range(0, int(s["n_packs"]), PACKS_PER_READ):
                hi = min(int(s["n_packs"]), lo + PACKS_PER_READ)
                toks = ds.read_range(k, lo, hi)["ids"]
                if itemsize == 4 and toks.size and int(toks.max()) > INT32_MAX:
                    raise PacktoolError(f"{ds.directory}: token id {int(toks.max()):,} "
                                        "does not fit Megatron's int32 tokens")
                _append_bytes(f, toks.astype(ds.token_dtype), tick)
        written = f.tell()
    written += write_index(idx_path, DTYPE_CODES[dt], itemsize, n_seqs, lengths,
                           doc_indices())
    notes = []
    if ds.index.get("loss_mask"):
        notes.append("loss mask not exported: a Megatron indexed dataset holds tokens only")
    return {
        "files": [bin_path, idx_path],
        "bytes_written": written,
        "notes": notes,
        "details": {"bin": "written", "dtype": dt, "n_sequences": n_seqs,
                    "n_documents": len(ds)},
    }
