"""Finding the input files: files as given, folders read recursively, globs; a folder that
cannot be listed is an error, and a ``datasets.save_to_disk`` folder's metadata files are not
corpus files (its ``state.json`` names the ``.arrow`` files to read).

Only regular files are inputs. A FIFO blocks its first reader until something writes to it
(a run given one waited for ever), and a run reads an input more than once: its size for the
plan, its bytes, their crc32 again on resume, a part again after a fallback to the reference;
a pipe, a socket or a device gives none of that. Such a file, given or found under a supported
name, is refused by name before anything is read (:func:`_not_regular`)."""

from __future__ import annotations

import glob
import json
import os
import stat
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


# what a model folder holds beside its tokenizer: read as JSONL they fail record by record (a
# new user's `tokenize data/ -t data/tokenizer.json` was told to --skip-bad-records)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def expand_inputs(inputs: list[str], tokenizer: str | Path | None = None) -> list:
    """Files as given; directories as all supported files inside (recursive, sorted); globs.
    URLs (``s3://bucket/corpus/``, ``gs://b/*.parquet``) likewise, as :class:`RemoteInput`.
    Refused before anything is read: the ``tokenizer`` file itself, a tokenizer's files found
    in a folder or by a glob, and files found there that look like copies of one corpus
    (``a.jsonl`` beside ``a.jsonl.gz``; listed one by one they are taken as asked)."""
    if not inputs:
        raise PacktoolError("no input given; pass files, directories or globs")
    out: list = []
    found_in: dict = {}  # a file found in a folder or by a glob -> that argument
    for arg in inputs:
        p = Path(arg)
        if is_url(arg):
            found = _expand_remote(str(arg))
        elif p.is_dir():
            models: list[Path] = []
            found = sorted(_walk(p, set(), models))
            if models:
                _refuse_tokenizer_file(models[0], arg)
            if not found:
                raise PacktoolError(f"directory {p} holds no supported files ({SUPPORTED})")
        elif p.exists():
            if file_kind(p) is None:
                raise PacktoolError(
                    f"{p}: unsupported file type; supported: {SUPPORTED} "
                    "(rename the file or convert it)"
                )
            out.append(p)
            continue
        elif glob.has_magic(arg):
            found = sorted(Path(f) for f in glob.glob(arg, recursive=True))
            found = [f for f in found if file_kind(f) and _is_file(f)
                     and not _is_dataset_metadata(f)]
            if not found:
                raise PacktoolError(f"pattern {arg!r} matches no supported files ({SUPPORTED})")
        else:
            raise PacktoolError(f"{p}: no such file or directory")
        out.extend(found)  # found in a folder, under a prefix or by a glob
        found_in.update((f, arg) for f in found if str(f) != str(arg))
    for f, arg in found_in.items():
        if f.name in TOKENIZER_FILES:
            _refuse_tokenizer_file(f, arg)
    _refuse_copies(list(found_in))
    _refuse_repeats(out, found_in, _local_identity(tokenizer))
    return out


def _refuse_repeats(out: list, found_in: dict, tok) -> None:
    """No input read twice, and the tokenizer (``tok``: its device and inode) never one."""
    seen: dict = {}
    for p in out:
        # a local file is known by its device and inode, from the open that proves it can be
        # read (Path.resolve, a system call per path component, took 60 us a file)
        key = p if isinstance(p, RemoteInput) else _opened_identity(p)
        if key == tok:
            raise PacktoolError(
                f"{p} is the --tokenizer itself, not a corpus; "
                + (f"move it out of {found_in[p]} or list the input files instead"
                   if p in found_in else "leave it out of the inputs"))
        if key in seen:
            raise PacktoolError(
                f"{p} is given twice (also as {seen[key]}, the same file); each input is "
                "read once")
        seen[key] = p


def _refuse_tokenizer_file(path, arg: str) -> None:
    raise PacktoolError(f"{path} is a tokenizer file, not a corpus, and {arg} would read it as "
                        "one; move it out of that folder, or list the input files instead")


def _refuse_copies(found: list) -> None:
    """Files found in one folder under one name in several formats (``a.jsonl``,
    ``a.jsonl.gz``, ``a.parquet``) would each be tokenized: the corpus twice or more."""
    by_stem: dict = {}
    for f in found:
        kind = next(k for k in sorted(KINDS, key=len, reverse=True)
                    if f.name.lower().endswith(k))
        folder = str(f).rsplit("/", 1)[0] if isinstance(f, RemoteInput) else f.parent
        by_stem.setdefault((folder, f.name[:-len(kind)]), []).append(f)
    for (folder, _), files in by_stem.items():
        if len(files) > 1:
            names = [f.name for f in files]
            listed = ", ".join(names[:-1]) + " and " + names[-1]
            raise PacktoolError(f"{listed} in {folder} look like copies of one corpus (one "
                                "name, several formats); pass the one you mean")


def _local_identity(path) -> tuple[int, int] | None:
    """(device, inode) of a local file, or None (a folder, a URL, nothing there)."""
    if path is None or is_url(path):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if os.path.isfile(path) else None


def _opened_identity(p: Path) -> tuple[int, int]:
    """(device, inode) of ``p``, from an open that proves it readable and a regular file;
    non-blocking, so a FIFO with no writer is refused instead of waited on."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise PacktoolError(
            f"{p}: cannot open ({e.strerror}); check the path and permissions") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(p, st.st_mode)
    return st.st_dev, st.st_ino


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
            (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(p: Path, mode: int) -> PacktoolError:
    what = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
    return PacktoolError(
        f"{p} is {what}: packtool reads files it can read twice (the plan's size, the bytes, "
        "their crc32 again on resume, a part again after a fallback), which this cannot "
        "give; copy it to a regular file")


def _is_file(p: Path) -> bool:
    """``p`` is a regular file (through symlinks); False for a folder or a dangling link.
    Anything else (a FIFO, socket or device) is refused here, before a reader or the
    manifest sniff of :func:`_is_packtool_manifest` could block on it."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return False
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return stat.S_ISREG(mode)
    raise _not_regular(p, mode)


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


def _walk(folder: Path, seen: set, models: list) -> list[Path]:
    """Supported files under ``folder``, recursively; a folder that cannot be listed is an error
    (``Path.rglob`` skips it silently: 100 of 350 documents went missing that way).
    ``models``: SentencePiece ``.model`` files found on the way (a model folder, not data)."""
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
            out.extend(_walk(f, seen, models))
            continue
        if e.name.endswith(".model") and not e.name.startswith("."):
            models.append(f)
        if e.name.startswith(".") or not file_kind(f) or not _is_file(f):
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
    if not _is_file(folder / "state.json"):
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


