"""Outputs written under temporary names, committed all at once, under an exclusive lock.

What a user can observe, whatever kills a run (SIGKILL included) and whenever:

- **A lock per output** (:mod:`packtool.storage.flock`): ``.NAME.lock`` beside the output,
  ``flock``-ed for the whole run (shared by the array tasks of one run): a second run to the
  same output fails at once, naming the holder. A lock file is never written, truncated or followed.
- **Temporaries carry the pid.** ``.NAME.tmp-PID-RAND`` (data being written) and
  ``.NAME.old-PID-RAND`` (the previous output, moved aside during a commit), reclaimed once
  their pid is dead. None ever shadows a real output. A commit's journal is
  ``.KEY.journal`` (``.KEY.jtmp-PID-RAND`` while it is written): one name per commit key,
  written only under the key's lock, so one left behind is a killed run's, found with one
  ``stat``, not by listing the folder (a listing per part commit made a plan of 2,000 parts
  quadratic: 10,000 entries listed 2,000 times).
- **One commit point.** Several files (part records and a corpus manifest, an export's
  files and sidecar) are committed from a journal written once every temporary is complete:
  the old files move aside, the new ones in, the manifest last, so a reader that trusts only
  what a manifest names never sees one run's data beside another's manifest. A job's files
  are published from its own folder by renames, its record last (:func:`commit_job`). A
  directory (``pack``, a directory export) is swapped in with one
  ``renameat2(RENAME_EXCHANGE)``, falling back to the journaled rename-aside + rename. Ctrl-C
  and SIGTERM are deferred during a commit and, if one arrived, the commit is undone.
- **Recovery on the next run** (:func:`reclaim`). Under the lock, a journal left by a
  dead process is finished (its new manifest was in place) or undone (the previous output
  restored), and temporaries and free lock files of dead processes are removed; the run
  says how many bytes it reclaimed.
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
import re
import secrets
import shutil
import sys
from pathlib import Path

from .. import _signals
from .._io import create
from ..errors import PacktoolError
from . import flock

TEMP_KINDS = "tmp|old|commit|jtmp"  # commit: the pid-named journal of older packtools
# the files of one prefix share its lock
_SUFFIXES = (r"(?:\.(?:bin|boundaries|mask|roles|prompt|rewards|tree|images|img_grid|img_span|"
             r"img_ref\.jsonl|pos3|json|idx))?")
EXCHANGE = True  # use renameat2(RENAME_EXCHANGE) where the kernel and file system have it
FSYNC = os.environ.get("PACKTOOL_FSYNC", "1") != "0"  # durable commits (0: off, to measure)


# ------------------------------------------------------------- temporaries and recovery
def temp_name(path: Path, kind: str = "tmp") -> Path:
    """A new temporary name for ``path`` (``.NAME.tmp-PID-RAND``), reclaimed once its pid
    is dead."""
    path = Path(os.path.abspath(path))
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(3)}")


def journal_path(key: Path) -> Path:
    """The journal of a commit of ``key`` (written and removed under ``key``'s lock)."""
    return key.with_name(f".{key.name}.journal")


def final_name(path: str | Path) -> Path:
    """The output a temporary name stands for (``.o.bin.tmp-12-ab3f`` -> ``o.bin``): errors
    name what the user asked for, never a hidden file. Other paths are returned unchanged."""
    p = Path(path)
    for parent in (p, *p.parents):
        m = re.fullmatch(rf"\.(.+)\.(?:{TEMP_KINDS})-\d+-[0-9a-f]+", parent.name)
        if m:
            return parent.with_name(m.group(1)) / p.relative_to(parent)
    return p


def remove_path(path: Path) -> None:
    """A file, link or folder, gone (a folder's contents too; a link is not followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def size_of(path: Path) -> int:
    try:
        if path.is_dir() and not path.is_symlink():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.lstat().st_size
    except OSError:
        return 0


def pid_alive(pid: int) -> bool:
    """Whether a temporary's pid may still be writing it (our own pid: no, see below)."""
    if pid == os.getpid():
        return False  # at first acquisition nothing of ours is in flight: a reused pid's leftover
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):  # a killed child not yet reaped is a zombie
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


