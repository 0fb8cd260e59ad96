"""Where a stage's jobs run: in this process, as Ray tasks, or as one array task of N.

An executor knows nothing of tokens or packs. A stage hands it a list of independent,
idempotent jobs (each finished job leaves a verified completion record, so a re-run skips
it) and a function that runs one; the stage writes its manifest afterwards, from what the
jobs left on disk. datatrove's executors are the model::

    stage                          executor                         stage
    plan -> jobs [j0, j1, ...] ->  local:  run(j) for each, here  -> finalize: check every
                                   ray:    one task per job,         job's record, write the
                                           retried on worker death   manifest (the commit)
                                   tasks:  --tasks N --task K runs
                                           jobs K, K+N, K+2N ...

``run(job, tick)`` must be a module-level function (Ray pickles it); ``tick(n)`` reports
progress inside a local job (on Ray a job's weight is counted when it finishes). It returns
``(result, skipped)``: ``skipped`` when the job found its output already finished; or a
:class:`~packtool.storage.output.PendingUpload`: what is left of the job once its files are
written, which only waits on a store (their upload, then the job's record). The local
executor runs a job's tail in a thread while the next job computes, at most one tail at a
time::

    main thread    [ job 0 ][ job 1 ][ job 2 ]w[ job 3 ]     w: waits for the tail before
    tail thread             [ up 0 ]  [  up 1  ][ up 2  ][ up 3 ]   (so at most two jobs'
                                                                     files are on disk)

A bucket run then takes about the larger of the work and the uploads plus one job's share
of the other, instead of their sum (scripts/bench_bucket_overlap.py, docs/STORAGE.md: 19.0 s
-> 15.6 s for tokenize over a 25 MB/s link). Ray runs a tail at once, in its task.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._progress import no_step, progress_bar
from .errors import PacktoolError
from .options import opt
from .storage.output import PendingUpload

EXECUTORS = ("local", "ray")
RAY_CONNECT_TIMEOUT = 10.0  # seconds to reach a Ray address before naming it unreachable


@dataclass(frozen=True)
class RunOptions:
    """Where a plan runs: in this process (``local``), as Ray tasks, or as task ``task`` of
    ``tasks`` batch-scheduler array tasks (then ``finalize`` once). The data files are the
    same bytes whichever way."""

    executor: str = opt("local", "local: the jobs in turn with every core; ray: one Ray task "
                        "per job (pip install 'packtool[ray]').", type=("choice", EXECUTORS),
                        show_default=True)
    ray_address: str | None = opt(None, "Ray cluster to join (auto, ray://HOST:10001, "
                                  "HOST:6379); default: start a local instance.")
    ray_cpus: int = opt(1, "--executor ray: CPUs (tokenizer threads) per task.",
                        type=("int", 1, None), show_default=True)
    max_retries: int = 3               # Ray's retries of a task whose worker died
    tasks: int | None = opt(None, "Array jobs: the number of tasks sharing the plan (with "
                            "--task).", type=("int", 1, None))
    task: int | None = opt(None, "Array jobs: run only this task's share (0-based; Slurm: "
                           "$SLURM_ARRAY_TASK_ID).", type=("int", 0, None))
    finalize: bool = opt(False, "Array jobs: after every task, check every job's output and "
                         "write the manifest (names the missing or corrupt ones otherwise).",
                         type="flag")

    @property
    def one_task(self) -> bool:
        """One array task of several: it shares the output with the others."""
        return (self.task is not None and self.tasks is not None and self.tasks > 1
                and not self.finalize)

    def check(self) -> None:
        if self.executor not in EXECUTORS:
            raise PacktoolError(f"--executor {self.executor!r}: choose one of "
                                f"{', '.join(EXECUTORS)}")
        if (self.tasks is None) != (self.task is None) and not (
                self.finalize and self.task is None):
            raise PacktoolError("--tasks N and --task K go together (K from 0 to N-1)")
        if self.tasks is not None and self.executor != "local":
            raise PacktoolError("--tasks/--task run one share of the plan in this process; "
                                "leave out --executor ray")
        if self.finalize and self.task is not None:
            raise PacktoolError("--finalize runs once, after every task: leave out --task")
        if self.ray_cpus < 1:
            raise PacktoolError(f"--ray-cpus {self.ray_cpus}: must be at least 1")
        if self.task is not None:
            deal(0, self.tasks, self.task)  # the range check

    def mine(self, n_jobs: int) -> list[int]:
        """The jobs this invocation runs: all of them, task K's share, or none (finalize)."""
        if self.finalize:
            return []
        if self.task is not None:
            return deal(n_jobs, self.tasks, self.task)
        return list(range(n_jobs))

    def describe(self) -> str:
        if self.finalize:
            return "finalize"
        if self.one_task:
            return f"task {self.task} of {self.tasks}"
        return self.executor


