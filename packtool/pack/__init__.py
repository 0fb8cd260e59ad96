"""``packtool pack``: token corpora -> a packed dataset, as plan, jobs, finalize.

:func:`packtool.plan.plan_pack` decides everything from lengths alone (pure, tested without
disk); the shards are written as jobs (:mod:`.jobs`) by whichever executor runs them
(:mod:`packtool.executors`: here, on Ray, or as array tasks); finalize writes ``index.json``
and puts the dataset in place. A local run is the one-task case of that path.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import __version__
from .._atomic import (
    check_replaceable,
    clear_temporaries,
    commit_dir,
    is_enospc,
    no_space,
    output_lock,
    reclaim,
    remove_path,
    temp_name,
    unexpected,
)
from ..errors import PacktoolError
from ..executors import Jobs, RunOptions, run_jobs
from ..formats.packed import INDEX, VALID, index, read_index
from ..formats.tokens import open_tokens, read_lengths
from ..mixture import mixture_plan, parse_source
from ..plan import PackOptions, plan_pack
from . import jobs as pj
from .meta import METRIC_KEYS, held_out_entry, index_meta, metrics, storage
from .result import PackResult

__all__ = ["PackResult", "open_sources", "owned", "pack", "pack_corpus"]


def open_sources(prefixes: list[str | Path], checksums: bool = False) -> list:
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
            + "); re-tokenize them with one tokenizer before packing them together")
    if checksums:
        for c in corpora:
            c.verify_checksums()
    return corpora


def pack_corpus(prefixes: list[str | Path], out: str | Path, seq_len: int, algo: str = "bfd",
                *, overwrite: bool = False, progress: bool = False, **options) -> PackResult:
    """Pack token files into a packed dataset directory ``out``. ``options`` are the fields
    of :class:`packtool.plan.PackOptions` (overflow, seed, shuffle, layout, shard_size...)."""
    try:
        opts = PackOptions(seq_len=seq_len, algo=algo, **options)
    except TypeError as e:
        raise PacktoolError(f"pack: {e}") from None
    return pack(prefixes, out, opts, overwrite=overwrite, progress=progress)


def owned(folder: Path) -> None:
    """Prove ``folder`` a packed dataset of ours: a valid index.json (format, schema,
    digest) and nothing in it but the files that index lists (and the held-out split, the
    same way), else a refusal naming what is not ours."""
    folder = Path(folder)
    try:
        idx = read_index(folder)
    except PacktoolError as e:
        raise PacktoolError(f"--overwrite only replaces a previous packtool output: {folder} is "
                            f"not a packtool packed dataset ({e}); choose another --out"
                            ) from None
    names = {INDEX} | {f["name"] for sh in idx["shards"] for f in sh["files"].values()}
    if idx.get("held_out"):
        names.add(VALID)
        owned(folder / VALID)
    unexpected(folder, names, "packed dataset")


def _plan_digest(options: PackOptions, corpora: list, factors: list[float]) -> str:
    from .._io import sha256_file
    from ..formats.tokens import prefix_paths

    common = {"packtool": __version__, "options": asdict(options), "factors": factors,
              "sources": [sha256_file(prefix_paths(c.prefix)["json"]) for c in corpora]}
    return hashlib.sha256(json.dumps(common, sort_keys=True).encode()).hexdigest()


def staging_dir(out: Path, digest: str, run: RunOptions) -> Path:
    """Where the shards are assembled: a temporary of this process for a local run (removed
    if it fails, reclaimed if it is killed); for Ray or array tasks a folder named by the
    plan, which every task (and a re-run, which resumes) finds."""
    if run.executor == "local" and run.tasks is None and not run.finalize:
        return temp_name(out)
    return out.with_name(f".{out.name}.staging-{digest[:16]}")


def pack(prefixes: list[str | Path], out: str | Path, options: PackOptions, *,
         overwrite: bool = False, progress: bool = False, verify_sources: bool = True,
         run: RunOptions | None = None) -> PackResult:
    """Plan, write the shards as jobs, finalize. ``prefixes`` may carry repeat factors
    (``web:2.0``); held-out documents (``options.valid_docs``/``valid_fraction``) are packed
    into ``out/valid``. Sources' checksums are verified before the dataset is committed (a
    full read, ~1.4 GB/s; ``verify_sources=False`` skips it and says so).

    ``run``: where the jobs run (:class:`packtool.executors.RunOptions`). The run holds
    ``out``'s lock throughout (a second run fails at once); array tasks hold it shared."""
    run = run or RunOptions()
    run.check()
    options.check()
    out = Path(os.path.abspath(out))
    with output_lock(out, shared=run.one_task) as notes:
        result = _pack(prefixes, out, options, run, overwrite, progress, verify_sources)
    result.warnings[:0] = notes
    return result


