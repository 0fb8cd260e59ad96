"""``packtool pack``: token files -> a packed dataset, as plan then write.

:func:`packtool.plan.plan_pack` decides everything from lengths alone (pure, tested without
disk); :func:`write_packed` turns that layout plus the sources into shards through the packed
format's writer (:class:`packtool.formats.packed.PackedWriter`), gathering tokens from the
memory-mapped sources a chunk at a time.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ._atomic import atomic_dir, output_lock
from ._io import sha256_file
from ._progress import progress_bar
from .errors import PacktoolError
from .formats.packed import INDEX, PackedWriter
from .formats.tokens import TokenCorpus, gather_segments, open_tokens, prefix_paths
from .metrics import bounds_text, pack_metrics
from .plan import PackLayout, PackOptions, RunOptions, mixture_plan, parse_source, plan_pack


def open_sources(prefixes: list[str | Path], checksums: bool = False) -> list[TokenCorpus]:
    """Open token corpora to pack together (one tokenizer, each once); with ``checksums``
    re-hash every source file first, so a corrupt source never reaches a shard."""
    if not prefixes:
        raise PacktoolError("no token files given; pass the --out PREFIX of packtool tokenize")
    corpora = [open_tokens(p) for p in prefixes]
    seen = set()
    for c in corpora:
        key = c.prefix.resolve()
        if key in seen:
            raise PacktoolError(f"token files {c.prefix} given twice; to use a corpus more than "
                                f"once give it a repeat factor ({c.prefix}:2.0) instead")
        seen.add(key)
    shas = {c.meta["tokenizer"]["sha256"] for c in corpora}
    if len(shas) > 1:
        raise PacktoolError(
            "the token files were made with different tokenizers (sha256 "
            + ", ".join(sorted(s[:12] for s in shas))
            + "); re-tokenize them with one tokenizer before packing them together"
        )
    if checksums:
        for c in corpora:
            c.verify_checksums()
    return corpora


@dataclass
class PackResult:
    out: str
    algo: str
    seq_len: int
    n_packs: int
    n_tokens: int
    n_segments: int
    counts: dict
    metrics: dict
    solver: dict
    seconds: float
    assign_seconds: float
    n_shards: int
    sources_verified: bool
    sources: list[dict] = field(default_factory=list)   # per source: factor, used, share
    valid: dict | None = None                           # the held-out split's counts
    warnings: list[str] = field(default_factory=list)

    @property
    def efficiency(self) -> float:
        return self.metrics["efficiency"]

    @property
    def packing_factor(self) -> float:
        return self.metrics["packing_factor"]

    def summary(self) -> str:
        c = self.counts
        over = []
        if c["n_split"]:
            over.append(f"split {c['n_split']:,} docs into {c['n_split_pieces']:,} pieces")
        if c["n_truncated"]:
            over.append(f"truncated {c['n_truncated']:,} docs "
                        f"(-{c['n_truncated_tokens']:,} tokens)")
        if c["n_dropped"]:
            over.append(f"dropped {c['n_dropped']:,} docs ({c['n_dropped_tokens']:,} tokens)")
        if c["n_empty"]:
            over.append(f"skipped {c['n_empty']:,} empty docs")
        m = self.metrics
        lines = [
            f"{self.out}: {self.n_packs:,} packs of {self.seq_len:,} ({self.algo}), "
            f"{self.n_tokens:,} tokens, efficiency {100 * m['efficiency']:.3f}%, "
            f"{bounds_text(m)}, packing factor {m['packing_factor']:.2f}"
            + ("; " + "; ".join(over) if over else "")
            + f"; {self.n_shards} shard(s) in {self.seconds:.2f}s "
            f"(assignment {self.assign_seconds:.2f}s)"
            + ("; source checksums verified" if self.sources_verified else "")]
        if len(self.sources) > 1 or any(src["factor"] != 1 for src in self.sources):
            lines += [f"  {src['prefix']}: x{src['factor']:g}: {src['docs_used']:,} of "
                      f"{src['n_docs']:,} documents, {src['tokens_used']:,} tokens = "
                      f"{100 * src['token_share']:.2f}% of the packed tokens"
                      for src in self.sources]
        if self.valid:
            v = self.valid
            lines.append(f"  held out: {v['n_docs_held_out']:,} documents -> {v['path']}: "
                         f"{v['n_packs']:,} packs, {v['n_tokens']:,} tokens")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(d.pop("metrics"))  # efficiency, bounds, gaps at the top level, as in index.json
        return d


def pack_corpus(prefixes: list[str | Path], out: str | Path, seq_len: int, algo: str = "bfd",
                *, overwrite: bool = False, progress: bool = False, **options) -> PackResult:
    """Pack token files into a packed dataset directory ``out``. ``options`` are the fields
    of :class:`packtool.plan.PackOptions` (overflow, seed, shuffle, shard_size, max_depth...)."""
    try:
        opts = PackOptions(seq_len=seq_len, algo=algo, **options)
    except TypeError as e:
        raise PacktoolError(f"pack: {e}") from None
    return pack(prefixes, out, opts, overwrite=overwrite, progress=progress)


def pack(prefixes: list[str | Path], out: str | Path, options: PackOptions, *,
         overwrite: bool = False, progress: bool = False, verify_sources: bool = True,
         run: RunOptions | None = None) -> PackResult:
    """Plan, then write. ``prefixes`` may carry repeat factors (``web:2.0``); held-out
    documents (``options.valid_docs``/``valid_fraction``) are packed into ``out/valid``.
    Sources' checksums are verified before anything is written (a full read of the sources,
    ~1.4 GB/s; ``verify_sources=False`` skips it and says so).

    ``run`` (:class:`packtool.plan.RunOptions`): Ray tasks write the shards, or one array
    task writes its share and ``finalize`` writes index.json once all are there (see
    :mod:`packtool.scale`); the shards are the same bytes whichever way they were written.
    The run holds ``out``'s lock throughout (a second run to ``out`` fails at once), except
    one array task of several, whose shards are locked one by one."""
    from .scale import check_run

    run = run or RunOptions()
    check_run(run)
    options.check()
    flags = {"overwrite": overwrite, "progress": progress, "verify_sources": verify_sources}
    if run.one_task:
        return _pack(prefixes, out, options, flags, run)
    with output_lock(out) as notes:
        result = _pack(prefixes, out, options, flags, run)
    result.warnings[:0] = notes
    return result


def _pack(prefixes, out, options: PackOptions, flags: dict, run: RunOptions) -> PackResult:
    t0 = time.perf_counter()
    overwrite, progress, verify_sources = (flags["overwrite"], flags["progress"],
                                           flags["verify_sources"])
    executor, tasks, task, finalize = run.executor, run.tasks, run.task, run.finalize
    specs = [parse_source(p) for p in prefixes]
    corpora = open_sources([prefix for prefix, _ in specs])
    factors = [factor for _, factor in specs]
    out_dir = Path(out).resolve()
    for c in corpora:
        if out_dir == c.prefix.resolve().parent or out_dir in c.prefix.resolve().parents:
            raise PacktoolError(f"--out {out} contains the source {c.prefix}; write the packed "
                                "dataset to a directory of its own")
    lengths = np.concatenate([c.lengths for c in corpora])
    t_assign = time.perf_counter()
    repeats, held = mixture_plan(lengths, [len(c) for c in corpora], factors, options)
    layout = plan_pack(lengths, options, repeats)
    valid = plan_pack(lengths, options, held.astype(np.int64)) if held.any() else None
    assign_seconds = time.perf_counter() - t_assign
    if verify_sources and not run.one_task:  # a task of several: --finalize checks them
        for c in corpora:
            c.verify_checksums()
    if executor == "local" and tasks is None and not finalize:
        index = write_packed(layout, corpora, out, overwrite=overwrite, progress=progress,
                             factors=factors, valid=valid)
    else:
        from .scale import PackInputs, pack_parts

        inputs = PackInputs(layout, valid, corpora, [prefix for prefix, _ in specs], factors)
        index = pack_parts(inputs, Path(out), overwrite=overwrite, progress=progress, run=run)
        if index is None:  # one array task's share written; --finalize writes the index
            return PackResult(
                out=str(out), algo=options.algo, seq_len=options.seq_len,
                n_packs=layout.n_packs, n_tokens=layout.counts["n_tokens"],
                n_segments=layout.counts["n_segments"], counts=layout.counts,
                metrics=_metrics(layout), solver=layout.report.to_json(),
                seconds=time.perf_counter() - t0, assign_seconds=assign_seconds,
                n_shards=layout.n_shards, sources_verified=False,
                warnings=layout.report.warnings
                + [f"task {task} of {tasks}: wrote its share of the shards; run --finalize "
                   "once every task is done to write index.json"])
    return PackResult(
        out=str(out), algo=options.algo, seq_len=options.seq_len, n_packs=layout.n_packs,
        n_tokens=layout.counts["n_tokens"], n_segments=layout.counts["n_segments"],
        counts=layout.counts, metrics={k: index[k] for k in _METRIC_KEYS},
        solver=index["solver"], seconds=time.perf_counter() - t0,
        assign_seconds=assign_seconds, n_shards=layout.n_shards,
        sources_verified=verify_sources, sources=index["sources"], valid=index["held_out"],
        warnings=list(layout.report.warnings))


_METRIC_KEYS = ("efficiency", "lower_bound_packs", "gap_percent", "l2_bound_packs",
                "lp_bound_packs", "lp_converged", "best_bound_packs",
                "gap_to_best_bound_percent", "packing_factor")


def write_packed(layout: PackLayout, corpora: list[TokenCorpus], out: str | Path, *,
                 overwrite: bool = False, progress: bool = False,
                 factors: list[float] | None = None, valid: PackLayout | None = None) -> dict:
    """Write ``layout``'s shards from ``corpora`` into ``out`` (atomically), and ``valid``'s
    into ``out/valid``; returns the index."""
    total = layout.counts["n_tokens"] + (valid.counts["n_tokens"] if valid else 0)
    bar = progress_bar(total, "pack", enabled=progress)
    try:
        with atomic_dir(Path(out), overwrite, owned_marker=INDEX) as tmp:
            held_out = None
            if valid is not None:
                (tmp / VALID).mkdir()
                v = _write_layout(valid, corpora, tmp / VALID, bar, factors, "valid", None)
                held_out = held_out_entry(layout.options, v)
            index = _write_layout(layout, corpora, tmp, bar, factors, "train", held_out)
    finally:
        if bar is not None:
            bar.close()
    return index


VALID = "valid"


def _write_layout(layout: PackLayout, corpora: list[TokenCorpus], directory: Path, bar,
                  factors: list[float] | None, split: str, held_out: dict | None) -> dict:
    writer = layout_writer(layout, corpora, directory)
    for k in range(layout.n_shards):
        packs, segs = layout.shard(k)
        _write_shard(writer, layout, packs, segs, corpora, bar)
    return writer.finish(index_meta(layout, corpora, factors, split, held_out))


def layout_writer(layout: PackLayout, corpora: list[TokenCorpus], directory: Path
                  ) -> PackedWriter:
    tok_dtype = max((c.dtype for c in corpora), key=lambda d: d.itemsize)
    return PackedWriter(directory, layout.options.seq_len, tok_dtype,
                        any(c.has_mask for c in corpora))


def _metrics(layout: PackLayout) -> dict:
    rep = layout.report
    return pack_metrics(layout.seg_length, layout.options.seq_len, layout.n_packs,
                        rep.lp_bound, rep.lp_converged)


def index_meta(layout: PackLayout, corpora: list[TokenCorpus], factors: list[float] | None,
               split: str, held_out: dict | None) -> dict:
    """Everything index.json says besides the format's own keys and the shards."""
    opts, rep = layout.options, layout.report
    return {"algo": opts.algo, "algo_options": rep.options, "seed": opts.seed,
            "shuffle": opts.shuffle, "overflow": opts.overflow,
            "group_docs": opts.group_docs, "n_packs": layout.n_packs,
            **layout.counts, **_metrics(layout), "solver": rep.to_json(), "split": split,
            "held_out": held_out, "sources": _source_entries(layout, corpora, factors)}


