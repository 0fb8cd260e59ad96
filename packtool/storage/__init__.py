"""Where packtool's files live: a local folder, or any fsspec URL (``s3://``, ``gs://``,
``hf://``, ``az://``, ...), through fsspec and its maintained backends (s3fs, gcsfs,
huggingface_hub's HfFileSystem), installed as extras (``pip install 'packtool[s3]'``).

Credentials come from where each backend looks (environment, config files, instance roles);
``storage_options`` (``--storage-options JSON``) passes anything else, e.g. an endpoint URL::

    open_packed("s3://bucket/packed", storage_options={"client_kwargs":
                {"endpoint_url": "http://127.0.0.1:9000"}})

Reading: manifests are read directly; data files are fetched into a local cache
(:mod:`.cache`), verified against their checksums when fetched and their cached copies checked
when opened (size always, crc32 once per process), then memory-mapped.
Writing: :mod:`.publish` (data objects first, each verified, the manifest last: the commit).

Modules: :mod:`.place` a folder as the readers see it, :mod:`.cache` the local cache of
fetched files, :mod:`.output` where a stage writes (``open_output``: a FolderOutput or a
BucketOutput, chosen once), :mod:`.write` one job of a stage written to an output,
:mod:`.atomic` a local folder's commits (temporary names, a journal, the swap) and what
a dead run left, :mod:`.flock` local file locks,
:mod:`.publish` the commit to a store (from local scratch folders), :mod:`.lock` the lock
object of a store without locks.
"""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path

from ..errors import PacktoolError

# protocol -> the extra that installs its backend
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "hf": "hf", "az": "azure",
          "abfs": "azure", "abfss": "azure"}
PIP = {"s3": "s3fs", "gcs": "gcsfs", "hf": "huggingface_hub", "azure": "adlfs"}


def is_url(path) -> bool:
    """A remote location (``scheme://...``, but not ``file://``: :func:`local_path`)."""
    s = str(path)
    return "://" in s and not s.lower().startswith("file://")


def local_path(path):
    """A path as packtool takes it in (every path argument of a command, the readers'
    directory or prefix, a tokenizer): a ``file://`` URL becomes the local path it names
    (RFC 8089: ``file:///abs/path`` or ``file://localhost/abs/path``, %-escapes decoded);
    anything else is returned as given. Without this a ``file:///abs/out`` became the
    relative folder ``./file:/abs/out``. A URL of another host is refused by name: packtool
    reads and writes this machine's files, not another's."""
    if not isinstance(path, str) or path[:7].lower() != "file://":
        return path
    from urllib.parse import unquote

    host, slash, rest = path[7:].partition("/")
    if host.lower() not in ("", "localhost"):
        raise PacktoolError(f"{path}: a file:// URL of host {host!r}; packtool reads and "
                            "writes this machine's files only: write file:///PATH (three "
                            "slashes) or the path itself, or copy the files here")
    if not slash:
        raise PacktoolError(f"{path}: a file:// URL with no path; write file:///PATH")
    return unquote("/" + rest)


def local_file(path) -> Path | None:
    """The local file or folder ``path`` names, absolute; None for a store's URL."""
    return None if is_url(path) else Path(os.path.abspath(local_path(path)))


def protocol(url: str) -> str:
    return str(url).split("://", 1)[0]


def parse_options(text: str | dict | None) -> dict:
    """``--storage-options`` JSON (or a dict) as a dict, refused by name if not an object."""
    if text is None or isinstance(text, dict):
        return dict(text or {})
    try:
        value = json.loads(text)
    except ValueError as e:
        raise PacktoolError(f"--storage-options {text!r}: not JSON ({e}); give an object, e.g. "
                            "'{\"client_kwargs\": {\"endpoint_url\": \"http://host:9000\"}}'"
                            ) from None
    if not isinstance(value, dict):
        raise PacktoolError(f"--storage-options {text!r}: a JSON object is needed, got "
                            f"{type(value).__name__}")
    return value


_FILESYSTEMS: dict = {}
ENV = "PACKTOOL_STORAGE_OPTIONS"


