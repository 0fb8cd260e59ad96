"""The token-file format (``packtool.tokens``, version 2): what ``packtool tokenize`` writes
and ``open_tokens`` reads; schema, writer, reader and validator in one place.

A corpus is one or more *parts*, in order; each part is three files sharing the part's name
(see docs/FORMAT.md)::

    NAME.bin         token ids back to back, little-endian uint16 if vocab_size <= 65,536
                     else uint32; np.memmap(NAME.bin, dtype="<u2") reads it.
    NAME.boundaries  little-endian int64, one entry per document of the part: its cumulative
                     end offset in NAME.bin (LOCAL to the part). Document i is
                     bin[ends[i-1]:ends[i]] (ends[-1] = 0).
    NAME.mask        uint8 per token, 1 = trained on (SFT/chat corpora only).
    PREFIX.json      the manifest: format, version, dtype, totals, tokenizer sha256, inputs,
                     options and ``parts`` (name, counts, sha256 of each file), in order.
                     Renamed into place last.

A one-part corpus names its part after the prefix (PREFIX.bin: version 1's layout); a corpus
of K > 1 parts names them ``PREFIX.part-00000`` ... Parts are independent (local
boundaries), so each is written, checked and resumed alone (packtool.scale); concatenating
the parts' .bin (and .mask) gives a one-part run's file byte for byte. Version 1 (one
PREFIX.bin, ``checksums`` at the top level) stays readable.

Zero-length documents keep their entry, so document index = input record index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from .._io import HashingWriter, check_once, sha256_file
from ..errors import FormatError

FORMAT = "packtool.tokens"
VERSION = 2
READABLE = (1, 2)  # version 1: a single PREFIX.bin with its checksums at the top level
UINT16_MAX_VOCAB = 65_536


@dataclass(frozen=True)
class File:
    suffix: str
    dtype: str      # "tokens" (from the manifest's dtype) or a numpy dtype string
    per: str        # "token" or "document"
    doc: str
    optional: str | None = None  # present only when the manifest has this key true


SCHEMA = (
    File(".bin", "tokens", "token", "token ids back to back, in input order; no header"),
    File(".boundaries", "<i8", "document", "cumulative end offset of each document"),
    File(".mask", "|u1", "token", "1 = the loss is taken on this token", optional="mask"),
)
SUFFIXES = (*(f.suffix for f in SCHEMA), ".json")

MANIFEST_KEYS = {  # every key of PREFIX.json, documented in docs/FORMAT.md (a test checks it)
    "format": '"packtool.tokens"', "version": "2 (1: single-part, still read)",
    "dtype": "uint16 or uint32",
    "vocab_size": "the tokenizer's id space", "n_docs": "documents", "n_tokens": "tokens",
    "n_empty": "zero-length documents", "tokenizer": "path and sha256 of tokenizer.json",
    "bos_id": "id added before every document, or null",
    "eos_id": "id added after every document, or null",
    "inputs": "per input file: path, kind, n_docs, skipped...", "mask": "PREFIX.mask exists",
    "n_trained_tokens": "tokens with mask 1", "options": "the tokenize options",
    "engine": "the tokenizer engine that ran and how it was checked",
    "checksums": "version 1 only: sha256 and bytes of each data file",
    "parts": "version 2: per part, in order: name, counts, inputs, checksums",
    "plan": "version 2: how the inputs were split into parts (policy, n_parts, digest)",
    "created_by": '"packtool X.Y.Z"',
}
PART_KEYS = {  # every key of a part entry (manifest "parts", and the part's .NAME.part.json)
    "name": "the part's file name stem: NAME.bin, NAME.boundaries, NAME.mask",
    "n_docs": "documents in the part", "n_tokens": "tokens in the part",
    "n_empty": "zero-length documents", "n_trained_tokens": "tokens with mask 1",
    "inputs": "per input file of the part: path, kind, n_docs, skipped...",
    "checksums": "sha256 and bytes of each of the part's data files",
}


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (ids 0..65,535), else uint32."""
    return np.dtype("<u2") if vocab_size <= UINT16_MAX_VOCAB else np.dtype("<u4")


