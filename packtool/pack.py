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
from .errors import PacktoolError
from .formats.packed import INDEX, PackedWriter
from .formats.tokens import TokenCorpus, gather_segments, open_tokens, prefix_paths
from .metrics import bounds_text, pack_metrics
from .plan import PackLayout, PackOptions, plan_pack


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
            raise PacktoolError(f"token files {c.prefix} given twice; each corpus is packed once")
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
            + f"; {self.n_shards} shard(s) in {self.seconds:.1f}s "
            f"(assignment {self.assign_seconds:.2f}s)"
            + ("; source checksums verified" if self.sources_verified else "")]
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
         overwrite: bool = False, progress: bool = False, verify_sources: bool = True
         ) -> PackResult:
    """Plan, then write. Sources' checksums are verified before anything is written (a full
    read of the sources, ~1.4 GB/s; ``verify_sources=False`` skips it and says so)."""
    options.check()
    with output_lock(out) as notes:  # the whole run: a second one to ``out`` fails at once
        result = _pack(prefixes, out, options, overwrite, progress, verify_sources)
    result.warnings[:0] = notes
    return result


def _pack(prefixes, out, options: PackOptions, overwrite: bool, progress: bool,
          verify_sources: bool) -> PackResult:
    t0 = time.perf_counter()
    corpora = open_sources(prefixes)
    out_dir = Path(out).resolve()
    for c in corpora:
        if out_dir == c.prefix.resolve().parent or out_dir in c.prefix.resolve().parents:
            raise PacktoolError(f"--out {out} contains the source {c.prefix}; write the packed "
                                "dataset to a directory of its own")
    lengths = np.concatenate([c.lengths for c in corpora])
    t_assign = time.perf_counter()
    layout = plan_pack(lengths, options)
    assign_seconds = time.perf_counter() - t_assign
    if verify_sources:
        for c in corpora:
            c.verify_checksums()
    index = write_packed(layout, corpora, out, overwrite=overwrite, progress=progress)
    return PackResult(
        out=str(out), algo=options.algo, seq_len=options.seq_len, n_packs=layout.n_packs,
        n_tokens=layout.counts["n_tokens"], n_segments=layout.counts["n_segments"],
        counts=layout.counts, metrics={k: index[k] for k in _METRIC_KEYS},
        solver=index["solver"], seconds=time.perf_counter() - t0,
        assign_seconds=assign_seconds, n_shards=layout.n_shards,
        sources_verified=verify_sources, warnings=list(layout.report.warnings))


_METRIC_KEYS = ("efficiency", "lower_bound_packs", "gap_percent", "l2_bound_packs",
                "lp_bound_packs", "lp_converged", "best_bound_packs",
                "gap_to_best_bound_percent", "packing_factor")


def write_packed(layout: PackLayout, corpora: list[TokenCorpus], out: str | Path, *,
                 overwrite: bool = False, progress: bool = False) -> dict:
    """Write ``layout``'s shards from ``corpora`` into ``out`` (atomically); the index."""
    opts = layout.options
    tok_dtype = max((c.dtype for c in corpora), key=lambda d: d.itemsize)
    has_mask = any(c.mask is not None for c in corpora)
    bar = _progress_bar(layout.counts["n_tokens"], progress)
    try:
        with atomic_dir(Path(out), overwrite, owned_marker=INDEX) as tmp:
            writer = PackedWriter(tmp, opts.seq_len, tok_dtype, has_mask)
            for k in range(layout.n_shards):
                packs, segs = layout.shard(k)
                _write_shard(writer, layout, packs, segs, corpora, bar)
            rep = layout.report
            metrics = pack_metrics(layout.seg_length, opts.seq_len, layout.n_packs,
                                   rep.lp_bound, rep.lp_converged)
            index = writer.finish({
                "algo": opts.algo, "algo_options": rep.options, "seed": opts.seed,
                "shuffle": opts.shuffle, "overflow": opts.overflow, "n_packs": layout.n_packs,
                **layout.counts, **metrics, "solver": rep.to_json(),
                "sources": [_source_entry(c) for c in corpora]})
    finally:
        if bar is not None:
            bar.close()
    return index


def _write_shard(writer: PackedWriter, layout: PackLayout, packs: slice, segs: slice,
                 corpora: list[TokenCorpus], bar) -> None:
    seg_len = layout.seg_length[segs]
    sdoc, soff = layout.seg_doc[segs], layout.seg_offset[segs]
    tok_ends = np.concatenate([[0], np.cumsum(seg_len)]).astype(np.int64)

    def fill_tokens(tokens, mask, a, b, t_a, t_b):
        gather_segments(corpora, sdoc[a:b], soff[a:b], seg_len[a:b], tokens, tok_ends[a:b],
                        mask)

    writer.write_shard(seg_len, layout.pack_nseg[packs], sdoc, soff, fill_tokens,
                       progress=None if bar is None else bar.update)


def _source_entry(c: TokenCorpus) -> dict:
    return {
        "prefix": str(c.prefix),
        "manifest_sha256": sha256_file(prefix_paths(c.prefix)["json"]),
        "n_docs": len(c),
        "n_tokens": c.n_tokens,
        "dtype": c.dtype.name,
        "tokenizer_sha256": c.meta["tokenizer"]["sha256"],
        "checksums": c.meta["checksums"],
    }


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="tok", unit_scale=True, desc="pack", dynamic_ncols=True,
                mininterval=0.5)
