"""How a pack run's plan becomes jobs and an index: :class:`WholeCorpusPlan` plans the whole
corpus in this process and hands out one job per shard (:mod:`.shards`); :class:`StreamedPlan`
(``--group-docs G``) hands out one job per group of documents, each planning and writing its
own shards (:mod:`.streamed`). Both hold the jobs as ``items`` (each run by ``write``, of
``weights`` tokens), check every job's output at finalize, wherever it was written (the
staging folder, or a store: ``check``), and say what the index of each split holds."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import numpy as np

from .. import __version__, conflicts
from ..errors import PacktoolError
from ..formats.tokens import open_tokens, read_lengths
from ..storage import local_file
from . import shards as pj
from .caps import DocImages
from .meta import (
    METRIC_KEYS,
    group_index_meta,
    index_meta,
    metrics,
    recorded_overflow,
    storage,
)
from .mixture import mixture_plan, refuse_idle, resolve_sources, share_factors
from .plan import PackOptions, plan_pack
from .result import PackResult


def longest_document(corpora) -> int:
    """The longest document's tokens, from the boundaries (a streaming pass)."""
    chunks = pj.length_chunks(corpora)
    return max((int(x.max()) for k in range(len(corpora)) for x in chunks(k)), default=0)


def with_targets(sources: list[dict], prefixes) -> list[dict]:
    """The result's per-source entries with ``target_share`` (normalised) beside the
    ``token_share`` reached, when the sources were given as ``PREFIX=SHARE``."""
    shares = resolve_sources(prefixes)[1]
    if shares is None or len(shares) != len(sources):
        return sources
    return [{**src, "target_share": s / sum(shares)}
            for src, s in zip(sources, shares, strict=True)]


def open_sources(prefixes: list[str | Path], checksums: bool = False) -> list:
    """Open token corpora to pack together (one tokenizer, each once); with ``checksums``
    re-hash every source file first, so a corrupt source never reaches a shard."""
    if not prefixes:
        raise PacktoolError("no token files given; pass the --out PREFIX of packtool tokenize")
    corpora = [open_tokens(p) for p in prefixes]
    seen = set()
    for c in corpora:
        key = local.resolve() if (local := local_file(c.prefix)) else c.prefix
        if key in seen:
            raise PacktoolError(f"token files {c.prefix} given twice; to use a corpus more than "
                                f"once give it a repeat factor ({c.prefix}:2.0) instead")
        seen.add(key)
    shas = {c.meta["tokenizer"]["sha256"] for c in corpora}
    if len(shas) > 1:
        raise PacktoolError(
            "the token files were made with different tokenizers (sha256 "
            + ", ".join(sorted(s[:12] for s in shas))
            + "); re-tokenize them with one tokenizer before packing them together")
    if checksums:
        for c in corpora:
            c.verify_checksums()
    return corpora


def plan_digest(options: PackOptions, corpora: list, factors: list[float]) -> str:

    # --check decides how this run reads its sources, not what it writes: a task run
    # with either finds the other's plan
    opts = {k: v for k, v in options.flat().items() if k != "source_check"}
    common = {"packtool": __version__, "options": opts, "factors": factors,
              "sources": [c.file_sha256 for c in corpora]}
    return hashlib.sha256(json.dumps(common, sort_keys=True).encode()).hexdigest()


class SourceCheck:
    """The sources' checksums (crc32 of every file, ~4 GB/s; sha256, ~1.4 GB/s, for a corpus
    made before token manifests recorded crc32 or with ``strong``: a full read) in a thread of
    its own while this process writes the shards, whose gathers then skip the check on first
    read: the tokens layout copies the sources' bytes, so the dataset is committed only after
    :meth:`wait` (it raises what the check found). Overlapped, the read costs the tokens
    layout's pack ~nothing on 2 cores instead of 1.2 s per 1.6 GB (bench_pack.py section 4)."""

    def __init__(self, corpora: list, strong: bool = False):
        self.error: BaseException | None = None
        self.strong = strong  # sha256 too (--check sha256)
        for q in (q for c in corpora for q in c.parts):
            q.checksums = False  # checked here, not again by this process's gathers
        self.thread = threading.Thread(target=self._run, args=(corpora,), daemon=True,
                                       name="packtool-source-checksums")
        self.thread.start()

    def _run(self, corpora: list) -> None:
        try:
            for c in corpora:
                c.verify_checksums(strong=self.strong)
        except BaseException as e:  # raised in the committing thread by wait()
            self.error = e

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def plan_sources(prefixes, options: PackOptions) -> tuple[list, list[float], str, dict]:
    """The sources opened (``PREFIX:FACTOR`` read; ``PREFIX=SHARE`` turned into factors), the
    plan's digest, and the dataset's dtypes and mask storage: what every way of writing a
    dataset starts from."""
    specs, shares = resolve_sources(prefixes, options.tokens)
    corpora = open_sources([prefix for prefix, _ in specs])
    factors = [factor for _, factor in specs]
    if shares is not None:
        factors = share_factors(read_lengths(corpora), [len(c) for c in corpora], shares,
                                options, [str(c.prefix) for c in corpora])
    digest = plan_digest(options, corpora, factors)
    return corpora, factors, digest, storage(corpora, options, longest_document(corpora))


