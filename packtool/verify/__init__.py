"""``packtool verify``: prove a packed dataset (or a token corpus) intact and that it loses or
mixes nothing. The checks of each format live with the format (its validator); this package
adds what needs both, computed with its own plain code and never the writer's, so that a bug
in the planner or the gather kernel cannot vouch for itself:

1. the format's validator (:func:`packtool.formats.packed.validate_packed`): index digest and
   keys, file names, sizes, dtypes, crc32 of every file, every pack's invariants;
2. with sources (``--source PREFIX...``): the source manifests are the ones packed (sha256)
   and their files match their checksums; the held-out documents and the mixture's copies
   are recomputed from the recorded seed and factors (:mod:`.draws`); every segment a
   document must become under the overflow policy is in the packs exactly as often as
   asked, and nothing else is (:mod:`.segments`: fingerprints of both multisets, a
   document's miscount named by one more pass); every stored token (and loss mask) equals
   the source's, compared with plain numpy indexing;
3. the attention costs index.json stores per shard are what each row's mask computes
   (:mod:`.costs`, with a completion's attention to its shared prompt);
4. a token corpus with images (its own, or a ``--source``): every image read again and
   counted from its header, its spans and 3-D positions recomputed (:mod:`.images`).

It streams: the sources a chunk of 2**18 documents at a time (their boundaries), the packs a
shard at a time. Memory: one shard's arrays and one chunk, plus 2 bits a document per source
with a mixture or a held-out split (and, while a sample above 2% of a source is drawn, a byte
per candidate): no per-document array otherwise (docs/SCALE.md has the measured bytes per
document and the time against pack's, scripts/bench_scale_memory.py).

Also: :mod:`.rules` the held-out rule in its own exact arithmetic, :mod:`.aligned` an
aligned dataset's rows from the definition, :mod:`.groups` pairs and groups (every group in
one pack, its prompt first), :mod:`.trees` prefix trees (each tree the trie of its records,
recomputed by a naive dict walk).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import PacktoolError, listing
from ..formats.packed import INDEX, VALID, ValidationError, validate_packed
from ..formats.tokens import open_tokens, validate_tokens
from ..storage import is_url, join, kind_of, local_path, parent
from ..storage.cache import rehashing
from . import segments as sg
from .costs import check_stored_costs
from .draws import Selection

VerifyError = ValidationError
CHUNK_TOKENS = 1 << 20  # tokens compared at a time: ~60 bytes each in temporaries


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
    align: dict | None = None        # an aligned dataset: K, pad id, pads, what set K
    images: dict | None = None       # images re-read, counted and placed (.images)

    def summary(self) -> str:
        if self.kind == "tokens":
            im = self.images
            return (f"OK {self.path}: {self.n_docs:,} documents, {self.n_tokens:,} tokens; "
                    "manifest, sizes, boundaries and sha256 checksums hold"
                    + (f"; {im['n_images']:,} images read again, their {im['n_vision_tokens']:,}"
                       " image tokens counted from their headers, spans and 3-D positions "
                       "recomputed" if im else ""))
        what = ""
        if self.sources_checked:
            p = self.policy
            how = ("exactly once" if not self.mixture else "as often as the mixture asks ("
                   + ", ".join(f"{m['prefix']} x{m['factor']:g}" for m in self.mixture) + ")")
            what = (f"; every source token accounted for: {self.n_tokens:,} packed {how}"
                    + (f", {p['n_truncated_tokens']:,} truncated away from {p['n_truncated']:,} "
                       "documents by --overflow truncate" if p.get("n_truncated") else "")
                    + (f", {p['n_dropped_tokens']:,} in {p['n_dropped']:,} "
                       + (f"sequences of {p['n_dropped_groups']:,} groups dropped whole"
                          if "n_dropped_groups" in p else "documents dropped")
                       + " by --overflow drop" if p.get("n_dropped") else ""))
        v, a = self.valid, self.align
        held = (f"; held-out split {VALID}/ checked too: {v['n_packs']:,} packs, "
                f"{v['n_tokens']:,} tokens, no document in both splits" if v else "")
        aligned = (f"; every row aligned to {a['align']} as TE's THD layout says "
                   f"({a['n_align_tokens']:,} pads of id {a['pad_id']})" if a else "")
        return (f"OK {self.path}: {self.n_packs:,} packs, {self.n_tokens:,} tokens, "
                f"{self.n_segments:,} segments in {self.n_shards} shard(s) ({self.layout} "
                f"layout); checksums and invariants hold{aligned}{what}{held}")

    def to_json(self) -> dict:
        return {"ok": True, **asdict(self)}


def verify(path: str | Path, sources: list[str | Path] | None = None) -> VerifyResult:
    """A packed directory (with optional sources) or a token-corpus prefix (local, or a URL:
    :mod:`packtool.storage`). A remote file is checked in the bytes read, not trusted for
    being in the cache: every cache entry opened is hashed again
    (:func:`packtool.storage.cache.rehashing`), a bad one fetched again."""
    path, sources = local_path(path), [local_path(s) for s in sources or ()]
    if is_url(path):
        with rehashing():
            return _verify_url(str(path), sources)
    p = Path(path)
    if p.is_dir():
        return verify_packed(p, sources)
    if not (Path(str(p) + ".json").exists() or p.suffix == ".json" and p.exists()):
        raise PacktoolError(f"{path} is not a directory (a packed dataset) nor a token-corpus "
                            f"prefix (no {p.name}.json); pass the --out of packtool pack or "
                            "packtool tokenize")
    return _tokens_result(p, sources, path)


def _verify_url(path: str, sources) -> VerifyResult:
    from ..formats.tokens import split_prefix
    from ..storage.place import place_of

    if kind_of(path) == "packed":
        return verify_packed(path, sources)
    where, stem = place_of(split_prefix(path))
    if not where.is_file(f"{stem}.json"):
        raise PacktoolError(f"{path}: neither a packed dataset (no index.json in it) nor a "
                            f"token corpus (no {stem}.json); pass the --out of packtool pack "
                            "or packtool tokenize")
    return _tokens_result(split_prefix(path), sources, path)


def _tokens_result(prefix, sources, path) -> VerifyResult:
    """A token corpus's result (``--source`` refused); one with images proved by
    :mod:`.images` first."""
    if sources:
        raise PacktoolError(f"{path} is a token corpus; --source applies to packed directories")
    corpus = validate_tokens(prefix)
    images = None
    if corpus.vision:
        from .images import check_images

        images = check_images(corpus)
    return VerifyResult(str(corpus.prefix), "tokens", corpus.n_tokens, n_docs=len(corpus),
                        images=images)


def verify_packed(directory: str | Path, sources: list[str | Path] | None = None
                  ) -> VerifyResult:
    """Run every check (also on the held-out split in ``directory/valid``, and that no
    document is in both); return a :class:`VerifyResult` or raise :class:`VerifyError`."""
    with rehashing():  # remote files (the dataset's or a source's): their bytes re-hashed
        return _verify_packed(directory if is_url(directory) else Path(directory), sources)


def _verify_packed(directory, sources) -> VerifyResult:
    ds = validate_packed(directory)
    index = ds.index
    if index.get("split") == "valid" and sources:
        up = parent(directory)
        raise PacktoolError(f"{directory} is the held-out split of {up}: verify "
                            f"{up} --source ... checks both splits against the sources")
    result = VerifyResult(str(directory), "packed", index["n_tokens"], n_docs=index["n_docs"],
                          n_packs=index["n_packs"], n_segments=index["n_segments"],
                          n_shards=len(index["shards"]), layout=ds.layout,
                          sources_checked=bool(sources))  # returned only once they are
    _unlisted(ds)
    valid = None
    if index.get("held_out"):
        valid = validate_packed(join(directory, index["held_out"]["path"]))
        _unlisted(valid)
        if valid.index.get("split") != "valid":
            raise VerifyError(f"{valid.directory}: not the held-out split of {directory}")
        result.valid = {"n_packs": valid.index["n_packs"], "n_tokens": valid.index["n_tokens"],
                        "n_segments": valid.index["n_segments"]}
        _disjoint(ds, valid)
    splits = [d for d in (ds, valid) if d is not None]
    if ds.layout == "index" and not sources:
        for d in splits:
            _index_sources(d)
    for d in splits:
        _max_docs(d)
    corpora = _sources(index, sources) if sources else None
    if (index.get("trees") or {}).get("min_shared"):  # --share-prefix: packtool.verify.trees
        return _trees(ds, corpora, result)
    if index.get("groups"):  # pairs and groups: packtool.verify.groups
        from .groups import against_sources, check_rows

        check_rows(ds)
        if sources:
            result.policy = against_sources(ds, corpora)
            return result
    if ds.align > 1:
        result.align = _aligned(ds, splits, corpora)
    if sources:
        _against_sources(ds, valid, corpora)
        result.policy = {k: index[k] for k in ("n_truncated", "n_truncated_tokens",
                                               "n_dropped", "n_dropped_tokens")}
        if any(s.get("factor", 1.0) != 1.0 for s in index["sources"]):
            result.mixture = [{"prefix": s["prefix"], "factor": s.get("factor", 1.0)}
                              for s in index["sources"]]
    for d in splits:
        check_stored_costs(d)
    return result


def _trees(ds, corpora, result: VerifyResult) -> VerifyResult:
    """A dataset of prefix trees: every tree whole in a row and its paths tiling their
    documents; with sources, each tree the trie of its records and every token the
    sources' (:mod:`.trees`)."""
    from .trees import against_sources, shapes

    if corpora is None:
        shapes(ds, None)
    else:
        result.policy = against_sources(ds, corpora)
        if ds.layout == "tokens":
            _compare_tokens(ds, corpora)
    check_stored_costs(ds)
    return result


