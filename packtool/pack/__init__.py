"""``packtool pack``: token corpora -> a packed dataset, as plan, jobs, finalize.

:func:`packtool.pack.plan.plan_pack` decides everything from lengths alone (pure, tested
without disk); the shards are written as jobs (:mod:`.jobs`, :mod:`.groups`, run against the
output by :mod:`.tasks`) by whichever executor runs them (:mod:`packtool.executors`: here, on
Ray, or as array tasks); finalize writes ``index.json``. A local run is the one-task case of
that path, and a bucket is written the same way as a folder (:mod:`packtool.storage.output`)::

    local folder OUT     jobs write into a staging folder beside OUT (a temporary of this
                         process, or .OUT.staging-<digest> for Ray and array tasks); the
                         index is written there and the folder swapped in: the commit
    bucket s3://b/OUT    no rename: jobs publish straight to OUT (.packtool-plan.json vouches
                         for their objects until an index does), index.json put last: the
                         commit; entries, the marker and leftovers of ours removed after it

Modules: :mod:`.plan` the plan from lengths, :mod:`.segments` documents cut into segments
(``--overflow``), :mod:`.vsl` ``--vsl`` cutting, :mod:`.grouped` the plan of pairs and
groups, :mod:`.mixture` mixtures and held-out splits from lengths, :mod:`.selection` their
draws as bitmaps (``--group-docs``), :mod:`.order` the packs' output order (shuffle,
``--balance attention``), :mod:`.flow` the plan turned into jobs and an index,
:mod:`.jobs` one shard's job, :mod:`.groups` the jobs of ``--group-docs``,
:mod:`.entries` what a finished job records, :mod:`.tasks` the jobs run against the
output, :mod:`.meta` index.json's keys besides the format's, :mod:`.result` what
``pack`` reports.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import _signals
from .._atomic import (
    check_replaceable,
    clear_temporaries,
    commit_dir,
    is_enospc,
    no_space,
    reclaim,
    remove_path,
    temp_name,
)
from .._progress import shown
from ..errors import PacktoolError, listing
from ..executors import Jobs, RunOptions, finished_jobs, run_jobs
from ..formats._manifest import manifest_text
from ..formats.packed import INDEX, VALID, index
from ..formats.packed.files import dataset_files, ours_hidden
from ..storage import default_options, is_url
from ..storage.output import Output
from .flow import SourceCheck, open_sources, plan_flow, plan_sources, with_targets
from .meta import held_out_entry
from .plan import PackOptions
from .result import PackResult, run_warnings
from .tasks import PackTasks, check_job, run_task

__all__ = ["PackResult", "open_sources", "owned", "pack", "pack_corpus"]
MARKER = ".packtool-plan.json"
PLAN_FORMAT = "packtool.packed.plan"


def pack_corpus(prefixes: list[str | Path], out: str | Path, seq_len: int, algo: str = "bfd",
                *, overwrite: bool = False, progress: bool = False, **options) -> PackResult:
    """Pack token files into a packed dataset directory ``out``. ``options`` are the fields
    of :class:`packtool.pack.plan.PackOptions` (overflow, seed, shuffle, layout,
    shard_size...)."""
    try:
        opts = PackOptions(seq_len=seq_len, algo=algo, **options)
    except TypeError as e:
        raise PacktoolError(f"pack: {e}") from None
    return pack(prefixes, out, opts, overwrite=overwrite, progress=progress)


def owned(folder, place=None) -> None:
    """Prove ``folder`` a packed dataset of ours, a local folder or a bucket alike
    (``place``: its :class:`packtool.storage.place.Place`): a valid index.json (format,
    schema, digest) and nothing in it but the files that index lists (the held-out split
    the same way) and packtool's own hidden files, else a refusal naming what is not ours."""
    from ..storage.place import Place

    place = place if place is not None else Place(folder)
    there = place.names()
    try:
        names = dataset_files(place)
    except PacktoolError as e:
        raise PacktoolError(f"--overwrite only replaces a previous packtool output: "
                            f"{place.folder} is not a packtool packed dataset ({e}); it holds "
                            f"{listing(there)}: choose another --out") from None
    extra = place.unlisted(names, ours_hidden, there)
    if extra:
        raise PacktoolError(f"--overwrite only replaces a previous packtool output: "
                            f"{place.folder} holds files that are not part of the packed "
                            f"dataset it holds ({listing(extra)}); move them away or choose "
                            "another --out")


def staging_dir(out: Path, digest: str, run: RunOptions) -> Path:
    """Where the shards are assembled locally: a temporary of this process for a local run
    (removed if it fails, reclaimed if it is killed); for Ray or array tasks a folder named
    by the plan, which every task (and a re-run, which resumes) finds."""
    if run.executor == "local" and run.tasks is None and not run.finalize:
        return temp_name(out)
    return out.with_name(f".{out.name}.staging-{digest[:16]}")