_OUR_TEMP = re.compile(rf"\.[\w.-]+?\.({TEMP_KINDS})-(\d+)-[0-9a-f]+")
_OUR_LOCK = re.compile(r"\.[\w.-]+\.lock")


def left_by_us(path: Path) -> bool:
    """A hidden entry packtool provably left in an output: a lock file shaped as its locks
    are (an empty regular file of one link, see :func:`.flock.lock_like`), or a
    temporary of its naming (``.NAME.tmp-PID-HEX``) whose pid is dead, as reclaim requires.
    A user's ``.notes.lock`` with content, or a live process's file, is not ours."""
    if _OUR_LOCK.fullmatch(path.name):
        try:
            return flock.lock_like(os.lstat(path))  # the path itself, never followed
        except OSError:
            return False
    m = _OUR_TEMP.fullmatch(path.name)
    return bool(m) and not pid_alive(int(m.group(2)))


# ------------------------------------------------------------------------------ recovery
def _leftovers(output: Path) -> list[tuple[Path, str, int]]:
    """Temporaries of ``output``: of its own files (``.o.bin.tmp-PID-X``), and of the parts of
    a multi-part corpus and their manifests (``.o.part-00001.bin.tmp-…``,
    ``..o.part.json.tmp-…``, a part commit's journal ``.o.part-00001.journal``)."""
    name = re.escape(output.name)
    stem = rf"\.(?:{name}{_SUFFIXES}|\.?{name}\.(?:part[-.][\w.-]*|plan\.json|export\.json))"
    return _found(output.parent, re.compile(rf"{stem}\.({TEMP_KINDS})-(\d+)-[0-9a-f]+"),
                  re.compile(rf"{stem}\.lock"), re.compile(rf"{stem}\.journal"))


def _inner_leftovers(folder: Path) -> list[tuple[Path, str, int]]:
    """Temporaries of dead jobs inside an output being assembled (a pack's staging folder:
    ``.shard-00003.tmp-PID-X``, ``.index.tmp-PID-X``)."""
    found = []
    if folder.is_dir() and not folder.is_symlink():
        for sub in (folder, folder / "valid"):
            if sub.is_dir() and not sub.is_symlink():
                found += _found(sub, _OUR_TEMP, _OUR_LOCK)
    return found


def _found(folder: Path, temp, lock, journal=None) -> list[tuple[Path, str, int]]:
    """(path, kind, pid) of the entries of ``folder`` the patterns match: a temporary
    (``temp``: its kind and pid), a journal, a lock (pid 0)."""
    found = []
    for n in os.listdir(folder):
        m = temp.fullmatch(n)
        if m:
            found.append((folder / n, m.group(1), int(m.group(2))))
        elif journal is not None and journal.fullmatch(n):
            found.append((folder / n, "journal", 0))
        elif lock.fullmatch(n):
            found.append((folder / n, "lock", 0))
    return found


def clear_temporaries(folder: Path) -> None:
    """Every temporary inside an output being assembled, whoever left it, and its jobs' lock
    files that nobody holds: called once all its jobs are done (a Ray worker killed mid-job
    leaves a temporary that its retry does not reuse, and its job's lock file)."""
    for path, kind, _ in _inner_leftovers(folder):
        if kind == "lock":
            flock.remove_if_free(path)
        else:
            remove_path(path)


