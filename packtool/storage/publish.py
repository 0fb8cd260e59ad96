"""Writing to object storage, where there is no rename. An output is made of jobs (tokenize
parts, pack shards); each job is written on this machine's disk by the ordinary local code
(its checks, temporaries and atomic commit), in a scratch folder of the process
(:func:`scratch_dir`), then *published*, and its local files removed (local disk holds the
jobs in flight, not the output):

1. **Lock**: a lock object (``.NAME.lock``) created with a conditional put (``If-None-Match:
   *``, which S3, GCS and R2 honour): a second writer of the output is refused, naming the
   holder. A store that cannot put conditionally is refused with that reason unless
   ``PACKTOOL_UNSAFE_STORE_LOCK=1`` (then one writer at a time is the user's business).
2. **Data objects**, each uploaded (multipart past ``CHUNK``) and verified: its size, and
   where the store gives an MD5 ETag, that ETag against the local bytes' (multipart form
   too). An object already there with the same size and ETag is not sent again.
3. **The job's record last** (a part's ``.NAME.part.json``, a shard's entry): a job is
   finished on the store when its record is there and its objects have the sizes it lists,
   so the same command after an interruption skips finished jobs (resume).
4. **The manifest last of all** (``PREFIX.json``, ``index.json``): the commit point, after
   every job. A reader never sees a manifest whose objects are incomplete. An ``--overwrite``
   deletes the old manifest first (readers stop seeing the old output before any object of
   it changes), as a local ``--overwrite`` retires its manifest first.
5. **Leftovers**: objects of ours (by name) that the new manifest does not list, left by an
   earlier or interrupted run, are removed after the commit, and counted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import _signals
from ..errors import PacktoolError
from . import put
from .atomic import pid_alive
from .cache import default_dir
from .place import object_states

CHUNK = 64 << 20      # multipart part size (s3fs's own default is 50 MiB)


@dataclass
class Published:
    url: str
    uploaded: int = 0          # objects sent
    skipped: int = 0           # already there, verified (a resumed run)
    bytes_sent: int = 0


def _md5_etags(path: Path, chunk: int) -> set[str]:
    """The ETags S3 gives ``path``'s bytes: the MD5 of a single put, and the multipart form
    (MD5 of the parts' MD5s, ``-N``) for parts of ``chunk`` bytes."""
    whole, parts = hashlib.md5(), []
    with open(path, "rb") as f:
        block = f.read(chunk)
        while block:
            whole.update(block)
            after = f.read(chunk)
            if parts or after:  # one block: its MD5 is the whole's, not computed twice
                parts.append(hashlib.md5(block).digest())
            block = after
    out = {whole.hexdigest()}
    if len(parts) > 1:
        out.add(f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}")
    return out


def _same(state, size: int, etags: set[str]) -> bool:
    """The object (``state``: its size and ETag, None if absent) holds these bytes: their
    size, and their MD5 where the ETag is one."""
    if state is None or state[0] != size:
        return False
    return state[1] is None or state[1] in etags or not _looks_md5(state[1])


def _looks_md5(etag: str) -> bool:
    head = etag.split("-", 1)[0]
    return len(head) == 32 and all(c in "0123456789abcdef" for c in head.lower())


def put_object(fs, rpath: str, data: bytes, url: str) -> None:
    """A small object (a record, a manifest) in one put, its size checked."""
    put(fs, rpath, data)
    state = object_states(fs, [rpath])[rpath]
    if state is None or state[0] != len(data):
        raise PacktoolError(f"{url} did not arrive whole; run the command again")


def upload(fs, files: list[tuple[Path, str]], result: Published) -> None:
    """Data objects (local file, remote path), each verified. What is already there with
    the same size and MD5 is not sent again; the rest are put, then checked against the
    local bytes (size, and the ETag where it is an MD5). A job's objects share a name stem,
    so on S3 and GCS the checks before and after are one listing request each: before, a
    check cost s3fs a HEAD and a LIST per object."""
    before = object_states(fs, [r for _, r in files])
    sent = []
    # the local MD5s in a thread (hashlib releases the GIL), meanwhile the puts
    with ThreadPoolExecutor(1, thread_name_prefix="packtool-md5") as pool:
        md5s = {r: pool.submit(_md5_etags, local, CHUNK) for local, r in files}
        for local, rpath in files:
            _signals.check()  # a signal stops a job's upload (in a thread: see executors)
            size, state = local.stat().st_size, before[rpath]
            if state is not None and state[0] == size and _same(state, size,
                                                                 md5s[rpath].result()):
                result.skipped += 1
                continue
            put(fs, rpath, local=str(local), chunksize=CHUNK)
            sent.append((local, rpath, size))
        after = object_states(fs, [r for _, r, _ in sent]) if sent else {}
        for local, rpath, size in sent:
            if not _same(after[rpath], size, md5s[rpath].result()):
                raise PacktoolError(f"{fs.unstrip_protocol(rpath)}: the uploaded object does "
                                    f"not match {local} "
                                    "(size or MD5 differs); nothing was committed: run the "
                                    "command again")
            result.uploaded += 1
            result.bytes_sent += size


@contextlib.contextmanager
def scratch_dir(url: str):
    """A folder of this process for jobs bound for ``url`` (``CACHE_DIR/staging/<hash of the
    URL>/<host>-<pid>-<random>/``), removed on exit; what killed processes of this host left
    there is removed on entry. A Ray worker on another node has its own: local disk holds
    the jobs in flight, not the output."""
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