def default_options() -> dict:
    """What ``--storage-options`` (or ``$PACKTOOL_STORAGE_OPTIONS``, which the CLI sets so
    worker processes see it too) gives every URL that is opened without its own options."""
    return parse_options(os.environ.get(ENV) or None)


# a scoped --storage-options names each protocol's own: {"s3": {...}, "http": {...}}
SCOPE_ALIASES = {"s3a": "s3", "gcs": "gs", "https": "http", "abfs": "az", "abfss": "az"}
WEB = ("http", "https")
TIMEOUT_ENV = "PACKTOOL_STORAGE_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
S3 = ("s3", "s3a")


def _scoped(options: dict) -> bool:
    from fsspec.registry import known_implementations

    names = set(known_implementations) | set(SCOPE_ALIASES.values())
    return bool(options) and all(k in names and isinstance(v, dict) for k, v in options.items())


def options_for(proto: str, storage_options: dict | None = None) -> dict:
    """The options of ``proto``'s filesystem: those given, else ``--storage-options``. A
    scoped form (``{"s3": {...}, "http": {...}}``) gives each protocol its own. An unscoped
    ``--storage-options`` goes to every store but not to an ``http(s)://`` input: a public
    web file, whose filesystem takes aiohttp's request arguments (an S3 endpoint_url there
    failed every read with a TypeError)."""
    given = default_options() if storage_options is None else storage_options
    if _scoped(given):
        return dict(given.get(proto) or given.get(SCOPE_ALIASES.get(proto, proto)) or {})
    if storage_options is None and proto in WEB:
        return {}
    return given


def timeout() -> float:
    """Seconds a store may take to connect or to answer one request
    (``$PACKTOOL_STORAGE_TIMEOUT``, default 60)."""
    text = os.environ.get(TIMEOUT_ENV)
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise PacktoolError(f"{TIMEOUT_ENV}={text!r}: give a positive number of seconds")
    return value


def bounded(proto: str, options: dict) -> dict:
    """``options`` with a timeout on every request where the backend takes one and the user
    set none: s3fs's botocore config, a connect and a read timeout of T
    (``$PACKTOOL_STORAGE_TIMEOUT``) and ``ATTEMPTS`` attempts a request in botocore's
    standard mode (it retries throttling, 5xx, broken connections and timeouts, backing off
    rand x 1 s, then rand x 2 s). s3fs's own retries are turned off (:func:`filesystem`):
    they multiplied botocore's (5 x 2 attempts a request, 5 x 5 x 2 for a read, so a
    stopped store held a command 20-50 x T: 41 s at T = 2, and ``verify`` over 900 s at
    the default). A store that stops answering now fails a request within ``ATTEMPTS`` x T
    plus 3 s of back-off (~3 min at the default 60 s). gcsfs, adlfs and the HTTP backend
    keep their own defaults (their timeout options differ by version)."""
    if proto not in S3:
        return options
    t = timeout()
    config = {"connect_timeout": t, "read_timeout": t,
              "retries": {"max_attempts": ATTEMPTS, "mode": "standard"},
              **(options.get("config_kwargs") or {})}
    return {**options, "config_kwargs": config}


ATTEMPTS = 3  # botocore's standard mode default
BACKOFF_S = 3.0  # its back-off between them at most: 1 s, then 2 s
SLOWEST_BYTES_S = 64 * 1024  # the slowest upload a put is given time for


def deadline(nbytes: int = 0) -> float:
    """Seconds one request may take in all: every attempt's timeout, the back-off between
    them, and ``nbytes`` at 64 kB/s; a slower link sets a larger PACKTOOL_STORAGE_TIMEOUT."""
    return ATTEMPTS * timeout() + BACKOFF_S + nbytes / SLOWEST_BYTES_S


