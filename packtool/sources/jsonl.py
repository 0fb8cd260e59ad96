"""JSON Lines, plain, gzip or zstd (multi-frame; a truncated last frame is an error, which
``zstandard``'s stream reader would take for the end), parsed by orjson where installed."""

from __future__ import annotations

import functools
import gzip
import io
import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

from ..errors import PacktoolError
from .files import input_size, open_hashed
from .records import BadRecord, InputStats, ReadOptions, corrupt, read_lines, too_large


def open_jsonl(path, kind: str):
    """(the file, its decompressed stream, finish: the file's content hash, open_hashed)."""
    raw, finish = open_hashed(path)  # closed by the caller's `with raw`
    if kind == "jsonl.gz":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb"), finish
    if kind == "jsonl.zst":
        return raw, io.BufferedReader(_ZstdFrames(raw), buffer_size=1 << 20), finish
    return raw, raw, finish


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


def _record(line: bytes | None, size: int, opts: ReadOptions, text_field: str | None):
    """The document of one JSONL line (``None``: a line over the record limit), or
    :class:`BadRecord`."""
    if line is None:
        raise too_large(size, opts.max_record_bytes)
    try:
        obj, strict = _parse_json(line)
    except UnicodeDecodeError as e:
        raise BadRecord("invalid_utf8", f"invalid UTF-8 ({e.reason} at byte {e.start})") from None
    except ValueError as e:
        raise BadRecord("invalid_json", f"invalid JSON ({e})") from None
    except RecursionError:
        raise BadRecord("too_deep", "JSON nested deeper than Python can parse "
                        f"(over {sys.getrecursionlimit():,} levels)") from None
    # the common record (an object with a string --text-field) from orjson needs no
    # lone-surrogate check (a UTF-8 re-encode of every text): the reader, the one thread
    # holding the GIL for every record, goes from 0.31 to 0.24 s of CPU per 100 MB
    if (strict and text_field is not None and type(obj) is dict
            and type(value := obj.get(text_field)) is str):
        return value
    return opts.extract(obj)


def iter_jsonl(path: Path, kind: str, opts: ReadOptions, stats: InputStats,
               progress) -> Iterator[tuple]:
    """``(line number, document or BadRecord)`` of each record; blank lines into ``stats``."""
    import zstandard

    if kind != "jsonl" and input_size(path) == 0:
        raise PacktoolError(
            f"{path}: 0 bytes, not a valid {kind.split('.')[1]} stream (even an empty corpus "
            "compresses to a few bytes); remove the file or re-compress it"
        )
    raw, f, finish = open_jsonl(path, kind)
    errors = (gzip.BadGzipFile, EOFError, zlib.error, zstandard.ZstdError)
    text_field = opts.text_field if opts.plain_text else None
    lineno = last_pos = 0
    try:
        with raw:
            it = read_lines(f, opts.max_record_bytes)
            while True:
                try:
                    line, size = next(it)
                except StopIteration:
                    break
                except errors as e:
                    raise corrupt(path, kind, e) from None
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
                    doc = _record(line, size, opts, text_field)
                except BadRecord as bad:
                    doc = bad
                pos = raw.tell()
                progress(pos - last_pos)
                last_pos = pos
                yield lineno, doc
            progress(raw.tell() - last_pos)
            stats.content = finish()  # every byte, as read (a gzip member's padding too)
    except OSError as e:
        raise PacktoolError(f"{path}: read error ({e})") from None
