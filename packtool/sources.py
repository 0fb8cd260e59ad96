"""Input corpora: find the files, stream their documents as ``str`` with record numbers.

Supported kinds (by file name):

==================  =========================================================
``.jsonl/.json``    one JSON object per line; blank lines are not records
``.jsonl.gz``       the same, gzip-compressed (also ``.json.gz``)
``.jsonl.zst``      the same, zstd-compressed (also ``.json.zst``, ``.jsonl.zstd``)
``.parquet``        read in record batches (never whole into memory)
``.txt``            one document per file, or per line / blank-line paragraph
==================  =========================================================

Every record-level problem raises :class:`PacktoolError` naming the file, the record and the
fix, unless ``skip_bad_records`` is set, in which case it is counted per input file.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

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
    ".txt": "txt",
}
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
            found = sorted(
                f for f in p.rglob("*") if f.is_file() and file_kind(f) and not f.name.startswith(".")
                and not _is_packtool_manifest(f)
            )
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
            found = [f for f in found if file_kind(f)]
            if not found:
                raise PacktoolError(f"pattern {arg!r} matches no supported files ({_SUPPORTED})")
            out.extend(found)
        else:
            raise PacktoolError(f"{p}: no such file or directory")
    seen: dict = {}
    for p in out:
        key = p.resolve()
        if key in seen:
            raise PacktoolError(f"{p} is given twice (also as {seen[key]}); each input is read once")
        seen[key] = p
        try:
            open(p, "rb").close()
        except OSError as e:
            raise PacktoolError(f"{p}: cannot open ({e.strerror}); check the path and permissions")
    return out


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
    blank_lines: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_records: list[int] = field(default_factory=list)

    def skip(self, record: int, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.skipped_records.append(record)

    def to_json(self) -> dict:
        d = {"path": self.path, "kind": self.kind, "n_docs": self.n_docs}
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
    parquet_batch_rows: int = 8192
    prompt_field: str | None = None       # with completion_field: SFT prompt/completion pairs
    completion_field: str | None = None
    messages_field: str | None = None     # chat conversations: [{"role", "content"}, ...]

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
        return _check_messages(_get_field(obj, self.messages_field), self.messages_field)


_SKIPPED = object()  # a record already counted as skipped


class _BadRecord(Exception):
    def __init__(self, reason: str, message: str):
        self.reason, self.message = reason, message


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
        raise _BadRecord("bad_messages", f"field {key!r} is {_json_type(value)}, expected an array of messages")
    if not value:
        raise _BadRecord("bad_messages", f"field {key!r} is an empty conversation")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise _BadRecord("bad_messages", f"message {i} is a {_json_type(m)}, expected an object")
        for k in ("role", "content"):
            if k not in m:
                raise _BadRecord("bad_messages", f"message {i} has no {k!r} (keys: {', '.join(map(repr, m))})")
            if not isinstance(m[k], str):
                raise _BadRecord("bad_messages", f"message {i} {k!r} is {_json_type(m[k])}, expected a string")
            _check_text(m[k], f"message {i} {k}")
    return value


def _open_jsonl(path: Path, kind: str):
    raw = open(path, "rb")
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


def _parse_json(line: bytes):
    """``json.loads``, through orjson when installed (``packtool[fast]``): 0.34 s instead of
    0.74 s for 100 MB of synthetic JSONL, which matters once a fast engine tokenizes 20M+
    tokens/s. What orjson refuses (lone surrogates, NaN, integers over 64 bits, invalid UTF-8)
    goes to ``json.loads``, so what is accepted and every error message stay as they were."""
    try:
        import orjson
    except ImportError:
        return json.loads(line)
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def iter_jsonl(path: Path, kind: str, opts: ReadOptions, stats: InputStats, progress) -> Iterator[str]:
    raw, f = _open_jsonl(path, kind)
    errors = _decompress_errors()
    lineno = 0
    last_pos = 0
    try:
        with raw:
            it = iter(f)
            while True:
                try:
                    line = next(it)
                except StopIteration:
                    break
                except errors as e:
                    raise _corrupt(path, kind, e) from None
                lineno += 1
                if not line.strip():
                    stats.blank_lines += 1
                    continue
                if stats.n_docs == 0 and not stats.skipped and line.lstrip(b"\xef\xbb\xbf \t").startswith(b"["):
                    raise PacktoolError(
                        f"{path} line {lineno}: the file is a JSON array, not JSON Lines (one "
                        "object per line); convert it, e.g. jq -c '.[]' in.json > in.jsonl")
                try:
                    try:
                        obj = _parse_json(line)
                    except UnicodeDecodeError as e:
                        raise _BadRecord("invalid_utf8", f"invalid UTF-8 ({e.reason} at byte {e.start})")
                    except ValueError as e:
                        raise _BadRecord("invalid_json", f"invalid JSON ({e})")
                    text = opts.extract(obj)
                except _BadRecord as bad:
                    if opts.skip_bad_records:
                        stats.skip(lineno, bad.reason)
                        continue
                    hint = "" if bad.reason in ("missing_field",) else "; fix the record or pass --skip-bad-records"
                    raise PacktoolError(f"{path} line {lineno}: {bad.message}{hint}") from None
                stats.n_docs += 1
                if lineno & 1023 == 0:
                    pos = raw.tell()
                    progress(pos - last_pos)
                    last_pos = pos
                yield text
            progress(raw.tell() - last_pos)
    except OSError as e:
        raise PacktoolError(f"{path}: read error ({e})") from None


def iter_parquet(path: Path, opts: ReadOptions, stats: InputStats, progress) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise _corrupt(path, "parquet", e) from None
    if opts.mode != "text":
        yield from _iter_parquet_rows(pf, path, opts, stats, progress)
        return
    key = opts.text_field
    names = pf.schema_arrow.names
    top, _, rest = key.partition(".")
    if key in names:
        top, rest = key, ""
    if top not in names:
        raise PacktoolError(
            f"{path}: no column {key!r} (columns: {', '.join(names)}); "
            "pass --text-field NAME to read another column"
        )
    size = path.stat().st_size
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=opts.parquet_batch_rows, columns=[top]):
            col = batch.column(0)
            if rest:
                for part in rest.split("."):
                    if not pa.types.is_struct(col.type) or col.type.get_field_index(part) < 0:
                        raise PacktoolError(
                            f"{path}: column {top!r} has no nested field {key!r} "
                            f"(type {col.type}); pass --text-field NAME"
                        )
                    col = pc.struct_field(col, part)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                texts = col.to_pylist()
            elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                texts = _binary_to_text(col, path, row, opts, stats)
            else:
                raise PacktoolError(
                    f"{path}: column {key!r} has type {col.type}, expected a string; "
                    "pass --text-field NAME to read another column"
                )
            for i, text in enumerate(texts):
                if text is _SKIPPED:
                    continue
                if text is None:
                    if opts.skip_bad_records:
                        stats.skip(row + i + 1, "null")
                        continue
                    raise PacktoolError(
                        f"{path} row {row + i + 1}: {key!r} is null, expected a string; "
                        "fix the record or pass --skip-bad-records"
                    )
                stats.n_docs += 1
                yield text
            row += len(texts)
            progress(size * batch.num_rows / max(pf.metadata.num_rows, 1))
    except (pa.ArrowException, OSError) as e:
        raise _corrupt(path, "parquet", e) from None


def _iter_parquet_rows(pf, path, opts, stats, progress):
    import pyarrow as pa

    fields = [f for f in (opts.prompt_field, opts.completion_field, opts.messages_field) if f]
    names = pf.schema_arrow.names
    tops = sorted({f.split(".")[0] if f not in names else f for f in fields})
    missing = [t for t in tops if t not in names]
    if missing:
        raise PacktoolError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)})")
    size, row = path.stat().st_size, 0
    try:
        for batch in pf.iter_batches(batch_size=opts.parquet_batch_rows, columns=tops):
            for i, obj in enumerate(batch.to_pylist()):
                try:
                    doc = opts.extract(obj)
                except _BadRecord as bad:
                    if opts.skip_bad_records:
                        stats.skip(row + i + 1, bad.reason)
                        continue
                    raise PacktoolError(f"{path} row {row + i + 1}: {bad.message}; fix the record "
                                        "or pass --skip-bad-records") from None
                stats.n_docs += 1
                yield doc
            row += batch.num_rows
            progress(size * batch.num_rows / max(pf.metadata.num_rows, 1))
    except (pa.ArrowException, OSError) as e:
        raise _corrupt(path, "parquet", e) from None


def _binary_to_text(col, path, row0, opts, stats):

    out = []
    for i, b in enumerate(col.to_pylist()):
        if b is None:
            out.append(None)
            continue
        try:
            out.append(b.decode("utf-8"))
        except UnicodeDecodeError as e:
            if not opts.skip_bad_records:
                raise PacktoolError(
                    f"{path} row {row0 + i + 1}: invalid UTF-8 ({e.reason} at byte {e.start}); "
                    "fix the record or pass --skip-bad-records"
                ) from None
            stats.skip(row0 + i + 1, "invalid_utf8")
            out.append(_SKIPPED)
    return out


def _decode_txt(data: bytes, path: Path, first_line: int) -> str:
    if first_line == 1 and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte-order mark marks the encoding; it is not text
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        raise _BadRecord("invalid_utf8", f"{path} line {line}: invalid UTF-8 ({e.reason})") from None


def iter_txt(path: Path, opts: ReadOptions, stats: InputStats, progress) -> Iterator[str]:
    split = opts.txt_split
    if split not in TXT_SPLITS:
        raise PacktoolError(f"--txt-split {split!r}: choose one of {', '.join(TXT_SPLITS)}")

    def emit(data: bytes, first_line: int):
        try:
            text = _decode_txt(data, path, first_line)
        except _BadRecord as bad:
            if opts.skip_bad_records:
                stats.skip(first_line, bad.reason)
                return None
            raise PacktoolError(f"{bad.message}; fix the file or pass --skip-bad-records") from None
        stats.n_docs += 1
        return text

    try:
        if split == "file":
            data = path.read_bytes()
            progress(len(data))
            text = emit(data, 1)
            if text is not None:
                yield text
            return
        with open(path, "rb") as f:
            para: list[bytes] = []
            para_line = 0
            lineno = 0
            for line in f:
                lineno += 1
                progress(len(line))
                if split == "line":
                    text = emit(line.rstrip(b"\r\n") if line.endswith(b"\n") else line, lineno)
                    if text is not None:
                        yield text
                    continue
                if line.strip():
                    if not para:
                        para_line = lineno
                    para.append(line)
                elif para:
                    text = emit(b"".join(para).rstrip(b"\r\n"), para_line)
                    para = []
                    if text is not None:
                        yield text
            if para:
                text = emit(b"".join(para).rstrip(b"\r\n"), para_line)
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
    if kind == "txt":
        if opts.mode != "text":
            raise PacktoolError(f"{path}: .txt files hold plain text; prompt/completion and "
                                "messages need JSONL or Parquet records")
        return iter_txt(path, opts, stats, progress)
    raise PacktoolError(f"{path}: unsupported file type; supported: {_SUPPORTED}")