def put(fs, rpath: str, data: bytes | None = None, local: str | None = None, **kwargs) -> None:
    """One put (``data``, or the file ``local``) within :func:`deadline`: the backend's own
    timeouts do not bound a PUT, whose ``Expect: 100-continue`` waits for a stopped server
    for ever (botocore adds it, aiohttp's read timeout does not cover it)."""
    nbytes = len(data) if data is not None else os.path.getsize(local)
    from fsspec.asyn import AsyncFileSystem

    if isinstance(fs, AsyncFileSystem):
        kwargs["timeout"] = deadline(nbytes)
    if data is not None:
        fs.pipe_file(rpath, data, **kwargs)
    else:
        fs.put_file(local, rpath, **kwargs)


def set_default_options(text: str | dict | None) -> None:
    """The CLI's ``--storage-options``: checked now, then kept in the environment (Ray's
    local workers and subprocesses inherit it)."""
    value = parse_options(text)
    if value:
        os.environ[ENV] = json.dumps(value)


def filesystem(url: str, storage_options: dict | None = None):
    """The fsspec filesystem for ``url`` (one per protocol and options in a process), and the
    path within it. A missing backend is an error naming the pip command."""
    try:
        import fsspec
    except ImportError:
        raise PacktoolError(f"{url}: reading and writing URLs needs fsspec: pip install "
                            "'packtool[s3]' (or [gcs], [hf])") from None
    proto = protocol(url)
    storage_options = options_for(proto, storage_options)
    key = (proto, json.dumps(storage_options, sort_keys=True, default=str),
           os.environ.get(TIMEOUT_ENV))
    if key not in _FILESYSTEMS:
        try:
            cls = fsspec.get_filesystem_class(proto)
        except (ImportError, ValueError) as e:
            extra = EXTRAS.get(proto)
            how = (f"pip install 'packtool[{extra}]' (it installs {PIP[extra]})" if extra
                   else "install the fsspec backend for it")
            raise PacktoolError(f"{url}: no filesystem for {proto}:// here ({e}); {how}"
                                ) from None
        # no listings cache: other processes (Ray workers, array tasks) write the same
        # prefixes, and a stale listing would hide their objects from a resume or finalize
        options = bounded(proto, storage_options)
        try:
            try:
                fs = cls(**{"use_listings_cache": False, **options})
            except TypeError:  # a backend without fsspec's listings cache
                fs = cls(**options)
            if proto in S3:  # s3fs: its session takes the options now (an unknown one
                fs.connect()  # failed the first request, with a traceback)
                fs.retries = 1  # botocore retries (bounded()); s3fs's would multiply them
        except Exception as e:  # a backend's own validation of the options
            raise PacktoolError(
                f"{url}: cannot open {proto}:// with --storage-options {storage_options!r}: "
                f"{type(e).__name__}: {e}; give only options its filesystem takes (for "
                "several protocols, each its own: '{\"s3\": {...}, \"gs\": {...}}')"
            ) from None
        _FILESYSTEMS[key] = fs
    fs = _FILESYSTEMS[key]
    return fs, fs._strip_protocol(url)


def kind_of(path) -> str:
    """'packed' for a folder holding index.json (local or remote), else 'corpus' (a token
    corpus prefix)."""
    from .place import Place

    return "packed" if Place(path).is_file("index.json") else "corpus"


def join(base, *names: str):
    """``base`` / names, for a local folder (a Path) or a URL (a str)."""
    if is_url(base):
        return posixpath.join(str(base), *names)
    return Path(base).joinpath(*names)


def parent(path):
    """The folder holding ``path``; a URL's is inside its bucket (``s3://bkt`` has none: an
    output or a corpus prefix is a name inside a bucket, refused by name here, not later
    as a filesystem for ``s3:``)."""
    if is_url(path):
        proto, rest = str(path).split("://", 1)
        if "/" not in rest.strip("/"):
            raise PacktoolError(f"{path} names a whole bucket (or host); packtool reads and "
                                f"writes a name inside one: give {proto}://"
                                f"{rest.strip('/') or 'BUCKET'}/NAME")
        return f"{proto}://{posixpath.dirname(rest.rstrip('/'))}"
    return Path(path).parent


