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
import json
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


def fetch_tokenizer(url: str) -> Path:
    """A tokenizer at a URL (a ``tokenizer.json``, a ``.model``, or a model folder holding
    one, with its ``tokenizer_config.json``: the chat template), copied into
    ``CACHE_DIR/tokenizers/<hash of URL and ETags>/`` once, and its local path. Each Ray
    worker or array task fetches its own copy: no shared file system is needed."""
    from . import filesystem
    from .cache import default_dir

    fs, path = filesystem(url)
    path = path.rstrip("/")
    wanted = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if fs.isdir(path):
        files = {n: f"{path}/{n}" for n in wanted if fs.isfile(f"{path}/{n}")}
        if not ({"tokenizer.json", "tokenizer.model"} & set(files)):
            raise PacktoolError(f"tokenizer {url}: holds no tokenizer.json or tokenizer.model")
    elif fs.isfile(path):
        folder = path.rsplit("/", 1)[0]
        files = {basename(path): path}
        if fs.isfile(f"{folder}/tokenizer_config.json"):
            files["tokenizer_config.json"] = f"{folder}/tokenizer_config.json"
    else:
        raise PacktoolError(f"tokenizer {url}: no such object or prefix")
    tags = [str(fs.info(p).get("ETag") or fs.info(p).get("size")) for p in files.values()]
    key = hashlib.sha256(json.dumps([url, sorted(files), tags]).encode()).hexdigest()[:20]
    dest = default_dir() / "tokenizers" / key
    if not dest.is_dir():
        tmp = dest.with_name(f".{key}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
        tmp.mkdir(parents=True)
        try:
            for name, rpath in files.items():
                fs.get_file(rpath, str(tmp / name))
            os.replace(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    main = next(n for n in ("tokenizer.json", "tokenizer.model", *files) if n in files)
    return dest / main
