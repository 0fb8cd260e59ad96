"""Write outputs under temporary names and rename them into place only when complete.

Ctrl-C, SIGTERM or an error mid-run therefore never leaves a half-written file under the
name the user asked for: either the old state or the complete new output is visible. A
SIGKILL can leave a dot-prefixed ``.NAME.tmp-PID-RANDOM`` behind; it never shadows a real output.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

from . import _signals
from .errors import PacktoolError


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def refuse_existing_files(paths: list[Path], overwrite: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise PacktoolError(
            f"output already exists: {', '.join(existing)}; pass --overwrite to replace it "
            "or choose another --out"
        )


@contextlib.contextmanager
def atomic_files(paths: list[Path], overwrite: bool = False):
    """Yield temporary paths for ``paths``; on success rename each into place, else delete.

    The last path is renamed last: make it the manifest, so a reader that finds the manifest
    finds complete data files beside it.
    """
    paths = [Path(os.path.abspath(p)) for p in paths]
    refuse_existing_files(paths, overwrite)
    for p in paths:
        if not p.parent.is_dir():
            raise PacktoolError(f"output directory {p.parent} does not exist; create it first")
    temps = [_temp_name(p) for p in paths]
    try:
        yield temps
    except BaseException:
        for t in temps:
            _remove(t)
        raise
    try:
        _signals.check()  # a signal swallowed by a library still cancels the commit
    except BaseException:
        for t in temps:
            _remove(t)
        raise
    for t, p in zip(temps, paths, strict=True):
        os.replace(t, p)


@contextlib.contextmanager
def atomic_dir(path: Path, overwrite: bool = False, owned_marker: str | None = None):
    """Yield a fresh temporary directory that becomes ``path`` on success.

    An existing non-empty ``path`` is refused unless ``overwrite``, and even then only if it
    is one of our own outputs (it holds ``owned_marker``, e.g. index.json): --overwrite never
    deletes a directory of the user's other files.
    """
    path = Path(os.path.abspath(path))
    if path.exists():
        if not path.is_dir():
            raise PacktoolError(f"output {path} exists and is not a directory; choose another --out")
        if any(path.iterdir()):
            if not overwrite:
                raise PacktoolError(
                    f"output directory {path} is not empty; pass --overwrite to replace it "
                    "or choose another --out"
                )
            if owned_marker and not (path / owned_marker).is_file():
                raise PacktoolError(
                    f"output directory {path} holds other files (no {owned_marker}): "
                    "--overwrite only replaces a previous packtool output; choose another --out"
                )
    if not path.parent.is_dir():
        raise PacktoolError(f"parent directory {path.parent} does not exist; create it first")
    tmp = _temp_name(path)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    try:
        _signals.check()  # a signal swallowed by a library still cancels the commit
    except BaseException:
        _remove(tmp)
        raise
    if path.exists():
        old = _temp_name(path)
        os.replace(path, old)
        os.replace(tmp, path)
        _remove(old)
    else:
        os.replace(tmp, path)