def _unlisted(ds) -> None:
    """A packed dataset, a local folder or a bucket alike, holds only what its index lists
    (the shards' files, the held-out split) and packtool's own hidden leftovers: anything
    else (an export written inside it, `export P -o P/ex`) is an error naming it, since
    readers and the sampler take the index's word for what the dataset is."""
    from ..formats.packed.ownership import dataset_files, ours_hidden

    extra = ds.place.unlisted(dataset_files(ds.place), ours_hidden)
    if extra:
        raise VerifyError(f"{ds.directory} holds {len(extra)} file(s) its {INDEX} does not "
                          f"list ({listing(extra)}): a packed dataset holds only what its "
                          "index lists; move them out of it")


def _max_docs(ds) -> None:
    """No pack holds more segments than ``pack --max-docs`` allowed (the packer's options in
    index.json), counted from each shard's pack table."""
    cap = (ds.index.get("algo_options") or {}).get("max_docs")
    if not cap:
        return
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        per = np.diff(np.asarray(sh.pack_seg, np.int64))
        if per.size and int(per.max()) > cap:
            j = int(np.argmax(per))
            raise VerifyError(f"{sh.name} pack {j:,}: {int(per[j])} segments > --max-docs {cap}")


def _aligned(ds, splits: list, corpora) -> dict:
    """Every row of an aligned dataset (and its held-out split) laid out as
    :mod:`.aligned` defines, the tokens the sources' when given; the pads counted agree
    with index.json's ``n_align_tokens``."""
    from .aligned import check_rows, source_pad_id

    if corpora is not None and ds.index.get("pad_from") in ("tokenizer", "eos"):
        want = source_pad_id(corpora[0].meta, ds.index["pad_from"])
        if want != ds.pad_id:
            raise VerifyError(f"{ds.directory}/index.json: pad_id {ds.pad_id:,} is not the "
                              f"{ds.index['pad_from']} pad id of {corpora[0].prefix} ({want}); "
                              "re-run packtool pack")
    tokens = (None if corpora is None else
              lambda doc, off, length: _source_tokens(corpora, doc, off, length))
    for d in splits:
        pads = check_rows(d, tokens)
        if pads != d.index["n_align_tokens"]:
            raise VerifyError(f"{d.directory}/index.json: n_align_tokens is "
                              f"{d.index['n_align_tokens']:,}, the rows hold {pads:,} pads")
    return {"align": ds.align, "pad_id": ds.pad_id, "n_align_tokens": ds.index["n_align_tokens"],
            "parallel": ds.index["parallel"]}


