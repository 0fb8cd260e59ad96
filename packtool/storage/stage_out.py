"""Local folders for outputs bound for a store (:mod:`.publish`): a scratch folder per process
for the jobs in flight, and a tokenizer at a URL fetched once into the cache.

A job's scratch folder is ``CACHE_DIR/staging/<hash of the URL>/<host>-<pid>-<random>/``:
local to the process (a Ray worker on another node has its own), removed when the job is
published; a killed process's is removed by the next job of its host. Local disk holds the
jobs in flight, not the output.
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
from . import basename
from .temps import pid_alive


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
        if h == host and rest.isdigit() and int(rest) != os.getpid() \
                and not pid_alive(int(rest)):
            shutil.rmtree(old, ignore_errors=True)
    folder = base / f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
    tags = [str(info.get("ETag") or info.get("size"))
            for info in (fs.info(p) for p in files.values())]
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
