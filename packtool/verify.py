"""``packtool verify``: prove a packed dataset (or a token corpus) intact and that it loses or
mixes nothing. The checks of each format live with the format (its validator); this module
adds what needs both, computed with its own plain code and never the writer's, so that a bug
in the planner or the gather kernel cannot vouch for itself:

1. the format's validator (:func:`packtool.formats.packed.validate_packed`): index digest and
   keys, file names, sizes, dtypes, crc32 of every file, every pack's invariants;
2. with sources (``--source PREFIX...``): the source manifests are the ones packed (sha256)
   and their files match their checksums; the held-out documents and the mixture's copies
   are recomputed from the recorded seed and factors; every segment a document must become
   under the overflow policy (:func:`expected_segments`, written here from the definition) is
   in the packs exactly as often as asked, and nothing else is; every stored token (and loss
   mask) equals the source's, compared with plain numpy indexing.

Measured (tests/test_verify.py's corpus aside, ``python scripts/bench_pack.py --verify``):
the recomputation costs about as much as reading the sources once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import PacktoolError
from .formats.packed import VALID, ValidationError, validate_packed
from .formats.tokens import open_tokens, read_lengths, validate_tokens
from .storage import is_url, join, kind_of, parent
from .verify_rules import expected_holdout

VerifyError = ValidationError
CHUNK_TOKENS = 1 << 23


@dataclass
class VerifyResult:
    path: str
    kind: str                       # "packed" or "tokens"
    n_tokens: int
    n_docs: int = 0                 # tokens: documents
    n_packs: int = 0                # packed: packs, segments, shards (the training split)
    n_segments: int = 0
    n_shards: int = 0
    layout: str = ""
    sources_checked: bool = False
    policy: dict = field(default_factory=dict)   # what the overflow policy removed, by request
    mixture: list = field(default_factory=list)  # per source: factor, when not all 1
    valid: dict | None = None        # the held-out split: packs, tokens, segments, checked

    def summary(self) -> str:
        if self.kind == "tokens":
            return (f"OK {self.path}: {self.n_docs:,} documents, {self.n_tokens:,} tokens; "
                    "manifest, sizes, boundaries and sha256 checksums hold")
        what = ""
        if self.sources_checked:
            p = self.policy
            how = ("exactly once" if not self.mixture else "as often as the mixture asks ("
                   + ", ".join(f"{m['prefix']} x{m['factor']:g}" for m in self.mixture) + ")")
            what = (f"; every source token accounted for: {self.n_tokens:,} packed {how}"
                    + (f", {p['n_truncated_tokens']:,} truncated away from {p['n_truncated']:,} "
                       "documents by --overflow truncate" if p.get("n_truncated") else "")
                    + (f", {p['n_dropped_tokens']:,} in {p['n_dropped']:,} documents dropped by "
                       "--overflow drop" if p.get("n_dropped") else ""))
        held = ""
        if self.valid:
            v = self.valid
            held = (f"; held-out split {VALID}/ checked too: {v['n_packs']:,} packs, "
                    f"{v['n_tokens']:,} tokens, no document in both splits")
        return (f"OK {self.path}: {self.n_packs:,} packs, {self.n_tokens:,} tokens, "
                f"{self.n_segments:,} segments in {self.n_shards} shard(s) ({self.layout} "
                f"layout); checksums and invariants hold{what}{held}")

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self)}


def verify(path: str | Path, sources: list[str | Path] | None = None) -> VerifyResult:
    """A packed directory (with optional sources) or a token-corpus prefix (local, or a URL:
    :mod:`packtool.storage`)."""
    if is_url(path):
        return _verify_url(str(path), sources)
    p = Path(path)
    if p.is_dir():
        return verify_packed(p, sources)
    if not (Path(str(p) + ".json").exists() or p.suffix == ".json" and p.exists()):
        raise PacktoolError(f"{path} is not a directory (a packed dataset) nor a token-corpus "
                            f"prefix (no {p.name}.json); pass the --out of packtool pack or "
                            "packtool tokenize")
    if sources:
        raise PacktoolError(f"{path} is a token corpus; --source applies to packed directories")
    corpus = validate_tokens(p)
    return VerifyResult(str(corpus.prefix), "tokens", corpus.n_tokens, n_docs=len(corpus))


def _verify_url(path: str, sources) -> VerifyResult:
    from .formats.tokens import split_prefix
    from .storage.place import place_of

    if kind_of(path) == "packed":
        return verify_packed(path, sources)
    where, stem = place_of(split_prefix(path))
    if not where.is_file(f"{stem}.json"):
        raise PacktoolError(f"{path}: neither a packed dataset (no index.json in it) nor a "
                            f"token corpus (no {stem}.json); pass the --out of packtool pack "
                            "or packtool tokenize")
    if sources:
        raise PacktoolError(f"{path} is a token corpus; --source applies to packed directories")
    corpus = validate_tokens(split_prefix(path))
    return VerifyResult(str(corpus.prefix), "tokens", corpus.n_tokens, n_docs=len(corpus))


def verify_packed(directory: str | Path, sources: list[str | Path] | None = None
                  ) -> VerifyResult:
    """Run every check (also on the held-out split in ``directory/valid``, and that no
    document is in both); return a :class:`VerifyResult` or raise :class:`VerifyError`."""
    directory = directory if is_url(directory) else Path(directory)
    ds = validate_packed(directory)
    index = ds.index
    if index.get("split") == "valid" and sources:
        up = parent(directory)
        raise PacktoolError(f"{directory} is the held-out split of {up}: verify "
                            f"{up} --source ... checks both splits against the sources")
    result = VerifyResult(str(directory), "packed", index["n_tokens"], n_docs=index["n_docs"],
                          n_packs=index["n_packs"], n_segments=index["n_segments"],
                          n_shards=len(index["shards"]), layout=ds.layout)
    valid = None
    if index.get("held_out"):
        valid = validate_packed(join(directory, index["held_out"]["path"]))
        if valid.index.get("split") != "valid":
            raise VerifyError(f"{valid.directory}: not the held-out split of {directory}")
        result.valid = {"n_packs": valid.index["n_packs"], "n_tokens": valid.index["n_tokens"],
                        "n_segments": valid.index["n_segments"]}
        _disjoint(ds, valid)
    if ds.layout == "index" and not sources:
        for d in (ds, valid):
            if d is not None:
                _index_sources(d)
    if sources:
        corpora = _sources(index, sources)
        lengths = read_lengths(corpora)
        sizes = np.cumsum([0] + [len(c) for c in corpora])
        copies, held = expected_copies(index, [lengths[a:b] for a, b in
                                               zip(sizes[:-1], sizes[1:], strict=True)])
        if valid is not None:
            _check(valid, corpora, _count(valid, held.astype(np.uint16), lengths))
        _check(ds, corpora, _count(ds, copies, lengths))
        result.sources_checked = True
        result.policy = {k: index[k] for k in ("n_truncated", "n_truncated_tokens",
                                               "n_dropped", "n_dropped_tokens")}
        if any(s.get("factor", 1.0) != 1.0 for s in index["sources"]):
            result.mixture = [{"prefix": s["prefix"], "factor": s.get("factor", 1.0)}
                              for s in index["sources"]]
    return result


def _index_sources(ds) -> None:
    """An index-layout dataset's tokens are its sources': without --source too, their
    checksums, and every segment inside its source document (what reading a pack checks)."""
    corpora = ds.sources()
    for c in corpora:
        c.verify_checksums()
    lengths = read_lengths(corpora).astype(np.int64)
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        doc, off = np.asarray(sh.seg_doc, np.int64), np.asarray(sh.seg_offset, np.int64)
        past = (off < 0) | (off + np.asarray(sh.seg_length, np.int64) > lengths[doc])
        if past.any():
            i = int(np.flatnonzero(past)[0])
            raise VerifyError(f"{sh.name} segment {i:,}: reaches past the end of its source "
                              f"document {int(doc[i]):,} ({int(lengths[doc[i]]):,} tokens)")


def _disjoint(train, valid) -> None:
    """No document of the held-out packs (few) is in the training packs."""
    held = np.unique(np.concatenate([np.asarray(valid.shard(k).seg_doc, np.int64)
                                     for k in range(valid.n_shards)] or [np.empty(0, int)]))
    for k in range(train.n_shards):
        both = np.intersect1d(np.asarray(train.shard(k).seg_doc, np.int64), held)
        if both.size:
            raise VerifyError(f"source document {int(both[0]):,} is in the training packs and "
                              f"in the held-out packs ({valid_dir(train)})")


def valid_dir(ds) -> Path:
    return join(ds.directory, VALID)


def _sources(index: dict, specs) -> list:
    """The ``--source`` corpora: as many as were packed, each the very corpus (manifest
    sha256), every file matching its checksums; ``PREFIX:FACTOR`` must name the factor."""
    recorded = index["sources"]
    if len(specs) != len(recorded):
        raise VerifyError(f"{len(specs)} --source prefixes given, the dataset was packed from "
                          f"{len(recorded)}: {', '.join(s['prefix'] for s in recorded)}")
    corpora = []
    for spec, rec in zip(specs, recorded, strict=True):
        head, sep, tail = str(spec).rpartition(":")
        prefix = str(spec)
        if sep and head and tail.replace(".", "", 1).isdigit():
            prefix = head
            if float(tail) != rec.get("factor", 1.0):
                raise VerifyError(f"--source {spec}: the dataset was packed with factor "
                                  f"{rec.get('factor', 1.0):g} for this source, not "
                                  f"{float(tail):g}")
        c = open_tokens(prefix)
        if c.file_sha256 != rec["manifest_sha256"]:
            raise VerifyError(f"--source {prefix} is not the corpus that was packed (manifest "
                              f"sha256 differs from {rec['prefix']}'s)")
        c.verify_checksums()  # a corrupt source must not vouch for the packs
        corpora.append(c)
    return corpora


# ------------------------------------------------------- what the packs must hold, recomputed
def expected_copies(index: dict, lengths: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(copies of each document in the training packs, held-out mask), from the index's
    seed, factors and held-out request, by the rules docs/FORMAT.md states: held out, per
    source, :func:`packtool.verify_rules.expected_holdout` of its non-empty documents, drawn
    without replacement by ``default_rng([seed, 1, k])``; each other document floor(factor) times,
    plus one for round(frac(factor) * eligible) of them drawn by ``default_rng([seed, 2, k])``.
    """
    seed = int(index["seed"])
    held_req = index.get("held_out") or {}
    factors = [float(s.get("factor", 1.0)) for s in index["sources"]]
    wants = expected_holdout(held_req, [int(np.count_nonzero(x)) for x in lengths],
                             sum(x.size for x in lengths)) if held_req else None
    copies, held = [], []
    for k, (n_k, factor) in enumerate(zip(lengths, factors, strict=True)):
        h = np.zeros(n_k.size, bool)
        if wants and wants[k]:
            h[np.random.default_rng([seed, 1, k]).choice(np.flatnonzero(n_k > 0), size=wants[k],
                                                          replace=False)] = True
        c = np.full(n_k.size, int(factor), np.uint16)
        c[h] = 0
        extra = round((factor - int(factor)) * (n_k.size - int(h.sum())))
        if extra:
            eligible = np.flatnonzero(~h)
            c[np.random.default_rng([seed, 2, k]).choice(eligible, size=extra,
                                                          replace=False)] += 1
        copies.append(c)
        held.append(h)
    return np.concatenate(copies), np.concatenate(held)