def _index_sources(ds) -> None:
    """An index-layout dataset's tokens are its sources': without --source too, their
    checksums, and every segment inside its source document (what reading a pack checks),
    a shard at a time (two boundary reads a segment)."""
    corpora = ds.sources()
    for c in corpora:
        c.verify_checksums()
    parts = [q for c in corpora for q in c.parts]
    for sh, s0, doc, off, length in sg.shard_chunks(ds):
        start, end, _ = sg.doc_span(parts, doc)
        past = (off < 0) | (off + length > end - start)
        if past.any():
            i = int(np.flatnonzero(past)[0])
            raise VerifyError(f"{sh.name} segment {s0 + i:,}: reaches past the end of its "
                              f"source document {int(doc[i]):,} ({int(end[i] - start[i]):,} "
                              "tokens)")


def _disjoint(train, valid) -> None:
    """No document of the held-out packs (few) is in the training packs."""
    held = np.unique(np.concatenate([doc for *_, doc, _, _ in sg.shard_chunks(valid)]
                                    or [np.empty(0, np.int64)]))
    for _, _, doc, _, _ in sg.shard_chunks(train):
        both = np.intersect1d(doc, held)
        if both.size:
            raise VerifyError(f"source document {int(both[0]):,} is in the training packs and "
                              f"in the held-out packs ({join(train.directory, VALID)})")


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
        if c.vision:  # its images, counts and positions, proved before they vouch
            from .images import check_images

            check_images(c)
        corpora.append(c)
    return corpora


