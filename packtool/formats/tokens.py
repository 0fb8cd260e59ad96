"""The token-file format (``packtool.tokens``, version 1): what ``packtool tokenize`` writes
and ``open_tokens`` reads; schema, writer, reader and validator in one place.

Files sharing a prefix (see docs/FORMAT.md)::

    PREFIX.bin         token ids back to back, little-endian uint16 if vocab_size <= 65,536
                       else uint32; np.memmap(PREFIX.bin, dtype="<u2") reads it.
    PREFIX.boundaries  little-endian int64, one entry per document: its cumulative end offset
                       in PREFIX.bin. Document i is bin[ends[i-1]:ends[i]] (ends[-1] = 0).
    PREFIX.mask        uint8 per token, 1 = trained on (SFT/chat corpora only).
    PREFIX.json        the manifest: format, version, dtype, counts, tokenizer sha256,
                       inputs, options and sha256 of the data files. Renamed into place last.

Zero-length documents keep their entry, so document index = input record index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from .._io import HashingWriter, sha256_file
from .._numba import njit
from ..errors import FormatError

FORMAT = "packtool.tokens"
VERSION = 1
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
    "format": '"packtool.tokens"', "version": "1", "dtype": "uint16 or uint32",
    "vocab_size": "the tokenizer's id space", "n_docs": "documents", "n_tokens": "tokens",
    "n_empty": "zero-length documents", "tokenizer": "path and sha256 of tokenizer.json",
    "bos_id": "id added before every document, or null",
    "eos_id": "id added after every document, or null",
    "inputs": "per input file: path, kind, n_docs, skipped...", "mask": "PREFIX.mask exists",
    "n_trained_tokens": "tokens with mask 1", "options": "the tokenize options",
    "engine": "the tokenizer engine that ran and how it was checked",
    "checksums": "sha256 and bytes of each data file", "created_by": '"packtool X.Y.Z"',
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
    """Streams a corpus into temporary files (``paths``: suffix key -> path) and writes its
    manifest last: the format's keys, the caller's ``meta``, the counts and checksums."""

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

    def finish(self, meta: dict) -> dict:
        checksums = {"bin": self.bin.close(), "boundaries": self.boundaries.close()}
        if self.mask is not None:
            checksums["mask"] = self.mask.close()
        manifest = {"format": FORMAT, "version": VERSION, **meta, "n_docs": self.n_docs,
                    "n_tokens": self.n_tokens, "n_empty": self.n_empty, "mask": self.with_mask,
                    "n_trained_tokens": self.n_trained if self.with_mask else self.n_tokens,
                    "checksums": checksums, "created_by": f"packtool {__version__}"}
        unknown = set(manifest) - set(MANIFEST_KEYS)
        if unknown:  # a key must be documented in MANIFEST_KEYS (and so in FORMAT.md)
            raise RuntimeError(f"manifest keys not in the schema: {sorted(unknown)}")
        self.paths["json"].write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
        return manifest


@njit
def _gather(src, src_start, length, dst, dst_start):
    for s in range(src_start.shape[0]):
        a, b = src_start[s], dst_start[s]
        for j in range(length[s]):
            dst[b + j] = src[a + j]


@njit
def _fill(dst, dst_start, length, value):
    for s in range(dst_start.shape[0]):
        dst[dst_start[s]:dst_start[s] + length[s]] = value


def gather_segments(corpora: list, doc: np.ndarray, offset: np.ndarray, length: np.ndarray,
                    dst: np.ndarray, dst_start: np.ndarray, dst_mask: np.ndarray | None = None,
                    ) -> None:
    """Copy segments (global document over ``corpora`` in order, offset, length) into ``dst``
    at ``dst_start`` (and their loss masks into ``dst_mask``; 1 for corpora without one).
    Offsets come from validated boundaries (see :func:`open_tokens`); segments are checked
    against their documents here, so no kernel reads outside a source file."""
    base = np.cumsum([0] + [len(c) for c in corpora]).astype(np.int64)
    if doc.size and (int(doc.min()) < 0 or int(doc.max()) >= base[-1]):
        raise FormatError(f"segment source document out of range (0..{base[-1] - 1})")
    which = np.searchsorted(base, doc, side="right") - 1
    for c, corpus in enumerate(corpora):
        m = which == c
        if not m.any():
            continue
        local = doc[m] - base[c]
        src = corpus.starts[local] + offset[m]
        if (offset[m] < 0).any() or (offset[m] + length[m] > corpus.lengths[local]).any():
            raise FormatError(f"{corpus.prefix}: a segment reaches past the end of its document")
        _gather(corpus.tokens, src, length[m], dst, dst_start[m])
        if dst_mask is not None and corpus.mask is not None:
            _gather(corpus.mask, src, length[m], dst_mask, dst_start[m])
        elif dst_mask is not None:  # a corpus without a mask is trained on everywhere
            _fill(dst_mask, dst_start[m], length[m], 1)


def _memmap(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


@dataclass
class TokenCorpus:
    """A tokenized corpus on disk: ``len(c)`` documents, ``c[i]`` a memmap view of one.

    >>> c = open_tokens("out/corpus")          # doctest: +SKIP
    >>> c[3]                                   # tokens of record 3, np.uint16 view
    >>> c.lengths                              # int64 tokens per document
    """

    prefix: Path
    meta: dict
    tokens: np.ndarray
    ends: np.ndarray
    mask: np.ndarray | None = None  # uint8 per token, 1 = trained on (SFT/chat corpora only)
    _lengths: np.ndarray | None = field(default=None, repr=False)

    @property
    def dtype(self) -> np.dtype:
        return self.tokens.dtype

    @property
    def n_tokens(self) -> int:
        return int(self.meta["n_tokens"])

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

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self.ends)
        if not -n <= i < n:
            raise IndexError(f"document {i} out of range for a corpus of {n:,} documents")
        i %= n
        start = int(self.ends[i - 1]) if i else 0
        return self.tokens[start : int(self.ends[i])]

    def doc_mask(self, i: int) -> np.ndarray:
        """Loss mask of document i (all ones for a corpus without one)."""
        toks = self[i]
        if self.mask is None:
            return np.ones(len(toks), np.uint8)
        start = int(self.ends[i - 1]) if i % len(self) else 0
        return self.mask[start:start + len(toks)]

    def verify_checksums(self) -> None:
        """Re-hash the data files and compare with the manifest (a full read of the data)."""
        paths = prefix_paths(self.prefix)
        for key in self.meta["checksums"]:
            want = self.meta["checksums"][key]["sha256"]
            got = sha256_file(paths[key])
            if got != want:
                raise FormatError(
                    f"{paths[key]}: sha256 {got[:12]}... does not match the manifest's "
                    f"{want[:12]}...; the file is corrupt, re-run packtool tokenize"
                )


def read_manifest(path: Path, expected_format: str, expected_version: int) -> dict:
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path} not found; is this the output of packtool?") from None
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != expected_format:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise FormatError(f"{path}: format is {got!r}, expected {expected_format!r}")
    if meta.get("version") != expected_version:
        raise FormatError(
            f"{path}: {expected_format} version {meta.get('version')!r} is not supported by this "
            f"packtool (it reads version {expected_version}); upgrade packtool or re-create the "
            "file"
        )
    return meta


def _checked_meta(meta: dict, path: Path) -> tuple[np.dtype, int, int]:
    """dtype and counts of a manifest, refused by name when missing or of the wrong type."""
    try:
        dtype = np.dtype(meta["dtype"]).newbyteorder("<")
        n_docs, n_tokens = meta["n_docs"], meta["n_tokens"]
        if dtype not in (np.dtype("<u2"), np.dtype("<u4")):
            raise ValueError(f"dtype {meta['dtype']!r} is not uint16 or uint32")
        for key, v in (("n_docs", n_docs), ("n_tokens", n_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{key} is {v!r}, not a count")
        if not isinstance(meta["checksums"], dict):
            raise ValueError("checksums is not an object")
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        raise FormatError(f"{path}: malformed manifest ({what}); re-run packtool tokenize"
                          ) from None
    return dtype, n_docs, n_tokens


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


def open_tokens(prefix: str | Path) -> TokenCorpus:
    """Open ``PREFIX.{bin,boundaries,json}`` as written by ``packtool tokenize``.

    Always checked at open (cheap): the manifest's keys and types, every file's size, and the
    boundaries (non-decreasing, from >= 0 to the token count), so no later read can leave a
    file. Checksums are a full read: :meth:`TokenCorpus.verify_checksums` (``pack`` and
    ``verify`` call it).
    """
    prefix = split_prefix(prefix)
    paths = prefix_paths(prefix)
    meta = read_manifest(paths["json"], FORMAT, VERSION)
    dtype, n_docs, n_tokens = _checked_meta(meta, paths["json"])
    sizes = [("bin", n_tokens * dtype.itemsize), ("boundaries", n_docs * 8)]
    if meta.get("mask"):
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
    check_boundaries(ends, n_tokens, paths["boundaries"])
    mask = _memmap(paths["mask"], np.dtype("u1"), n_tokens) if meta.get("mask") else None
    return TokenCorpus(prefix=prefix, meta=meta, tokens=tokens, ends=ends, mask=mask)


def validate_tokens(prefix: str | Path) -> TokenCorpus:
    """Everything :func:`open_tokens` checks, plus every file's sha256 and mask values in
    {0, 1}: what ``packtool verify PREFIX`` runs."""
    corpus = open_tokens(prefix)
    corpus.verify_checksums()
    if corpus.mask is not None and corpus.n_tokens and int(np.asarray(corpus.mask).max()) > 1:
        raise FormatError(f"{prefix_paths(corpus.prefix)['mask']}: values other than 0 and 1")
    if int(corpus.meta.get("vocab_size") or 0) and corpus.n_tokens:
        top = int(np.asarray(corpus.tokens).max())
        if top >= int(corpus.meta["vocab_size"]):
            raise FormatError(f"{prefix_paths(corpus.prefix)['bin']}: token id {top:,} >= "
                              f"vocab_size {corpus.meta['vocab_size']:,}")
    return corpus
