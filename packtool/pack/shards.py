"""``pack``'s jobs: one shard each, written into the output's staging folder, and the
finalize step that turns the staging folder into the dataset. A local run is the one-task
case of the same path (:mod:`packtool.executors` runs the jobs here, on Ray or as array
tasks), so there is one way a shard is written and committed::

    OUT's staging folder .OUT.staging-<plan digest>/   (beside OUT, named by the plan, so a
        shard-00003.*.npy                                re-run or another task finds it)
        .shard-00003.entry.json   the shard's index entry + the job's digest: written last,
                                  so a shard is finished when its entry is there and intact
                                  (its schema: packtool.pack.entries)
        valid/...                 the held-out split's shards, the same way
    finalize: every entry checked, index.json written (valid/ first), entries removed, the
              staging folder renamed to OUT (swapped with a previous OUT of ours).

A job writes into a folder of its own (``.shard-00003.tmp-PID-RAND/`` in the staging
folder, or a scratch folder for a bucket) and is published, its entry last
(:func:`packtool.storage.write.run_job`). A job's bytes depend only on the plan and the
sources, so every executor writes the same files, and a killed job leaves only a temporary
of its pid, reclaimed by the next run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._io import write_new
from ..formats.packed import VALID, ShardWriter, shard_name
from . import entries as fe


@dataclass(frozen=True)
class Target:
    """Where and how the shards of a run are written (the same for every job)."""

    staging: str               # the staging folder
    prefixes: tuple[str, ...]  # the sources, in order (opened once per process)
    dtypes: dict               # role -> dtype string
    layout: str
    mask_storage: str | None
    grouped: bool = False      # pairs/groups: seg_group and seg_role beside the segments
    trees: bool = False        # prefix trees (version 6): seg_up too
    images: bool = False       # sources with images: their vision term in the cost classes


@dataclass(frozen=True)
class ShardJob:
    """Shard ``k`` of a split ("train" in the staging folder, "valid" in its valid/) and its
    segments in output order; ``digest`` covers everything its bytes depend on."""

    split: str
    k: int
    pack_seg: np.ndarray
    seg_doc: np.ndarray
    seg_offset: np.ndarray
    seg_length: np.ndarray
    digest: str
    target: Target
    groups: dict | None = None  # pairs/groups: {"seg_group", "seg_role"(, "seg_up")}

    @property
    def n_tokens(self) -> int:
        return int(self.seg_length.sum())

    @property
    def folder(self) -> Path:
        base = Path(self.target.staging)
        return base / VALID if self.split == "valid" else base

    def label(self) -> str:
        return f"{self.split} shard {self.k} ({shard_name(self.k)})"


class ShardJobs(Sequence):
    """Every shard of every split, in order (valid first: its index is written first), each
    job built when it is asked for: a local run holds one shard's segment arrays at a time."""

    def __init__(self, layouts: dict, common: dict, target: Target):
        self.layouts, self.common, self.target = layouts, common, target
        self._digests: dict[int, str] = {}
        self.specs = [(split, k) for split, layout in layouts.items()
                      for k in range(layout.n_shards)]
        self.weights = []
        for layout in layouts.values():
            tokens = np.concatenate([[0], np.cumsum(layout.pack_lengths())])
            starts = layout.shard_starts
            self.weights += np.diff(tokens[starts]).astype(np.int64).tolist()

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, i: int) -> ShardJob:
        split, k = self.specs[i]
        layout = self.layouts[split]
        packs, segs = layout.shard(k)
        dtypes = self.target.dtypes
        first = stored(layout.seg_first[packs.start:packs.stop + 1] - segs.start,
                       dtypes["segment_index"])
        arrays = (first, *shard_segments(layout, segs, dtypes))
        groups = None
        if self.target.grouped:
            from .pairs import shard_groups

            g, r, up = shard_groups(layout, segs)
            groups = {"seg_group": stored(g, dtypes["group"]), "seg_role": stored(r, "<u2")}
            if self.target.trees:
                groups["seg_up"] = stored(up, dtypes["length"])
        h = hashlib.sha256(json.dumps({**self.common, "split": split, "k": k},
                                      sort_keys=True).encode())
        for arr in (*arrays, *(groups or {}).values()):
            h.update(arr.dtype.str.encode())
            h.update(np.ascontiguousarray(arr))
        self._digests[i] = h.hexdigest()
        return ShardJob(split, k, *arrays, self._digests[i], self.target, groups)

    def header(self, i: int) -> ShardJob:
        """Job ``i`` without its segment arrays (its digest known from building it once in
        this process): what checking a written shard needs."""
        if i not in self._digests:
            return self[i]
        split, k = self.specs[i]
        none = np.empty(0, np.int64)
        return ShardJob(split, k, none, none, none, none, self._digests[i], self.target)


