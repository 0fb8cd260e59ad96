"""One job of a stage (a tokenize part, a pack shard or group) written to an output, one way
for every stage and wherever the output is (:class:`packtool.storage.output.Output`)::

    job_lock   .NAME.lock beside the job's files: a second writer (an array task, a Ray
               retry) waits, then finds the job done
    finished   the job's record there, of this plan, and every file it lists as recorded:
               skipped (resume)
    write      into a folder of the job's own (beside the output, or a scratch folder of
               this machine for a bucket): plain files, no temporary names
    publish    the files moved to the output, the record last: renamed in (a folder), or
               uploaded and verified (a bucket: a PendingUpload, while the next job is
               written); a full disk said of the output

The job is idempotent and atomic, so the local loop, Ray tasks and array tasks run the same
function (:mod:`packtool.executors`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from .atomic import is_enospc
from .output import Output


def run_job(out: Output, name: str, lock: str, label: str, finished: Callable,
            skipped: Callable, write: Callable, kept: Callable = lambda: None):
    """Make the job ``name`` exist at ``out``: ``finished()`` gives its result if it is
    already written (then ``skipped(result)`` gives the job's result and ticks its
    progress); else ``write(folder)`` writes it into a folder of its own and gives (its
    file names and its record's, relative to the folder; its result; options of
    :meth:`Output.finish_job`). The job's ``(result, skipped)``, or for a bucket the
    PendingUpload that publishes it (holding the job's lock and scratch folder). A full
    disk is said of the output, with what stays (``kept()``) for a re-run."""
    with contextlib.ExitStack() as held:
        held.enter_context(out.job_lock(lock, label))
        done = finished()
        if done is not None:
            return skipped(done), True
        folder = held.enter_context(out.scratch(name))
        try:
            names, record, result, options = write(folder)
        except OSError as e:
            if not is_enospc(e):
                raise
            raise out.no_space(e, folder, kept()) from None
        return out.finish_job(held, folder, names, record, result, **options)
