"""Where a stage writes: one interface, chosen once by :func:`open_output`, over a local
folder (:class:`FolderOutput`) and a bucket prefix (:class:`BucketOutput`).

``tokenize``, ``pack`` and ``export`` are written once over an :class:`Output`; where the
files live is the output's business (mosaicml/streaming's uploader is a no-op for a local
path; datatrove's ``DataFolder`` serves both), and no stage asks again. The steps, and what
each does where::

    step                   FolderOutput                        BucketOutput (no rename)
    lock(shared)           flock of .NAME.lock                 lock object, conditional put
    place                  reads and listings of the folder    the same, through fsspec
    job_lock(name)         flock, waited for                   lock object, waited for
    scratch(name)          the job's own folder beside its     a scratch folder of this
                           files (.NAME.tmp-PID-RAND)          process (storage.publish)
    finish_job(...)        publish: renamed in, the record     a PendingUpload: each file
                           last (signals deferred)             uploaded, verified, the
                                                               record last
    put(name, data)        written whole                       one put, its size checked
    commit(files)          one journaled commit                puts in order, the last commits
    staging(...)           a staging folder beside OUT,        OUT itself, its objects vouched
      begin/swap_in        swapped in for OUT: the commit      for by a plan marker until the
                                                               manifest's put; then a sweep
    remove(names)          unlinked                            deleted

A job's files are in place, with its record last, when its tail returns: a job is finished
when its record is there and lists files of the sizes (locally, the checksums) it gives.
The local executor runs a bucket job's tail in a thread while the next job is written.
Manifests (the commit point) are written last of all, after every tail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .. import _signals
from .._io import create, write_new
from ..errors import PacktoolError
from . import atomic, basename, flock, is_url, join, local_path, parent, publish
from .lock import StoreLock
from .place import Place


def open_output(url, storage_options: dict | None = None) -> Output:
    """The output at ``url``: a :class:`BucketOutput` for a store's URL, else a
    :class:`FolderOutput` (a path, or a ``file://`` URL)."""
    return (BucketOutput if is_url(url) else FolderOutput)(url, storage_options)


class Output:
    """The output ``path`` (a prefix ``out/corpus``, or a folder ``out/packed``): ``place``
    is the folder that holds it, ``name`` its name there. ``committed``: :meth:`commit` has
    put the manifest in place (a bucket has no local commit to ask: a Ctrl-C during the
    clean-up after it finds the output complete, packtool._signals.after_commit)."""

    committed = False

    def __init__(self, path, storage_options: dict | None = None):
        self.given = local_path(path)
        self.path = self._normal(self.given)
        self.name = basename(self.path)
        self.place = Place(parent(self.path), storage_options)

    @staticmethod
    def _normal(path):
        return Path(os.path.abspath(path))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!s})"

    def as_folder(self, path=None) -> Output:
        """The output (or ``path``, another folder written the same way: a local staging
        folder) as a folder of its own (a packed dataset, a directory export): its files are
        named relative to it."""
        out = object.__new__(type(self))
        out.given = out.path = self.path if path is None else path
        out.name = ""
        out.place = Place(out.path, self.place.storage_options)
        return out

    def child(self, name: str):
        """The path (or URL) of ``name`` inside the output's folder."""
        return join(self.path, name)

    def claim_plan(self, marker: str, body: dict, run, overwrite: bool) -> None:
        """The run's plan marker ``marker`` (``body``: its format, ``digest``...), one way
        for every stage: until a job's record is there, it vouches for the job's files. The
        array tasks of one plan share it (the first puts it); another plan's is refused
        (finish that run) unless a whole run's --overwrite discards it."""
        data = json.dumps(body).encode()
        if run.one_task:
            self.put_new(marker, data)
        try:
            current = json.loads(self.place.read_bytes(marker))
        except FileNotFoundError:
            current = body  # none yet: ours is the one
        except (OSError, ValueError):
            current = {}
        if not isinstance(current, dict) or current.get("digest") != body["digest"]:
            if not overwrite or run.one_task:
                raise PacktoolError(
                    f"{self.path} is being written from another plan ({marker}: other "
                    "inputs, options or version); finish that run (the same command, or "
                    "--finalize after its array tasks) or pass --overwrite to a whole run to "
                    "discard it")
            self.remove([marker])
        if not run.one_task:
            self.put(marker, data)

    def remove(self, names) -> list[str]:
        """Remove ``names`` (relative to the place) where they exist; those removed."""
        gone = []
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                self._remove_one(name)
                gone.append(name)
        return gone

    # ---------------------------------------------------------------------- exports
    @contextlib.contextmanager
    def export_session(self, check_existing):
        """Under the output's lock, a folder of the export's own (beside the output, or a
        scratch folder for a bucket) and what the output holds (``check_existing(self,
        old)`` proves what is there ours first); a full disk said of the output."""
        with self.lock() as notes:
            for note in notes:
                print(f"packtool: {note}", file=sys.stderr)
            old = self.as_folder().place.names()
            check_existing(self, old)
            with self.scratch(self.name) as folder:
                try:
                    yield folder, old
                except OSError as e:
                    if not atomic.is_enospc(e):
                        raise
                    raise self.no_space(e, folder, None) from None

    def publish_export(self, folder: Path, info: dict, old: set, marker: str, side: str
                       ) -> dict:
        """What the writer wrote into ``folder`` published, a directory export's ``marker``
        or a single-file export's sidecar ``side`` last: renamed in, or uploaded
        (:meth:`_publish_dir`, :meth:`_publish_files`); its files named where they now are."""
        target = folder / self.name
        if target.is_dir():
            notes = self._publish_dir(target, old, marker)
            files = [self.child(Path(f).relative_to(target).as_posix()) for f in info["files"]]
        else:
            notes = self._publish_files(folder, side)
            files = [self.place.path(Path(f).name) for f in info["files"]]
        return {**info, "files": files, "notes": list(info.get("notes", [])) + notes}


