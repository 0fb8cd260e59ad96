"""``packtool verify``: prove a packed dataset (or a token corpus) intact and that it loses or
mixes nothing. The checks of each format live with the format (its validator); this module
adds what needs both: a packed dataset against the sources it was packed from.

1. :func:`packtool.formats.packed.validate_packed`: index digest and keys, file names inside
   the directory, sizes, dtypes, crc32 of every file, every pack's invariants.
2. With sources (``--source PREFIX...``): the source manifests are the ones packed and the
   source files match their own checksums; the segments are exactly what the overflow policy
   makes of the source documents (every document, piece and token once; truncated/dropped ones
   as counted); every segment's tokens (and loss mask) equal the source's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ._io import sha256_file
from .errors import PacktoolError
from .formats.packed import MASK, ValidationError, validate_packed
from .formats.tokens import gather_segments, prefix_paths, validate_tokens
from .plan import PackOptions, expected_segments, mixture_plan

VerifyError = ValidationError


@dataclass
class VerifyResult:
    path: str
    kind: str                       # "packed" or "tokens"
    n_tokens: int
    n_docs: int = 0                 # tokens: documents
    n_packs: int = 0                # packed: packs, segments, shards
    n_segments: int = 0
    n_shards: int = 0
    sources_checked: bool = False
    policy: dict = field(default_factory=dict)   # what the overflow policy removed, by request

    def summary(self) -> str:
        if self.kind == "tokens":
            return (f"OK {self.path}: {self.n_docs:,} documents, {self.n_tokens:,} tokens; "
                    "manifest, sizes, boundaries and sha256 checksums hold")
        what = ""
        if self.sources_checked:
            p = self.policy
            what = (f"; every source token accounted for: {self.n_tokens:,} packed exactly once"
                    + (f", {p['n_truncated_tokens']:,} truncated away from {p['n_truncated']:,} "
                       "documents by --overflow truncate" if p.get("n_truncated") else "")
                    + (f", {p['n_dropped_tokens']:,} in {p['n_dropped']:,} documents dropped by "
                       "--overflow drop" if p.get("n_dropped") else ""))
        return (f"OK {self.path}: {self.n_packs:,} packs, {self.n_tokens:,} tokens, "
                f"{self.n_segments:,} segments in {self.n_shards} shard(s); checksums and "
                f"invariants hold{what}")

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self)}


def verify(path: str | Path, sources: list[str | Path] | None = None) -> VerifyResult:
    """A packed directory (with optional sources) or a token-corpus prefix."""
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


def verify_packed(directory: str | Path, sources: list[str | Path] | None = None
                  ) -> VerifyResult:
    """Run every check (also on the held-out split in ``directory/valid``, and that no
    document is in both); return a :class:`VerifyResult` or raise :class:`VerifyError`."""
    directory = Path(directory)
    index, shards = validate_packed(directory)
    result = VerifyResult(str(directory), "packed", index["n_tokens"], n_docs=index["n_docs"],
                          n_packs=index["n_packs"], n_segments=index["n_segments"],
                          n_shards=len(shards))
    valid = None
    if index.get("held_out"):
        vdir = directory / index["held_out"]["path"]
        valid = validate_packed(vdir)
        if valid[0].get("split") != "valid":
            raise VerifyError(f"{vdir}: not the held-out split of {directory}")
        train_docs = np.unique(np.concatenate([np.asarray(a["source_docs"]) for a in shards]
                                              or [np.empty(0, np.int64)]))
        valid_docs = np.concatenate([np.asarray(a["source_docs"]) for a in valid[1]]
                                    or [np.empty(0, np.int64)])
        both = np.intersect1d(train_docs, valid_docs)
        if both.size:
            raise VerifyError(f"source document {int(both[0]):,} is in the training packs and "
                              f"in the held-out packs ({vdir})")
        result.n_packs += valid[0]["n_packs"]
    if sources:
        from .pack import open_sources

        corpora = open_sources(_source_prefixes(index, sources))  # opened once, for both
        repeats, held = _mixture(index, corpora)
        _verify_sources(index, shards, corpora, repeats)
        if valid is not None:
            _verify_sources(valid[0], valid[1], corpora, held.astype(np.int64))
        result.sources_checked = True
        result.policy = {k: index[k] for k in ("n_truncated", "n_truncated_tokens",
                                               "n_dropped", "n_dropped_tokens")}
    return result


def _source_prefixes(index: dict, sources) -> list[str]:
    """``--source`` prefixes; a ``PREFIX:FACTOR`` must name the factor the index records."""
    from .plan import parse_source

    out = []
    for k, spec in enumerate(sources):
        prefix, factor = parse_source(spec)
        recorded = index["sources"][k].get("factor", 1.0) if k < len(index["sources"]) else None
        if prefix != str(spec) and recorded is not None and factor != recorded:
            raise VerifyError(f"--source {spec}: the dataset was packed with factor "
                              f"{recorded:g} for this source, not {factor:g}")
        out.append(prefix)
    return out


def _mixture(index: dict, corpora) -> tuple[np.ndarray | None, np.ndarray]:
    """The copies and held-out documents the index's options imply (recomputed, not read)."""
    lengths = np.concatenate([c.lengths for c in corpora])
    held = index.get("held_out") or {}
    opts = PackOptions(int(index["seq_len"]), seed=index["seed"],
                       valid_docs=held.get("valid_docs"),
                       valid_fraction=held.get("valid_fraction"))
    factors = [float(s.get("factor", 1.0)) for s in index["sources"]]
    if len(factors) != len(corpora):
        raise VerifyError(f"{len(corpora)} --source prefixes given, the dataset was packed from "
                          f"{len(factors)}: {', '.join(s['prefix'] for s in index['sources'])}")
    return mixture_plan(lengths, [len(c) for c in corpora], factors, opts)