def held_out_entry(options: PackOptions, v: dict) -> dict:
    return {"path": VALID, "valid_docs": options.valid_docs,
            "valid_fraction": options.valid_fraction,
            "n_docs_held_out": int(sum(s["docs_used"] for s in v["sources"])),
            "n_packs": v["n_packs"], "n_tokens": v["n_tokens"]}


def _source_entries(layout: PackLayout, corpora: list[TokenCorpus],
                    factors: list[float] | None) -> list[dict]:
    """Per source: what it had, its repeat factor, and what the packs use of it (document
    copies and tokens, and the share of all packed tokens)."""
    base = np.cumsum([0] + [len(c) for c in corpora]).astype(np.int64)
    which = np.searchsorted(base, layout.seg_doc, side="right") - 1
    tokens = np.bincount(which, weights=layout.seg_length, minlength=len(corpora))
    docs = np.bincount(which[layout.seg_offset == 0], minlength=len(corpora))
    total = max(int(layout.seg_length.sum()), 1)
    return [{**_source_entry(c), "factor": (factors or [1.0] * len(corpora))[k],
             "docs_used": int(docs[k]), "tokens_used": int(tokens[k]),
             "token_share": float(tokens[k]) / total} for k, c in enumerate(corpora)]


def _write_shard(writer: PackedWriter, layout: PackLayout, packs: slice, segs: slice,
                 corpora: list[TokenCorpus], bar) -> None:
    _write_shard_arrays(writer, layout.seg_length[segs], layout.pack_nseg[packs],
                        layout.seg_doc[segs], layout.seg_offset[segs], corpora, bar)


def _write_shard_arrays(writer: PackedWriter, seg_len, pack_nseg, sdoc, soff,
                        corpora: list[TokenCorpus], bar, k: int | None = None) -> dict:
    """One shard from its segments (output order); ``k`` names it (default: the next)."""
    tok_ends = np.concatenate([[0], np.cumsum(seg_len)]).astype(np.int64)

    def fill_tokens(tokens, mask, a, b, t_a, t_b):
        gather_segments(corpora, sdoc[a:b], soff[a:b], seg_len[a:b], tokens, tok_ends[a:b],
                        mask)

    return writer.write_shard(seg_len, pack_nseg, sdoc, soff, fill_tokens,
                              progress=None if bar is None else bar.update, k=k)


def _source_entry(c: TokenCorpus) -> dict:
    return {
        "prefix": str(c.prefix),
        "manifest_sha256": sha256_file(prefix_paths(c.prefix)["json"]),
        "n_docs": len(c),
        "n_tokens": c.n_tokens,
        "dtype": c.dtype.name,
        "tokenizer_sha256": c.meta["tokenizer"]["sha256"],
        "checksums": (c.meta["checksums"] if "checksums" in c.meta
                      else {q["name"]: q["checksums"] for q in c.meta["parts"]}),
    }


