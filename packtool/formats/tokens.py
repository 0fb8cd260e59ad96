"""The token-file format: what ``packtool tokenize`` writes and ``open_tokens`` reads.

Three files share a prefix (see docs/FORMAT.md, version 1)::

    PREFIX.bin         token ids back to back, little-endian uint16 if vocab_size <= 65,536
                       else uint32; np.memmap(PREFIX.bin, dtype="<u2") reads it.
    PREFIX.boundaries  little-endian int64, one entry per document: its cumulative end offset
                       in PREFIX.bin. Document i is bin[ends[i-1]:ends[i]] (ends[-1] = 0).
    PREFIX.json        the manifest: format, version, dtype, counts, tokenizer sha256,
                       inputs, options and sha256 of the two data files.

Zero-length documents keep their entry, so document index = input record index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._io import sha256_file
from ..errors import FormatError

FORMAT = "packtool.tokens"
VERSION = 1
SUFFIXES = (".bin", ".boundaries", ".mask", ".json")
UINT16_MAX_VOCAB = 65_536


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
            f"packtool (it reads version {expected_version}); upgrade packtool or re-create the file"
        )
    return meta


def open_tokens(prefix: str | Path) -> TokenCorpus:
    """Open ``PREFIX.{bin,boundaries,json}`` as written by ``packtool tokenize``.

    File sizes are checked against the manifest, so a truncated or mismatched file fails here
    with a message naming it rather than later with garbage tokens.
    """
    prefix = split_prefix(prefix)
    paths = prefix_paths(prefix)
    meta = read_manifest(paths["json"], FORMAT, VERSION)
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    n_docs, n_tokens = int(meta["n_docs"]), int(meta["n_tokens"])
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
    if n_docs and int(ends[-1]) != n_tokens:
        raise FormatError(
            f"{paths['boundaries']}: last end offset {int(ends[-1]):,} != n_tokens {n_tokens:,}"
        )
    mask = _memmap(paths["mask"], np.dtype("u1"), n_tokens) if meta.get("mask") else None
    return TokenCorpus(prefix=prefix, meta=meta, tokens=tokens, ends=ends, mask=mask)