def _verify_sources(index: dict, shards: list[dict], corpora, repeats) -> None:
    recorded = index["sources"]
    if len(corpora) != len(recorded):
        raise VerifyError(f"{len(corpora)} --source prefixes given, the dataset was packed from "
                          f"{len(recorded)}: {', '.join(s['prefix'] for s in recorded)}")
    for c, rec in zip(corpora, recorded, strict=True):
        if sha256_file(prefix_paths(c.prefix)["json"]) != rec["manifest_sha256"]:
            raise VerifyError(f"--source {c.prefix} is not the corpus that was packed "
                              f"(manifest sha256 differs from {rec['prefix']}'s)")
        c.verify_checksums()  # a corrupt source must not vouch for the packs
    lengths = np.concatenate([c.lengths for c in corpora])
    want = expected_segments(lengths, int(index["seq_len"]), index["overflow"], repeats)
    order_w = np.lexsort((want.offset, want.doc))
    want_doc, want_off, want_len = want.doc[order_w], want.offset[order_w], want.length[order_w]
    segs = [_segments(s) for s in shards]
    cat = (lambda i: np.concatenate([s[i] for s in segs])) if segs else (
        lambda i: np.empty(0, np.int64))
    doc, off, lens = cat(0), cat(1), cat(2)
    order = np.lexsort((off, doc))
    for name, got, exp in (("document", doc[order], want_doc), ("offset", off[order], want_off),
                           ("length", lens[order], want_len)):
        if got.shape != exp.shape:
            raise VerifyError(f"the shards hold {got.size:,} segments, the sources under "
                              f"--overflow {index['overflow']} (and the mixture) make "
                              f"{exp.size:,}")
        bad = np.flatnonzero(got != exp)
        if bad.size:
            i = int(bad[0])
            raise VerifyError(
                f"segment {name} mismatch for source document {int(want_doc[i]):,} (offset "
                f"{int(want_off[i]):,}): tokens lost, duplicated or moved")
    for k, (s, (sdoc, soff, seg_len)) in enumerate(zip(shards, segs, strict=True)):
        _compare_tokens(index["shards"][k]["name"], s, corpora, sdoc, soff, seg_len)


def _segments(arrays: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cu = np.asarray(arrays["cu_seqlens"]).astype(np.int64)
    seg_len = np.diff(cu)[cu[1:] != 0]
    return np.asarray(arrays["source_docs"]), np.asarray(arrays["source_offsets"]), seg_len


def _compare_tokens(name, arrays, corpora, sdoc, soff, seg_len) -> None:
    dst = np.concatenate([[0], np.cumsum(seg_len)[:-1]]).astype(np.int64)
    expect = np.empty(int(seg_len.sum()), arrays["tokens"].dtype)
    expect_mask = np.empty(expect.size, np.uint8) if MASK in arrays else None
    gather_segments(corpora, sdoc, soff, seg_len, expect, dst, expect_mask)
    if expect_mask is not None:
        bad = np.flatnonzero(expect_mask != np.asarray(arrays[MASK]))
        if bad.size:
            raise VerifyError(f"{name} token {int(bad[0]):,}: loss_mask differs from the "
                              "source's mask")
    bad = np.flatnonzero(expect != np.asarray(arrays["tokens"]))
    if bad.size:
        t = int(bad[0])
        seg = int(np.searchsorted(dst, t, side="right") - 1)
        raise VerifyError(f"{name} token {t:,}: differs from source document "
                          f"{int(sdoc[seg]):,} at offset {int(soff[seg]) + t - int(dst[seg]):,}")