class FolderOutput(Output):
    """A local folder: a job is written in a folder of its own beside the output and
    published by renames, its record last (packtool.storage.atomic); manifests are
    committed journaled."""

    # ------------------------------------------------------------------ the prefix
    def check_prefix(self) -> Path:
        """``--out`` is a prefix, not a folder, and a name the file system can hold; the
        prefix (absolute)."""
        given = self.given
        if str(given).endswith(("/", "\\")) or Path(given).is_dir():
            raise PacktoolError(f"--out {given} is a directory; give a prefix inside it, e.g. "
                                f"{Path(given) / 'corpus'}")
        atomic.check_output_name(Path(self.path))  # the rule every command's --out obeys
        return Path(self.path)

    def file_ids(self, names) -> set[tuple[int, int]]:
        """(device, inode) of the files at ``names`` (relative to the place) that exist: an
        input that is one of them is an output."""
        ids = set()
        for n in names:
            with contextlib.suppress(OSError):
                st = os.stat(self.place.path(n))
                ids.add((st.st_dev, st.st_ino))
        return ids

    def contains(self, path) -> bool:
        """Whether the file or folder ``path`` lies inside the output."""
        return (not is_url(path)
                and str(Path(path).resolve()).startswith(str(self.path).rstrip("/") + "/"))

    @property
    def local_target(self) -> Path:
        """The local path written, to compare with the inputs read."""
        return Path(self.path)

    def make_place(self) -> None:
        Path(self.place.folder).mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------------- locks
    def lock(self, shared: bool = False):
        """The whole run's lock on the output (``shared``: the array tasks of one run hold
        it together); yields the notes of what was recovered from dead runs."""
        return atomic.output_lock(self.path, shared=shared)

    def job_lock(self, name: str, label: str):
        """One job's lock (``name``, a hidden file beside the job's files): a second writer
        of the same job waits, then finds it done."""
        lock = Path(self.place.path(name))
        lock.parent.mkdir(exist_ok=True)  # valid/ of a staging folder, made by its first job
        return flock.waiting(lock, label)

    def reclaim(self) -> list[str]:
        """What killed writers left beside the output, removed (under the run's lock)."""
        return atomic.reclaim(Path(self.path))

    # ----------------------------------------------------------------------- a job
    def scratch(self, name: str):
        """The job's own folder, ``.NAME.tmp-PID-RAND`` beside its files (reclaimed if the
        job is killed): on the same disk, so publishing is a rename."""
        return atomic.job_files(Path(self.place.folder), name)

    @property
    def store_place(self):
        """The place to check a job's objects in by size, None where its files are read
        and checksummed directly (a local folder)."""
        return None

    def finish_job(self, held, folder, names, record, result, *, retire=(), report=False):
        """The job published: ``retire`` removed, then its files renamed in, the record
        last; its ``(result, skipped)``."""
        self.remove(list(retire))
        atomic.commit_job(folder, names, record, Path(self.place.folder))
        return result, False

    def abandon(self, names: list[str]) -> None:
        """A failed run's plan marker (``names``) removed: a folder's jobs are published by
        renames under deferred signals, whole or not at all, so none is left half-published
        for it to vouch for (a killed run's marker stays)."""
        self.remove(names)

    def no_space(self, e: OSError, folder: Path, kept: str | None) -> PacktoolError:
        """A full disk while a job wrote ``folder``, said of the output (never a temporary
        name: a local pack's staging folder is named as its dataset)."""
        return atomic.no_space(e, atomic.final_name(self.path), [folder], kept)

    def published(self, text: str) -> None:
        """What publishing did, for the result: nothing, locally."""
        return None

    def commits_to(self, manifest: str, published, finished_here=None) -> None:
        """The run is complete only once ``manifest`` is committed; ``finished_here()``
        says what a stopped run leaves (None: its jobs are staged, so nothing stays)."""
        if finished_here is not None:
            _signals.commits_to(self.place.path(manifest), finished_here)

    # ------------------------------------------------------------------- manifests
    def put(self, name: str, data: bytes) -> None:
        """A small file (a staging folder's index, the retired list), written whole in
        place, not yet vouched for by anything: written under the run's lock and removed
        by the run's clean-up if it fails."""
        final = Path(self.place.path(name))
        final.parent.mkdir(exist_ok=True)
        final.unlink(missing_ok=True)
        write_new(final, data.decode("utf-8"))
        atomic.fsync_path(final)

    def commit(self, files: list[tuple[str, bytes]]) -> None:
        """Small files (records, then the manifest) written together, the last one the
        commit point: one journaled commit (all or none, whatever kills the run)."""
        paths = [Path(self.place.path(n)) for n, _ in files]
        with atomic.atomic_files(paths) as tmps:
            for tmp, (_, data) in zip(tmps, files, strict=True):
                with create(tmp) as f:
                    f.write(data)
        self.committed = True

    def put_new(self, name: str, data: bytes) -> bool:
        """``name`` written whole unless it exists (the first of several tasks wins): True
        if this call wrote it."""
        final = Path(self.place.path(name))
        tmp = atomic.temp_name(final)
        write_new(tmp, data.decode("utf-8"))
        try:
            os.link(tmp, final)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def _remove_one(self, name: str) -> None:
        Path(self.place.path(name)).unlink()

    # ------------------------------------------------ a folder assembled, then swapped in
    def check_replaceable(self, overwrite: bool, owned, manifest: str, vouched) -> None:
        """The folder may be written: nothing is there, or (``overwrite``) what ``owned``
        proves ours."""
        atomic.check_replaceable(Path(self.path), overwrite, owned)

    def staging(self, digest: str, run) -> Output:
        """Where the jobs are assembled: a temporary of this process for a local run
        (removed if it fails, reclaimed if it is killed); for Ray or array tasks a folder
        named by the plan, which every task (and a re-run, which resumes) finds."""
        out = Path(self.path)
        if run.executor == "local" and run.tasks is None and not run.finalize:
            return self.as_folder(atomic.temp_name(out))
        return self.as_folder(out.with_name(f".{out.name}.staging-{digest[:16]}"))

    def begin(self, target: Output, digest: str, run, overwrite: bool, marker: str,
              body: dict, manifests: list[str]) -> list[str]:
        """The staging folder of this plan, ready. Another plan's staging folder is refused
        (finish it with --finalize) unless --overwrite discards it, which only a whole run
        (holding the lock alone) may do."""
        path, staging = Path(self.path), Path(target.path)
        others = [p for p in path.parent.glob(f".{path.name}.staging-*")
                  if p != staging and p.is_dir() and not p.is_symlink()]
        if others and not (overwrite and not run.one_task):
            raise PacktoolError(
                f"{path} is being assembled from another plan ({others[0].name}: other "
                "sources, options or version); finish that run (the same command with "
                "--finalize) or pass --overwrite to discard it")
        for p in others:
            atomic.remove_path(p)
        if staging.is_symlink() or (staging.exists() and not staging.is_dir()):
            raise PacktoolError(f"{staging} is a symbolic link or not a folder; packtool "
                                f"assembles {path} only in a real folder of its own (never "
                                "through a link): remove it, or choose another --out")
        if run.finalize and not staging.is_dir():
            raise PacktoolError(f"--finalize: no task of this plan has run for {path} (no "
                                f"{staging.name}); run the array tasks first (--tasks N "
                                "--task K)")
        notes = [] if run.one_task else atomic.reclaim(path, inside=staging)  # before ours exists
        staging.mkdir(exist_ok=True)
        return notes

    def swap_in(self, target: Output, manifest: tuple[str, bytes], *, overwrite: bool, owned,
                keep, ours, remove_entries) -> list[str]:
        """The staging folder made the output: its ``manifest`` (name, bytes) written, the
        job entries and temporaries removed, then swapped in for the output (the commit)."""
        target.put(*manifest)
        staging = Path(target.path)
        remove_entries(staging)
        atomic.clear_temporaries(staging)
        atomic.check_replaceable(Path(self.path), overwrite, owned)
        atomic.commit_dir(staging, Path(self.path))
        return []

    def failed(self, e: BaseException, target: Output, whole_run: bool) -> None:
        """A run failing: a full disk said as such; a whole run's staging folder undone
        (nothing half-written)."""
        if atomic.is_enospc(e):
            raise atomic.no_space(e, self.path, [target.path] if whole_run else []) from None
        if whole_run:
            atomic.remove_path(target.path)

    # ---------------------------------------------------------------------- exports
    def _publish_dir(self, target: Path, old: set, marker: str) -> list[str]:
        """A directory export swapped in for the output (proven ours under the lock)."""
        atomic.check_replaceable(Path(self.path), True, lambda p: None)  # no link, no file
        atomic.commit_dir(target, Path(self.path))
        return []

    def _publish_files(self, folder: Path, side: str) -> list[str]:
        """Single files renamed in as one journaled commit, the sidecar ``side`` last."""
        names = [p.name for p in sorted(folder.iterdir()) if p.name != side] + [side]
        atomic.commit([(folder / n, Path(self.place.path(n))) for n in names], Path(self.path))
        return []


