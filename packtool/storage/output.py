"""Where a stage writes: one interface over a local folder and a bucket prefix.

``tokenize``, ``pack`` and ``export`` are written once over an :class:`Output`; where the
files live is the output's business (mosaicml/streaming's uploader is a no-op for a local
path; datatrove's ``DataFolder`` serves both). The steps, and what each does where::

    step                   local folder                        bucket (no rename)
    lock(shared)           flock of .NAME.lock (_atomic)       lock object, conditional put
    place                  reads and listings of the folder    the same, through fsspec
    job_lock(name)         flock, waited for                   lock object, waited for
    scratch()              the folder itself: a job commits    a scratch folder of this
                           its files in place (_atomic)        process (storage.stage_out)
    publish(dir, names,    nothing: already in place           each object uploaded and
            record)                                            verified, the record last
    put(name, data)        written whole, renamed in           one put, its size checked
    remove(names)          unlinked                            deleted

A job's files are in place, with its record last, when ``publish`` returns: a job is
finished when its record is there and lists files of the sizes (locally, the checksums) it
gives. For a bucket, a stage hands ``publish`` to its executor as the job's tail
(:class:`packtool.executors.Tail`, holding the job's lock and scratch folder), which the
local executor runs in a thread while the next job is written. Manifests (the commit
point) are written last of all by the stage, after every tail, through ``put`` or, for a
local folder, its journaled commit (:mod:`packtool._atomic`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from . import basename, is_url, local_path, parent
from .place import Place


class Output:
    """The output ``path`` (a prefix ``out/corpus``, or a folder ``out/packed``): ``place``
    is the folder that holds it, ``name`` its name there. ``committed``: :meth:`commit` has
    put the manifest in place (a bucket has no local commit to ask: a Ctrl-C during the
    clean-up after it finds the output complete, packtool._signals.after_commit)."""

    committed = False

    def __init__(self, path, storage_options: dict | None = None):
        self.remote = is_url(path)
        self.path = (str(path).rstrip("/") if self.remote
                     else Path(os.path.abspath(local_path(path))))
        self.name = basename(self.path)
        self.place = Place(parent(self.path), storage_options)

    def __repr__(self) -> str:
        return f"Output({self.path!s})"

    def inside(self) -> Output:
        """The output as a folder of its own (a packed dataset, a directory export)."""
        out = Output.__new__(Output)
        out.remote, out.path, out.name = self.remote, self.path, ""
        out.place = Place(self.path, self.place.storage_options)
        return out

    def at(self, folder) -> Output:
        """Another folder written the same way (a local staging folder, a split)."""
        out = Output.__new__(Output)
        out.remote, out.path, out.name = self.remote, folder, ""
        out.place = Place(folder, self.place.storage_options)
        return out

    # ------------------------------------------------------------------------ locks
    @contextlib.contextmanager
    def lock(self, shared: bool = False):
        """The whole run's lock on the output (``shared``: the array tasks of one run hold
        it together); yields the notes of what was recovered from dead runs."""
        if not self.remote:
            from .._atomic import output_lock

            with output_lock(self.path, shared=shared) as notes:
                yield notes
            return
        if shared:
            yield []
            return
        from .lock import StoreLock

        name = self._lock_name()
        with StoreLock(self.place.fs, f"{self.place.root}/{name}", str(self.place.path(name))):
            yield []

    def _lock_name(self) -> str:
        return f".{self.name}.lock" if self.name else ".packtool.lock"

    @contextlib.contextmanager
    def job_lock(self, name: str, label: str):
        """One job's lock (``name``, a hidden file beside the job's files): a second writer
        of the same job waits, then finds it done."""
        if not self.remote:
            from .. import _locks

            lock = Path(self.place.path(name))
            lock.parent.mkdir(exist_ok=True)  # valid/ of a staging folder, made by its first job
            with _locks.waiting(lock, label):
                yield
            return
        from .lock import StoreLock

        with StoreLock(self.place.fs, f"{self.place.root}/{name}", str(self.place.path(name)),
                       wait=True):
            yield

    # ----------------------------------------------------------------------- a job
    @contextlib.contextmanager
    def scratch(self):
        """The local folder a job writes its files in: the output's own folder (they are
        committed in place), or for a bucket a scratch folder of this process, removed
        when the job is published."""
        if not self.remote:
            yield Path(self.place.folder)
            return
        from .stage_out import scratch_dir

        with scratch_dir(str(self.path)) as folder:
            yield folder

    def publish(self, folder: Path, names: list[str], record: str | None, sent=None) -> None:
        """A job's files (``names``, relative to ``folder``) and then its ``record`` in
        place: nothing to do for a local folder (the job committed them there); uploaded
        and verified for a bucket, the record last."""
        if not self.remote:
            return
        from .publish import Published, put_object, upload

        sent = sent if sent is not None else Published(str(self.path))
        root = self.place.root
        upload(self.place.fs, [(folder / n, f"{root}/{n}") for n in names], sent)
        if record is not None:
            put_object(self.place.fs, f"{root}/{record}", (folder / record).read_bytes(),
                       str(self.place.path(record)))

    # -------------------------------------------------------------------- manifests
    def put(self, name: str, data: bytes) -> None:
        """A small object (a marker, a staging folder's index) written whole: in place
        locally, one verified put in a bucket."""
        if self.remote:
            from .publish import put_object

            put_object(self.place.fs, f"{self.place.root}/{name}", data,
                       str(self.place.path(name)))
            return
        from .._atomic import fsync_path
        from .._io import write_new

        # locally what is put is not yet vouched for by anything (a staging folder's index,
        # the retired list): written in place, under the run's lock, and removed by the
        # run's clean-up if it fails
        final = Path(self.place.path(name))
        final.unlink(missing_ok=True)
        write_new(final, data.decode("utf-8"))
        fsync_path(final)

    def commit(self, files: list[tuple[str, bytes]]) -> None:
        """Small files (records, then the manifest) written together, the last one the
        commit point: one journaled commit locally (all or none, whatever kills the run),
        puts in order in a bucket (the last put commits; a reader trusts only it)."""
        if self.remote:
            from .. import _signals

            with _signals.deferred():  # a put stopped half-way may or may not have landed:
                for name, data in files:  # a signal waits, the caller checks after it
                    self.put(name, data)
                self.committed = True
            return
        from .._atomic import atomic_files
        from .._io import create

        paths = [Path(self.place.path(n)) for n, _ in files]
        with atomic_files(paths, True, key=paths[-1]) as tmps:
            for tmp, (_, data) in zip(tmps, files, strict=True):
                with create(tmp) as f:
                    f.write(data)
        self.committed = True

    def put_new(self, name: str, data: bytes) -> bool:
        """``name`` written whole unless it exists (the first of several tasks wins): True
        if this call wrote it."""
        if self.remote:
            if self.place.is_file(name):
                return False
            self.put(name, data)
            return True
        from .._atomic import temp_name
        from .._io import write_new

        final = Path(self.place.path(name))
        tmp = temp_name(final)
        write_new(tmp, data.decode("utf-8"))
        try:
            os.link(tmp, final)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def remove(self, names) -> list[str]:
        """Remove ``names`` (relative to the place) where they exist; those removed."""
        gone = []
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                if self.remote:
                    self.place.fs.rm_file(f"{self.place.root}/{name}")
                else:
                    Path(self.place.path(name)).unlink()
                gone.append(name)
        return gone