def pack(prefixes: list[str | Path], out: str | Path, options: PackOptions, *,
         overwrite: bool = False, progress: bool = False, verify_sources: bool = True,
         run: RunOptions | None = None) -> PackResult:
    """Plan, write the shards as jobs, finalize, to a local folder or a bucket alike.
    ``prefixes`` may carry repeat factors (``web:2.0``); held-out documents
    (``options.valid_docs``/``valid_fraction``) are packed into ``out/valid``. With
    ``layout="tokens"`` the sources' token files are verified (crc32 where recorded, else
    sha256; sha256 too with ``options.source_check="sha256"``: a full read) before the
    dataset is committed, since their bytes are copied into it (``verify_sources=False``
    skips it and says so); an index-layout dataset copies no token, and its readers verify
    each source file on its first read.

    ``run``: where the jobs run (:class:`packtool.executors.RunOptions`). The run holds
    ``out``'s lock throughout (a second run fails at once); array tasks hold it shared."""
    run = run or RunOptions()
    run.check()
    options.check()
    output = Output(out, default_options()).inside()
    with output.lock(shared=run.one_task) as notes:
        result = _pack(prefixes, output, options, run, overwrite, progress, verify_sources)
    result.warnings[:0] = notes
    return result


def _pack(prefixes, out: Output, options, run, overwrite, progress, verify_sources
          ) -> PackResult:
    t0 = time.perf_counter()
    corpora, factors, digest, stored = plan_sources(prefixes, options)
    _refuse_sources_inside(out, corpora)
    # fail before the work (an array task too: it only reads OUT), and again at the end
    _check_replaceable(out, overwrite)
    verify_sources = verify_sources and options.layout == "tokens"
    check = (SourceCheck(corpora, strong=options.source_check == "sha256")  # meanwhile
             if verify_sources and not run.one_task else None)
    target = out if out.remote else out.at(staging_dir(out.path, digest, run))
    with shown(progress):  # a packer that runs long (optimal, nnlshp) shows it is working
        flow = plan_flow(corpora, factors, options, digest, stored,
                         "" if out.remote else str(target.path))
    notes = _begin(out, target, digest, run, overwrite)
    local = not run.one_task and not run.finalize and not out.remote
    if out.remote:  # the shards published stay for a re-run; index.json's put commits
        _signals.commits_to(join_path(out, INDEX), lambda: finished_jobs("shard"),
                            exists=lambda: out.committed)
    try:
        jobs = flow.jobs()
        run_jobs(Jobs(PackTasks(jobs.items, jobs.run, str(target.path),
                                out.place.storage_options or {}), run_task, jobs.weights,
                      lambda j: j.label(), "pack"), run, progress)
        if run.one_task:
            return flow.result(out.path, time.perf_counter() - t0, [
                f"{run.describe()}: wrote its share of the shards; run --finalize once every "
                "task is done to write index.json"])
        splits = flow.finalize(out.path, stored, run, check=lambda inner: check_job(
            inner, target, checksums=run.finalize))
        if check is not None:
            check.wait()
        idx, removed = _commit(out, target, splits, overwrite, flow.remove_entries)
    except BaseException as e:
        if is_enospc(e) and not out.remote:
            raise no_space(e, out.path, [target.path] if local else []) from None
        if local:  # nothing half-written: a local run is undone
            remove_path(target.path)
        raise
    res = flow.result(out.path, time.perf_counter() - t0, notes, idx)
    res.sources = with_targets(res.sources, prefixes)
    res.sources_verified = verify_sources
    res.warnings += run_warnings(res, options.seq_len)
    if out.remote:
        res.published = (f"published to {out.path}: index.json last, every shard verified on "
                         "upload" + (f"; {len(removed):,} leftover objects of an earlier run "
                                     "removed" if removed else ""))
    return res


def _refuse_sources_inside(out: Output, corpora) -> None:
    for c in corpora:
        if is_url(c.prefix) != out.remote:
            continue
        src = str(c.prefix) if out.remote else str(Path(c.prefix).resolve())
        if src.startswith(str(out.path).rstrip("/") + "/"):
            raise PacktoolError(f"--out {out.path} contains the source {c.prefix}; write the "
                                "packed dataset to a directory of its own")


def _check_replaceable(out: Output, overwrite: bool) -> None:
    """The output may be written: nothing is there, or (``overwrite``) a packed dataset
    :func:`owned` proves ours; in a bucket, also the objects of a run in progress that its
    plan marker vouches for."""
    if not out.remote:
        return check_replaceable(Path(out.path), overwrite, owned)
    names = {n for n in out.place.names() if not n.endswith(".lock")}
    if INDEX in names:
        if not overwrite:
            raise PacktoolError(f"output already exists: {out.path}/{INDEX}; pass --overwrite "
                                "to replace it")
        owned(out.path, out.place)
        return None
    foreign = sorted(n for n in names if not (ours_hidden(out.place, n) or _ours_data(n)))
    if foreign or (names and _read_json(out, MARKER).get("format") != PLAN_FORMAT):
        raise PacktoolError(f"--out {out.path} holds objects no packtool index or plan "
                            f"marker vouches for ({', '.join((foreign or sorted(names))[:5])}); "
                            "write the dataset to a folder of its own")
    return None