def deal(n_items: int, tasks: int, task: int) -> list[int]:
    """Task ``task``'s share of ``n_items`` (0-based, round robin: items task, task + tasks,
    ...): sorted inputs of similar sizes spread evenly, and N need not divide the count."""
    if tasks < 1 or not 0 <= task < tasks:
        raise PacktoolError(f"--task {task}: must be from 0 to --tasks - 1 = {tasks - 1} "
                            "(Slurm: --task $SLURM_ARRAY_TASK_ID with --array=0-N-1)")
    return list(range(task, n_items, tasks))


@dataclass(frozen=True)
class Jobs:
    """What a stage hands an executor: the jobs (a sequence; a lazy one builds each job
    when it runs, so a local run holds one job's data at a time), the function that runs
    one, and how the progress bar counts them (``weights[k]`` in ``unit``)."""

    items: Sequence
    run: Callable
    weights: Sequence[int]
    label: Callable          # job -> "part 3 (c.part-00003)", for errors
    desc: str
    unit: str = "tok"


def run_jobs(jobs: Jobs, run: RunOptions, progress: bool = False) -> tuple[dict, int]:
    """Run the jobs ``run`` owns; returns ({job index: result}, number skipped as finished)."""
    mine = run.mine(len(jobs.items))
    if not mine:
        return {}, 0
    total = sum(int(jobs.weights[k]) for k in mine)
    desc = jobs.desc + (" (ray)" if run.executor == "ray" else "")
    bar = progress_bar(total, desc, jobs.unit, progress)
    outcomes: dict = {}  # job index -> (result, skipped)
    FINISHED.clear()
    try:
        (_run_ray if run.executor == "ray" else _run_local)(jobs, mine, run, bar, outcomes)
    finally:
        if bar is not None:
            bar.close()
    return ({k: result for k, (result, _) in outcomes.items()},
            sum(bool(was_done) for _, was_done in outcomes.values()))


