"""Input corpora: find the files, stream their documents as ``str`` with record numbers.

Supported kinds (by file name):

==================  =========================================================
``.jsonl/.json``    one JSON object per line; blank lines are not records
``.jsonl.gz``       the same, gzip-compressed (also ``.json.gz``)
``.jsonl.zst``      the same, zstd-compressed (also ``.json.zst``, ``.jsonl.zstd``)
``.parquet``        read in record batches of at most ~64 MiB (never whole into memory)
``.arrow``          Arrow IPC, stream or file format (what ``datasets.save_to_disk`` writes)
``.txt``            one document per file, or per line / blank-line paragraph
==================  =========================================================

A directory is read recursively; a folder it cannot list is an error, and the metadata files of a
``datasets.save_to_disk`` folder (``state.json``, ``dataset_info.json``, ``dataset_dict.json``)
are not corpus files: its ``state.json`` names the ``.arrow`` files to read.

Every record-level problem raises :class:`PacktoolError` naming the file, the record and the
fix, unless ``skip_bad_records`` is set, in which case it is counted per input file. A record over
``max_record_bytes`` (default 64 MiB) is such a problem: tokenizing one record takes up to
about 210x its size in memory (``MEMORY_PER_RECORD_BYTE``; a 16 MB line of Japanese peaked at
3.4 GB RSS), so the limit is what keeps a stray giant record from taking the machine down.
JSONL and text lines over the limit are skipped in 1 MiB pieces, never held whole.

Modules: :mod:`.discover` finding the files, :mod:`.files` one reader per kind,
:mod:`.jsonl` and :mod:`.txt` and :mod:`.columnar` (Parquet, Arrow) the readers,
:mod:`.records` a record's text (field, chat) and the bad-record rule, :mod:`.groups`
preference pairs and groups read from a record.
"""

from __future__ import annotations

from ..errors import PacktoolError
from .columnar import PARQUET_BATCH_BYTES, iter_arrow, iter_parquet
from .discover import KINDS, SUPPORTED, expand_inputs, file_kind
from .files import RemoteInput, as_input, content_hash, content_unchanged, identity
from .jsonl import iter_jsonl
from .records import (
    DEFAULT_MAX_RECORD_BYTES,
    MEMORY_PER_RECORD_BYTE,
    InputStats,
    ReadOptions,
    counted,
    utf8_size,
)
from .txt import TXT_SPLITS, iter_txt

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "KINDS", "MEMORY_PER_RECORD_BYTE", "PARQUET_BATCH_BYTES",
           "TXT_SPLITS", "InputStats", "ReadOptions", "RemoteInput", "as_input", "content_hash",
           "content_unchanged", "expand_inputs", "file_kind", "identity", "iter_documents",
           "utf8_size"]


def iter_documents(path, opts: ReadOptions, stats: InputStats, progress=lambda n: None):
    """Yield the text of every record of ``path`` in order, counting into ``stats``."""
    if opts.vision is not None:  # a record's images: relative to its file, inline ones
        return _located(path, opts, stats, progress)  # named by file and record
    return _records(path, opts, stats, progress)


def _records(path, opts: ReadOptions, stats: InputStats, progress):
    kind = file_kind(path)
    if kind in ("jsonl", "jsonl.gz", "jsonl.zst"):
        records = iter_jsonl(path, kind, opts, stats, progress)
    elif kind in ("parquet", "arrow"):
        records = (iter_parquet if kind == "parquet" else iter_arrow)(path, opts, progress)
    elif kind == "txt":
        if opts.mode != "text" or opts.tree_field:
            raise PacktoolError(f"{path}: .txt files hold plain text; prompt/completion, "
                                "messages and --tree-field need JSONL or Parquet records")
        records = iter_txt(path, opts, progress)
    else:
        raise PacktoolError(f"{path}: unsupported file type; supported: {SUPPORTED}")
    unit = "row" if kind in ("parquet", "arrow") else "line"
    return counted(path, unit, records, opts.skip_bad_records, stats)


def _located(path, opts: ReadOptions, stats: InputStats, progress):
    if file_kind(path) == "txt":
        raise PacktoolError(f"{path}: .txt files hold plain text; records with images need "
                            "JSONL or Parquet (--images-field, or image content parts)")
    opts.vision.source = str(path)
    for doc in _records(path, opts, stats, progress):
        doc.locate(str(path), stats.record)
        yield doc