def plan_flow(corpora, factors, options: PackOptions, digest: str, stored: dict,
              staging: str):
    """The run's plan as jobs writing into ``staging`` (a :class:`WholeCorpusPlan`, or a
    :class:`StreamedPlan` with ``--group-docs``); this process's opened sources handed to
    them."""
    from ..formats.tokens.groups import group_table

    table = group_table(corpora)
    images = any(c.vision for c in corpora)
    conflicts.check(options.features() | {"groups" if table is not None else "plain"}
                    | ({"mixture"} if any(f != 1 for f in factors) else set())
                    | ({"images"} if images else set()))
    if not images and (options.max_images or options.max_vision_tokens):
        raise PacktoolError("--max-images / --max-vision-tokens cap a pack's images, and no "
                            "source holds any (tokenize --vision): drop them")
    trees = bool(options.share_prompt or options.share_prefix)
    target = pj.Target(staging, tuple(str(c.prefix) for c in corpora), stored["dtypes"],
                       options.layout, stored["mask_storage"], table is not None or trees,
                       trees, images)
    flow = StreamedPlan(corpora, factors, options, target, digest) if options.group_docs else \
        WholeCorpusPlan(corpora, factors, options, target, digest, table)
    pj.provide_sources(target.prefixes, corpora)
    return flow


class WholeCorpusPlan:
    """One plan of the whole corpus in this process; shard jobs write it."""

    def __init__(self, corpora, factors, options: PackOptions, target, digest, table=None):
        t0 = time.perf_counter()
        self.corpora, self.factors, self.options = corpora, factors, options
        lengths, self.layouts = read_lengths(corpora), {}
        if options.share_prefix:  # prefix trees: packtool.pack.trees
            from .trees import plan_trees

            self.layout = plan_trees(lengths, options, table, corpora)
        elif table is not None:  # pairs and groups: packtool.pack.pairs
            from .pairs import plan_grouped

            self.layout = plan_grouped(lengths, options, table)
        else:
            sizes, names = [len(c) for c in corpora], [str(c.prefix) for c in corpora]
            repeats, held = None, None  # a plain pack: no mask of held-out documents (1 B/doc)
            if any(f != 1 for f in factors) or options.valid_docs or options.valid_fraction:
                repeats, held = mixture_plan(lengths, sizes, factors, options, names)
            else:  # each document once: a source with none is refused all the same
                at = np.cumsum([0, *sizes])
                nonempty = [int(np.count_nonzero(lengths[a:b]))
                            for a, b in zip(at[:-1], at[1:], strict=True)]
                refuse_idle(nonempty, nonempty, factors, names)
            images = DocImages.of(corpora)  # None: no image in any source
            self.layout = plan_pack(lengths, options, repeats, images=images)
            if held is not None and held.any():
                self.layouts["valid"] = plan_pack(lengths, options, held.astype(np.int64),
                                                  images=images)
            del repeats, held
        del lengths
        self.layouts["train"] = self.layout
        refuse_empty(self.layout.n_packs, options)
        self.assign_seconds = time.perf_counter() - t0
        self.items = pj.ShardJobs(self.layouts, {"plan": digest}, target)  # the jobs
        self.write, self.weights = pj.write_shard, self.items.weights

    def finalize(self, out, stored: dict, check) -> dict:
        """Every shard of the plan checked (``check(job)``: its entry and files where they
        were written, :func:`packtool.pack.shards.check_job`);
        {split: (index meta without held_out, shard entries)}."""
        headers = map(self.items.header, range(len(self.items)))
        entries = {(job.split, job.k): entry for job, entry in
                   checked(headers, len(self.items), check, out, "shards")}
        return {split: (lambda held, final, lay=layout, sp=split: index_meta(
                    lay, self.corpora, self.factors, sp, held, final, stored),
                        [entries[(split, k)] for k in range(layout.n_shards)], layout.options)
                for split, layout in self.layouts.items()}

    def result(self, out: Path, seconds: float, warnings: list[str],
               idx: dict | None = None) -> PackResult:
        lay = self.layout
        return PackResult(
            out=str(out), algo=self.options.algo, seq_len=self.options.seq_len,
            n_packs=lay.n_packs, n_tokens=lay.counts["n_tokens"],
            n_segments=lay.counts["n_segments"], counts=lay.counts, n_shards=lay.n_shards,
            layout=self.options.layout, assign_seconds=self.assign_seconds,
            metrics=metrics(lay) if idx is None else {k: idx[k] for k in METRIC_KEYS},
            solver=lay.report.to_json() if idx is None else idx["solver"], seconds=seconds,
            sources_verified=False, sources=[] if idx is None else idx["sources"],
            valid=None if idx is None else idx["held_out"],
            vsl=None if idx is None else idx.get("vsl"), overflow=recorded_overflow(lay),
            groups=getattr(lay, "groups", None) if idx is None else idx.get("groups"),
            trees=getattr(lay, "trees", None) if idx is None else idx.get("trees"),
            warnings=warnings + list(lay.report.warnings))