def reclaim(output: Path, inside: Path | None = None) -> list[str]:
    """Under ``output``'s lock: finish or undo commits of dead runs, then remove their
    temporaries (beside ``output``, and inside ``inside``, an output being assembled).
    Returns one note per action, for the run's warnings."""
    notes = []
    own = journal_path(output)
    if own.exists():
        notes.append(f"{output}: " + _recover(own) + " (a run was killed mid-commit)")
    found = _leftovers(output) + (_inner_leftovers(inside) if inside is not None else [])
    for path, kind, _ in found:
        if kind == "journal" and path != own:
            notes += _recover_other(path)
    for path, kind, _ in found:  # a part's or a commit's lock left by a killed process
        if kind == "lock":
            flock.remove_if_free(path)
    leftovers = [x for x in found if x[1] not in ("journal", "lock") and not pid_alive(x[2])]
    for path, kind, pid in leftovers:  # a journal named by its pid (an older packtool's):
        if kind == "commit":  # undone before its set-aside files could be swept as temporaries
            notes.append(f"{output}: " + _recover(path) + f" (pid {pid} was killed mid-commit)")
    nbytes, pids = 0, set()
    for path, kind, pid in leftovers:
        if kind != "commit" and (path.exists() or path.is_symlink()):
            nbytes += size_of(path)
            pids.add(pid)
            remove_path(path)
    if pids:
        notes.append(f"reclaimed {nbytes:,} bytes of temporary files beside {output} left by "
                     f"{len(pids)} interrupted run(s) (pid {', '.join(map(str, sorted(pids)))})")
    return notes


def _recover_other(journal: Path) -> list[str]:
    """A journal of another key (a part's commit): recovered under that key's lock, unless a
    live process holds it (its commit is under way)."""
    key = journal.with_name(journal.name[1:-len(".journal")])
    try:
        with flock.hold(flock.lock_path(key), "exclusive", f"output {key}"):
            if not journal.exists():
                return []
            return [f"{key}: " + _recover(journal) + " (a run was killed mid-commit)"]
    except PacktoolError:
        return []


def _recover(journal: Path) -> str:
    try:
        entries = [[Path(x) if x else None for x in e] for e in json.loads(journal.read_text())]
    except (OSError, ValueError):  # killed while writing the journal: nothing was renamed yet
        remove_path(journal)
        return "removed an incomplete commit journal; the previous output is unchanged"
    if _committed(entries):
        finish(entries, journal)
        return "completed an interrupted commit: its new output was already in place"
    undo(entries)
    remove_path(journal)
    return "undid an interrupted commit: the previous output is back in place"


def _committed(entries) -> bool:
    temp, final, _ = entries[-1]  # the manifest (or the one directory) moves in last
    return temp is not None and not temp.exists() and final.exists()


def finish(entries, journal: Path) -> None:
    remove_path(journal)
    for _, _, aside in entries:
        if aside is not None:
            remove_path(aside)


def undo(entries) -> None:
    """Back to the state before the commit, whatever step it stopped at: a final whose
    temporary is gone is the new one (remove it); an aside is the old one (put it back)."""
    for temp, final, aside in entries:
        if temp is not None and not temp.exists() and final.exists():
            remove_path(final)
        if aside is not None and aside.exists():
            os.replace(aside, final)
        if temp is not None:  # None: an older packtool's "only remove final" entry
            remove_path(temp)


# ----------------------------------------------------------------------------- full disk
def no_space(err: OSError, output: Path, temps: list[Path], kept: str | None = None
             ) -> PacktoolError:
    """A full disk, worded for the output the user asked for (never a temporary): what the
    run needed or had written, what is free, and what stays (``kept``: finished parts that a
    re-run reuses), after removing ``temps``."""
    written = sum(size_of(t) for t in temps)
    for t in temps:
        remove_path(t)
    free = shutil.disk_usage(output.parent).free
    more = getattr(err, "needed", None)
    if more:
        need = (f"it needs {written + more:,} bytes, {free:,} bytes are free on its file "
                "system")
    else:
        need = (f"it needs more than the free space ({free:,} bytes are free on its file "
                f"system; it filled up after {written:,} bytes of the output were written)")
    left = (f"; {kept} stay, and the same command run again resumes from them" if kept
            else " (nothing was written)")
    return PacktoolError(f"no space left on device for {output}: {need}{left}; free space or "
                         "choose another --out")



