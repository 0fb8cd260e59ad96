"""Plain text: one document per file, per line, or per blank-line paragraph
(``--txt-split``); over-long lines and paragraphs are counted, never held whole."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..errors import PacktoolError
from .files import input_size, open_input, read_all
from .records import BadRecord, ReadOptions, read_lines, too_large

TXT_SPLITS = ("file", "line", "blank-line")


def _decode_txt(data: bytes, path: Path, first_line: int) -> str:
    if first_line == 1 and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte-order mark marks the encoding; it is not text
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        raise BadRecord("invalid_utf8",
                         f"{path} line {line}: invalid UTF-8 ({e.reason})") from None


def _emit(data: bytes | None, first_line: int, size: int, path: Path,
          opts: ReadOptions) -> str | BadRecord:
    """The document of ``data`` (``None``: over the record limit, not held), or with
    ``--skip-bad-records`` the bad record to count."""
    limit = opts.max_record_bytes
    try:
        if data is None or len(data) > limit:
            raise too_large(size if data is None else len(data), limit)
        return _decode_txt(data, path, first_line)
    except BadRecord as bad:
        if opts.skip_bad_records:
            return bad
        where = "" if bad.reason == "invalid_utf8" else f"{path} line {first_line}: "
        fix = bad.hint().replace("the record", "the file")  # the option keeps its name
        raise PacktoolError(f"{where}{bad.message}{fix}") from None


def _by_line(f, limit: int, progress):
    """``(line without its newline or None, line number, size)`` per line."""
    for lineno, (line, size) in enumerate(read_lines(f, limit), 1):
        progress(size)
        if line is not None and line.endswith(b"\n"):
            line = line.rstrip(b"\r\n")
        yield line, lineno, size


def _by_paragraph(f, limit: int, progress):
    """``(paragraph or None if over the limit, first line number, size)`` per blank-line
    separated paragraph; an over-long one is counted, not held."""
    para: list[bytes] | None = []
    para_line = para_size = 0
    for lineno, (line, size) in enumerate(read_lines(f, limit), 1):
        progress(size)
        if line is None or line.strip():
            if not para_size:
                para_line, para = lineno, []
            para_size += size
            para = None if line is None or para is None or para_size > limit + 2 else para
            if para is not None:
                para.append(line)
        elif para_size:
            yield (None if para is None else b"".join(para).rstrip(b"\r\n")), para_line, \
                para_size
            para, para_size = [], 0
    if para_size:
        yield (None if para is None else b"".join(para).rstrip(b"\r\n")), para_line, para_size


def iter_txt(path: Path, opts: ReadOptions, progress) -> Iterator[tuple]:
    """``(first line number, document or BadRecord)`` of each document."""
    split = opts.txt_split
    if split not in TXT_SPLITS:
        raise PacktoolError(f"--txt-split {split!r}: choose one of {', '.join(TXT_SPLITS)}")
    limit = opts.max_record_bytes
    try:
        if split == "file":
            size = input_size(path)
            data = read_all(path) if size <= limit else None
            progress(size)
            f, pieces = contextlib.nullcontext(), [(data, 1, size)]
        else:
            f = open_input(path)
            pieces = (_by_line if split == "line" else _by_paragraph)(f, limit, progress)
        with f:
            for data, first_line, size in pieces:
                yield first_line, _emit(data, first_line, size, path, opts)
    except OSError as e:
        raise PacktoolError(f"{path}: read error ({e})") from None
