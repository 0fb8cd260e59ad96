"""An output at a URL, made by a stage's local code in a staging folder and then published
(:mod:`.publish`): what ``pack`` and ``tokenize`` share when ``--out`` is ``s3://...``.

The staging folder is ``CACHE_DIR/staging/<hash of the URL>/``: local to this machine,
packtool's own (it is removed before a run and after a successful publish). A run
interrupted during the upload leaves no manifest at the URL; the same command makes the
output again (outputs are deterministic: the same bytes) and uploads only the objects that
are not already there, verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import socket
from pathlib import Path

from ..errors import PacktoolError
from . import basename, is_url


def refuse_distributed(url: str, run) -> None:
    """Ray and array tasks write into one folder every worker sees; a URL output is staged on
    this machine, so they are refused until each task publishes its own objects."""
    if run is not None and (run.executor != "local" or run.tasks is not None or run.finalize):
        raise PacktoolError(
            f"--out {url}: an object-store output is made on this machine and published when "
            "complete, so --executor ray, --tasks and --finalize need a local or shared --out "
            "(write there, then copy with fsspec/aws s3 sync); inputs and sources may still be "
            "URLs")


@contextlib.contextmanager
def scratch_dir(url: str):
    """A folder of this process for jobs bound for ``url`` (``CACHE_DIR/staging/<hash of the
    URL>/<host>-<pid>-<random>/``), removed on exit; what killed processes of this host left
    there is removed on entry."""
    from .cache import default_dir

    base = default_dir() / "staging" / hashlib.sha256(url.encode()).hexdigest()[:16]
    if base.is_symlink():
        raise PacktoolError(f"{base} is a symbolic link; packtool stages only in a folder of "
                            "its own: remove it")
    base.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    for old in base.iterdir():
        h, _, rest = old.name.rpartition("-")[0].rpartition("-")
        if h == host and rest.isdigit() and not _alive(int(rest)):
            shutil.rmtree(old, ignore_errors=True)
    folder = base / f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_root(url: str) -> Path:
    from .cache import default_dir

    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    root = default_dir() / "staging" / key
    if root.is_symlink():
        raise PacktoolError(f"{root} is a symbolic link; packtool stages only in a folder of "
                            "its own: remove it")
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return root


def local_name(url: str, root: Path) -> Path:
    return root / basename(url)


def cleanup(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def require_url(out) -> str:
    if not is_url(out):
        raise PacktoolError(f"{out} is not a URL")
    return str(out).rstrip("/")