def split_prefix(path: str | Path) -> Path:
    """Accept ``PREFIX`` or any of its files (``PREFIX.json``...) and return ``PREFIX``."""
    p = Path(path)
    if p.suffix in SUFFIXES and not Path(str(p) + ".json").exists():
        return p.with_suffix("")
    return p


def prefix_paths(prefix: str | Path) -> dict[str, Path]:
    prefix = str(prefix)
    return {s[1:]: Path(prefix + s) for s in SUFFIXES}


class TokenWriter:
    """Streams one part into temporary files (``paths``: suffix key -> path); :meth:`finish`
    closes them and returns the part's entry (counts and checksums, see ``PART_KEYS``)."""

    def __init__(self, paths: dict[str, Path], with_mask: bool):
        self.paths, self.with_mask = paths, with_mask
        self.bin, self.boundaries = HashingWriter(paths["bin"]), HashingWriter(paths["boundaries"])
        self.mask = HashingWriter(paths["mask"]) if with_mask else None
        self.n_docs = self.n_tokens = self.n_empty = self.n_trained = 0

    def write(self, lengths: np.ndarray, ids: np.ndarray, mask: np.ndarray | None) -> None:
        """Append documents of ``lengths`` whose tokens are ``ids`` (and loss ``mask``)."""
        self.bin.write(ids)
        if self.mask is not None:
            self.mask.write(mask)
            self.n_trained += int(mask.sum())
        self.boundaries.write((np.cumsum(lengths) + self.n_tokens).astype("<i8", copy=False))
        self.n_docs += len(lengths)
        self.n_tokens += int(ids.size)
        self.n_empty += int(np.count_nonzero(lengths == 0))

    def abort(self) -> None:
        for w in (self.bin, self.boundaries, self.mask):
            if w is not None:
                w.abort()

    def finish(self, name: str, inputs: list[dict]) -> dict:
        checksums = {"bin": self.bin.close(), "boundaries": self.boundaries.close()}
        if self.mask is not None:
            checksums["mask"] = self.mask.close()
        return {"name": name, "n_docs": self.n_docs, "n_tokens": self.n_tokens,
                "n_empty": self.n_empty,
                "n_trained_tokens": self.n_trained if self.with_mask else self.n_tokens,
                "inputs": inputs, "checksums": checksums}


def corpus_manifest(meta: dict, parts: list[dict], plan: dict) -> dict:
    """The version-2 ``PREFIX.json`` of ``parts`` (entries in order) around the caller's
    ``meta`` (dtype, tokenizer, options, engine...): totals are the parts' sums."""
    with_mask = "mask" in parts[0]["checksums"] if parts else False
    manifest = {"format": FORMAT, "version": VERSION, **meta,
                "n_docs": sum(q["n_docs"] for q in parts),
                "n_tokens": sum(q["n_tokens"] for q in parts),
                "n_empty": sum(q["n_empty"] for q in parts), "mask": with_mask,
                "n_trained_tokens": sum(q["n_trained_tokens"] for q in parts),
                "inputs": [i for q in parts for i in q["inputs"]],
                "parts": parts, "plan": plan, "created_by": f"packtool {__version__}"}
    unknown = set(manifest) - set(MANIFEST_KEYS)
    if unknown:  # a key must be documented in MANIFEST_KEYS (and so in FORMAT.md)
        raise RuntimeError(f"manifest keys not in the schema: {sorted(unknown)}")
    for q in parts:
        if set(q) - set(PART_KEYS):
            raise RuntimeError(f"part keys not in the schema: {sorted(set(q) - set(PART_KEYS))}")
    return manifest


