"""Parquet (by record batches of about ``PARQUET_BATCH_BYTES`` of text, never whole) and Arrow
IPC files, text columns of any string type (dictionary and ``string_view`` too)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..errors import PacktoolError
from .files import input_size, is_remote, open_input
from .records import BadRecord, ReadOptions, corrupt, too_large, utf8_size

PARQUET_BATCH_BYTES = 64 << 20  # rows per Parquet batch: about this much decoded text


def iter_parquet(path: Path, opts: ReadOptions, progress) -> Iterator[tuple]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = open_input(path, ranges=True) if is_remote(path) else path  # range reads
    try:
        pf = pq.ParquetFile(source)
        md = pf.metadata
    except (pa.ArrowException, OSError) as e:
        raise corrupt(path, "parquet", e) from None
    columns = _columns(path, pf.schema_arrow.names, opts)
    n_rows = max(md.num_rows, 1)
    # rows per batch: about PARQUET_BATCH_BYTES of decoded data, so that 8,192 rows of 20 MB
    # documents are not decoded at once (and progress moves within a row group)
    row_bytes = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)) / n_rows
    rows = max(1, min(opts.parquet_batch_rows, int(PARQUET_BATCH_BYTES // max(row_bytes, 1.0))))
    size = input_size(path)

    def batches():
        for batch in pf.iter_batches(batch_size=rows, columns=columns):
            yield batch, size * batch.num_rows / n_rows

    try:
        yield from _iter_batches(path, "parquet", batches(), size, opts, progress)
    finally:
        pf.close()


def iter_arrow(path: Path, opts: ReadOptions, progress) -> Iterator[tuple]:
    """Arrow IPC: the file format (starts with ``ARROW1``) or the stream format (what
    ``datasets.save_to_disk`` writes), read one record batch at a time from a memory map (an
    object in a store: from its stream)."""
    import pyarrow as pa

    try:
        src = (pa.PythonFile(open_input(path, ranges=True), mode="r") if is_remote(path)
               else pa.memory_map(str(path)))
        is_file = src.read(6) == b"ARROW1"
        src.seek(0)
        reader = pa.ipc.open_file(src) if is_file else pa.ipc.open_stream(src)
    except (pa.ArrowException, OSError) as e:
        raise corrupt(path, "arrow", e) from None
    columns = _columns(path, reader.schema.names, opts)
    size = input_size(path)

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
        yield from _iter_batches(path, "arrow", batches(), size, opts, progress)


def _columns(path: Path, names: list[str], opts: ReadOptions) -> list[str]:
    """The top-level columns to read for ``opts``' fields (``a.b`` reads column ``a``)."""
    fields = opts.fields
    tops = []
    for f in fields:
        top = f if f in names else f.split(".")[0]
        if top not in names:
            fix = "; pass --text-field NAME to read another column" if opts.mode == "text" else ""
            raise PacktoolError(f"{path}: no column {f!r} (columns: {', '.join(names)}){fix}")
        tops.append(top)
    return sorted(set(tops))


def _iter_batches(path, kind, batches, size, opts, progress):
    """``(row number, document or BadRecord)`` of each row of Arrow record batches,
    advancing ``progress`` by each batch's share of the file's bytes, spread over its rows by
    text length, so that the total is the file size."""
    import pyarrow as pa

    row, reported = 0, 0.0
    try:
        for batch, share in batches:
            if opts.plain_text:
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
                yield row + i + 1, doc
            row += batch.num_rows
    except (pa.ArrowException, OSError) as e:
        raise corrupt(path, kind, e) from None
    progress(size - reported)


def _bad(path, row: int, bad: BadRecord, opts: ReadOptions) -> BadRecord:
    """``bad``, to be counted as skipped, or with no ``--skip-bad-records`` an error."""
    if opts.skip_bad_records:
        return bad
    raise PacktoolError(f"{path} row {row}: {bad.message}{bad.hint()}")


def _text_column(col, name: str, path, row0: int, opts: ReadOptions):
    """The texts of one batch's column (str, or a BadRecord skipped) and their sizes in bytes.

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
            _bad(path, row0 + first + 1, too_large(int(sizes[first]), opts.max_record_bytes), opts)
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
            texts[i] = BadRecord("too_large", "")
        elif text is None:
            texts[i] = _bad(path, row0 + i + 1, BadRecord(
                "null", f"{key!r} is null, expected a string"), opts)
    return texts, (sizes + 1).tolist()


def _decode_row(b: bytes, path, row: int, opts):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        return _bad(path, row, BadRecord(
            "invalid_utf8", f"invalid UTF-8 ({e.reason} at byte {e.start})"), opts)


def _row_docs(batch, path, row0: int, opts: ReadOptions) -> list:
    """prompt/completion or messages documents of one batch (or a BadRecord skipped)."""
    try:
        objs = batch.to_pylist()
    except UnicodeDecodeError:  # find the row: decode one at a time
        objs = []
        for i in range(batch.num_rows):
            try:
                objs.append(batch.slice(i, 1).to_pylist()[0])
            except UnicodeDecodeError as e:
                objs.append(_bad(path, row0 + i + 1, BadRecord(
                    "invalid_utf8", f"invalid UTF-8 ({e.reason} at byte {e.start})"), opts))
    docs = []
    for i, obj in enumerate(objs):
        if isinstance(obj, BadRecord):
            docs.append(obj)
            continue
        try:
            doc = opts.extract(obj)
            size = utf8_size(doc)
            if size > opts.max_record_bytes:
                raise too_large(size, opts.max_record_bytes)
        except BadRecord as bad:
            doc = _bad(path, row0 + i + 1, bad, opts)
        docs.append(doc)
    return docs