def shard_segments(layout, segs: slice, dtypes: dict, chunk: int = 1 << 20) -> list:
    """A shard's (document, offset, length) in the dtypes they are stored in, derived a
    chunk of segments at a time: ~8 bytes a segment held instead of 24, and the chunk's
    int64 temporaries (a shard of short documents holds millions of segments)."""
    n = segs.stop - segs.start
    out = [np.empty(n, np.dtype(dtypes[role])) for role in ("document", "offset", "length")]
    for a in range(segs.start, segs.stop, chunk):
        b = min(a + chunk, segs.stop)
        for o, values in zip(out, layout.segments(a, b), strict=True):
            o[a - segs.start:b - segs.start] = stored(values, o.dtype)
    return out


def stored(values: np.ndarray, dtype) -> np.ndarray:
    """``values`` in a stored dtype, refused if any does not fit (a planner bug)."""
    dtype = np.dtype(dtype)
    if values.size and (int(values.min()) < 0 or int(values.max()) > np.iinfo(dtype).max):
        raise RuntimeError(f"a segment table value out of {dtype}'s range")
    return values.astype(dtype, copy=False)


# ------------------------------------------------------------------------ the sources
_SOURCES: dict = {}  # prefixes -> opened corpora: sources are opened once per process


def provide_sources(prefixes: tuple[str, ...], corpora: list) -> None:
    """Hand this process's already opened sources to the jobs (a local run)."""
    _SOURCES[prefixes] = corpora


def sources(prefixes: tuple[str, ...]) -> list:
    if prefixes not in _SOURCES:
        from ..formats.tokens import open_tokens

        _SOURCES[prefixes] = [open_tokens(p) for p in prefixes]
    return _SOURCES[prefixes]


def length_chunks(corpora, chunk: int = 1 << 20):
    """``chunks(k)``: source k's document lengths, ``chunk`` at a time, from its boundaries
    (a streaming pass)."""
    def chunks(k):
        for q in corpora[k].parts:
            prev = np.int64(0)
            for a in range(0, len(q), chunk):
                e = np.asarray(q.ends[a:a + chunk], np.int64)
                yield np.diff(e, prepend=prev)
                prev = e[-1]
    return chunks


def image_table(prefixes: tuple[str, ...]):
    """The sources' image table, made once per opening of them (16 bytes an image)."""
    corpora = sources(prefixes)
    made = _SOURCES.get(("images", prefixes))
    if made is None or made[0] is not corpora:
        from ..formats.packed.images import ImageTable

        made = _SOURCES[("images", prefixes)] = (corpora, ImageTable(corpora))
    return made[1]


# ------------------------------------------------------------------------ one shard
def write_shard(job: ShardJob, tick) -> tuple[dict, list[str]]:
    """Write shard ``job`` into its folder (:attr:`ShardJob.folder`, the job's own), its
    entry last: (its index entry, its files' names relative to the staging folder). The
    stage holds the job's lock, skips a shard already written and publishes the files
    (:func:`packtool.storage.write.run_job`)."""
    t = job.target
    job.folder.mkdir(exist_ok=True)
    corpora = sources(t.prefixes) if t.layout == "tokens" else None
    writer = ShardWriter(job.folder, t.dtypes, t.layout, t.mask_storage,
                         gather=None if corpora is None else gatherer(corpora),
                         grouped=t.grouped, trees=t.trees,
                         images=image_table(t.prefixes) if t.images else None)
    entry = writer.write(job.k, job.pack_seg, job.seg_doc, job.seg_offset,
                         job.seg_length, tick, groups=job.groups)
    write_new(Path(t.staging) / entry_name(job), json.dumps(fe.shard_entry(job.digest, entry)))
    sub = f"{VALID}/" if job.split == "valid" else ""
    return entry, [sub + f["name"] for f in entry["files"].values()]