def gather_segments(corpora: list, doc: np.ndarray, offset: np.ndarray, length: np.ndarray,
                    dst: np.ndarray, dst_start: np.ndarray, dst_mask: np.ndarray | None = None,
                    ) -> None:
    """Copy segments (global document over ``corpora`` in order, offset, length) into ``dst``
    at ``dst_start`` (and their loss masks into ``dst_mask``; 1 for corpora without one).
    Documents are numbered across corpora and, within a corpus, across its parts.
    Offsets come from validated boundaries (see :func:`open_tokens`); segments are checked
    against their documents here, so no kernel reads outside a source file."""
    from ._kernels import _fill, _gather

    parts = [q for c in corpora for q in c.parts]
    base = np.cumsum([0] + [len(q) for q in parts]).astype(np.int64)
    if doc.size and (int(doc.min()) < 0 or int(doc.max()) >= base[-1]):
        raise FormatError(f"segment source document out of range (0..{base[-1] - 1})")
    which = np.searchsorted(base, doc, side="right") - 1
    for c, part in enumerate(parts):
        m = which == c
        if not m.any():
            continue
        local = doc[m] - base[c]
        src = part.starts[local] + offset[m]
        if (offset[m] < 0).any() or (offset[m] + length[m] > part.lengths[local]).any():
            raise FormatError(f"{part.prefix}: a segment reaches past the end of its document")
        _gather(part.tokens, src, length[m], dst, dst_start[m])
        if dst_mask is not None and part.mask is not None:
            _gather(part.mask, src, length[m], dst_mask, dst_start[m])
        elif dst_mask is not None:  # a corpus without a mask is trained on everywhere
            _fill(dst_mask, dst_start[m], length[m], 1)


