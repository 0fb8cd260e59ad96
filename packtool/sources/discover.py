"""Finding the input files: files as given, folders read recursively, globs; a folder that
cannot be listed is an error, and a ``datasets.save_to_disk`` folder's metadata files are not
corpus files (its ``state.json`` names the ``.arrow`` files to read)."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

from ..errors import PacktoolError
from ..storage import is_url
from .files import RemoteInput

KINDS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".jsonl.gz": "jsonl.gz",
    ".json.gz": "jsonl.gz",
    ".jsonl.zst": "jsonl.zst",
    ".json.zst": "jsonl.zst",
    ".jsonl.zstd": "jsonl.zst",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "txt",
}
# a datasets.save_to_disk folder's metadata, beside its .arrow files
_HF_METADATA = ("state.json", "dataset_info.json", "dataset_dict.json")
SUPPORTED = ", ".join(KINDS)


def file_kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in sorted(KINDS, key=len, reverse=True):
        if name.endswith(suffix):
            return KINDS[suffix]
    return None


def expand_inputs(inputs: list[str]) -> list:
    """Files as given; directories as all supported files inside (recursive, sorted); globs.
    URLs (``s3://bucket/corpus/``, ``gs://b/*.parquet``) likewise, as :class:`RemoteInput`."""
    if not inputs:
        raise PacktoolError("no input given; pass files, directories or globs")
    out: list = []
    for arg in inputs:
        if is_url(arg):
            out.extend(_expand_remote(str(arg)))
            continue
        p = Path(arg)
        if p.is_dir():
            found = sorted(_walk(p, set()))
            if not found:
                raise PacktoolError(f"directory {p} holds no supported files ({SUPPORTED})")
            out.extend(found)
        elif p.exists():
            if file_kind(p) is None:
                raise PacktoolError(
                    f"{p}: unsupported file type; supported: {SUPPORTED} "
                    "(rename the file or convert it)"
                )
            out.append(p)
        elif glob.has_magic(arg):
            found = sorted(Path(f) for f in glob.glob(arg, recursive=True) if Path(f).is_file())
            found = [f for f in found if file_kind(f) and not _is_dataset_metadata(f)]
            if not found:
                raise PacktoolError(f"pattern {arg!r} matches no supported files ({SUPPORTED})")
            out.extend(found)
        else:
            raise PacktoolError(f"{p}: no such file or directory")
    seen: dict = {}
    for p in out:
        # a local file is known by its device and inode, from the open that proves it can be
        # read (Path.resolve, a system call per path component, took 60 us a file)
        key = p if isinstance(p, RemoteInput) else _opened_identity(p)
        if key in seen:
            raise PacktoolError(
                f"{p} is given twice (also as {seen[key]}, the same file); each input is "
                "read once")
        seen[key] = p
    return out


def _opened_identity(p: Path) -> tuple[int, int]:
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as e:
        raise PacktoolError(
            f"{p}: cannot open ({e.strerror}); check the path and permissions") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino


def _expand_remote(arg: str) -> list[RemoteInput]:
    """The objects a URL names: one object, every supported object under a prefix
    (recursive, sorted, hidden names and packtool's own manifests left out), or a glob's."""
    from ..storage import filesystem, protocol

    fs, path = filesystem(arg)
    proto = protocol(arg)

    def url(p: str) -> RemoteInput:  # fsspec's HTTP paths keep their scheme (http://h/x)
        return RemoteInput(p if "://" in p else f"{proto}://{p}")

    if glob.has_magic(path):
        found = [url(p) for p in sorted(fs.glob(path)) if fs.isfile(p)]
        found = [f for f in found if file_kind(f) and not f.name.startswith(".")]
        if not found:
            raise PacktoolError(f"pattern {arg!r} matches no supported objects ({SUPPORTED})")
        return found
    if fs.isfile(path):
        if file_kind(url(path)) is None:
            raise PacktoolError(f"{arg}: unsupported file type; supported: {SUPPORTED} "
                                "(rename the object or convert it)")
        return [url(path)]
    if not fs.isdir(path):
        raise PacktoolError(f"{arg}: no such object or prefix")
    found = []
    for p in sorted(fs.find(path)):
        f = url(p)
        if any(part.startswith(".") for part in p[len(path):].split("/")) or not file_kind(f):
            continue
        if f.name.endswith(".json") and fs.cat_file(p, start=0, end=256).find(
                b'"format": "packtool.') >= 0:
            continue  # packtool's own manifest beside its inputs
        found.append(f)
    if not found:
        raise PacktoolError(f"{arg} holds no supported objects ({SUPPORTED})")
    return found


def _walk(folder: Path, seen: set) -> list[Path]:
    """Supported files under ``folder``, recursively; a folder that cannot be listed is an error
    (``Path.rglob`` skips it silently: 100 of 350 documents went missing that way)."""
    key = folder.resolve()
    if key in seen:  # a symlink loop
        return []
    seen.add(key)
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise PacktoolError(
            f"{folder}: cannot read this folder ({e.strerror}); fix its permissions, or pass "
            "the files you want instead of the parent folder"
        ) from None
    names = {e.name for e in entries}
    data_files = _save_to_disk_files(folder, names)
    out: list[Path] = []
    for e in entries:
        f = folder / e.name
        try:
            is_dir = e.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            out.extend(_walk(f, seen))
            continue
        if e.name.startswith(".") or not file_kind(f) or not f.is_file():
            continue
        if data_files is not None and (e.name in _HF_METADATA or file_kind(f) == "arrow"):
            if e.name in data_files:
                out.append(f)
            continue
        if e.name == "dataset_dict.json" or _is_packtool_manifest(f):
            continue
        out.append(f)
    return out


def _is_dataset_metadata(path: Path) -> bool:
    """A save_to_disk folder's state.json / dataset_info.json (matched by a glob)."""
    if path.name == "dataset_dict.json":
        return True
    return (path.name in _HF_METADATA
            and _save_to_disk_files(path.parent, set(os.listdir(path.parent))) is not None)


def _save_to_disk_files(folder: Path, names: set) -> set | None:
    """The ``.arrow`` files a ``datasets.save_to_disk`` folder's ``state.json`` lists, or None
    when ``folder`` is not one (other ``.arrow`` files there, e.g. map caches, are not data)."""
    if "state.json" not in names or not any(n.endswith(".arrow") for n in names):
        return None
    try:
        state = json.loads((folder / "state.json").read_text())
        return {d["filename"] for d in state["_data_files"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PacktoolError(
            f"{folder / 'state.json'}: not a readable datasets save_to_disk state ({e}); "
            "pass the .arrow files themselves"
        ) from None


def _is_packtool_manifest(path: Path) -> bool:
    """packtool's own .json outputs (token manifests, index.json) sitting in an input folder."""
    if not path.name.endswith(".json"):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return b'"format": "packtool.' in head