def is_enospc(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


_remove = remove_path  # one name for a test to watch the commits' removals


# ---------------------------------------------------------------------------------- lock
@contextlib.contextmanager
def output_lock(output: str | Path, shared: bool = False):
    """Hold ``output``'s lock (re-entrant; ``shared``: the array tasks of one run hold it
    together); yield the notes of what was recovered and reclaimed from dead runs (an empty
    list for a shared holder, which leaves that to the run that finalizes). Missing parent
    folders are created, and removed again if the run fails and they are still empty."""
    output = Path(os.path.abspath(output))
    check_output_name(output)
    lock = flock.lock_path(output)
    created = make_parents(output)
    try:
        with flock.hold(lock, "shared" if shared else "exclusive", f"output {output}"):
            yield [] if shared else reclaim(output)
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
    tmp = temp_name(journal.with_name(journal.name[1:-len(".journal")]), "jtmp")
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


def _commit(entries: list[tuple[Path, Path, Path | None]], journal: Path) -> None:
    """Move each ``temp`` to ``final``, an existing ``final`` first to ``aside``. The last
    entry is the commit point. Data (and the folders
    it goes to) are fsynced before the journal, the folders again after the last rename.
    Signals are deferred throughout; one that arrived undoes the commit, then ends the run."""
    for temp, _, _ in entries:
        if temp.exists():
            fsync_tree(temp) if temp.is_dir() else fsync_path(temp)
    folders = {final.parent for _, final, _ in entries}
    for d in folders:
        fsync_path(d)
    with _signals.deferred():
        _signals.check()
        _write_journal(journal, entries)
        try:
            # the old manifest leaves first, then the data; the new manifest comes in last
            for _, final, aside in reversed(entries):
                if aside is not None and (final.exists() or final.is_symlink()):
                    os.replace(final, aside)
            for temp, final, _ in entries:
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


def commit(moves: list[tuple[Path, Path]], key: Path) -> None:
    """Files (temporary, final) renamed in as one journaled commit of ``key`` (each final
    already there moved aside first), the last one the commit point."""
    _commit([(t, f, temp_name(f, "old")) for t, f in moves], journal_path(key))


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
    return _commit([(tmp, path, temp_name(path, "old"))], journal_path(path))


# ------------------------------------------------------------------------------- a job
@contextlib.contextmanager
def job_files(folder: Path, name: str):
    """A temporary folder of this pid in ``folder`` for one job's files (a part, a shard, a
    group of shards), ``.NAME.tmp-PID-RAND``; removed on exit, whatever happened (a killed
    run's is reclaimed by the next run). Publish what was written with :func:`commit_job`."""
    folder.mkdir(exist_ok=True)
    tmp = folder / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        with _signals.deferred():  # a second Ctrl-C must not stop the clean-up half-way
            _remove(tmp)


def commit_job(tmp: Path, names: list[str], record: str, dest: Path) -> None:
    """A finished job's files (``names`` relative to ``tmp``) renamed into ``dest``, its
    ``record`` last: every file fsynced first, the folders after the renames, signals deferred
    throughout (a Ctrl-C never leaves half a job without its record). A job is finished when
    its record is there and lists files of the sizes and checksums it gives; one killed before
    the record is done again."""
    fsync_tree(tmp)
    with _signals.deferred():
        folders = set()
        for name in names:
            final = dest / name
            final.parent.mkdir(exist_ok=True)  # valid/ of a staging folder
            os.replace(tmp / name, final)
            folders.add(final.parent)
        for d in folders:
            fsync_path(d)
        os.replace(tmp / record, dest / record)
        fsync_path((dest / record).parent)
    _signals.check()


# ---------------------------------------------------------------------------------- api
@contextlib.contextmanager
def atomic_files(paths: list[Path]):
    """Yield temporary paths for ``paths``; on success commit them all, else delete them.
    The last path is the commit point (make it the manifest) and its lock is held
    throughout; a full disk is said of it."""
    paths = [Path(os.path.abspath(p)) for p in paths]
    key = paths[-1]
    with output_lock(key) as notes:
        for note in notes:
            print(f"packtool: {note}", file=sys.stderr)
        temps = [temp_name(p) for p in paths]
        try:  # to the end of the commit, a signal still finds the temporaries removed
            yield temps
            commit(list(zip(temps, paths, strict=True)), key)
        except BaseException as e:
            with _signals.deferred():  # a second Ctrl-C must not stop the clean-up half-way
                err = no_space(e, key, temps) if is_enospc(e) else None
                for t in temps:
                    _remove(t)
            if err is not None:
                raise err from None
            raise


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
    owned(path)
