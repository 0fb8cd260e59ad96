"""One job of a stage (a tokenize part, a pack shard or group) written to an output, one way
for every stage and wherever the output is (:class:`packtool.storage.output.Output`)::

    job_lock   .NAME.lock beside the job's files: a second writer (an array task, a Ray
               retry) waits, then finds the job done
    finished   the job's record there, of this plan, and every file it lists as recorded:
               skipped (resume)
    write      into the output's scratch folder (a local folder itself: files, then the
               record, committed in place by packtool.storage.atomic)
    finish     nothing more locally; for a bucket a PendingUpload that uploads the files, each
               verified, the record last, while the next job is written

The job is idempotent and atomic, so the local loop, Ray tasks and array tasks run the same
function (:mod:`packtool.executors`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from .output import Output


def run_job(out: Output, lock: str, label: str, finished: Callable, skipped: Callable,
            write: Callable):
    """Make the job exist at ``out``: ``finished()`` gives its result if it is already
    written (then ``skipped(result)`` gives the job's result and ticks its progress);
    else ``write(folder)`` writes it into the scratch folder and gives (file names, or a
    function giving them when a bucket asks, record name, result, options of
    :meth:`Output.finish_job`). The job's ``(result, skipped)``, or for a bucket the
    PendingUpload that publishes it (holding the job's lock and scratch folder)."""
    with contextlib.ExitStack() as held:
        held.enter_context(out.job_lock(lock, label))
        done = finished()
        if done is not None:
            return skipped(done), True
        folder = held.enter_context(out.scratch())
        names, record, result, options = write(folder)
        return out.finish_job(held, folder, names, record, result, **options)
