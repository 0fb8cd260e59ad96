"""A token corpus in memory: its parts' memory maps (opened lazily, at most ``OPEN_PARTS`` at
once: each map holds a file descriptor, so a corpus of 2,000 parts reads under ``ulimit -n
256``), documents by global index, and the reads the packer and the readers make of it
(lengths a chunk at a time, segments gathered). Opening and checking is :mod:`.reader`'s."""

from __future__ import annotations

import contextlib
import json
import mmap
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..._io import check_once, file_digests
from ...errors import FormatError
from .schema import DATA_KEYS, FILES, FIX, prefix_paths

OPEN_PARTS = 32  # parts whose memory maps stay open at once (3 descriptors each at most)
_open: OrderedDict = OrderedDict()  # id(part) -> part, least recently used first
_open_lock = threading.Lock()


def memmap(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    """A read-only map of the first ``count`` items of ``path`` as a plain ndarray (np.memmap's
    Python-level __getitem__ and __array_finalize__ cost ~2 us a slice, and making one ~70 us:
    a reader slices several times a pack, a corpus of 2,000 parts maps 4,000 files); the
    array keeps the map alive. A file shorter than that is a ValueError."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=dtype, count=count)


@dataclass(eq=False)
class TokenPart:
    """One part of a corpus, boundaries LOCAL to its ``.bin``; its files are ``NAME.bin``,
    ``NAME.boundaries`` (``NAME.mask``) in ``place`` (a local folder, or a URL whose files are
    fetched into the cache, verified, when first used: :mod:`packtool.storage`).

    With ``checksums`` (the default of :func:`open_tokens`), the first use of ``tokens`` or
    ``mask`` re-hashes a local file against the manifest once per file per process (crc32,
    ~10 GB/s here; sha256, ~1.4 GB/s, for a corpus that records none; the same file opened
    again, or already checked by ``pack``, costs nothing): a flipped byte is an error, never
    silently different tokens. Lengths come from the boundaries alone, so ``stats`` never
    pays for it."""

    place: object         # packtool.storage.place.Place
    name: str
    entry: dict           # the manifest's part entry (counts, inputs, checksums)
    dtype: np.dtype
    with_mask: bool
    checksums: bool = True
    _maps: dict | None = field(default=None, repr=False)
    _lengths: np.ndarray | None = field(default=None, repr=False)
    _verified: set = field(default_factory=set, repr=False)  # keys checked for these maps
    _ref_starts: tuple | None = field(default=None, repr=False)

    @property
    def cached(self) -> bool:
        """Its files are cached copies of a store\'s objects (never hard-linked out)."""
        return not self.place.in_place([f"{self.name}.bin"])

    @property
    def prefix(self):
        """The part's prefix as a user sees it (a Path, or a URL)."""
        return self.place.path(self.name)

    def path(self, key: str):
        """``NAME.key`` as a user sees it."""
        return self.place.path(f"{self.name}.{key}")

    def file(self, key: str, check=None) -> Path:
        """A local path to ``NAME.key`` (for a remote part, its verified cached copy;
        ``check(path, want)``: how a file read in place is checked)."""
        return self.place.local(f"{self.name}.{key}", self.entry["checksums"][key], check)

    def _map(self, key: str) -> np.ndarray:
        """The map of ``NAME.key``, made on first use of that key alone: a part in a store
        is fetched a file at a time, so what reads only the boundaries (pack's index layout,
        stats, which) never downloads the tokens (mapping all three at once fetched the
        whole .bin of every part for an index pack from a bucket)."""
        with _open_lock:
            if self._maps is None:
                self._maps = {}
            array = self._maps.get(key)
            if array is None:
                self._verified.discard(key)  # a new map of the file: checked on first use
                dtype, count = self.layout(key)
                array = self._maps[key] = memmap(self.file(key), dtype, count)
            _open[id(self)] = self
            _open.move_to_end(id(self))
            while len(_open) > OPEN_PARTS:  # views handed out keep their own map alive
                _, old = _open.popitem(last=False)
                old._maps = None
            return array

    def layout(self, key: str) -> tuple[np.dtype, int]:
        """(dtype, items) of ``NAME.key`` as this entry says it is (:data:`.schema.SCHEMA`)."""
        f = FILES[key]
        if f.dtype == "json":
            return np.dtype("u1"), self.entry["checksums"][key]["bytes"]
        count = self.entry.get({"token": "n_tokens", "document": "n_docs"}.get(f.per, "n_images"),
                               0)
        return (self.dtype if f.dtype == "tokens" else np.dtype(f.dtype)), count * f.width

    def _checked(self, key: str) -> np.ndarray:
        """The map of ``NAME.key``, its file checked once per map (a reader reads it per
        pack: the check's stat and path resolution cost ~10 us a call)."""
        array = self._map(key)
        if self.checksums and key not in self._verified:
            self.file(key, check_file)  # a store's object: checked when it was fetched
            self._verified.add(key)
        return array

    @property
    def tokens(self) -> np.ndarray:
        return self._checked("bin")

    @property
    def mask(self) -> np.ndarray | None:
        if not self.with_mask:
            return None
        return self._checked("mask")

    @property
    def ends(self) -> np.ndarray:
        return self._map("boundaries")

    def per_doc(self, key: str) -> np.ndarray | None:  # roles, prompt, rewards, or None
        return self._checked(key) if key in self.entry["checksums"] else None

    def span(self, j: int, key: str = "boundaries") -> tuple[int, int]:
        """(start, end) of document ``j``'s tokens (of its images: ``key`` "images")."""
        ends = self.ends if key == "boundaries" else self._checked(key)
        return (int(ends[j - 1]) if j else 0), int(ends[j])

    def images(self, j: int) -> dict:
        """Document ``j``'s images: ``grid`` [k, 3], ``span`` [k, 2], ``refs`` (dicts)."""
        a, b = self.span(j, "images")
        refs = self._refs()
        raw = self._checked("img_ref.jsonl")
        return {"grid": self._checked("img_grid").reshape(-1, 3)[a:b],
                "span": self._checked("img_span").reshape(-1, 2)[a:b],
                "refs": [json.loads(bytes(raw[refs[i]:refs[i + 1] - 1])) for i in range(a, b)]}

    def _refs(self) -> np.ndarray:
        """Start of each line of ``.img_ref.jsonl`` (and its end), found once per map."""
        raw = self._checked("img_ref.jsonl")
        if self._ref_starts is None or self._ref_starts[1] is not raw:
            starts = np.concatenate([[0], np.flatnonzero(raw == 10) + 1]).astype(np.int64)
            if len(starts) != self.entry.get("n_images", 0) + 1 or (
                    len(raw) and raw[-1] != 10):
                raise FormatError(f"{self.path('img_ref.jsonl')}: {len(starts) - 1:,} lines, "
                                  f"the manifest says {self.entry.get('n_images', 0):,} "
                                  f"images; {FIX}")
            self._ref_starts = (starts, raw)
        return self._ref_starts[0]

    def positions3(self, j: int) -> np.ndarray:
        """int32 [3, len] mRoPE positions of document ``j``."""
        a, b = self.span(j)
        return self._checked("pos3").reshape(-1, 3)[a:b].T

    @property
    def lengths(self) -> np.ndarray:
        if self._lengths is None:
            self._lengths = np.diff(np.asarray(self.ends), prepend=np.int64(0)).astype(np.int64)
        return self._lengths

    @property
    def starts(self) -> np.ndarray:
        return np.asarray(self.ends) - self.lengths

    def __len__(self) -> int:
        return int(self.entry["n_docs"])

    def files(self) -> list:
        """The part's data files as a user sees them (Paths, or URLs)."""
        return [self.path(k) for k in DATA_KEYS if k in self.entry["checksums"]]

    def verify_checksums(self, strong: bool = True) -> None:
        """Re-hash the part's data files and compare with its entry (a full read; a remote
        file is fetched, and so verified, into the cache; a cached copy, with ``strong``,
        hashed again, however often this process checked it). ``strong``: sha256 too, not
        only the crc32 a first read checks (see :func:`check_file`)."""
        from ...storage.cache import rehashing

        with rehashing() if strong else contextlib.nullcontext():
            for key in self.entry["checksums"]:
                self.file(key, lambda path, want: check_file(path, want, strong))


def verify_part_files(prefix: Path, entry: dict, strong: bool = True) -> None:
    """Every data file of a part has the size and digests its entry records, else a
    :class:`FormatError` naming the file."""
    paths = prefix_paths(prefix)
    for key, want in entry["checksums"].items():
        check_file(paths[key], want, strong)


def check_file(path: Path, want: dict, strong: bool = False) -> None:
    """Size and digest of ``path`` against a manifest entry, once per file per process: its
    crc32 where the entry has one (~10x faster than sha256: a reader's first read, the copy
    of ``pack --layout tokens``), else sha256; ``strong`` (``verify``): both."""
    if not path.exists():
        raise FormatError(f"{path} is missing (the manifest expects it)")
    fast = ["crc32" if "crc32" in want else "sha256"]
    names = [a for a in ("sha256", "crc32") if a in want] if strong else fast

    def check_now():
        if "bytes" in want:
            check_size(path, want["bytes"])
        got = file_digests(path, names)
        for a in names:
            if got[a] != want[a]:
                raise FormatError(
                    f"{path}: {a} {got[a][:12]}... does not match the manifest's "
                    f"{want[a][:12]}...; the file is corrupt, {FIX}")

    check_once(path, _key(want, names), check_now, also=(_key(want, fast),))


def check_size(path: Path, want: int) -> None:
    """``path`` holds the ``want`` bytes its manifest says, else a FormatError naming it."""
    try:
        got = path.stat().st_size
    except FileNotFoundError:
        raise FormatError(f"{path} is missing (the manifest expects it)") from None
    if got != want:
        raise FormatError(f"{path} has {got:,} bytes but the manifest says {want:,}; the file "
                          f"is truncated or belongs to another corpus. {FIX[0].upper()}{FIX[1:]}")


def _key(want: dict, names) -> str:
    return " ".join(f"{a}:{want[a]}" for a in names)


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
    file_sha256: str = ""  # sha256 of PREFIX.json's bytes as read at open
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

    @property
    def groups(self) -> dict | None:
        """{kind, n_groups, rewards} of a corpus of pairs or groups (version 4), else None."""
        return self.meta.get("groups")

    @property
    def vision(self) -> dict | None:
        """The manifest's ``images`` (rule, ids, totals) of a corpus with images, else None."""
        return self.meta.get("images")

    def images(self, i: int) -> dict:
        """Document ``i``'s images: ``{"grid": [k, 3] (t, h, w), "span": [k, 2] (offset of
        its first image token in the document, image tokens), "refs": [...]}``."""
        if not self.vision:
            raise FormatError(f"{self.prefix} holds no images (tokenized without --vision)")
        part, j = self.locate(i)
        return part.images(j)

    def positions3(self, i: int) -> np.ndarray:
        """int32 [3, len] (temporal, height, width) positions of document ``i`` (an mRoPE
        rule's corpus only)."""
        if not (self.vision or {}).get("mrope"):
            raise FormatError(f"{self.prefix} stores no 3-D positions (only a Qwen-VL "
                              "--vision rule makes them)")
        part, j = self.locate(i)
        return part.positions3(j)

    def per_doc(self, key: str) -> np.ndarray | None:
        """``roles``, ``prompt`` or ``rewards`` of every document over all parts, or None."""
        got = [q.per_doc(key) for q in self.parts]
        if not got or any(g is None for g in got):
            return None
        return np.concatenate([np.asarray(g) for g in got])

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
        a, b = part.span(j)
        return part.tokens[a:b]

    def doc_mask(self, i: int) -> np.ndarray:
        """Loss mask of document i (all ones for a corpus without one)."""
        part, j = self.locate(i)
        a, b = part.span(j)
        return np.ones(b - a, np.uint8) if part.mask is None else part.mask[a:b]

    def gather(self, doc: np.ndarray, offset: np.ndarray, length: np.ndarray, dst: np.ndarray,
               dst_start: np.ndarray, dst_mask: np.ndarray | None = None) -> None:
        """Copy segments (document, offset, length) into ``dst`` at ``dst_start`` (and their
        loss masks into ``dst_mask``; 1 for a corpus without one). Segments are checked
        against their documents here, so no kernel reads outside a source file."""
        gather([self], doc, offset, length, dst, dst_start, dst_mask)

    def data_files(self) -> list[Path]:
        """Every data file of every part (what a copy of the corpus must carry)."""
        return [f for q in self.parts for f in q.files()]

    def verify_checksums(self, strong: bool = True) -> None:
        """Re-hash every part's data files and compare with the manifest (a full read):
        sha256 and crc32, or with ``strong=False`` the crc32 alone where recorded."""
        for q in self.parts:
            q.verify_checksums(strong)


def read_lengths(corpora: list[TokenCorpus], chunk: int = 1 << 20) -> np.ndarray:
    """Every document's length over ``corpora`` in order, read from the boundaries files a
    chunk at a time into one int32 array (int64 if a document holds 2**31 tokens or more):
    4 bytes a document, nothing cached (``TokenCorpus.lengths`` keeps int64 copies)."""
    out = np.empty(sum(len(c) for c in corpora), np.int32)
    at = 0
    for q in (q for c in corpora for q in c.parts):
        ends = q.ends
        prev = np.int64(0)
        for a in range(0, len(q), chunk):
            e = np.asarray(ends[a:a + chunk], np.int64)
            d = np.diff(e, prepend=prev)
            if d.size and int(d.max()) >= 2**31:
                return np.concatenate([c.lengths for c in corpora])
            out[at:at + d.size] = d
            at += d.size
            prev = e[-1]
    return out


def read_lengths_range(corpora: list[TokenCorpus], lo: int, hi: int) -> np.ndarray:
    """The lengths of global documents lo..hi-1 over ``corpora`` (int64), read from the
    boundaries of the parts they fall in: what a group of documents needs, nothing more."""
    out, base = [np.zeros(0, np.int64)], 0
    for q in (q for c in corpora for q in c.parts):
        a, b = max(lo - base, 0), min(hi - base, len(q))  # its documents a..b-1
        if b > a:
            e = np.asarray(q.ends[max(a - 1, 0):b], np.int64)
            out.append(np.diff(e, prepend=np.int64(0)) if a == 0 else np.diff(e))
        base += len(q)
        if base >= hi:
            break
    return np.concatenate(out)


def gather(corpora: list[TokenCorpus], doc: np.ndarray, offset: np.ndarray,
           length: np.ndarray, dst: np.ndarray, dst_start: np.ndarray,
           dst_mask: np.ndarray | None = None) -> None:
    """Copy segments (document, offset, length) of ``corpora``, whose documents are numbered
    one after another (the sources of a pack, in order), into ``dst`` at ``dst_start`` (and
    their loss masks into ``dst_mask``; 1 for a corpus without one). Segments are checked
    against their documents here, so no kernel reads outside a source file."""
    from .._kernels import fill, gather

    parts = [q for c in corpora for q in c.parts]
    base = np.cumsum([0] + [len(q) for q in parts]).astype(np.int64)
    if doc.size and (int(doc.min()) < 0 or int(doc.max()) >= base[-1]):
        raise FormatError(f"segment source document out of range (0..{base[-1] - 1})")
    which = np.searchsorted(base, doc, side="right") - 1
    for c in np.unique(which).tolist():
        part = parts[c]
        m = which == c
        local = doc[m] - base[c]
        ends = part.ends  # two reads a segment; no per-document array is built
        end = np.asarray(ends[local], np.int64)
        start = np.where(local > 0, np.asarray(ends[np.maximum(local - 1, 0)], np.int64), 0)
        src = start + offset[m]
        if (offset[m] < 0).any() or (src + length[m] > end).any():
            raise FormatError(f"{part.prefix}: a segment reaches past the end of its document")
        gather(part.tokens, src, length[m], dst, dst_start[m])
        if dst_mask is not None and part.mask is not None:
            gather(part.mask, src, length[m], dst_mask, dst_start[m])
        elif dst_mask is not None:  # a corpus without a mask is trained on everywhere
            fill(dst_mask, dst_start[m], length[m], 1)