class StreamedPlan:
    """--group-docs G: one job per group plans and writes it (packtool.pack.streamed)."""

    def __init__(self, corpora, factors, options: PackOptions, target, digest):
        from . import streamed

        t0 = time.perf_counter()
        self.g = streamed
        self.corpora, self.factors, self.options = corpora, factors, options
        self.items = streamed.group_jobs(corpora, factors, options, target, digest)
        self.write, self.weights = streamed.write_group, [j.n_tokens for j in self.items]
        self.combined: dict = {}  # per split, what finalize folded from the groups' entries
        self.assign_seconds = time.perf_counter() - t0

    def finalize(self, out, stored: dict, check) -> dict:
        folded = {s: self.g.SplitTotals(self.options.seq_len) for s in ("valid", "train")}
        for _, entry in checked(self.items, len(self.items), check, out, "groups"):
            for split, part in entry["splits"].items():  # folded as checked: one in memory
                folded[split].add(part)
        self.combined = {s: c.result() for s, c in folded.items()}
        refuse_empty((self.combined["train"] or {}).get("n_packs", 0), self.options)
        return {split: (lambda held, final, c=c, split=split: group_index_meta(
                    c, self.options, self.corpora, self.factors, split, held, final, stored),
                        c["shards"], self.options)
                for split, c in self.combined.items() if c is not None}

    def result(self, out: Path, seconds: float, warnings: list[str],
               idx: dict | None = None) -> PackResult:
        c = self.combined.get("train")
        counts = c["counts"] if c else {}
        return PackResult(
            out=str(out), algo=self.options.algo, seq_len=self.options.seq_len,
            n_packs=idx["n_packs"] if idx else 0, n_tokens=idx["n_tokens"] if idx else 0,
            n_segments=idx["n_segments"] if idx else 0, counts=counts,
            n_shards=len(idx["shards"]) if idx else 0, layout=self.options.layout,
            assign_seconds=self.assign_seconds,
            metrics={k: idx[k] for k in METRIC_KEYS} if idx else {},
            solver=idx["solver"] if idx else {}, seconds=seconds, sources_verified=False,
            sources=idx["sources"] if idx else [], valid=idx["held_out"] if idx else None,
            overflow=self.options.overflow, warnings=warnings)


def refuse_empty(n_packs: int, options: PackOptions) -> None:
    """An empty training set is refused (as ``pack --help`` says), before anything is
    committed: every document or group dropped by --overflow drop, or none fitting."""
    if not n_packs:
        raise PacktoolError(
            f"the training set would be empty: no document or group is left at --seq-len "
            f"{options.seq_len:,} with --overflow {options.overflow} (every one longer, and "
            "dropped); raise --seq-len, or use --overflow split for plain documents")


def checked(jobs, n: int, check, out: Path, what: str):
    """(job, its entry) of each of the ``n`` jobs written (``check(job)``: (entry or None,
    why)); the others refused together once all are checked, each named."""
    bad = []
    for job in jobs:
        entry, why = check(job)
        if entry is None:
            bad.append(f"{job.label()}: {why}")
        else:
            yield job, entry
    if bad:
        shown = "; ".join(bad[:20]) + (f"; and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise PacktoolError(f"{len(bad)} of {n} {what} of {out} are not written: {shown}. "
                            f"Run the tasks that own them again (finished {what} are "
                            "skipped)")
