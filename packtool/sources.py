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
"""

from __future__ import annotations

import functools
import glob
import gzip
import io
import json
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PacktoolError

KINDS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".jsonl.gz": "jsonl.gz",
    ".json.gz": "jsonl.gz",
    ".jsonl.zst": "jsonl.zst",
    ".json.zst": "jsonl.zst",
    ".jsonl.zstd": "jsonl.zst",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "txt",
}
DEFAULT_MAX_RECORD_BYTES = 64 << 20
# Tokenizing one record takes up to about this many times its size in memory, above the
# process's baseline (the tokenizers library's per-token structures and the reader's copies):
# measured by scripts/bench_record_memory.py for 4/8/16 MB records, both engines: prose
# 88-148x, Japanese 146-205x (16 MB: 3.4 GB peak RSS); text of a token every 1.5 bytes
# ("a, a, ...") ~310x. The limit above keeps a stray giant record from taking the machine down.
MEMORY_PER_RECORD_BYTE = 210
PARQUET_BATCH_BYTES = 64 << 20  # rows per Parquet batch: about this much decoded text
# a datasets.save_to_disk folder's metadata, beside its .arrow files
_HF_METADATA = ("state.json", "dataset_info.json", "dataset_dict.json")
TXT_SPLITS = ("file", "line", "blank-line")
_SUPPORTED = ", ".join(KINDS)


def file_kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in sorted(KINDS, key=len, reverse=True):
        if name.endswith(suffix):
            return KINDS[suffix]
    return None


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files as given; directories as all supported files inside (recursive, sorted); globs."""
    if not inputs:
        raise PacktoolError("no input given; pass files, directories or globs")
    out: list[Path] = []
    for arg in inputs:
        p = Path(arg)
        if p.is_dir():
            found = sorted(_walk(p, set()))
            if not found:
                raise PacktoolError(f"directory {p} holds no supported files ({_SUPPORTED})")
            out.extend(found)
        elif p.exists():
            if file_kind(p) is None:
                raise PacktoolError(
                    f"{p}: unsupported file type; supported: {_SUPPORTED} "
                    "(rename the file or convert it)"
                )
            out.append(p)
        elif glob.has_magic(arg):
            found = sorted(Path(f) for f in glob.glob(arg, recursive=True) if Path(f).is_file())
            found = [f for f in found if file_kind(f) and not _is_dataset_metadata(f)]
            if not found:
                raise PacktoolError(f"pattern {arg!r} matches no supported files ({_SUPPORTED})")
            out.extend(found)
        else:
            raise PacktoolError(f"{p}: no such file or directory")
    seen: dict = {}
    for p in out:
        key = p.resolve()
        if key in seen:
            raise PacktoolError(
                f"{p} is given twice (also as {seen[key]}); each input is read once")
        seen[key] = p
        try:
            open(p, "rb").close()
        except OSError as e:
            raise PacktoolError(
                f"{p}: cannot open ({e.strerror}); check the path and permissions") from None
    return out


def _walk(folder: Path, seen: set) -> list[Path]:
    """Supported files under ``folder``, recursively; a folder that cannot be listed is an error
    (``Path.rglob`` skips it silently: 100 of 350 documents went missing that way)."""
    key = folder.resolve()
    if key in seen:  # a symlink loop
        return []
    seen.add(key)
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise PacktoolError(
            f"{folder}: cannot read this folder ({e.strerror}); fix its permissions, or pass "
            "the files you want instead of the parent folder"
        ) from None
    names = {e.name for e in entries}
    data_files = _save_to_disk_files(folder, names)
    out: list[Path] = []
    for e in entries:
        f = folder / e.name
        try:
            is_dir = e.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            out.extend(_walk(f, seen))
            continue
        if e.name.startswith(".") or not file_kind(f) or not f.is_file():
            continue
        if data_files is not None and (e.name in _HF_METADATA or file_kind(f) == "arrow"):
            if e.name in data_files:
                out.append(f)
            continue
        if e.name == "dataset_dict.json" or _is_packtool_manifest(f):
            continue
        out.append(f)
    return out