class _Behind:
    """The one tail in flight in a local run, in a daemon thread (a second Ctrl-C, or the
    CLI's exit, does not wait for it). Its error is raised in the main thread when the next
    tail is handed over or at the end, as it was raised (a store's error keeps its class,
    so the CLI names it as before); the run then commits nothing."""

    def __init__(self, outcomes: dict):
        self.outcomes, self.thread, self.error = outcomes, None, None

    def hand(self, k: int, tail: PendingUpload, label: str = "") -> None:
        """Wait for the tail in flight, then start job ``k``'s (dropped if the one before
        failed)."""
        try:
            self.wait()
        except BaseException:
            tail.drop()
            raise

        def run():
            try:
                self.outcomes[k] = tail()
                FINISHED.append(label)
            except BaseException as e:  # a KeyboardInterrupt from _signals.check() too
                self.error = e

        self.thread = threading.Thread(target=run, name=f"packtool-tail-{k}", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def __enter__(self) -> _Behind:
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            self.wait()
            return
        # the run is failing (another job's error, Ctrl-C): the tail in flight ends first
        # (after a signal, at its next object), so that its job's lock and scratch folder
        # are released before the output's lock; its own error is not the first one
        if self.thread is not None:
            self.thread.join()  # a second Ctrl-C stops the wait
        self.error = None


# the labels of the jobs a run has finished (published, for a bucket), in the order they
# finished (for Ray: came back to the driver): what a run stopped half-way leaves for the
# next (packtool._signals.kept)
FINISHED: list[str] = []


def finished_jobs(noun: str) -> str | None:
    """"2 finished part(s) of it (part 0 (c.part-00000); ...)" of :data:`FINISHED`."""
    done = list(FINISHED)
    if not done:
        return None
    shown = "; ".join(done[:3]) + (f" and {len(done) - 3} more" if len(done) > 3 else "")
    return f"{len(done)} finished {noun}(s) of it ({shown})"


def _run_local(jobs: Jobs, mine: list[int], run: RunOptions, bar, outcomes: dict) -> None:
    tick = bar.update if bar is not None else no_step
    with _Behind(outcomes) as behind:
        for k in mine:
            before = bar.n if bar is not None else 0
            item = jobs.items[k]
            outcome = jobs.run(item, tick)
            if isinstance(outcome, PendingUpload):
                behind.hand(k, outcome, jobs.label(item))
            else:
                outcomes[k] = outcome
                FINISHED.append(jobs.label(item))
            if bar is not None:  # a skipped job ticks nothing: count its weight now
                bar.update(max(0, before + int(jobs.weights[k]) - bar.n))


# what the driver's environment gives every job, wherever it runs (a Ray worker started
# before this run, or on another node, has its own environment)
CARRIED_ENV = ("PACKTOOL_STORAGE_OPTIONS",)


def _ray_job(run, item, env: dict):
    for k in CARRIED_ENV:
        if k in env:
            os.environ[k] = env[k]
        else:
            os.environ.pop(k, None)
    outcome = run(item, no_step)  # a job's tail (its upload) runs here, in its task
    return outcome() if isinstance(outcome, PendingUpload) else outcome


def _run_ray(jobs: Jobs, mine: list[int], run: RunOptions, bar, outcomes: dict) -> None:
    """One Ray task per job (``run.ray_cpus`` CPUs each), retried on worker death; the first
    failure cancels the rest."""
    with ray_session(run.ray_address) as ray:
        remote = ray.remote(num_cpus=run.ray_cpus, max_retries=run.max_retries)(_ray_job)
        fn = ray.put(jobs.run)
        env = {k: os.environ[k] for k in CARRIED_ENV if k in os.environ}
        refs = {remote.remote(fn, jobs.items[k], env): k for k in mine}
        try:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1)
                for ref in done:
                    k = refs.pop(ref)
                    try:
                        outcomes[k] = ray.get(ref)
                    except Exception as e:
                        raise _ray_error(e, jobs.label(jobs.items[k])) from None
                    FINISHED.append(jobs.label(jobs.items[k]))  # published, for a bucket
                    if bar is not None:
                        bar.update(int(jobs.weights[k]))
        except BaseException:
            for ref in refs:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise


def _ray_error(e: Exception, what: str) -> Exception:
    """A PacktoolError raised inside a task comes back as itself (same message); anything
    else names the job and the Ray error."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, PacktoolError):
        return cause
    return PacktoolError(f"{what} failed on Ray: {type(e).__name__}: {e}")


def import_ray():
    try:
        import ray
    except ImportError:
        raise PacktoolError("--executor ray needs Ray: pip install 'packtool[ray]'") from None
    return ray


def _reachable(address: str, timeout: float) -> None:
    """Fail within ``timeout`` seconds, naming ``address``, when nothing listens there (Ray
    itself retries an unreachable address for minutes)."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise PacktoolError(f"--ray-address {address}: expected HOST:PORT, ray://HOST:PORT or "
                            "auto")
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise PacktoolError(
            f"--ray-address {address}: nothing answers there ({e.strerror or e}, after "
            f"{time.monotonic() - t0:.1f}s); start the cluster (ray start --head) or leave out "
            "--ray-address for a local instance") from None


@contextlib.contextmanager
def ray_session(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT):
    """Join the cluster at ``address`` (``auto``, ``ray://host:10001``, ``host:6379``), or
    start a local instance; one started here is stopped on exit. An instance already
    initialized in this process (a test fixture, a notebook) is used as it is."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if address is not None:
        _reachable(address, timeout)
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
        p for p in [str(Path(__file__).resolve().parent.parent),
                    os.environ.get("PYTHONPATH", "")] if p)}} if address is None else None
    try:
        ray.init(address=address, include_dashboard=False, runtime_env=env,
                 log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise PacktoolError(f"--ray-address {address}: cannot connect to Ray ({e}); start "
                            "the cluster (ray start --head) or leave out --ray-address for a "
                            "local instance") from None
    try:
        yield ray
    finally:
        ray.shutdown()
