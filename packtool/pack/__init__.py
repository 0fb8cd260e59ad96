"""``packtool pack``: token corpora -> a packed dataset, as plan, jobs, finalize.

:func:`packtool.pack.plan.plan_pack` decides everything from lengths alone (pure, tested without
disk); the shards are written as jobs (:mod:`.jobs`) by whichever executor runs them
(:mod:`packtool.executors`: here, on Ray, or as array tasks); finalize writes ``index.json``
and puts the dataset in place. A local run is the one-task case of that path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

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
from .._progress import shown
from ..errors import PacktoolError
from ..executors import RunOptions, run_jobs
from ..formats._manifest import manifest_text
from ..formats.packed import INDEX, VALID, index, read_index
from ..storage import is_url
from .flow import SourceCheck, open_sources, plan_flow, plan_sources
from .meta import held_out_entry
from .plan import PackOptions
from .result import PackResult, run_warnings

__all__ = ["PackResult", "open_sources", "owned", "pack", "pack_corpus"]


def pack_corpus(prefixes: list[str | Path], out: str | Path, seq_len: int, algo: str = "bfd",
                *, overwrite: bool = False, progress: bool = False, **options) -> PackResult:
    """Pack token files into a packed dataset directory ``out``. ``options`` are the fields
    of :class:`packtool.pack.plan.PackOptions` (overflow, seed, shuffle, layout, shard_size...)."""
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
        listing = ", ".join(held[:10]) + (f" and {len(held) - 10} more" if len(held) > 10
                                           else "")
        raise PacktoolError(f"--overwrite only replaces a previous packtool output: {folder} is "
                            f"not a packtool packed dataset ({e}); it holds {listing}: choose "
                            "another --out") from None
    names = {INDEX} | {f["name"] for sh in idx["shards"] for f in sh["files"].values()}
    if idx.get("held_out"):
        names.add(VALID)
        owned(folder / VALID)
    unexpected(folder, names, "packed dataset")


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
    (crc32 where recorded, else sha256: a full read) before the dataset is committed, since
    their bytes are copied into it (``verify_sources=False`` skips it and says so); an
    index-layout dataset copies no token, and its readers verify each source file on its
    first read.

    ``run``: where the jobs run (:class:`packtool.executors.RunOptions`). The run holds
    ``out``'s lock throughout (a second run fails at once); array tasks hold it shared."""
    run = run or RunOptions()
    run.check()
    options.check()
    if is_url(out):  # each job written where it runs, then published: packtool.pack.remote
        from .remote import pack_to_store

        return pack_to_store(prefixes, str(out), options, overwrite=overwrite,
                             progress=progress, verify_sources=verify_sources, run=run)
    out = Path(os.path.abspath(out))
    with output_lock(out, shared=run.one_task) as notes:
        result = _pack(prefixes, out, options, run, overwrite, progress, verify_sources)
    result.warnings[:0] = notes
    return result


def _pack(prefixes, out: Path, options, run, overwrite, progress, verify_sources) -> PackResult:
    t0 = time.perf_counter()
    corpora, factors, digest, stored = plan_sources(prefixes, options)
    for c in corpora:
        if is_url(c.prefix):
            continue
        src = Path(c.prefix).resolve()
        if out == src.parent or out in src.parents:
            raise PacktoolError(f"--out {out} contains the source {c.prefix}; write the packed "
                                "dataset to a directory of its own")
    # fail before the work (an array task too: it only reads OUT), and again at the end
    check_replaceable(out, overwrite, owned)
    verify_sources = verify_sources and options.layout == "tokens"
    check = SourceCheck(corpora) if verify_sources and not run.one_task else None  # meanwhile
    staging = staging_dir(out, digest, run)
    with shown(progress):  # a packer that runs long (optimal, nnlshp) shows it is working
        flow = plan_flow(corpora, factors, options, digest, stored, str(staging))
    notes = _prepare(out, staging, run, overwrite)
    local = not run.one_task and not run.finalize
    try:
        run_jobs(flow.jobs(), run, progress)
        if run.one_task:
            return flow.result(out, time.perf_counter() - t0, [
                f"{run.describe()}: wrote its share of the shards; run --finalize once every "
                "task is done to write index.json"])
        splits = flow.finalize(out, stored, run)
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
    res.warnings += run_warnings(res, options.seq_len)
    return res


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
        write_new(folder / INDEX, manifest_text(idx))
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
    if staging.is_symlink() or (staging.exists() and not staging.is_dir()):
        raise PacktoolError(f"{staging} is a symbolic link or not a folder; packtool assembles "
                            f"{out} only in a real folder of its own (never through a link): "
                            "remove it, or choose another --out")
    if run.finalize and not staging.is_dir():
        raise PacktoolError(f"--finalize: no task of this plan has run for {out} (no "
                            f"{staging.name}); run the array tasks first (--tasks N --task K)")
    notes = [] if run.one_task else reclaim(out, inside=staging)  # before ours exists
    staging.mkdir(exist_ok=True)
    return notes
