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
import threading
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
from .meta import (
    METRIC_KEYS,
    group_index_meta,
    held_out_entry,
    index_meta,
    metrics,
    storage,
)
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
        held = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
        shown = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10 else "")
        raise PacktoolError(f"--overwrite only replaces a previous packtool output: {folder} is "
                            f"not a packtool packed dataset ({e}); it holds {shown}: choose "
                            "another --out") from None
    names = {INDEX} | {f["name"] for sh in idx["shards"] for f in sh["files"].values()}
    if idx.get("held_out"):
        names.add(VALID)
        owned(folder / VALID)
    unexpected(folder, names, "packed dataset")


def _plan_digest(options: PackOptions, corpora: list, factors: list[float]) -> str:

    common = {"packtool": __version__, "options": asdict(options), "factors": factors,
              "sources": [c.file_sha256 for c in corpora]}
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
    into ``out/valid``. With ``layout="tokens"`` the sources' token files are verified
    (sha256, a full read, ~1.4 GB/s) before the dataset is committed, since their bytes are
    copied into it (``verify_sources=False`` skips it and says so); an index-layout dataset
    copies no token, and its readers verify each source file on its first read.

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
    # fail before the work (an array task too: it only reads OUT), and again at the end
    check_replaceable(out, overwrite, owned)
    verify_sources = verify_sources and options.layout == "tokens"
    check = SourceCheck(corpora) if verify_sources and not run.one_task else None  # meanwhile
    digest = _plan_digest(options, corpora, factors)
    staging = staging_dir(out, digest, run)
    stored = storage(corpora, options, longest_document(corpora))
    target = pj.Target(str(staging), tuple(str(c.prefix) for c in corpora), stored["dtypes"],
                       options.layout, stored["mask_storage"])
    flow = _Grouped(corpora, factors, options, target, digest) if options.group_docs else \
        _Global(corpora, factors, options, target, digest)
    notes = _prepare(out, staging, run, overwrite)
    pj.provide_sources(target.prefixes, corpora)
    local = not run.one_task and not run.finalize
    try:
        run_jobs(flow.jobs(), run, progress)
        if run.one_task:
            return flow.result(out, time.perf_counter() - t0, [
                f"{run.describe()}: wrote its share of the shards; run --finalize once every "
                "task is done to write index.json"])
        splits = flow.finalize(out, staging, stored, run)
        if check is not None:
            check.wait()
        idx = _commit(out, staging, splits, overwrite, flow.remove_entries)
    except BaseException as e:
        if is_enospc(e):
            raise no_space(e, out, [staging] if local else []) from None
        if local:  # nothing half-written: a local run is undone
            remove_path(staging)
        raise
    res = flow.result(out, time.perf_counter() - t0, notes, idx)
    res.sources_verified = verify_sources
    return res


class SourceCheck:
    """The sources' checksums (sha256 of every file: a full read, ~1.4 GB/s) in a thread of
    its own while this process writes the shards, whose gathers then skip the check on first
    read: the tokens layout copies the sources' bytes, so the dataset is committed only after
    :meth:`wait` (it raises what the check found). Overlapped, the read costs the tokens
    layout's pack ~nothing on 2 cores instead of 1.2 s per 1.6 GB (bench_pack.py section 4)."""

    def __init__(self, corpora: list):
        self.error: BaseException | None = None
        for q in (q for c in corpora for q in c.parts):
            q.checksums = False  # checked here, not again by this process's gathers
        self.thread = threading.Thread(target=self._run, args=(corpora,), daemon=True,
                                       name="packtool-source-checksums")
        self.thread.start()

    def _run(self, corpora: list) -> None:
        try:
            for c in corpora:
                c.verify_checksums()
        except BaseException as e:  # raised in the committing thread by wait()
            self.error = e

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def longest_document(corpora) -> int:
    """The longest document's tokens, from the boundaries (a streaming pass)."""
    longest = 0
    for c in corpora:
        for q in c.parts:
            prev = np.int64(0)
            for a in range(0, len(q), 1 << 20):
                e = np.asarray(q.ends[a:a + (1 << 20)], np.int64)
                if e.size:
                    longest = max(longest, int(np.diff(e, prepend=prev).max()))
                    prev = e[-1]
    return longest


