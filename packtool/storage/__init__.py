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
    if storage_options is None:
        storage_options = default_options()
    key = (proto, json.dumps(storage_options, sort_keys=True, default=str))
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
        fresh = {"use_listings_cache": False, **storage_options}
        try:
            try:
                _FILESYSTEMS[key] = cls(**fresh)
            except TypeError:  # a backend without fsspec's listings cache
                _FILESYSTEMS[key] = cls(**storage_options)
        except Exception as e:  # a backend's own validation of the options
            raise PacktoolError(f"{url}: cannot open {proto}:// with --storage-options "
                                f"{storage_options!r}: {type(e).__name__}: {e}") from None
    fs = _FILESYSTEMS[key]
    return fs, fs._strip_protocol(url)


def kind_of(path) -> str:
    """'packed' for a folder holding index.json (local or remote), else 'corpus' (a token
    corpus prefix)."""
    if is_url(path):
        from .place import Place

        return "packed" if Place(path).is_file("index.json") else "corpus"
    return "packed" if (Path(path) / "index.json").is_file() else "corpus"


def join(base, *names: str):
    """``base`` / names, for a local folder (a Path) or a URL (a str)."""
    if is_url(base):
        return posixpath.join(str(base), *names)
    return Path(base).joinpath(*names)


def parent(path):
    if is_url(path):
        proto, rest = str(path).split("://", 1)
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