def _pack(prefixes, out: Path, options, run, overwrite, progress, verify_sources) -> PackResult:
    t0 = time.perf_counter()
    specs = [parse_source(p) for p in prefixes]
    corpora = open_sources([prefix for prefix, _ in specs])
    factors = [factor for _, factor in specs]
    for c in corpora:
        src = c.prefix.resolve()
        if out == src.parent or out in src.parents:
            raise PacktoolError(f"--out {out} contains the source {c.prefix}; write the packed "
                                "dataset to a directory of its own")
    if not run.one_task:
        check_replaceable(out, overwrite, owned)  # fail before the work, and again at the end
    lengths = read_lengths(corpora)
    t_assign = time.perf_counter()
    repeats, held = mixture_plan(lengths, [len(c) for c in corpora], factors, options)
    layout = plan_pack(lengths, options, repeats)
    valid = plan_pack(lengths, options, held.astype(np.int64)) if held.any() else None
    assign_seconds = time.perf_counter() - t_assign
    digest = _plan_digest(options, corpora, factors)
    staging = staging_dir(out, digest, run)
    stored = storage(corpora, options, int(lengths.max()) if lengths.size else 0)
    target = pj.Target(str(staging), tuple(str(c.prefix) for c in corpora), stored["dtypes"],
                       options.layout, stored["mask_storage"])
    layouts = {"valid": valid, "train": layout} if valid is not None else {"train": layout}
    jobs = pj.shard_jobs(layouts, {"plan": digest}, target)
    notes = _prepare(out, staging, run, overwrite)
    pj.provide_sources(target.prefixes, corpora)
    base = dict(out=str(out), algo=options.algo, seq_len=options.seq_len,
                n_packs=layout.n_packs, n_tokens=layout.counts["n_tokens"],
                n_segments=layout.counts["n_segments"], counts=layout.counts,
                n_shards=layout.n_shards, layout=options.layout,
                assign_seconds=assign_seconds)
    local = not run.one_task and not run.finalize
    try:
        run_jobs(Jobs(jobs, pj.write_shard, jobs.weights, lambda j: j.label(), "pack"), run,
                 progress)
        if run.one_task:
            return PackResult(**base, metrics=metrics(layout), solver=layout.report.to_json(),
                              seconds=time.perf_counter() - t0, sources_verified=False,
                              warnings=layout.report.warnings + [
                                  f"{run.describe()}: wrote its share of the shards; run "
                                  "--finalize once every task is done to write index.json"])
        idx = _finalize(out, staging, jobs, layouts, corpora, factors, stored, overwrite,
                        verify_sources, run)
    except BaseException as e:
        if is_enospc(e):
            raise no_space(e, out, [staging] if local else []) from None
        if local:  # nothing half-written: a local run is undone
            remove_path(staging)
        raise
    return PackResult(**base, metrics={k: idx[k] for k in METRIC_KEYS}, solver=idx["solver"],
                      seconds=time.perf_counter() - t0, sources_verified=verify_sources,
                      sources=idx["sources"], valid=idx["held_out"],
                      warnings=notes + list(layout.report.warnings))


def _prepare(out: Path, staging: Path, run: RunOptions, overwrite: bool) -> list[str]:
    """The staging folder of this plan, ready; a staging folder of another plan is another
    run's work in progress: refused (finish it with --finalize) unless --overwrite discards
    it, which only a whole run (holding the lock alone) may do."""
    others = [p for p in out.parent.glob(f".{out.name}.staging-*")
              if p != staging and p.is_dir() and not p.is_symlink()]
    if others and not (overwrite and not run.one_task):
        raise PacktoolError(
            f"{out} is being assembled from another plan ({others[0].name}: other sources, "
            "options or version); finish that run (the same command with --finalize) or "
            "pass --overwrite to discard it")
    for p in others:
        remove_path(p)
    if run.finalize and not staging.is_dir():
        raise PacktoolError(f"--finalize: no task of this plan has run for {out} (no "
                            f"{staging.name}); run the array tasks first (--tasks N --task K)")
    notes = [] if run.one_task else reclaim(out, inside=staging)  # before ours exists
    staging.mkdir(exist_ok=True)
    return notes


def _finalize(out: Path, staging: Path, jobs, layouts, corpora, factors, stored, overwrite,
              verify_sources: bool, run: RunOptions) -> dict:
    """Check every shard of the plan (size and crc32 of every file, unless this process
    just wrote them all), the sources, then write index.json (OUT/valid's first) and put
    the staging folder in place of OUT."""
    from .._atomic import fsync_path
    from .._io import write_new

    entries, bad = {}, []
    for job in jobs:
        entry, why = pj.check_shard(job, checksums=run.finalize)
        if entry is None:
            bad.append(f"{job.label()}: {why}")
        entries[(job.split, job.k)] = entry
    if bad:
        shown = "; ".join(bad[:20]) + (f"; and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise PacktoolError(f"{len(bad)} of {len(jobs)} shards of {out} are not written: "
                            f"{shown}. Run the tasks that own them again (finished shards are "
                            "skipped)")
    if verify_sources:
        for c in corpora:
            c.verify_checksums()
    held, idx = None, None
    for split, layout in layouts.items():
        folder = staging / VALID if split == "valid" else staging
        final = out / VALID if split == "valid" else out
        shards = [entries[(split, k)] for k in range(layout.n_shards)]
        idx = index(index_meta(layout, corpora, factors, split, held, final, stored), shards)
        if (folder / INDEX).exists():
            (folder / INDEX).unlink()
        write_new(folder / INDEX, json.dumps(idx, indent=1) + "\n")
        fsync_path(folder / INDEX)
        if split == "valid":
            held = held_out_entry(layout.options, idx)
    pj.remove_entries(staging)
    clear_temporaries(staging)
    check_replaceable(out, overwrite, owned)
    commit_dir(staging, out)
    return idx