def _is_dataset_metadata(path: Path) -> bool:
    """A save_to_disk folder's state.json / dataset_info.json (matched by a glob)."""
    if path.name == "dataset_dict.json":
        return True
    return (path.name in _HF_METADATA
            and _save_to_disk_files(path.parent, set(os.listdir(path.parent))) is not None)


def _save_to_disk_files(folder: Path, names: set) -> set | None:
    """The ``.arrow`` files a ``datasets.save_to_disk`` folder's ``state.json`` lists, or None
    when ``folder`` is not one (other ``.arrow`` files there, e.g. map caches, are not data)."""
    if "state.json" not in names or not any(n.endswith(".arrow") for n in names):
        return None
    try:
        state = json.loads((folder / "state.json").read_text())
        return {d["filename"] for d in state["_data_files"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PacktoolError(
            f"{folder / 'state.json'}: not a readable datasets save_to_disk state ({e}); "
            "pass the .arrow files themselves"
        ) from None


def _is_packtool_manifest(path: Path) -> bool:
    """packtool's own .json outputs (token manifests, index.json) sitting in an input folder."""
    if not path.name.endswith(".json"):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return b'"format": "packtool.' in head


@dataclass
class InputStats:
    """What one input file contributed; goes into the manifest."""

    path: str
    kind: str
    n_docs: int = 0
    record: int = 0  # number (line or row) of the record last yielded, for messages
    blank_lines: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_records: list[int] = field(default_factory=list)
    content: dict | None = None  # bytes and crc32 of the file as read

    def skip(self, record: int, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.skipped_records.append(record)

    def to_json(self) -> dict:
        d = {"path": self.path, "kind": self.kind, "n_docs": self.n_docs}
        if self.content is not None:
            d["content"] = self.content
        if self.blank_lines:
            d["blank_lines"] = self.blank_lines
        if self.skipped:
            d["skipped"] = self.skipped
            d["skipped_records"] = self.skipped_records
        return d


@dataclass
class ReadOptions:
    text_field: str = "text"
    txt_split: str = "file"
    skip_bad_records: bool = False
    parquet_batch_rows: int = 8192       # at most; fewer when rows are long (PARQUET_BATCH_BYTES)
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    prompt_field: str | None = None       # with completion_field: SFT prompt/completion pairs
    completion_field: str | None = None
    messages_field: str | None = None     # chat conversations: [{"role", "content"}, ...]
    render: Callable | None = None        # renders a conversation here, in the reader, so a
    #                                       failure is a bad record of a known file and line

    @property
    def mode(self) -> str:
        if self.messages_field:
            return "messages"
        if self.prompt_field or self.completion_field:
            return "prompt_completion"
        return "text"

    def extract(self, obj):
        """The record's document: a str, a (prompt, completion) pair, or a message list."""
        if self.mode == "text":
            return _check_text(_get_field(obj, self.text_field), self.text_field)
        if self.mode == "prompt_completion":
            return (_check_text(_get_field(obj, self.prompt_field), self.prompt_field),
                    _check_text(_get_field(obj, self.completion_field), self.completion_field))
        messages = _check_messages(_get_field(obj, self.messages_field), self.messages_field)
        if self.render is None:
            return messages
        try:
            return self.render(messages)
        except PacktoolError as e:  # the template refused this conversation
            raise _BadRecord(getattr(e, "reason", "chat_template"), str(e)) from None


_SKIPPED = object()  # a record already counted as skipped


class _BadRecord(Exception):
    def __init__(self, reason: str, message: str):
        self.reason, self.message = reason, message

    def hint(self) -> str:
        """The fix, unless the message already names it."""
        if self.reason in ("missing_field", "too_large"):
            return ""
        return "; fix the record or pass --skip-bad-records"


def _too_large(size: int, limit: int) -> _BadRecord:
    return _BadRecord(
        "too_large",
        f"record is {size:,} bytes, over --max-record-bytes {limit:,} (tokenizing takes about "
        f"{MEMORY_PER_RECORD_BYTE}x a record's size in memory); raise --max-record-bytes if the "
        "machine has the memory, split the record, or pass --skip-bad-records",
    )


def utf8_size(doc) -> int:
    """A record's size in UTF-8 bytes: a text, a (prompt, completion) pair or messages."""
    if isinstance(doc, str):
        return len(doc) if doc.isascii() else len(doc.encode("utf-8", "surrogatepass"))
    if isinstance(doc, tuple):  # (prompt, completion), or (rendered text, trained spans)
        return sum(utf8_size(x) for x in doc if isinstance(x, str))
    return sum(utf8_size(m["content"]) + utf8_size(m["role"]) for m in doc)


def _lines(f, limit: int):
    """``(line, size)`` for each line of ``f``; ``line`` is None when the line (without its
    newline) is over ``limit`` bytes: the rest of it is read and dropped in 1 MiB pieces."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, len(line)
            continue
        size = len(line)
        while True:
            piece = f.readline(1 << 20)
            size += len(piece)
            if not piece or piece.endswith(b"\n"):
                break
        yield None, size - piece.endswith(b"\n")


def _get_field(obj, key: str):
    """``obj[key]``, or with dots a nested lookup (``meta.body``); a literal dotted key wins."""
    if not isinstance(obj, dict):
        raise _BadRecord("not_an_object", f"record is a JSON {_json_type(obj)}, not an object")
    if key in obj:
        return obj[key]
    cur, walked = obj, []
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            where = ".".join(walked) or "the record"
            keys = ", ".join(repr(k) for k in cur) if isinstance(cur, dict) else type(cur).__name__
            raise _BadRecord(
                "missing_field",
                f"no field {key!r} (keys in {where}: {keys or 'none'}); "
                "name the right key with --text-field (or --prompt-field, --completion-field, "
                "--messages-field)",
            )
        walked.append(part)
        cur = cur[part]
    return cur


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number",
               bool: "boolean", type(None): "null"}


def _json_type(v) -> str:
    return _JSON_TYPES.get(type(v), type(v).__name__)


def _check_text(value, key: str) -> str:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON "\ud800" escapes decode to lone surrogates
            raise _BadRecord("invalid_unicode", f"field {key!r} holds a lone surrogate "
                             f"(U+{ord(value[e.start]):04X} at character {e.start})") from None
        return value
    raise _BadRecord("not_a_string", f"field {key!r} is {_json_type(value)}, expected a string")


def _check_messages(value, key: str) -> list[dict]:
    if not isinstance(value, list):
        raise _BadRecord("bad_messages",
                         f"field {key!r} is {_json_type(value)}, expected an array of messages")
    if not value:
        raise _BadRecord("bad_messages", f"field {key!r} is an empty conversation")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise _BadRecord("bad_messages",
                             f"message {i} is a {_json_type(m)}, expected an object")
        for k in ("role", "content"):
            if k not in m:
                keys = ", ".join(map(repr, m))
                raise _BadRecord("bad_messages", f"message {i} has no {k!r} (keys: {keys})")
        if not isinstance(m["role"], str):
            raise _BadRecord("bad_messages",
                             f"message {i} 'role' is {_json_type(m['role'])}, expected a string")
        _check_text(m["role"], f"message {i} role")
        content = m["content"]
        if isinstance(content, str):
            _check_text(content, f"message {i} content")
        elif isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            for j, part in enumerate(content):
                _check_part(part, f"message {i} content part {j}")
        else:
            raise _BadRecord("bad_messages", f"message {i} 'content' is {_json_type(content)}, "
                             "expected a string or a list of text parts")
    return value


def _check_part(part, where: str) -> None:
    if not isinstance(part, dict):
        raise _BadRecord("bad_messages", f"{where} is a {_json_type(part)}, expected an object "
                         '{"type": "text", "text": ...}')
    if "type" not in part:
        keys = ", ".join(map(repr, part)) or "none"
        raise _BadRecord("bad_messages", f"{where} has no 'type' (keys: {keys})")
    if part["type"] != "text":
        raise _BadRecord("bad_parts", f"{where} has type {part['type']!r}; only text parts can "
                         "be tokenized (drop the other parts, or describe them in text)")
    if not isinstance(part.get("text"), str):
        raise _BadRecord("bad_messages", f"{where} 'text' is {_json_type(part.get('text'))}, "
                         "expected a string")
    _check_text(part["text"], f"{where} text")


def _open_jsonl(path: Path, kind: str):
    raw = open(path, "rb")  # noqa: SIM115 (closed by the caller's `with raw`)
    if kind == "jsonl.gz":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    if kind == "jsonl.zst":
        return raw, io.BufferedReader(_ZstdFrames(raw), buffer_size=1 << 20)
    return raw, raw


class _ZstdFrames(io.RawIOBase):
    """Decompress a (possibly multi-frame) zstd stream and fail on a truncated last frame,
    which ``zstandard``'s stream_reader silently treats as the end of the data."""

    def __init__(self, raw, chunk: int = 1 << 20):
        import zstandard

        self._raw, self._chunk = raw, chunk
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = None
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            data = self._raw.read(self._chunk)
            if not data:
                if self._obj is not None and not self._obj.eof:
                    raise EOFError("zstd stream ends in the middle of a frame")
                return 0
            out = []
            while data:
                if self._obj is None or self._obj.eof:
                    self._obj = self._dctx.decompressobj()
                out.append(self._obj.decompress(data))
                data = self._obj.unused_data if self._obj.eof else b""
            self._buf = b"".join(out)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _corrupt(path: Path, kind: str, e: Exception) -> PacktoolError:
    return PacktoolError(
        f"{path}: corrupt or truncated {kind} file ({type(e).__name__}: {e}); "
        "re-download or re-compress it"
    )


def _decompress_errors():
    import zstandard

    return (gzip.BadGzipFile, EOFError, zlib.error, zstandard.ZstdError)


@functools.cache
def _orjson():
    """(orjson.loads, orjson.JSONDecodeError), or None without ``packtool[fast]``; looked up
    once, not per line."""
    try:
        import orjson
    except ImportError:
        return None
    return orjson.loads, orjson.JSONDecodeError


def _parse_json(line: bytes):
    """``(record, strict)``: ``json.loads``, through orjson when installed (``packtool[fast]``):
    0.19-0.25 s instead of 0.37 s of CPU for 100 MB of synthetic JSONL, which matters once a
    fast engine tokenizes 15M+ tokens/s. What orjson refuses (lone surrogates, NaN, integers over 64
    bits, invalid UTF-8) goes to ``json.loads``, so what is accepted and every error message
    stay as they were. ``strict``: orjson parsed it, so no string in it holds a lone surrogate
    (orjson refuses ``\\ud800`` escapes and encoded surrogates)."""
    fast = _orjson()
    if fast is not None:
        try:
            return fast[0](line), True
        except fast[1]:
            pass
    return json.loads(line), False


def iter_jsonl(path: Path, kind: str, opts: ReadOptions, stats: InputStats,
               progress) -> Iterator[str]:
    if kind != "jsonl" and path.stat().st_size == 0:
        raise PacktoolError(
            f"{path}: 0 bytes, not a valid {kind.split('.')[1]} stream (even an empty corpus "
            "compresses to a few bytes); remove the file or re-compress it"
        )
    raw, f = _open_jsonl(path, kind)
    errors = _decompress_errors()
    limit = opts.max_record_bytes
    text_field = opts.text_field if opts.mode == "text" else None
    lineno = 0
    last_pos = 0
    try:
        with raw:
            it = _lines(f, limit)
            while True:
                try:
                    line, size = next(it)
                except StopIteration:
                    break
                except errors as e:
                    raise _corrupt(path, kind, e) from None
                lineno += 1
                if line is not None and line.isspace():  # strip() would copy each line
                    stats.blank_lines += 1
                    continue
                if (line is not None and stats.n_docs == 0 and not stats.skipped
                        and line.lstrip(b"\xef\xbb\xbf \t").startswith(b"[")):
                    raise PacktoolError(
                        f"{path} line {lineno}: the file is a JSON array, not JSON Lines (one "
                        "object per line); convert it, e.g. jq -c '.[]' in.json > in.jsonl")
                try:
                    if line is None:
                        raise _too_large(size, limit)
                    try:
                        obj, strict = _parse_json(line)
                    except UnicodeDecodeError as e:
                        raise _BadRecord("invalid_utf8",
                                         f"invalid UTF-8 ({e.reason} at byte {e.start})") from None
                    except ValueError as e:
                        raise _BadRecord("invalid_json", f"invalid JSON ({e})") from None
                    except RecursionError:
                        raise _BadRecord(
                            "too_deep", "JSON nested deeper than Python can parse "
                            f"(over {sys.getrecursionlimit():,} levels)") from None
                    # the common record (an object with a string --text-field) from orjson
                    # needs no lone-surrogate check (a UTF-8 re-encode of every text): the
                    # reader, the one thread holding the GIL for every record, goes from 0.31
                    # to 0.24 s of CPU per 100 MB
                    if (strict and text_field is not None and type(obj) is dict
                            and type(value := obj.get(text_field)) is str):
                        text = value
                    else:
                        text = opts.extract(obj)
                except _BadRecord as bad:
                    if opts.skip_bad_records:
                        stats.skip(lineno, bad.reason)
                        continue
                    raise PacktoolError(
                        f"{path} line {lineno}: {bad.message}{bad.hint()}") from None
                stats.n_docs += 1
                stats.record = lineno
                pos = raw.tell()
                progress(pos - last_pos)
                last_pos = pos
                yield text
            progress(raw.tell() - last_pos)
    except OSError as e:
        raise PacktoolError(f"{path}: read error ({e})") from None


def iter_parquet(path: Path, opts: ReadOptions, stats: InputStats, progress) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        md = pf.metadata
    except (pa.ArrowException, OSError) as e:
        raise _corrupt(path, "parquet", e) from None
    columns = _columns(path, pf.schema_arrow.names, opts)
    n_rows = max(md.num_rows, 1)
    # rows per batch: about PARQUET_BATCH_BYTES of decoded data, so that 8,192 rows of 20 MB
    # documents are not decoded at once (and progress moves within a row group)
    row_bytes = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)) / n_rows
    rows = max(1, min(opts.parquet_batch_rows, int(PARQUET_BATCH_BYTES // max(row_bytes, 1.0))))
    size = path.stat().st_size

    def batches():
        for batch in pf.iter_batches(batch_size=rows, columns=columns):
            yield batch, size * batch.num_rows / n_rows

    yield from _iter_batches(path, "parquet", batches(), size, opts, stats, progress)


def iter_arrow(path: Path, opts: ReadOptions, stats: InputStats, progress) -> Iterator[str]:
    """Arrow IPC: the file format (starts with ``ARROW1``) or the stream format (what
    ``datasets.save_to_disk`` writes), read one record batch at a time from a memory map."""
    import pyarrow as pa

    try:
        src = pa.memory_map(str(path))
        is_file = src.read(6) == b"ARROW1"
        src.seek(0)
        reader = pa.ipc.open_file(src) if is_file else pa.ipc.open_stream(src)
    except (pa.ArrowException, OSError) as e:
        raise _corrupt(path, "arrow", e) from None
    columns = _columns(path, reader.schema.names, opts)
    size = path.stat().st_size

    def batches():
        if is_file:
            n = reader.num_record_batches
            for i in range(n):
                yield reader.get_batch(i).select(columns), size / n
            return
        last = 0
        for batch in reader:
            pos = src.tell()
            yield batch.select(columns), pos - last
            last = pos

    with src:
        yield from _iter_batches(path, "arrow", batches(), size, opts, stats, progress)


def _columns(path: Path, names: list[str], opts: ReadOptions) -> list[str]:
    """The top-level columns to read for ``opts``' fields (``a.b`` reads column ``a``)."""
    fields = ([opts.text_field] if opts.mode == "text" else
              [f for f in (opts.prompt_field, opts.completion_field, opts.messages_field) if f])
    tops = []
    for f in fields:
        top = f if f in names else f.split(".")[0]
        if top not in names:
            fix = "; pass --text-field NAME to read another column" if opts.mode == "text" else ""
            raise PacktoolError(f"{path}: no column {f!r} (columns: {', '.join(names)}){fix}")
        tops.append(top)
    return sorted(set(tops))


class _Skip:
    """A row to count as skipped (with ``--skip-bad-records``) instead of yielding."""

    def __init__(self, reason: str):
        self.reason = reason


def _iter_batches(path, kind, batches, size, opts, stats, progress):
    """Yield the documents of Arrow record batches, advancing ``progress`` by each batch's share
    of the file's bytes, spread over its rows by text length, so that the total is the file size."""
    import pyarrow as pa

    row, reported = 0, 0.0
    try:
        for batch, share in batches:
            if opts.mode == "text":
                docs, weights = _text_column(batch.column(0), batch.schema.names[0], path,
                                             row, opts)
            else:
                docs = _row_docs(batch, path, row, opts)
                weights = None
            total_w = sum(weights) if weights is not None else len(docs)
            for i, doc in enumerate(docs):
                step = share * (weights[i] if weights is not None else 1) / max(total_w, 1)
                progress(step)
                reported += step
                if isinstance(doc, _Skip):
                    stats.skip(row + i + 1, doc.reason)
                    continue
                stats.n_docs += 1
                stats.record = row + i + 1
                yield doc
            row += batch.num_rows
    except (pa.ArrowException, OSError) as e:
        raise _corrupt(path, kind, e) from None
    progress(size - reported)


def _bad(path, row: int, bad: _BadRecord, opts: ReadOptions):
    if opts.skip_bad_records:
        return _Skip(bad.reason)
    raise PacktoolError(f"{path} row {row}: {bad.message}{bad.hint()}")


def _text_column(col, name: str, path, row0: int, opts: ReadOptions):
    """The texts of one batch's column (str, or _Skip) and their sizes in bytes.

    Reads string, large_string, string_view, binary (UTF-8 checked), and dictionaries of
    those. Invalid UTF-8 in a *string* column (Arrow does not check it on read) is found per
    row, like in a binary column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    key = opts.text_field
    if key != name:  # a nested field: column.a.b
        for part in key[len(name) + 1:].split("."):
            if not pa.types.is_struct(col.type) or col.type.get_field_index(part) < 0:
                raise PacktoolError(
                    f"{path}: column {name!r} has no nested field {key!r} "
                    f"(type {col.type}); pass --text-field NAME"
                )
            col = pc.struct_field(col, part)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_string_view(col.type) or pa.types.is_binary_view(col.type):
        col = col.cast(pa.large_binary())
    t = col.type
    is_str = pa.types.is_string(t) or pa.types.is_large_string(t)
    if not (is_str or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        raise PacktoolError(
            f"{path}: column {key!r} has type {t}, expected text (string, large_string, "
            "string_view, binary, or a dictionary of these); convert the column to strings, "
            f"e.g. pyarrow.compute.cast(table[{key!r}], pyarrow.string())"
        )
    sizes = pc.binary_length(col).fill_null(0).to_numpy(zero_copy_only=False)
    big = sizes > opts.max_record_bytes
    if big.any():
        first = int(np.flatnonzero(big)[0])
        if not opts.skip_bad_records:
            _bad(path, row0 + first + 1, _too_large(int(sizes[first]), opts.max_record_bytes), opts)
        col = pc.if_else(pa.array(big), pa.scalar(None, t), col)  # never decode the giants
    texts = None
    if is_str:
        try:
            texts = col.to_pylist()
        except UnicodeDecodeError:
            col = col.cast(pa.large_binary())
    if texts is None:
        texts = [None if b is None else _decode_row(b, path, row0 + i + 1, opts)
                 for i, b in enumerate(col.to_pylist())]
    for i, text in enumerate(texts):
        if big[i]:
            texts[i] = _Skip("too_large")
        elif text is None:
            texts[i] = _bad(path, row0 + i + 1, _BadRecord(
                "null", f"{key!r} is null, expected a string"), opts)
    return texts, (sizes + 1).tolist()


def _decode_row(b: bytes, path, row: int, opts):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        return _bad(path, row, _BadRecord(
            "invalid_utf8", f"invalid UTF-8 ({e.reason} at byte {e.start})"), opts)


def _row_docs(batch, path, row0: int, opts: ReadOptions) -> list:
    """prompt/completion or messages documents of one batch (or _Skip)."""
    try:
        objs = batch.to_pylist()
    except UnicodeDecodeError:  # find the row: decode one at a time
        objs = []
        for i in range(batch.num_rows):
            try:
                objs.append(batch.slice(i, 1).to_pylist()[0])
            except UnicodeDecodeError as e:
                objs.append(_bad(path, row0 + i + 1, _BadRecord(
                    "invalid_utf8", f"invalid UTF-8 ({e.reason} at byte {e.start})"), opts))
    docs = []
    for i, obj in enumerate(objs):
        if isinstance(obj, _Skip):
            docs.append(obj)
            continue
        try:
            doc = opts.extract(obj)
            size = utf8_size(doc)
            if size > opts.max_record_bytes:
                raise _too_large(size, opts.max_record_bytes)
        except _BadRecord as bad:
            doc = _bad(path, row0 + i + 1, bad, opts)
        docs.append(doc)
    return docs


def _decode_txt(data: bytes, path: Path, first_line: int) -> str:
    if first_line == 1 and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte-order mark marks the encoding; it is not text
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        raise _BadRecord("invalid_utf8",
                         f"{path} line {line}: invalid UTF-8 ({e.reason})") from None


def iter_txt(path: Path, opts: ReadOptions, stats: InputStats, progress) -> Iterator[str]:
    split = opts.txt_split
    if split not in TXT_SPLITS:
        raise PacktoolError(f"--txt-split {split!r}: choose one of {', '.join(TXT_SPLITS)}")
    limit = opts.max_record_bytes

    def emit(data: bytes | None, first_line: int, size: int):
        try:
            if data is None or len(data) > limit:
                raise _too_large(size if data is None else len(data), limit)
            text = _decode_txt(data, path, first_line)
        except _BadRecord as bad:
            if opts.skip_bad_records:
                stats.skip(first_line, bad.reason)
                return None
            where = "" if bad.reason == "invalid_utf8" else f"{path} line {first_line}: "
            fix = bad.hint().replace("record", "file") if bad.hint() else ""
            raise PacktoolError(f"{where}{bad.message}{fix}") from None
        stats.n_docs += 1
        stats.record = first_line
        return text

    try:
        if split == "file":
            size = path.stat().st_size
            data = path.read_bytes() if size <= limit else None
            progress(size)
            text = emit(data, 1, size)
            if text is not None:
                yield text
            return
        with open(path, "rb") as f:
            para: list[bytes] | None = []
            para_line = para_size = 0
            lineno = 0
            for line, size in _lines(f, limit):
                lineno += 1
                progress(size)
                if split == "line":
                    if line is not None and line.endswith(b"\n"):
                        line = line.rstrip(b"\r\n")
                    text = emit(line, lineno, size)
                    if text is not None:
                        yield text
                    continue
                if line is None or line.strip():
                    if not para_size:
                        para_line, para = lineno, []
                    para_size += size
                    # an over-long paragraph is counted, not held
                    para = None if line is None or para is None or para_size > limit + 2 else para
                    if para is not None:
                        para.append(line)
                elif para_size:
                    text = emit(None if para is None else b"".join(para).rstrip(b"\r\n"),
                                para_line, para_size)
                    para, para_size = [], 0
                    if text is not None:
                        yield text
            if para_size:
                text = emit(None if para is None else b"".join(para).rstrip(b"\r\n"),
                            para_line, para_size)
                if text is not None:
                    yield text
    except OSError as e:
        raise PacktoolError(f"{path}: read error ({e})") from None


def iter_documents(path: Path, opts: ReadOptions, stats: InputStats, progress=lambda n: None):
    """Yield the text of every record of ``path`` in order, counting into ``stats``."""
    kind = file_kind(path)
    if kind in ("jsonl", "jsonl.gz", "jsonl.zst"):
        return iter_jsonl(path, kind, opts, stats, progress)
    if kind == "parquet":
        return iter_parquet(path, opts, stats, progress)
    if kind == "arrow":
        return iter_arrow(path, opts, stats, progress)
    if kind == "txt":
        if opts.mode != "text":
            raise PacktoolError(f"{path}: .txt files hold plain text; prompt/completion and "
                                "messages need JSONL or Parquet records")
        return iter_txt(path, opts, stats, progress)
    raise PacktoolError(f"{path}: unsupported file type; supported: {_SUPPORTED}")
