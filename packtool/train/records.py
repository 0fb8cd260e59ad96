"""Where a document of a packed dataset came from, and back: global document -> source
prefix, part, input file and record number (the line of a JSONL record, blank lines and
skipped bad records counted; the row of a Parquet/Arrow record; the line or paragraph start
of a ``.txt`` record), and an input record -> its document -> the packs holding its segments.
From the sources' manifests (JSON) and the segment tables alone: no token is read."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PacktoolError
from ..formats.packed import source_location
from ..storage.place import place_of


@dataclass
class Document:
    """Where a global document of a packed dataset came from."""

    doc: int                  # global over the dataset's sources
    source: str               # the source corpus's prefix
    input: str | None         # the input file (None: the manifest lists none)
    record: int | None        # its line or row in that file (1-based; None: not recorded)
    part: str                 # the corpus part holding it


class Sources:
    """The sources' manifests, read as JSON only: global document -> input file and record."""

    def __init__(self, ds):
        self.entries = []   # per source: (prefix, first global doc, parts, inputs table)
        base = 0
        for src in ds.index["sources"]:
            meta = None
            for p in source_location(ds.directory, src):  # local or in a store
                place, stem = place_of(p, ds.place.storage_options, ds.place.cache_if_any())
                if place.is_file(f"{stem}.json"):
                    meta = json.loads(place.read_bytes(f"{stem}.json"))
                    break
            self.entries.append((src["prefix"], base, _inputs(meta, src)))
            base += int(src["n_docs"])
        self.bases = np.array([e[1] for e in self.entries] + [base], np.int64)

    def documents(self, docs: np.ndarray) -> list[Document]:
        """Where each of the global documents ``docs`` came from (vectorised: a step of 8 x 4
        packs holds thousands of segments)."""
        docs = np.asarray(docs, np.int64)
        src = np.searchsorted(self.bases, docs, side="right") - 1
        out = []
        for k, d, local in zip(src.tolist(), docs.tolist(), (docs - self.bases[src]).tolist(),
                               strict=True):
            prefix, _, table = self.entries[k]
            if table is None:
                out.append(Document(d, prefix, None, None, "?"))
                continue
            i = int(np.searchsorted(table["first"], local, side="right")) - 1
            rec = table["records"][i](local - int(table["first"][i]))
            out.append(Document(d, prefix, table["inputs"][i].get("path"), rec,
                                table["parts"][i]))
        return out

    def find(self, path: str, record: int) -> int:
        """The global document of ``record`` of input file ``path``."""
        hits = self.inputs_named(path)
        if not hits:
            raise PacktoolError(f"no source of this dataset lists the input {path}; the inputs "
                                "are named as tokenize recorded them (see the corpus manifest's "
                                "inputs), or by any path to the same file")
        if len(hits) > 1:
            names = "; ".join(f"{inp.get('path')} (source {prefix})" for prefix, _, inp in hits)
            raise PacktoolError(f"--record {path}: {len(hits)} inputs match: {names}; name one "
                                "by its path as the manifest records it")
        prefix, first, inp = hits[0]
        return first + document_of(inp, record, prefix)

    def inputs_named(self, path: str) -> list[tuple[str, int, dict]]:
        """(source prefix, its first global document, input) of every input that is ``path``:
        recorded as ``path`` or the same file once both are resolved (absolute, relative to the
        current directory, ``./x``, symlinks; a recorded relative path is taken from here too),
        else, for none, recorded under the base name ``path``."""
        want = _resolved(path)
        same, named = [], []
        for prefix, base, table in self.entries:
            for i, inp in enumerate(table["inputs"] if table is not None else []):
                rec = inp.get("path")
                if not isinstance(rec, str):
                    continue
                hit = (prefix, base + int(table["first"][i]), inp)
                if rec == path or _resolved(rec) == want:
                    same.append(hit)
                elif Path(rec).name == path:
                    named.append(hit)
        return same or named


def _resolved(path: str) -> str:
    """``path`` as one spelling per file: a URL as given, a local path made absolute with its
    symlinks followed (it need not exist here)."""
    if "://" in path:
        return path
    return os.path.realpath(os.path.expanduser(path))


def _inputs(meta: dict | None, src: dict) -> dict | None:
    if meta is None:
        return None
    parts = meta.get("parts") or [{"name": Path(src["prefix"]).name,
                                   "inputs": meta.get("inputs", []),
                                   "n_docs": meta.get("n_docs", 0)}]
    inputs, first, names, at = [], [], [], 0
    for q in parts:
        for inp in q.get("inputs", []):
            inputs.append(inp)
            first.append(at)
            names.append(q["name"])
            at += int(inp.get("n_docs", 0))
    return {"inputs": inputs, "first": np.array(first or [0], np.int64), "parts": names,
            "records": [_record_numbers(inp) for inp in inputs]}


def _record_numbers(inp: dict):
    """local document -> its record number (1-based), made once per input file: the
    (local+1)-th number that is not a gap (skipped record, blank line); None when blank lines
    were counted but not located (a corpus written before packtool recorded them)."""
    if inp.get("blank_lines") and "blank_records" not in inp:
        return lambda local: None
    gaps = _gaps(inp)
    before = gaps - np.arange(gaps.size)  # non-gap numbers up to each gap, plus one
    return lambda local: int(local + 1 + np.searchsorted(before, local + 1, side="right"))


def _gaps(inp: dict) -> np.ndarray:
    """Record numbers that are not documents (skipped bad records, blank lines), sorted."""
    gaps = list(inp.get("skipped_records", [])) + list(inp.get("blank_records", []))
    return np.sort(np.array(gaps, np.int64))


def record_number(inp: dict, local: int) -> int | None:
    """The record number (1-based) of the file's ``local``-th document: its position plus the
    non-documents (gaps) before it."""
    return _record_numbers(inp)(local)


def document_of(inp: dict, record: int, prefix: str) -> int:
    gaps = _gaps(inp)
    if record in set(gaps.tolist()):
        raise PacktoolError(f"{inp.get('path')} record {record} is not a document (a blank line "
                            f"or a record skipped as bad; see {prefix}.json)")
    local = record - 1 - int(np.searchsorted(gaps, record))
    if not 0 <= local < int(inp.get("n_docs", 0)):
        raise PacktoolError(f"{inp.get('path')} has {inp.get('n_docs', 0):,} documents; record "
                            f"{record} is not one of them")
    return local


def parse_record(spec: str) -> tuple[str, int]:
    """``FILE:RECORD`` as (file, 1-based record number)."""
    file, sep, rec = str(spec).rpartition(":")
    if not sep or not file or not re.fullmatch(r"[0-9]+", rec) or int(rec) < 1:
        raise PacktoolError(f"--record {spec!r}: expected FILE:RECORD, the input file and a "
                            "1-based line or row number in ASCII digits (data/part-3.jsonl:1042)")
    return file, int(rec)


def rows_of(ds, doc: int) -> list[tuple[int, int, int]]:
    """(pack, first token, end token) of every segment of global document ``doc``, from the
    segment tables alone."""
    found, base = [], 0
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        for s in np.flatnonzero(np.asarray(sh.seg_doc) == doc).tolist():
            j = int(np.searchsorted(np.asarray(sh.pack_seg), s, side="right")) - 1
            off, n = int(sh.seg_offset[s]), int(sh.seg_length[s])
            found.append((base + j, off, off + n))
        base += sh.n_packs
    return found
