"""Temporary names, and what the next run does with what a killed run left: its commit
finished or undone from the journal, its temporaries and free lock files removed.

``.NAME.tmp-PID-RAND`` (data being written), ``.NAME.old-PID-RAND`` (the previous output,
moved aside during a commit), ``.NAME.jtmp-PID-RAND`` (a journal being written): reclaimed
once their pid is dead. ``.KEY.journal``: a commit of ``KEY`` in progress, written and removed
under ``KEY``'s lock, so one left behind is a killed run's (see :mod:`packtool.storage.atomic`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
from pathlib import Path

from ..errors import PacktoolError
from . import flock

TEMP_KINDS = "tmp|old|jtmp"
# the files of one prefix share its lock
_SUFFIXES = (r"(?:\.(?:bin|boundaries|mask|roles|prompt|rewards|tree|images|img_grid|img_span|"
             r"img_ref\.jsonl|pos3|json|idx))?")


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
    are (an empty regular file of one link, see :func:`packtool.flock.lock_like`), or a
    temporary of its naming (``.NAME.tmp-PID-HEX``) whose pid is dead, as reclaim requires.
    A user's ``.notes.lock`` with content, or a live process's file, is not ours."""
    if _OUR_LOCK.fullmatch(path.name):
        return flock.is_lock_file(path)
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
    nbytes, pids = 0, set()
    for path, kind, pid in found:
        if kind not in ("journal", "lock") and not pid_alive(pid) and (
                path.exists() or path.is_symlink()):
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
        if temp is not None:
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