def _read_json(out: Output, name: str) -> dict:
    try:
        body = json.loads(out.place.read_bytes(name))
    except (FileNotFoundError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _begin(out: Output, target: Output, digest: str, run: RunOptions, overwrite: bool
           ) -> list[str]:
    """The jobs' folder of this plan, ready. Another plan's work in progress (a staging
    folder, or a bucket's plan marker) is refused (finish it with --finalize) unless
    --overwrite discards it, which only a whole run (holding the lock alone) may do."""
    if out.remote:
        marker = _read_json(out, MARKER)
        if run.finalize:
            return []
        if marker and marker.get("digest") != digest and (not overwrite or run.one_task):
            raise PacktoolError(f"{out.path} is being assembled from another plan ({MARKER}); "
                                "finish that run (the same command, or --finalize after its "
                                "array tasks) or pass --overwrite to a whole run to discard it")
        out.put(MARKER, json.dumps({"format": PLAN_FORMAT, "digest": digest}).encode())
        if overwrite and out.place.is_file(INDEX) and not run.one_task:
            out.remove([INDEX, f"{VALID}/{INDEX}"])  # readers stop seeing the old dataset
        return []
    path, staging = Path(out.path), Path(target.path)
    others = [p for p in path.parent.glob(f".{path.name}.staging-*")
              if p != staging and p.is_dir() and not p.is_symlink()]
    if others and not (overwrite and not run.one_task):
        raise PacktoolError(
            f"{path} is being assembled from another plan ({others[0].name}: other sources, "
            "options or version); finish that run (the same command with --finalize) or "
            "pass --overwrite to discard it")
    for p in others:
        remove_path(p)
    if staging.is_symlink() or (staging.exists() and not staging.is_dir()):
        raise PacktoolError(f"{staging} is a symbolic link or not a folder; packtool assembles "
                            f"{path} only in a real folder of its own (never through a link): "
                            "remove it, or choose another --out")
    if run.finalize and not staging.is_dir():
        raise PacktoolError(f"--finalize: no task of this plan has run for {path} (no "
                            f"{staging.name}); run the array tasks first (--tasks N --task K)")
    notes = [] if run.one_task else reclaim(path, inside=staging)  # before ours exists
    staging.mkdir(exist_ok=True)
    return notes


def _commit(out: Output, target: Output, splits: dict, overwrite: bool, remove_entries
            ) -> tuple[dict, list[str]]:
    """index.json of each split (OUT/valid's first, the training index names it) written
    into the jobs' folder; then locally the entries and temporaries removed and the staging
    folder swapped in for OUT (the commit), in a bucket the index put last is the commit and
    the entries, the plan marker and leftovers of ours are removed after it. (the training
    index, the leftovers removed)"""
    held, idx, keep = None, None, set()
    for split in ("valid", "train"):
        if split not in splits:
            continue
        make_meta, shards, options = splits[split]
        sub = f"{VALID}/" if split == "valid" else ""
        final = join_path(out, VALID) if split == "valid" else out.path
        idx = index(make_meta(held, final), shards)
        data = manifest_text(idx).encode()
        if out.remote and split == "train":  # the put that commits the dataset
            target.commit([(INDEX, data)])
        else:
            if not out.remote:
                Path(target.path, sub).mkdir(exist_ok=True)
            target.put(sub + INDEX, data)
        keep |= {sub + INDEX} | {sub + f["name"] for sh in shards for f in sh["files"].values()}
        if split == "valid":
            held = held_out_entry(options, idx)
    if out.remote:  # a signal now waits for the clean-up (the dataset is in place), as
        with _signals.deferred():  # tokenize's: no leftover of ours stays unlisted beside it
            stale = [n for n in out.place.names() if n not in keep and not n.endswith(".lock")
                     and (ours_hidden(out.place, n) or _ours_data(n))]
            removed = [n for n in out.remove(stale) if not n.startswith(".")]
        _signals.check()
        return idx, removed
    staging = Path(target.path)
    remove_entries(staging)
    clear_temporaries(staging)
    check_replaceable(Path(out.path), overwrite, owned)
    commit_dir(staging, Path(out.path))
    return idx, []


def _ours_data(name: str) -> bool:
    """A packed dataset's data object in a bucket (what an earlier run of ours left)."""
    import re

    return re.fullmatch(r"(?:valid/)?(?:shard-[0-9]+(?:-v?[0-9]+)?\.[a-z_]+\.npy|index\.json)",
                        name) is not None


def join_path(out: Output, name: str):
    from ..storage import join

    return join(out.path, name)
