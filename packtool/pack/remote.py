"""``pack --out s3://bucket/packed``: the same plan and jobs as a local run (a shard each, or a
group with ``--group-docs``), each written on the disk of the process that runs it (local,
a Ray worker, an array task: no shared file system), then published
(:mod:`packtool.storage.publish`)::

    run        lock object .packtool.lock (conditional put); .packtool-plan.json (the plan's
               digest: what vouches for shard objects before an index lists them)
    job        written into a scratch folder of this process; its shard files uploaded and
               verified, its entry (.shard-K.entry.json, .group-G.entry.json) last: the job's
               commit; the local files removed
    finalize   every job's entry checked on the store, valid/index.json then index.json put
               (the commit), entries, the plan marker and leftovers of ours removed

Sources may be URLs too (read through the cache); an index-layout dataset records each
source's path relative to itself when both are in one bucket. The objects are the same bytes
as a local run's files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._progress import shown
from ..errors import FormatError, PacktoolError
from ..executors import Jobs, RunOptions, run_jobs
from ..formats._manifest import check_digest, manifest_text
from ..formats.packed import DIGEST_KEY, FORMAT, INDEX, VALID, index
from ..storage import default_options
from ..storage.place import Place
from ..storage.publish import Published, StoreLock, put_object, remove_leftovers, upload
from ..storage.stage_out import require_url, scratch_dir
from . import entries as fe
from .flow import SourceCheck, plan_flow, plan_sources
from .jobs import ShardJob
from .meta import held_out_entry
from .result import run_warnings

LOCK = ".packtool.lock"
MARKER = ".packtool-plan.json"
PLAN_FORMAT = "packtool.packed.plan"
_OURS = re.compile(r"^(?:valid/)?(?:shard-[0-9]+(?:-v?[0-9]+)?\.[a-z_]+\.npy|index\.json|"
                   r"\.(?:shard|group)-[0-9]+\.(?:entry\.json|lock))$|^\.packtool[-.]")


def ours(name: str) -> bool:
    """Objects a packed dataset on a store is made of (shards, indexes, job entries, its
    plan marker and locks): what may be replaced or removed as leftovers."""
    return bool(_OURS.match(name))


@dataclass(frozen=True)
class RemoteJob:
    """A shard or group job of the plan (its staging a placeholder: each process writes in
    a scratch folder of its own), published under ``url``."""

    inner: object
    write: Callable             # pack.jobs.write_shard or pack.groups.write_group
    url: str
    storage_options: dict

    def label(self) -> str:
        return self.inner.label()

    @property
    def shard(self) -> bool:
        return isinstance(self.inner, ShardJob)

    @property
    def entry_name(self) -> str:
        if self.shard:
            return (f"{VALID}/" if self.inner.split == "valid" else "") + \
                fe.shard_entry_name(self.inner.k)
        return fe.group_entry_name(self.inner.g)


class RemoteJobs(Sequence):
    def __init__(self, items: Sequence, write: Callable, url: str, options: dict):
        self.items, self.write, self.url, self.options = items, write, url, options

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> RemoteJob:
        return RemoteJob(self.items[i], self.write, self.url, self.options)


def check_remote(job: RemoteJob, place: Place) -> tuple[dict | None, str]:
    """(what the local check returns: a shard's index entry, a group's whole entry, "")
    when the job is published (its entry of this plan, its objects of their sizes)."""
    kind = fe.SHARD_ENTRY if job.shard else fe.GROUP_ENTRY
    m, why = fe.read_entry(job.entry_name, kind, place)
    if m is None:
        return None, why
    if m["digest"] != job.inner.digest or (not job.shard and m["g"] != job.inner.g):
        return None, "made from another plan (digest differs)"
    if job.shard:
        why = fe.check_objects(place, f"{VALID}/" if job.inner.split == "valid" else "",
                               [m["entry"]])
    else:
        why = next((w for split, stats in m["splits"].items() if (w := fe.check_objects(
            place, f"{VALID}/" if split == "valid" else "", stats["shards"]))), "")
    return (None, why) if why else ((m["entry"] if job.shard else m), "")


def run_remote(job: RemoteJob, tick) -> tuple[dict, bool]:
    """Make the job's shards exist on the store, verified: (its entry, True if it already
    was). Two writers of one job (array tasks) serialize on its lock object."""
    place = Place(job.url, job.storage_options)
    lock = job.entry_name.replace(".entry.json", ".lock")
    with StoreLock(place.fs, f"{place.root}/{lock}", str(place.path(lock)), wait=True):
        done, _ = check_remote(job, place)
        if done is not None:
            tick(getattr(job.inner, "n_tokens", 0))
            return done, True
        with scratch_dir(job.url) as scratch:
            target = dataclasses.replace(job.inner.target, staging=str(scratch))
            inner = dataclasses.replace(job.inner, target=target)
            result, _ = job.write(inner, tick)
            sent = Published(job.url)
            shard_files = sorted(p for p in scratch.rglob("*")  # the entry goes last
                                 if p.is_file() and not p.name.startswith("."))
            upload(place.fs, [(p, f"{place.root}/{p.relative_to(scratch).as_posix()}")
                              for p in shard_files], sent)
            put_object(place.fs, f"{place.root}/{job.entry_name}",
                       (scratch / job.entry_name).read_bytes(), str(place.path(job.entry_name)))
    return result, False


def _begin(place: Place, url: str, digest: str, overwrite: bool, run: RunOptions) -> None:
    """Before any object changes: what is there is ours (an index of ours, or a plan marker
    of ours vouches for shard objects) or refused; a plan in progress is this one (or a
    whole run's --overwrite discards it); an overwritten index deleted first."""
    names = sorted(n for p in place.fs.find(place.root)
                   if not (n := p[len(place.root) + 1:]).endswith(".lock"))
    foreign = [n for n in names if not ours(n)]
    if foreign:
        raise PacktoolError(f"--out {url} holds objects that are not a packed dataset's "
                            f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); "
                            "write the dataset to a folder of its own")
    marker = _read_json(place, MARKER)
    if INDEX in names:
        _check_ours(place, url, overwrite)
    elif names and not (marker and marker.get("format") == PLAN_FORMAT):
        raise PacktoolError(f"--out {url} holds shard objects no packtool index or plan marker "
                            "vouches for; write the dataset to a folder of its own")
    if marker and marker.get("digest") != digest and (not overwrite or run.one_task):
        raise PacktoolError(f"{url} is being assembled from another plan ({MARKER}); finish "
                            "that run (the same command, or --finalize after its array tasks) "
                            "or pass --overwrite to a whole run to discard it")
    put_object(place.fs, f"{place.root}/{MARKER}",
               json.dumps({"format": PLAN_FORMAT, "digest": digest}).encode(),
               str(place.path(MARKER)))
    if overwrite and INDEX in names and not run.one_task:
        for name in (INDEX, f"{VALID}/{INDEX}"):  # readers stop seeing the old dataset
            with contextlib.suppress(FileNotFoundError):
                place.fs.rm_file(f"{place.root}/{name}")