def basename(path) -> str:
    return posixpath.basename(str(path).rstrip("/")) if is_url(path) else Path(path).name


def relative(target, base) -> str | None:
    """``target``'s path relative to the folder ``base`` (both local, or URLs of one bucket),
    or None when there is none (a local target of a remote base, another bucket)."""
    t, b = str(target), str(base)
    if is_url(t) != is_url(b):
        return None
    if not is_url(t):
        return os.path.relpath(os.path.abspath(t), os.path.abspath(b))
    (tp, tr), (bp, br) = t.split("://", 1), b.split("://", 1)
    if tp != bp or tr.split("/", 1)[0] != br.split("/", 1)[0]:
        return None
    return posixpath.relpath(tr, br)


def normalize(base, relative: str):
    """``relative`` (a path a manifest recorded, ``../c``) resolved against ``base``."""
    if is_url(base):
        proto, rest = str(base).split("://", 1)
        return f"{proto}://{posixpath.normpath(posixpath.join(rest, relative))}"
    return Path(os.path.normpath(Path(base) / relative))


# exception class names (any module: botocore, aiohttp, fsspec) -> what went wrong
_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                "NoAuthTokenError", "DefaultCredentialsError"}
_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                "ProxyConnectionError", "ClientConnectorError", "ServerDisconnectedError",
                "ClientOSError"}
_TIMED_OUT = {"ReadTimeoutError", "FSTimeoutError", "ServerTimeoutError"}


def _endpoint(e: BaseException) -> str:
    """The store's address: from the error (botocore names the request's URL), else the
    configured endpoint_url, else the backend's default."""
    from urllib.parse import urlsplit

    url = (getattr(e, "kwargs", None) or {}).get("endpoint_url")
    if not url:
        opts = default_options()
        opts = opts.get("s3", opts) if _scoped(opts) else opts
        url = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
    if not url:
        return "the store's default endpoint"
    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else str(url)


def store_error(e: BaseException, urls=()) -> PacktoolError | None:
    """A store's failure (``e``: an exception of botocore, aiohttp or fsspec) as a message
    naming the command's ``urls``, the endpoint and the fix; None for any other error. The
    CLI turns these into ``Error: ...`` and exit 1, never a traceback."""
    names = {c.__name__ for c in type(e).__mro__}
    where = ", ".join(dict.fromkeys(str(u) for u in urls)) or "the store"
    at = _endpoint(e)
    said = str(e) or type(e).__name__  # an FSTimeoutError says nothing: "()" before
    if names & _CREDENTIALS:
        return PacktoolError(
            f"{where}: no credentials for the store at {at} ({said}); give them where the "
            "backend looks (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE and "
            "~/.aws/credentials, an instance role; GOOGLE_APPLICATION_CREDENTIALS for gs://) "
            "or in --storage-options (e.g. '{\"key\": ..., \"secret\": ...}', or "
            "'{\"anon\": true}' for a public bucket)")
    if names & _UNREACHABLE:
        return PacktoolError(
            f"{where}: cannot reach the store at {at} ({said}); check that it is up and that "
            "--storage-options' endpoint_url names it, then run the command again (a run "
            "cut short resumes: finished parts and shards are skipped)")
    if "ClientResponseError" in names:  # aiohttp: an http(s):// server's refusal
        request = getattr(e, "request_info", None)
        return PacktoolError(
            f"{where}: {getattr(request, 'url', at)} answered HTTP {getattr(e, 'status', '?')} "
            f"{getattr(e, 'message', '')}; check the URL, and that the file is public or "
            "--storage-options gives its headers ('{\"http\": {\"headers\": {...}}}')")
    if names & _TIMED_OUT:
        return PacktoolError(
            f"{where}: the store at {at} did not answer within {timeout():g} s "
            f"({said}, after {ATTEMPTS} attempts); check "
            f"that it is up and reachable, or allow it longer ({TIMEOUT_ENV}=SECONDS, or "
            "--storage-options '{\"config_kwargs\": {\"read_timeout\": SECONDS}}'), then run "
            "the command again (a run cut short resumes)")
    return None