class Expected:
    """What the packs of one split must hold, per entry of the source documents' segment
    table (a document's pieces under ``--overflow split`` one after another, else one entry
    a document): how many copies. Counted against the shards with its own plain code, a
    shard at a time: per entry 1 byte, per document ~6 bytes in all."""

    def __init__(self, lengths: np.ndarray, copies: np.ndarray, seq_len: int, overflow: str):
        self.n, self.seq_len, self.overflow = lengths, seq_len, overflow
        over = np.flatnonzero(lengths > seq_len)
        self.split = over if overflow == "split" else over[:0]
        pieces = -(-lengths[self.split].astype(np.int64) // seq_len)
        self.extra = np.concatenate([[0], np.cumsum(pieces - 1)])  # before each split doc
        keep = (copies > 0) & (lengths > 0)
        if overflow == "drop":
            keep[over] = False
        per_doc = copies.copy()
        per_doc[~keep] = 0
        if self.split.size:
            reps = np.ones(lengths.size, np.int32)
            reps[self.split] = pieces
            self.want = np.repeat(per_doc, reps)        # copies per entry
        else:
            self.want = per_doc
        self.got = np.zeros(self.want.size, np.uint16)  # copies found

    def entry(self, doc: np.ndarray, offset: np.ndarray) -> np.ndarray:
        j = np.searchsorted(self.split, doc, side="left")
        return doc + self.extra[j] + offset // self.seq_len

    def count(self, doc: np.ndarray, offset: np.ndarray, length: np.ndarray, where) -> None:
        """Check each segment is one the policy makes of its document, and count it."""
        n_docs = self.n.size
        ok = (doc >= 0) & (doc < n_docs) & (offset >= 0) & (length >= 1)
        d = np.where(ok, doc, 0)
        n = self.n[d].astype(np.int64)
        L = self.seq_len
        if self.overflow == "split":
            ok &= (offset % L == 0) & (offset < n) & (length == np.minimum(L, n - offset))
        elif self.overflow == "truncate":
            ok &= (offset == 0) & (length == np.minimum(n, L))
        else:
            ok &= (offset == 0) & (length == n) & (n <= L)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise VerifyError(f"{where}: segment mismatch: (document {int(doc[i]):,}, offset "
                              f"{int(offset[i]):,}, length {int(length[i]):,}) is not one "
                              f"--overflow {self.overflow} makes of its source document: "
                              "tokens lost, duplicated or moved")
        e, c = np.unique(self.entry(doc, offset), return_counts=True)
        self.got[e] += c.astype(np.uint16)

    def check(self, where) -> None:
        bad = np.flatnonzero(self.got != self.want)
        if bad.size:
            e = int(bad[0])
            doc, off = self._locate(e)
            raise VerifyError(
                f"{where}: source document {doc:,} (offset {off:,}) is in the packs "
                f"{int(self.got[e])} time(s), expected {int(self.want[e])}: segment mismatch, "
                f"tokens lost, duplicated or moved (the shards hold {int(self.got.sum()):,} "
                f"segments, the sources under --overflow {self.overflow} and the mixture "
                f"make {int(self.want.sum()):,})")

    def _locate(self, e: int) -> tuple[int, int]:
        first = self.split + self.extra[:-1]  # entry of each split document's first piece
        j = int(np.searchsorted(first, e, side="right")) - 1
        if j >= 0 and e < first[j] + self.extra[j + 1] - self.extra[j] + 1:
            return int(self.split[j]), (e - int(first[j])) * self.seq_len
        return e - int(self.extra[j + 1] if j >= 0 else 0), 0


def _count(ds, copies: np.ndarray, lengths: np.ndarray) -> Expected:
    index = ds.index
    exp = Expected(lengths, copies, int(index["seq_len"]), index["overflow"])
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        doc = np.asarray(sh.seg_doc, np.int64)
        ok = doc < lengths.size
        if not ok.all():  # a document past the sources: named as such
            raise VerifyError(f"{ds.directory} {sh.name}: source document "
                              f"{int(doc[~ok][0]):,} does not exist (the sources hold "
                              f"{lengths.size:,})")
        exp.count(doc, np.asarray(sh.seg_offset, np.int64),
                  np.asarray(sh.seg_length, np.int64), f"{ds.directory} {sh.name}")
    return exp


def _check(ds, corpora, exp: Expected) -> None:
    exp.check(ds.directory)
    if ds.layout == "tokens":  # the index layout reads these very tokens from the sources
        for k in range(ds.n_shards):
            _compare_tokens(ds, k, corpora)


def _source_tokens(corpora, doc, offset, length) -> tuple[np.ndarray, np.ndarray]:
    """The tokens (and loss mask, 1 without one) of segments, by plain numpy indexing into
    each part's memory map."""
    parts = [q for c in corpora for q in c.parts]
    base = np.cumsum([0] + [len(q) for q in parts])
    which = np.searchsorted(base, doc, side="right") - 1
    pos = np.concatenate([[0], np.cumsum(length)]).astype(np.int64)
    toks = np.empty(int(pos[-1]), np.int64)
    mask = np.ones(int(pos[-1]), np.uint8)
    for p in np.unique(which).tolist():
        sel = np.flatnonzero(which == p)
        q = parts[p]
        ls = length[sel]
        cs = np.concatenate([[0], np.cumsum(ls)]).astype(np.int64)
        within = np.arange(cs[-1], dtype=np.int64) - np.repeat(cs[:-1], ls)
        dst = np.repeat(pos[sel], ls) + within
        src = np.repeat(q.starts[doc[sel] - base[p]] + offset[sel], ls) + within
        toks[dst] = np.asarray(q.tokens)[src]
        if q.mask is not None:
            mask[dst] = np.asarray(q.mask)[src]
    return toks, mask


def _compare_tokens(ds, k: int, corpora) -> None:
    sh = ds.shard(k)
    n_packs = sh.n_packs
    lo = 0
    while lo < n_packs:
        hi = int(np.searchsorted(sh.po, sh.po[lo] + CHUNK_TOKENS, side="right")) - 1
        hi = min(max(hi, lo + 1), n_packs)
        r = ds.read_range(k, lo, hi)
        s0, s1 = int(sh.pack_seg[lo]), int(sh.pack_seg[hi])
        toks, mask = _source_tokens(corpora, np.asarray(sh.seg_doc[s0:s1], np.int64),
                                    np.asarray(sh.seg_offset[s0:s1], np.int64), r["seg_length"])
        bad = np.flatnonzero(toks != r["ids"])
        if bad.size:
            t = int(bad[0]) + int(sh.po[lo])
            raise VerifyError(f"{sh.name} token {t:,}: differs from its source document")
        if ds.index.get("loss_mask"):
            stored = np.ones(toks.size, np.uint8) if r["mask"] is None else r["mask"]
            bad = np.flatnonzero(stored != mask)
            if bad.size:
                raise VerifyError(f"{sh.name} token {int(bad[0]) + int(sh.po[lo]):,}: "
                                  "loss_mask differs from the source's mask")
        lo = hi
