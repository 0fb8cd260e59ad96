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
from .records import BadRecord, InputStats, ReadOptions, corrupt, read_blocks, too_large


def _open_jsonl(path, kind: str):
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


def _refuse_array(path, lineno: int) -> None:
    raise PacktoolError(
        f"{path} line {lineno}: the file is a JSON array, not JSON Lines (one object per "
        "line); convert it, e.g. jq -c '.[]' in.json > in.jsonl")


def _bad(path, lineno: int, line: bytes | None, size: int, opts: ReadOptions,
         stats: InputStats, text_field: str | None):
    """What a line the fast loop did not take is, judged as a line read on its own always
    was (with its newline, so that an error's position reads as before): a blank line
    (counted), a JSON array (refused), a record after all, or a bad record (skipped and
    counted, or refused with the file and line)."""
    if line is not None and line.isspace():  # strip() would copy each line
        stats.blank_lines += 1
        return None
    if (line is not None and stats.n_docs == 0 and not stats.skipped
            and line.lstrip(b"\xef\xbb\xbf \t").startswith(b"[")):
        _refuse_array(path, lineno)
    try:
        return _record(line, size, opts, text_field)
    except BadRecord as bad:
        if opts.skip_bad_records:
            stats.skip(lineno, bad.reason)
            return None
        raise PacktoolError(f"{path} line {lineno}: {bad.message}{bad.hint()}") from None


def _documents(path, blocks, opts: ReadOptions, stats: InputStats, text_field: str | None,
               progress=None):
    """Every document of ``blocks`` (:func:`read_blocks`), in order. The loop takes what
    ``_record`` takes from a line (a line without its newline parses the same); anything
    else (a blank line, an array, a bad or too large record) goes to :func:`_bad` with its
    newline back, so what is refused and every message stay as a reader of one line at a
    time gave them. ``progress``: given the bytes of the lines up to each document."""
    lineno = read = told = 0
    for lines, newline, over in blocks:
        last = len(lines) - 1
        for i, line in enumerate(lines):
            lineno += 1
            try:
                if not line:  # None: over the limit; b"": a blank line
                    raise BadRecord("", "")
                read += len(line) + (newline or i < last)
                text = _record(line, len(line), opts, text_field)
            except BadRecord:
                if line is not None and (newline or i < last):
                    line += b"\n"
                text = _bad(path, lineno, line, over.get(i, 0), opts, stats, text_field)
                if text is None:
                    continue
            stats.n_docs += 1
            stats.record = lineno
            if progress is not None:
                progress(read - told)
                told = read
            yield text


def _blocks(path, kind: str, raw, f, limit: int, progress=None):
    """:func:`read_blocks` of ``f``, a corrupt stream named; ``progress``: given the bytes
    of ``raw`` (the file as stored) read for each block."""
    errors = _decompress_errors()
    it, last_pos = read_blocks(f, limit), 0
    while True:
        try:
            block = next(it)
        except StopIteration:
            return
        except errors as e:
            raise corrupt(path, kind, e) from None
        if progress is not None:
            pos = raw.tell()
            progress(pos - last_pos)
            last_pos = pos
        yield block


def iter_jsonl(path: Path, kind: str, opts: ReadOptions, stats: InputStats,
               progress) -> Iterator[str]:
    if kind != "jsonl" and input_size(path) == 0:
        raise PacktoolError(
            f"{path}: 0 bytes, not a valid {kind.split('.')[1]} stream (even an empty corpus "
            "compresses to a few bytes); remove the file or re-compress it"
        )
    raw, f, finish = _open_jsonl(path, kind)
    text_field = opts.text_field if opts.mode == "text" else None
    told = 0

    def tell(n: int) -> None:
        nonlocal told
        told += n
        progress(n)

    # progress moves with each record: a plain file's lines are its bytes; a compressed
    # file's bytes are known a block at a time
    plain = kind == "jsonl"
    try:
        with raw:
            blocks = _blocks(path, kind, raw, f, opts.max_record_bytes, None if plain else tell)
            yield from _documents(path, blocks, opts, stats, text_field, tell if plain else None)
            progress(raw.tell() - told)
            stats.content = finish()  # every byte, as read (a gzip member's padding too)
    except OSError as e:
        raise PacktoolError(f"{path}: read error ({e})") from None