def _read_json(place: Place, name: str):
    try:
        return json.loads(place.read_bytes(name))
    except (FileNotFoundError, ValueError):
        return None


def _check_ours(place: Place, url: str, overwrite: bool) -> None:
    if not overwrite:
        raise PacktoolError(f"output already exists: {url}/{INDEX}; pass --overwrite to "
                            "replace it")
    try:
        idx = json.loads(place.read_bytes(INDEX))
        if not isinstance(idx, dict) or idx.get("format") != FORMAT:
            raise ValueError("not a packed dataset's index")
        check_digest(idx, DIGEST_KEY, f"{url}/{INDEX}", "")
    except (ValueError, FormatError) as e:
        raise PacktoolError(f"{url}/{INDEX} is not a packtool index ({e}); --overwrite "
                            "replaces only packtool's own output") from None


def _commit(place: Place, url: str, splits: dict) -> tuple[dict, list[str]]:
    """valid/index.json, then index.json (the commit); then the entries, the plan marker
    and leftovers of ours removed. (the training index, the leftovers removed)"""
    held, idx, keep = None, None, {LOCK}
    for split in ("valid", "train"):
        if split not in splits:
            continue
        make_meta, shards, options = splits[split]
        prefix = f"{VALID}/" if split == "valid" else ""
        idx = index(make_meta(held, f"{url}/{VALID}" if split == "valid" else url), shards)
        put_object(place.fs, f"{place.root}/{prefix}{INDEX}",
                   manifest_text(idx).encode(), str(place.path(prefix + INDEX)))
        keep |= {prefix + INDEX} | {prefix + f["name"] for sh in shards
                                    for f in sh["files"].values()}
        if split == "valid":
            held = held_out_entry(options, idx)
    removed = remove_leftovers(place.fs, place.root, keep, ours)
    return idx, [n for n in removed if not n.startswith(".")]


def pack_to_store(prefixes, url: str, options, *, overwrite: bool, progress: bool,
                  verify_sources: bool, run: RunOptions):
    t0 = time.perf_counter()
    url = require_url(url)
    storage_options = default_options()
    place = Place(url, storage_options)
    corpora, factors, digest, stored = plan_sources(prefixes, options)
    verify_sources = verify_sources and options.layout == "tokens"
    # meanwhile, as a local run: sources in a bucket are fetched into the cache (and checked)
    # while the plan is made, not after it by the first shard's gathers
    sources_check = SourceCheck(corpora) if verify_sources and not run.one_task else None
    with shown(progress):  # a packer that runs long (optimal, nnlshp) shows it is working
        flow = plan_flow(corpora, factors, options, digest, stored, staging="")
    lock = contextlib.nullcontext() if run.one_task else StoreLock(
        place.fs, f"{place.root}/{LOCK}", str(place.path(LOCK)))
    with lock:
        if not run.finalize:
            _begin(place, url, digest, overwrite, run)
        jobs = flow.jobs()
        remote = RemoteJobs(jobs.items, jobs.run, url, storage_options)
        run_jobs(Jobs(remote, run_remote, jobs.weights, lambda j: j.label(), "pack"), run,
                 progress)
        if run.one_task:
            return flow.result(url, time.perf_counter() - t0, [
                f"{run.describe()}: published its share of the shards; run --finalize once "
                "every task is done to write index.json"])
        splits = flow.finalize(url, stored, run, check=lambda inner: check_remote(
            RemoteJob(inner, jobs.run, url, storage_options), place))
        if sources_check is not None:
            sources_check.wait()
        idx, removed = _commit(place, url, splits)
    res = flow.result(url, time.perf_counter() - t0, [], idx)
    res.sources_verified = verify_sources
    res.warnings += run_warnings(res, options.seq_len)
    res.published = (f"published to {url}: index.json last, every shard verified on upload"
                     + (f"; {len(removed):,} leftover objects of an earlier run removed"
                        if removed else ""))
    return res