def _memmap(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


@dataclass
class TokenPart:
    """One part of a corpus: its own memmaps, boundaries LOCAL to its ``.bin``.

    With ``checksums`` (the default of :func:`open_tokens`), the first use of ``tokens`` or
    ``mask`` re-hashes that file against the manifest once per file per process (sha256,
    ~1.4 GB/s here; the same file opened again, or already checked by ``pack``, costs
    nothing): a flipped byte is an error, never silently different tokens. Lengths come from
    the boundaries alone, so ``stats`` never pays for it."""

    prefix: Path          # the part's files are prefix.bin, prefix.boundaries, prefix.mask
    entry: dict           # the manifest's part entry (counts, inputs, checksums)
    _tokens: np.ndarray
    ends: np.ndarray
    _mask: np.ndarray | None = None
    checksums: bool = True
    _lengths: np.ndarray | None = field(default=None, repr=False)

    @property
    def tokens(self) -> np.ndarray:
        if self.checksums:
            _check_file(prefix_paths(self.prefix)["bin"], self.entry["checksums"]["bin"])
        return self._tokens

    @property
    def mask(self) -> np.ndarray | None:
        if self._mask is not None and self.checksums:
            _check_file(prefix_paths(self.prefix)["mask"], self.entry["checksums"]["mask"])
        return self._mask

    @property
    def name(self) -> str:
        return self.prefix.name

    @property
    def lengths(self) -> np.ndarray:
        if self._lengths is None:
            self._lengths = np.diff(np.asarray(self.ends), prepend=np.int64(0)).astype(np.int64)
        return self._lengths

    @property
    def starts(self) -> np.ndarray:
        return np.asarray(self.ends) - self.lengths

    def __len__(self) -> int:
        return len(self.ends)

    def verify_checksums(self) -> None:
        """Re-hash the part's data files and compare with its entry (a full read)."""
        verify_part_files(self.prefix, self.entry)


def verify_part_files(prefix: Path, entry: dict) -> None:
    """Every data file of a part has the size and sha256 its entry records, else a
    :class:`FormatError` naming the file."""
    paths = prefix_paths(prefix)
    for key, want in entry["checksums"].items():
        _check_file(paths[key], want)


def _check_file(path: Path, want: dict) -> None:
    """Size and sha256 of ``path`` against a manifest entry, once per file per process."""
    if not path.exists():
        raise FormatError(f"{path} is missing (the manifest expects it)")

    def check():
        size = path.stat().st_size
        if "bytes" in want and size != want["bytes"]:
            raise FormatError(f"{path} has {size:,} bytes but the manifest says "
                              f"{want['bytes']:,}; the file is truncated or belongs to another "
                              "corpus. Re-run packtool tokenize")
        got = sha256_file(path)
        if got != want["sha256"]:
            raise FormatError(
                f"{path}: sha256 {got[:12]}... does not match the manifest's "
                f"{want['sha256'][:12]}...; the file is corrupt, re-run packtool tokenize")

    check_once(path, want.get("sha256"), check)


def _multi(corpus: TokenCorpus, what: str):
    raise FormatError(
        f"{corpus.prefix} has {len(corpus.parts)} parts, so there is no single {what} array: "
        f"read corpus.parts[k].{what} (each part's own file), or corpus[i] / "
        "corpus.doc_mask(i) by global document")


@dataclass
class TokenCorpus:
    """A tokenized corpus on disk: ``len(c)`` documents over all parts, ``c[i]`` a memmap view
    of one (global index), ``c.parts`` the per-part views.

    >>> c = open_tokens("out/corpus")          # doctest: +SKIP
    >>> c[3]                                   # tokens of record 3, np.uint16 view
    >>> c.lengths                              # int64 tokens per document (global)
    >>> c.parts[0].tokens                      # the first part's .bin, memory-mapped

    ``c.ends``/``c.starts``/``c.lengths`` are global (in memory for a multi-part corpus, 8
    bytes a document, like ``lengths``); ``c.tokens``/``c.mask`` exist only for a one-part
    corpus (a multi-part one has no single file) and otherwise raise naming ``c.parts``.
    """

    prefix: Path
    meta: dict
    parts: list[TokenPart]
    _ends: np.ndarray | None = field(default=None, repr=False)
    _lengths: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self):
        self.doc_base = np.cumsum([0] + [len(q) for q in self.parts]).astype(np.int64)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"]).newbyteorder("<")

    @property
    def n_tokens(self) -> int:
        return int(self.meta["n_tokens"])

    @property
    def has_mask(self) -> bool:
        return bool(self.meta.get("mask"))

    @property
    def tokens(self) -> np.ndarray:
        if len(self.parts) != 1:
            _multi(self, "tokens")
        return self.parts[0].tokens

    @property
    def mask(self) -> np.ndarray | None:
        """uint8 per token, 1 = trained on (SFT/chat corpora only), else None."""
        if not self.has_mask:
            return None
        if len(self.parts) != 1:
            _multi(self, "mask")
        return self.parts[0].mask

    @property
    def ends(self) -> np.ndarray:
        if len(self.parts) == 1:
            return self.parts[0].ends
        if self._ends is None:
            self._ends = np.cumsum(self.lengths)
        return self._ends

    @property
    def lengths(self) -> np.ndarray:
        if self._lengths is None:
            self._lengths = (np.concatenate([q.lengths for q in self.parts]) if self.parts
                             else np.empty(0, np.int64))
        return self._lengths

    @property
    def starts(self) -> np.ndarray:
        return np.asarray(self.ends) - self.lengths

    def __len__(self) -> int:
        return int(self.doc_base[-1])

    def locate(self, i: int) -> tuple[TokenPart, int]:
        """(part, local document index) of global document ``i``."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"document {i} out of range for a corpus of {n:,} documents")
        i %= n
        k = int(np.searchsorted(self.doc_base, i, side="right")) - 1
        return self.parts[k], i - int(self.doc_base[k])

    def __getitem__(self, i: int) -> np.ndarray:
        part, j = self.locate(i)
        start = int(part.ends[j - 1]) if j else 0
        return part.tokens[start : int(part.ends[j])]

    def doc_mask(self, i: int) -> np.ndarray:
        """Loss mask of document i (all ones for a corpus without one)."""
        part, j = self.locate(i)
        start = int(part.ends[j - 1]) if j else 0
        if part.mask is None:
            return np.ones(int(part.ends[j]) - start, np.uint8)
        return part.mask[start:int(part.ends[j])]

    def data_files(self) -> list[Path]:
        """Every data file of every part (what a copy of the corpus must carry)."""
        return [prefix_paths(q.prefix)[k] for q in self.parts for k in q.entry["checksums"]]

    def verify_checksums(self) -> None:
        """Re-hash every part's data files and compare with the manifest (a full read)."""
        for q in self.parts:
            q.verify_checksums()


