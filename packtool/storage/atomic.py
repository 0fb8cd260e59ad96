"""Outputs written under temporary names, committed all at once, under an exclusive lock.

What a user can observe, whatever kills a run (SIGKILL included) and whenever:

- **A lock per output** (:mod:`packtool.storage.flock`): ``.NAME.lock`` beside the output,
  ``flock``-ed for the whole run (shared by the array tasks of one run): a second run to the
  same output fails at once, naming the holder. A lock file is never written, truncated or followed.
- **Temporaries carry the pid.** ``.NAME.tmp-PID-RAND`` (data being written) and
  ``.NAME.old-PID-RAND`` (the previous output, moved aside during a commit). None ever
  shadows a real output. A commit's journal is ``.KEY.journal`` (``.KEY.jtmp-PID-RAND``
  while it is written): one name per commit key, written only under the key's lock, so a
  commit finds a journal of its key left by a dead run with one ``stat``, not by listing the
  folder (a listing per part commit made a plan of 2,000 parts quadratic: 10,000 entries
  listed 2,000 times).
- **One commit point.** Several files (token files) are committed from a journal written once
  every temporary is complete: the old manifest leaves first, the data files move in, the new
  manifest moves in last, so a reader that trusts only what a manifest names never sees one
  run's data beside another's manifest. A directory (``pack``) is swapped in with one
  ``renameat2(RENAME_EXCHANGE)``, falling back to the journaled rename-aside + rename. Ctrl-C
  and SIGTERM are deferred during a commit and, if one arrived, the commit is undone.
- **Recovery on the next run** (:mod:`packtool.storage.temps`). Under the lock, a journal left by a
  dead process is finished (its new manifest was in place) or undone (the previous output
  restored), and temporaries of dead processes are removed; the run says how many bytes it
  reclaimed.
- **Durable.** Data files and their folder are fsynced before the commit point (the manifest's
  or the directory's rename), the folder after it: a power cut never leaves a manifest naming
  data that is not on disk.
- **Only our own output is replaced.** ``--overwrite`` replaces a directory only when its
  format proves every entry in it ours (``owned``, the same proof for a bucket:
  :mod:`packtool.storage.output`); anything else is refused by name.
- **A full disk** is an error naming the output (not a temporary), the bytes written and free.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import sys
from pathlib import Path

from .. import _signals
from .._io import create
from ..errors import PacktoolError
from . import flock
from .temps import (  # noqa: F401 - temp_name, final_name, reclaim...: this module's API too
    clear_temporaries,
    final_name,
    finish,
    is_enospc,
    journal_path,
    no_space,
    reclaim,
    remove_path,
    size_of,
    tagged_name,
    temp_name,
    undo,
)

EXCHANGE = True  # use renameat2(RENAME_EXCHANGE) where the kernel and file system have it
FSYNC = os.environ.get("PACKTOOL_FSYNC", "1") != "0"  # durable commits (0: off, to measure)

_remove = remove_path


# ---------------------------------------------------------------------------------- lock
lock_path = flock.lock_path


@contextlib.contextmanager
def output_lock(output: str | Path, shared: bool = False, scan: bool = True):
    """Hold ``output``'s lock (re-entrant; ``shared``: the array tasks of one run hold it
    together); yield the notes of what was recovered and reclaimed from dead runs (an empty
    list for a shared holder, which leaves that to the run that finalizes; ``scan=False``:
    only ``output``'s own journal, see :func:`reclaim`). Missing parent folders are created,
    and removed again if the run fails and they are still empty."""
    output = Path(os.path.abspath(output))
    check_output_name(output)
    lock = lock_path(output)
    created = make_parents(output)
    try:
        with flock.hold(lock, "shared" if shared else "exclusive", f"output {output}"):
            yield [] if shared else reclaim(output, scan=scan)
    except BaseException:
        for d in created:  # deepest first; only what this run made and left empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def check_output_name(output: Path) -> None:
    """An output is a name of its own (not ``/``) that JSON and Parquet can record (UTF-8)."""
    if not output.name:
        raise PacktoolError(f"--out {output} names no file or folder of its own; give a path "
                            f"inside a folder, e.g. {output / 'packed'}")
    try:
        str(output).encode("utf-8")
    except UnicodeEncodeError:
        raise PacktoolError(f"--out {str(output)!r} is not valid UTF-8; packtool records output "
                            "names in JSON manifests (and Parquet files): rename it") from None


def make_parents(output: Path) -> list[Path]:
    """Create ``output``'s missing parent folders; return them, deepest first."""
    missing = []
    d = output.parent
    while not d.exists():
        missing.append(d)
        d = d.parent
    if not d.is_dir():
        raise PacktoolError(f"cannot write {output}: {d} is not a folder")
    for d in reversed(missing):
        try:
            d.mkdir(exist_ok=True)  # another run may make it first
        except OSError as e:
            raise PacktoolError(f"cannot create the folder {d} for {output}: "
                                f"{e.strerror or e}") from None
    return missing


# -------------------------------------------------------------------------------- commit
def _write_journal(journal: Path, entries) -> None:
    # its own kind: with a one-file output the key is that file, whose data temporary is
    # ``.NAME.tmp-TAG``; the journal's must not be the same name (reclaimable too)
    tmp = tagged_name(journal.with_name(journal.name[1:-len(".journal")]), "jtmp")
    try:
        with create(tmp) as f:
            f.write(json.dumps([[str(x) if x else None for x in e] for e in entries]).encode())
            f.flush()
            if FSYNC:
                os.fsync(f.fileno())
        os.replace(tmp, journal)
    except BaseException:
        _remove(tmp)
        raise


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's) data and metadata to the disk."""
    if not FSYNC:
        return
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Every file under ``folder``, then each folder (deepest first)."""
    if not FSYNC:
        return
    folders = []
    for root, _dirs, files in os.walk(folder):
        for f in files:
            fsync_path(Path(root) / f)
        folders.append(Path(root))
    for d in reversed(folders):
        fsync_path(d)


def _commit(entries: list[tuple[Path | None, Path, Path | None]], journal: Path) -> None:
    """Move each ``temp`` to ``final``, an existing ``final`` first to ``aside`` (``temp``
    None: only remove ``final``). The last entry is the commit point. Data (and the folders
    it goes to) are fsynced before the journal, the folders again after the last rename.
    Signals are deferred throughout; one that arrived undoes the commit, then ends the run."""
    for temp, _, _ in entries:
        if temp is not None and temp.exists():
            fsync_tree(temp) if temp.is_dir() else fsync_path(temp)
    folders = {final.parent for _, final, _ in entries}
    for d in folders:
        fsync_path(d)
    with _signals.deferred():
        _signals.check()
        _write_journal(journal, entries)
        try:
            # what only leaves (a manifest being replaced) leaves first, then the manifest,
            # then the data; the new manifest comes in last
            leaving = [e for e in entries if e[0] is None] + [
                e for e in reversed(entries) if e[0] is not None]
            for _, final, aside in leaving:
                if aside is not None and (final.exists() or final.is_symlink()):
                    os.replace(final, aside)
            for temp, final, _ in entries:  # ... and comes in last
                if temp is not None:
                    os.replace(temp, final)
            for d in folders:
                fsync_path(d)
            _signals.check()
        except BaseException:
            undo(entries)
            _remove(journal)
            raise
        _signals.committed()
        finish(entries, journal)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    kernel, libc or file system lacks it."""
    if not EXCHANGE or not sys.platform.startswith("linux"):
        return False
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def commit_dir(tmp: Path, path: Path) -> None:
    """Put the complete folder ``tmp`` in place of ``path`` (which, if it exists, the caller
    has proven its own): one ``RENAME_EXCHANGE``, else the journaled rename-aside."""
    if not path.exists():
        return _commit([(tmp, path, None)], journal_path(path))
    fsync_tree(tmp)
    with _signals.deferred():
        _signals.check()
        if _exchange(tmp, path):  # one step: old and new are never both missing
            if _signals.received:
                _exchange(tmp, path)
                _remove(tmp)
                _signals.check()
            _signals.committed()
            fsync_path(path.parent)
            _remove(tmp)  # the previous output, now under the temporary name
            return None
    return _commit([(tmp, path, tagged_name(path, "old"))], journal_path(path))


# ------------------------------------------------------------------------------- a job
@contextlib.contextmanager
def job_files(folder: Path, name: str):
    """A temporary folder of this pid in ``folder`` for one job's files (a part, a shard, a
    group of shards); removed on exit, whatever happened (a killed run's is reclaimed by
    the next run). Commit what was written with :func:`commit_job`."""
    folder.mkdir(exist_ok=True)
    tmp = folder / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def commit_job(tmp: Path, moves: list[tuple[str, Path]], record: Path) -> None:
    """A finished job's files into place, its record last: every file (and ``tmp``'s
    ``record.json``) fsynced, each ``(name in tmp, final path)`` renamed in, then the record,
    then the folders fsynced. A job is finished when its record is there and lists files of
    the sizes and checksums it gives; one killed before the record is done again."""
    fsync_tree(tmp)
    folders = set()
    for name, final in moves:
        os.replace(tmp / name, final)
        folders.add(final.parent)
    for d in folders:
        fsync_path(d)
    os.replace(tmp / "record.json", record)
    fsync_path(record.parent)


# ---------------------------------------------------------------------------------- api
def refuse_existing_files(paths: list[Path], overwrite: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise PacktoolError(
            f"output already exists: {', '.join(existing)}; pass --overwrite to replace it "
            "or choose another --out"
        )


def _key(paths: list[Path]) -> Path:
    """The output several files make up: ``o`` for o.bin, o.boundaries, o.json."""
    if len(paths) == 1:
        return paths[0]
    common = os.path.commonprefix([p.name for p in paths])
    return paths[0].with_name(common[:-1] if common.endswith(".") else common or paths[0].name)


@contextlib.contextmanager
def atomic_files(paths: list[Path], overwrite: bool = False, *, key: Path | None = None,
                 remove: list[Path] = (), label: Path | None = None, scan: bool = True,
                 owned=None, kept=None):
    """Yield temporary paths for ``paths``; on success commit them all, else delete them.

    The last path is the commit point: make it the manifest. ``remove``: files of a previous
    output that the new one does not have (deleted in the same commit). The output's lock
    (``key``, default the common prefix of the names) is held throughout; errors name
    ``label`` (default ``key``), the output the user asked for. ``scan=False``: a commit of
    one part of a larger output, whose run reclaims the folder (see :func:`reclaim`).
    ``owned(existing)``: with ``overwrite``, the writer's proof that the files already at
    ``paths`` are its own output (it raises, naming what is not); without it the caller has
    proven them before (a tokenize part, from the manifests that list it). ``kept()``: what
    of the output stays if the disk fills up (finished parts), for the error.
    """
    paths = [Path(os.path.abspath(p)) for p in paths]
    key = Path(os.path.abspath(key)) if key else _key(paths)
    with output_lock(key, scan=scan) as notes:
        for note in notes:
            print(f"packtool: {note}", file=sys.stderr)
        refuse_existing_files(paths, overwrite)
        existing = [p for p in paths if p.exists() or p.is_symlink()]
        if existing and owned is not None:
            owned(existing)
        tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        temps = [tagged_name(p, "tmp", tag) for p in paths]
        try:
            yield temps
        except BaseException as e:
            _discard(e, label or key, temps, kept)
        try:  # from the body's end to the commit, a signal still finds the temporaries removed
            entries = [(None, Path(os.path.abspath(p)), tagged_name(Path(p), "old", tag))
                       for p in remove if Path(p).exists()]
            entries += [(t, p, tagged_name(p, "old", tag))
                        for t, p in zip(temps, paths, strict=True)]
            _commit(entries, journal_path(key))
        except BaseException as e:
            _discard(e, label or key, temps, kept)


def _discard(e: BaseException, label: Path, temps: list[Path], kept=None):
    """Remove a failed run's temporaries and re-raise (a full disk as a clear error naming
    ``label``, the output the user asked for, and what ``kept()`` says stays)."""
    with _signals.deferred():  # a second Ctrl-C must not stop the clean-up half-way
        if is_enospc(e):
            err = no_space(e, label, temps, kept() if kept else None)
        else:
            err = None
            for t in temps:
                _remove(t)
    if err is not None:
        raise err from None
    raise e


@contextlib.contextmanager
def atomic_dir(path: Path, overwrite: bool = False, owned=None):
    """Yield a fresh temporary directory that becomes ``path`` on success.

    An existing non-empty ``path`` is refused unless ``overwrite``, and even then only if
    ``owned(path)`` (the format's proof that every entry in it is ours) passes: --overwrite
    never deletes a directory of the user's other files.
    """
    path = Path(os.path.abspath(path))
    with output_lock(path) as notes:
        for note in notes:
            print(f"packtool: {note}", file=sys.stderr)
        check_replaceable(path, overwrite, owned)
        tmp = tagged_name(path)
        try:  # made inside: a signal right after mkdir still finds it removed
            tmp.mkdir()
            yield tmp
            commit_dir(tmp, path)
        except BaseException as e:
            _discard(e, path, [tmp])


def check_replaceable(path: Path, overwrite: bool, owned) -> None:
    """``path`` may be written: it does not exist, is an empty folder, or (``overwrite``) a
    folder ``owned`` proves ours (it raises, naming what is not)."""
    if path.is_symlink():
        raise PacktoolError(f"output {path} is a symbolic link; packtool writes its outputs "
                            "only as real folders: choose another --out")
    if not path.exists():
        return
    if not path.is_dir():
        raise PacktoolError(f"output {path} exists and is not a directory; choose another "
                            "--out")
    if not any(path.iterdir()):
        return
    if not overwrite:
        raise PacktoolError(f"output directory {path} is not empty; pass --overwrite to "
                            "replace it or choose another --out")
    if owned is None:
        raise PacktoolError(f"output directory {path} is not empty and --overwrite cannot "
                            "prove it a packtool output; choose another --out")
    owned(path)