class _Global:
    """One plan of the whole corpus in this process; shard jobs write it."""

    def __init__(self, corpora, factors, options: PackOptions, target, digest):
        t0 = time.perf_counter()
        self.corpora, self.factors, self.options = corpora, factors, options
        lengths = read_lengths(corpora)
        repeats, held = None, None  # a plain pack: no mask of held-out documents (1 B/doc)
        if any(f != 1 for f in factors) or options.valid_docs or options.valid_fraction:
            repeats, held = mixture_plan(lengths, [len(c) for c in corpora], factors, options)
        self.layout = plan_pack(lengths, options, repeats)
        valid = (plan_pack(lengths, options, held.astype(np.int64))
                 if held is not None and held.any() else None)
        del lengths, repeats, held
        self.assign_seconds = time.perf_counter() - t0
        self.layouts = ({"valid": valid, "train": self.layout} if valid is not None
                        else {"train": self.layout})
        self.shards = pj.shard_jobs(self.layouts, {"plan": digest}, target)

    def jobs(self) -> Jobs:
        return Jobs(self.shards, pj.write_shard, self.shards.weights, lambda j: j.label(),
                    "pack")

    def finalize(self, out: Path, staging: Path, stored: dict, run: RunOptions) -> dict:
        """Every shard of the plan checked (size, and crc32 unless this process just wrote
        them all); {split: (index meta without held_out, shard entries)}."""
        entries, bad = {}, []
        for i in range(len(self.shards)):
            job = self.shards.header(i)
            entry, why = pj.check_shard(job, checksums=run.finalize)
            if entry is None:
                bad.append(f"{job.label()}: {why}")
            entries[(job.split, job.k)] = entry
        _refuse_missing(out, bad, len(self.shards), "shards")
        return {split: (lambda held, final, lay=layout, sp=split: index_meta(
                    lay, self.corpora, self.factors, sp, held, final, stored),
                        [entries[(split, k)] for k in range(layout.n_shards)], layout.options)
                for split, layout in self.layouts.items()}

    @staticmethod
    def remove_entries(staging: Path) -> None:
        pj.remove_entries(staging)

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
            warnings=warnings + list(lay.report.warnings))


class _Grouped:
    """--group-docs G: one job per group plans and writes it (packtool.pack.groups)."""

    def __init__(self, corpora, factors, options: PackOptions, target, digest):
        from . import groups

        t0 = time.perf_counter()
        self.g = groups
        self.corpora, self.factors, self.options = corpora, factors, options
        self.groups = groups.group_jobs(corpora, factors, options, target, digest)
        self.assign_seconds = time.perf_counter() - t0

    def jobs(self) -> Jobs:
        return Jobs(self.groups, self.g.write_group, [j.n_tokens for j in self.groups],
                    lambda j: j.label(), "pack")

    def finalize(self, out: Path, staging: Path, stored: dict, run: RunOptions) -> dict:
        folded, bad = {s: self.g.Combined() for s in ("valid", "train")}, []
        for job in self.groups:  # folded as checked: one entry in memory at a time
            entry, why = self.g.check_group(job, checksums=run.finalize)
            if entry is None:
                bad.append(f"{job.label()}: {why}")
                continue
            for split, part in entry["splits"].items():
                folded[split].add(part)
        _refuse_missing(out, bad, len(self.groups), "groups")
        self.combined = {s: c.result() for s, c in folded.items()}
        return {split: (lambda held, final, c=c, split=split: group_index_meta(
                    c, self.options, self.corpora, self.factors, split, held, final, stored),
                        c["shards"], self.options)
                for split, c in self.combined.items() if c is not None}

    def remove_entries(self, staging: Path) -> None:
        self.g.remove_group_entries(staging)

    def result(self, out: Path, seconds: float, warnings: list[str],
               idx: dict | None = None) -> PackResult:
        c = getattr(self, "combined", {}).get("train")
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
            warnings=warnings)


def _refuse_missing(out: Path, bad: list[str], n: int, what: str) -> None:
    if bad:
        shown = "; ".join(bad[:20]) + (f"; and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise PacktoolError(f"{len(bad)} of {n} {what} of {out} are not written: {shown}. "
                            f"Run the tasks that own them again (finished {what} are "
                            "skipped)")


def _commit(out: Path, staging: Path, splits: dict, overwrite: bool, remove_entries) -> dict:
    """index.json of each split (OUT/valid's first, the training index names it), the jobs'
    entries and temporaries removed, and the staging folder put in place of OUT."""
    from .._atomic import fsync_path
    from .._io import write_new

    held, idx = None, None
    for split in ("valid", "train"):
        if split not in splits:
            continue
        make_meta, shards, options = splits[split]
        folder = staging / VALID if split == "valid" else staging
        final = out / VALID if split == "valid" else out
        idx = index(make_meta(held, final), shards)
        if (folder / INDEX).exists():
            (folder / INDEX).unlink()
        write_new(folder / INDEX, json.dumps(idx, indent=1) + "\n")
        fsync_path(folder / INDEX)
        if split == "valid":
            held = held_out_entry(options, idx)
    remove_entries(staging)
    clear_temporaries(staging)
    check_replaceable(out, overwrite, owned)
    commit_dir(staging, out)
    return idx


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