def read_manifest(path: Path, expected_format: str, expected_version: int | tuple) -> dict:
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path} not found; is this the output of packtool?") from None
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != expected_format:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise FormatError(f"{path}: format is {got!r}, expected {expected_format!r}")
    versions = expected_version if isinstance(expected_version, tuple) else (expected_version,)
    if meta.get("version") not in versions or isinstance(meta.get("version"), bool):
        raise FormatError(
            f"{path}: {expected_format} version {meta.get('version')!r} is not supported by this "
            f"packtool (it reads version {' and '.join(map(str, versions))}); upgrade packtool "
            "or re-create the file"
        )
    return meta


def _checked_meta(meta: dict, path: Path) -> tuple[np.dtype, list[dict]]:
    """dtype and part entries of a manifest (version 1: one part named after the prefix),
    refused by name when missing or of the wrong type; totals must be the parts' sums."""
    from .packed import confined_name

    try:
        dtype = np.dtype(meta["dtype"]).newbyteorder("<")
        if dtype not in (np.dtype("<u2"), np.dtype("<u4")):
            raise ValueError(f"dtype {meta['dtype']!r} is not uint16 or uint32")
        if meta["version"] == 1:
            parts = [{"name": path.name[:-len(".json")], "n_docs": meta["n_docs"],
                      "n_tokens": meta["n_tokens"], "checksums": meta["checksums"]}]
        else:
            parts = meta["parts"]
            if not isinstance(parts, list):
                raise ValueError("parts is not a list")
        for q in parts:
            if not isinstance(q, dict):
                raise ValueError("a part entry is not an object")
            confined_name(q["name"], path)
            for key in ("n_docs", "n_tokens"):
                v = q[key]
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"{key} of part {q['name']!r} is {v!r}, not a count")
            if not isinstance(q["checksums"], dict) or not {"bin", "boundaries"} <= set(
                    q["checksums"]):
                raise ValueError(f"checksums of part {q['name']!r} lack bin/boundaries")
        for key in ("n_docs", "n_tokens"):
            v = meta[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{key} is {v!r}, not a count")
            if v != sum(q[key] for q in parts):
                raise ValueError(f"{key} {v:,} is not the sum of its parts' "
                                 f"({sum(q[key] for q in parts):,})")
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        raise FormatError(f"{path}: malformed manifest ({what}); re-run packtool tokenize"
                          ) from None
    except FormatError as e:
        raise FormatError(f"{e}; re-run packtool tokenize") from None
    return dtype, parts


def check_boundaries(ends: np.ndarray, n_tokens: int, path: Path, chunk: int = 1 << 24) -> None:
    """Document ends must start >= 0, never decrease and end at the token count: every
    offset a kernel later indexes with is proven in range here (O(documents), ~0.1 s/10M)."""
    prev = 0
    for a in range(0, len(ends), chunk):
        e = np.asarray(ends[a:a + chunk])
        d = np.diff(e, prepend=np.int64(prev))
        if (d < 0).any():
            i = a + int(np.flatnonzero(d < 0)[0])
            raise FormatError(f"{path}: document {i:,} ends at {int(ends[i]):,}, before the "
                              f"previous document's end; the file is corrupt, re-run packtool "
                              "tokenize")
        prev = int(e[-1])
    if len(ends) and prev != n_tokens:
        raise FormatError(f"{path}: last end offset {prev:,} != n_tokens {n_tokens:,}; the file "
                          "is corrupt, re-run packtool tokenize")


def open_part(prefix: Path, entry: dict, dtype: np.dtype, with_mask: bool,
              checksums: bool = True) -> TokenPart:
    """One part's files, checked: sizes against the entry, boundaries in range."""
    paths = prefix_paths(prefix)
    n_docs, n_tokens = entry["n_docs"], entry["n_tokens"]
    sizes = [("bin", n_tokens * dtype.itemsize), ("boundaries", n_docs * 8)]
    if with_mask:
        sizes.append(("mask", n_tokens))
    for key, want in sizes:
        try:
            got = paths[key].stat().st_size
        except FileNotFoundError:
            raise FormatError(f"{paths[key]} is missing (the manifest expects it)") from None
        if got != want:
            raise FormatError(
                f"{paths[key]} has {got:,} bytes but the manifest says {want:,}; the file is "
                "truncated or belongs to another corpus. Re-run packtool tokenize"
            )
    tokens = _memmap(paths["bin"], dtype, n_tokens)
    ends = _memmap(paths["boundaries"], np.dtype("<i8"), n_docs)
    if checksums:  # 8 bytes a document, read anyway: a shifted boundary is never silent
        _check_file(paths["boundaries"], entry["checksums"]["boundaries"])
    check_boundaries(ends, n_tokens, paths["boundaries"])
    mask = _memmap(paths["mask"], np.dtype("u1"), n_tokens) if with_mask else None
    return TokenPart(prefix=prefix, entry=entry, _tokens=tokens, ends=ends, _mask=mask,
                     checksums=checksums)


def _renamed(name: str, meta: dict, prefix: Path) -> str:
    """A part's file stem for a corpus whose files were renamed together (``a.*`` ->
    ``b.*``, as version 1 allowed): names written under the prefix the plan records follow
    the manifest's current name."""
    was = (meta.get("plan") or {}).get("prefix") if isinstance(meta.get("plan"), dict) else None
    if isinstance(was, str) and was and was != prefix.name and (
            name == was or name.startswith(was + ".part-")):
        return prefix.name + name[len(was):]
    return name


def open_tokens(prefix: str | Path, checksums: bool = True) -> TokenCorpus:
    """Open the corpus ``PREFIX.json`` describes (written by ``packtool tokenize``).

    Always checked at open (cheap): the manifest's keys and types, part names (plain names
    beside the manifest), every file's size, and every part's boundaries (non-decreasing,
    from >= 0 to the part's token count), so no later read can leave a file. With
    ``checksums`` a part's ``.bin``/``.mask`` is re-hashed on its first read, once per process
    (see :class:`TokenPart`); :meth:`TokenCorpus.verify_checksums` hashes everything at once.
    """
    prefix = split_prefix(prefix)
    path = prefix_paths(prefix)["json"]
    meta = read_manifest(path, FORMAT, READABLE)
    dtype, entries = _checked_meta(meta, path)
    parts = [open_part(prefix.parent / _renamed(q["name"], meta, prefix), q, dtype,
                       bool(meta.get("mask")), checksums) for q in entries]
    return TokenCorpus(prefix=prefix, meta=meta, parts=parts)


def validate_tokens(prefix: str | Path) -> TokenCorpus:
    """Everything :func:`open_tokens` checks, plus every file's sha256 and mask values in
    {0, 1}: what ``packtool verify PREFIX`` runs."""
    corpus = open_tokens(prefix)
    corpus.verify_checksums()
    vocab = int(corpus.meta.get("vocab_size") or 0)
    for q in corpus.parts:
        if q.mask is not None and len(q.tokens) and int(np.asarray(q.mask).max()) > 1:
            raise FormatError(f"{prefix_paths(q.prefix)['mask']}: values other than 0 and 1")
        if vocab and len(q.tokens):
            top = int(np.asarray(q.tokens).max())
            if top >= vocab:
                raise FormatError(f"{prefix_paths(q.prefix)['bin']}: token id {top:,} >= "
                                  f"vocab_size {vocab:,}")
    return corpus