def gatherer(corpora):
    """The writer's ``gather(doc, offset, length, dst, dst_start, dst_mask)``."""
    from ..formats.tokens import gather

    return functools.partial(gather, corpora)


def remove_entries(folder: Path) -> None:
    """The jobs' entries (a shard's, or a --group-docs group's), once index.json vouches for
    the shards."""
    for sub in (folder, folder / VALID):
        if not sub.is_dir():
            continue
        for p in (*sub.glob(".shard-*.entry.json"), *sub.glob(".group-*.entry.json")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


# -------------------------------------------------------------- a job run against the output
@dataclass(frozen=True)
class PackTask:
    """A shard or group job of the plan (``inner``), written by ``write``
    (:func:`write_shard` or :func:`packtool.pack.streamed.write_group`) to the output folder
    ``path`` (picklable: a Ray worker or an array task opens the output itself)."""

    inner: object
    write: Callable
    path: str
    storage_options: dict

    def label(self) -> str:
        return self.inner.label()


class PackTasks(Sequence):
    """The plan's jobs as tasks, each made when asked for (a shard job holds its segment
    arrays: made one at a time)."""

    def __init__(self, items: Sequence, write: Callable, path: str, options: dict):
        self.items, self.write, self.path, self.options = items, write, path, options

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> PackTask:
        return PackTask(self.items[i], self.write, self.path, self.options)


def entry_name(inner) -> str:
    """The job's entry, relative to the output folder."""
    if isinstance(inner, ShardJob):
        return (f"{VALID}/" if inner.split == "valid" else "") + fe.shard_entry_name(inner.k)
    return fe.group_entry_name(inner.g)


def check_job(inner, out, checksums: bool = True) -> tuple[dict | None, str]:
    """(a shard's index entry, or a group's whole entry; "") when the job is written at
    the output ``out`` (its entry of this plan, every file of its size, and locally with
    ``checksums`` its crc32), else (None, why)."""
    shard = isinstance(inner, ShardJob)
    m, why = fe.read_entry(entry_name(inner), fe.SHARD_ENTRY if shard else fe.GROUP_ENTRY,
                           out.place)
    if m is None:
        return None, why
    if m["digest"] != inner.digest or (not shard and m["g"] != inner.g):
        return None, "made from another plan (digest differs)"
    splits = ({inner.split: [m["entry"]]} if shard else
              {split: stats["shards"] for split, stats in m["splits"].items()})
    for split, shards in splits.items():
        why = fe.check_files(out.place, f"{VALID}/" if split == "valid" else "", shards,
                             checksums)
        if why:
            return None, why
    return (m["entry"] if shard else m), ""


def run_task(task: PackTask, tick):
    """Make the job's shards exist at the output, verified (:func:`packtool.storage.write.
    run_job`): (its result, True if it was already written and so skipped)."""
    from ..storage.output import open_output
    from ..storage.write import run_job

    out, inner = open_output(task.path, task.storage_options).as_folder(), task.inner
    name = entry_name(inner)

    def skipped(done):
        tick(getattr(inner, "n_tokens", 0))
        return done if isinstance(inner, ShardJob) else inner.g

    def write(folder: Path):
        here = dataclasses.replace(inner, target=dataclasses.replace(
            inner.target, staging=str(folder)))
        result, names = task.write(here, tick)
        return names, name, result, {}

    job = shard_name(inner.k) if isinstance(inner, ShardJob) else f"group-{inner.g:05d}"
    return run_job(out, job, name.replace(".entry.json", ".lock"), inner.label(),
                   lambda: check_job(inner, out)[0], skipped, write)