# ------------------------------------------------------- what the packs must hold, recomputed
def _against_sources(ds, valid, corpora) -> None:
    """Each split's segments are those the sources make under the policy and the mixture
    (:mod:`.segments`), then (tokens layout) its tokens the sources' (the index layout reads
    these very tokens from the sources)."""
    index = ds.index
    seq_len, overflow = int(index["seq_len"]), sg.policy_of(index)
    n_docs = sum(len(c) for c in corpora)
    sel = Selection(index, corpora)
    keys = sg.fresh_keys()
    splits = {"train": ds} if valid is None else {"valid": valid, "train": ds}
    want = {s: sg.Tally(n_docs, keys) for s in splits}
    sg.expected(corpora, sel, seq_len, overflow, want)
    for split, d in splits.items():
        got = sg.Tally(n_docs, keys)
        sg.packed(d, got, seq_len, overflow, n_docs)
        bucket = want[split].first_difference(got)
        if bucket is not None:
            sg.name_difference(d, corpora, sel, split, bucket, want[split], got, overflow)
        if d.layout == "tokens":
            _compare_tokens(d, corpora)


def _source_tokens(corpora, doc, offset, length) -> tuple[np.ndarray, np.ndarray]:
    """The tokens (and loss mask, 1 without one) of segments, by plain numpy indexing into
    each part's memory map (the documents' starts read from its boundaries)."""
    parts = [q for c in corpora for q in c.parts]
    start, _, which = sg.doc_span(parts, doc)
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
        src = np.repeat(start[sel] + offset[sel], ls) + within
        toks[dst] = np.asarray(q.tokens)[src]
        if q.mask is not None:
            mask[dst] = np.asarray(q.mask)[src]
    return toks, mask


def _compare_tokens(ds, corpora) -> None:
    """Every stored token (and loss mask bit) the sources', ~CHUNK_TOKENS at a time."""
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        lo = 0
        while lo < sh.n_packs:
            hi = int(np.searchsorted(sh.po, sh.po[lo] + CHUNK_TOKENS, side="right")) - 1
            hi = min(max(hi, lo + 1), sh.n_packs)
            r = ds.read_range(k, lo, hi)
            s0, s1 = int(sh.pack_seg[lo]), int(sh.pack_seg[hi])
            toks, mask = _source_tokens(corpora, np.asarray(sh.seg_doc[s0:s1], np.int64),
                                        np.asarray(sh.seg_offset[s0:s1], np.int64),
                                        r["seg_length"])
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