class BucketOutput(Output):
    """A bucket prefix: no rename, so a job is written in a local scratch folder and
    uploaded, each object verified, its record last; a plan marker vouches for the objects
    of a run in progress until a manifest does."""

    @staticmethod
    def _normal(path):
        return str(path).rstrip("/")

    def check_prefix(self) -> Path:
        """``--out`` is a prefix, not a folder: the prefix's name."""
        if str(self.given).endswith("/"):
            raise PacktoolError(f"--out {self.given} ends with '/': give a prefix, e.g. "
                                f"{self.given}corpus")
        return Path(self.name)

    def file_ids(self, names) -> set:
        return set()  # an object is never one of this machine's input files

    def contains(self, path) -> bool:
        return is_url(path) and str(path).startswith(str(self.path).rstrip("/") + "/")

    local_target = None  # a store's objects are never this machine's input files

    def make_place(self) -> None:
        """Nothing: a bucket has no folders to make."""

    # ----------------------------------------------------------------------- locks
    @contextlib.contextmanager
    def lock(self, shared: bool = False):
        """The whole run's lock object (array tasks, ``shared``, hold none: the plan
        marker keeps another plan out); yields no notes."""
        if shared:
            yield []
            return
        name = f".{self.name}.lock" if self.name else ".packtool.lock"
        with StoreLock(self.place.fs, f"{self.place.root}/{name}", str(self.place.path(name))):
            yield []

    def job_lock(self, name: str, label: str):
        return StoreLock(self.place.fs, f"{self.place.root}/{name}", str(self.place.path(name)),
                         wait=True)

    def reclaim(self) -> list[str]:
        return []  # a bucket's leftovers are swept after the commit

    # ----------------------------------------------------------------------- a job
    def scratch(self, name: str = ""):
        """A scratch folder of this process, removed when the job is published."""
        return publish.scratch_dir(str(self.path))

    @property
    def store_place(self):
        return self.place

    def finish_job(self, held, folder, names, record, result, *, retire=(), report=False):
        """The :class:`~packtool.storage.write.PendingUpload` that publishes the job
        (``retire``: what leaves first; ``report``: the result gains what was sent), holding
        the job's lock and scratch folder until then: uploaded while the next job is
        written."""
        self.remove(list(retire))
        names = names() if callable(names) else names  # a job may list its files lazily

        def send() -> tuple:
            sent = publish.Published(str(self.path))
            self.publish(folder, names, record, sent)
            return ({**result, "published": dataclasses.asdict(sent)} if report else result,
                    False)

        return PendingUpload(send, held.pop_all())

    def abandon(self, names: list[str]) -> None:
        """Nothing: an upload stopped half-way leaves objects the plan marker vouches for."""

    def no_space(self, e: OSError, folder: Path, kept: str | None) -> PacktoolError:
        """This machine's disk filled up while a job bound for the store was written."""
        return atomic.no_space(e, folder / self.name, [folder], kept)

    def publish(self, folder: Path, names: list[str], record: str, sent) -> None:
        """A job's files (``names``, relative to ``folder``) uploaded and verified, then its
        ``record``; ``sent`` (a :class:`~packtool.storage.publish.Published`) counts them."""
        publish.upload(self.place.fs, [(folder / n, f"{self.place.root}/{n}") for n in names],
                       sent)
        self.put(record, (folder / record).read_bytes())

    def published(self, text: str) -> str:
        return f"published to {self.path}: {text}"

    def commits_to(self, manifest: str, published, finished_here=None) -> None:
        """The run's objects stay for a re-run (``published()`` says which); the
        manifest's put is the commit."""
        _signals.commits_to(self.place.path(manifest), published, exists=lambda: self.committed)

    # ------------------------------------------------------------------- manifests
    def put(self, name: str, data: bytes) -> None:
        """One verified put."""
        publish.put_object(self.place.fs, f"{self.place.root}/{name}", data,
                           str(self.place.path(name)))

    def commit(self, files: list[tuple[str, bytes]]) -> None:
        """Puts in order: the last put commits (a reader trusts only it)."""
        with _signals.deferred():  # a put stopped half-way may or may not have landed:
            for name, data in files:  # a signal waits, the caller checks after it
                self.put(name, data)
            self.committed = True

    def put_new(self, name: str, data: bytes) -> bool:
        if self.place.is_file(name):
            return False
        self.put(name, data)
        return True

    def _remove_one(self, name: str) -> None:
        self.place.fs.rm_file(f"{self.place.root}/{name}")

    # ------------------------------------------- a prefix written in place, then swept
    def check_replaceable(self, overwrite: bool, owned, manifest: str, vouched) -> None:
        """The output may be written: nothing is there, (``overwrite``) what ``owned``
        proves ours, or the objects of a run in progress that ``vouched(names)`` (its
        plan marker) accepts."""
        names = {n for n in self.place.names() if not n.endswith(".lock")}
        if manifest in names:
            if not overwrite:
                raise PacktoolError(f"output already exists: {self.path}/{manifest}; pass "
                                    "--overwrite to replace it")
            owned(self.path, self.place)
            return
        vouched(names)

    def staging(self, digest: str, run) -> Output:
        return self  # no rename: the jobs publish straight to the output

    def begin(self, target: Output, digest: str, run, overwrite: bool, marker: str,
              body: dict, manifests: list[str]) -> list[str]:
        """The plan marker of this plan claimed (:meth:`claim_plan`), and with --overwrite
        the old ``manifests`` removed: readers stop seeing the old output."""
        if run.finalize:
            return []
        self.claim_plan(marker, body, run, overwrite)
        if overwrite and self.place.is_file(manifests[0]) and not run.one_task:
            self.remove(manifests)
        return []

    def swap_in(self, target: Output, manifest: tuple[str, bytes], *, overwrite: bool, owned,
                keep, ours, remove_entries) -> list[str]:
        """The ``manifest`` (name, bytes) put: the commit. Then every leftover of ours not
        in ``keep`` (job entries, the plan marker, an earlier run's objects) removed; a
        signal waits for this clean-up, as tokenize's does. The data objects removed."""
        target.commit([manifest])
        with _signals.deferred():
            stale = [n for n in self.place.names() if n not in keep and not n.endswith(".lock")
                     and ours(self.place, n)]
            removed = [n for n in self.remove(stale) if not n.startswith(".")]
        _signals.check()
        return removed

    def failed(self, e: BaseException, target: Output, whole_run: bool) -> None:
        """Nothing undone: the objects published stay for a re-run."""

    # ---------------------------------------------------------------------- exports
    def _publish_dir(self, target: Path, old: set, marker: str) -> list[str]:
        """A directory export's data objects uploaded, then its ``marker``, then the
        previous export's objects it does not list removed."""
        sent, inside = publish.Published(str(self.path)), self.as_folder()
        names = sorted(p.relative_to(target).as_posix() for p in target.rglob("*")
                       if p.is_file())
        inside.publish(target, [n for n in names if n != marker], marker, sent)
        removed = inside.remove(sorted(n for n in old - set(names) if not n.endswith(".lock")))
        return [self._sent(sent) + (f"; {len(removed):,} objects of the previous export "
                                    "removed" if removed else "")]

    def _publish_files(self, folder: Path, side: str) -> list[str]:
        """Single files uploaded, their sidecar ``side`` last."""
        sent = publish.Published(str(self.path))
        self.publish(folder, sorted(p.name for p in folder.iterdir() if p.name != side), side,
                     sent)
        return [self._sent(sent)]

    def _sent(self, sent) -> str:
        return self.published(f"{sent.uploaded:,} objects uploaded "
                              f"({sent.bytes_sent / 1e6:,.1f} MB), each verified, the marker "
                              "last")


class PendingUpload:
    """The rest of a job once its files are written, which only waits on a store: ``then()``
    uploads them and gives the job's ``(result, skipped)``. ``held`` (the job's lock, its
    scratch folder) is released when the tail ends, run or dropped."""

    def __init__(self, then: Callable[[], tuple], held: contextlib.ExitStack):
        self.then, self.held = then, held

    def __call__(self) -> tuple:
        with self.held:
            return self.then()

    def drop(self) -> None:
        """Release what the job holds without publishing it (the run is failing)."""
        self.held.close()
