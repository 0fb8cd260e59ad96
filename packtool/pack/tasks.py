"""A pack job (a shard, or a group with ``--group-docs``) run against an output, one way
wherever the output is (:class:`packtool.storage.output.Output`)::

    job_lock   .shard-K.lock (valid/.shard-K.lock, .group-G.lock): a second writer waits,
               then finds the job done
    check      the job's entry there, of this plan, and every file it lists of its size
               (a local folder: and its crc32)
    write      into the output's scratch folder (a local staging folder itself): files, then
               the entry, renamed in (packtool._atomic.commit_job)
    publish    nothing more locally; uploaded and verified for a bucket, the entry last,
               while the next job is written (the executor runs the job's Tail in a thread)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..executors import Tail
from ..formats.packed import VALID
from ..storage.output import Output
from . import entries as fe
from .jobs import ShardJob


@dataclass(frozen=True)
class PackTask:
    """A shard or group job of the plan, written to the output folder ``path`` (picklable:
    a Ray worker or an array task opens the output itself)."""

    inner: object
    write: Callable             # pack.jobs.write_shard or pack.groups.write_group
    path: str
    storage_options: dict

    def label(self) -> str:
        return self.inner.label()

    def output(self) -> Output:
        return Output(self.path, self.storage_options).inside()


class PackTasks(Sequence):
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


def check_job(inner, out: Output, checksums: bool = True) -> tuple[dict | None, str]:
    """(a shard's index entry, or a group's whole entry; "") when the job is written at
    ``out`` (its entry of this plan, every file of its size, and locally with
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
        sub = f"{VALID}/" if split == "valid" else ""
        why = (fe.check_objects(out.place, sub, shards) if out.remote else
               fe.check_files(Path(out.place.folder) / sub, shards, checksums))
        if why:
            return None, why
    return (m["entry"] if shard else m), ""


def run_task(task: PackTask, tick) -> tuple[dict, bool]:
    """Make the job's shards exist at the output, verified: (its result, True if it already
    was written and so skipped), or for a bucket the :class:`~packtool.executors.Tail` that
    publishes them (it holds the job's lock and scratch folder until then)."""
    out, inner = task.output(), task.inner
    name = entry_name(inner)
    with contextlib.ExitStack() as held:
        held.enter_context(out.job_lock(name.replace(".entry.json", ".lock"), inner.label()))
        done, _ = check_job(inner, out)
        if done is not None:
            tick(getattr(inner, "n_tokens", 0))
            return (done if isinstance(inner, ShardJob) else inner.g), True
        folder = held.enter_context(out.scratch())
        here = dataclasses.replace(inner, target=dataclasses.replace(
            inner.target, staging=str(folder)))
        result, _ = task.write(here, tick)
        if not out.remote:  # committed in place: nothing left to do
            return result, False
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                       if p.is_file() and not p.name.startswith("."))

        def publish() -> tuple[dict, bool]:
            out.publish(folder, files, name)
            return result, False

        return Tail(publish, held.pop_all())  # uploaded while the next shard is written
