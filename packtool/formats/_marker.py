"""The small manifest every directory export carries beside the trainer's own files.

It names what was exported from where, and marks the directory as ours, so --overwrite
replaces a previous export but never a directory of someone else's files. Trainers ignore it
(they glob *.bin, *.parquet or read index.json). It is a hidden file: pyarrow's and Hugging
Face's directory discovery skip it, and so does a glob, which the old name did not escape
(``datasets.load_dataset("parquet", data_files="DIR/*")`` read ``_packtool-export.json`` as
a Parquet shard and failed). Exports written under the old name are still ours to replace.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import PacktoolError
from ._manifest import (
    check,
    check_digest,
    confined_name,
    digest,
    list_of,
    obj,
    read_manifest,
    string,
)

MARKER = ".packtool-export.json"
OLD_MARKER = "_packtool-export.json"  # exports before issue 18; read for --overwrite only
MARKER_FORMAT, MARKER_VERSION = "packtool.export", 2
DIGEST_KEY = "marker_sha256"
_SPEC = obj({"export_format": string(True), "source": string(), "files": list_of(string(True)),
             DIGEST_KEY: string(True)})


def write_marker(directory: Path, fmt: str, source, files: list[str], **extra) -> int:
    """Write the marker into ``directory``; returns its size in bytes."""
    from .._io import write_new

    src = getattr(source, "directory", None) or getattr(source, "prefix", None)
    body = {"format": MARKER_FORMAT, "version": MARKER_VERSION, "export_format": fmt,
            "source": str(src), "files": files, **extra}
    body[DIGEST_KEY] = digest(body, DIGEST_KEY)
    text = json.dumps(body, indent=1) + "\n"
    write_new(directory / MARKER, text)
    return len(text.encode())


def export_owned(folder: Path) -> None:
    """Prove ``folder`` an export of ours: a valid marker (format, schema, digest) and
    nothing in the folder but the marker and the files it lists (an export made before the
    marker was renamed is proven by its marker under the old name)."""
    marker = OLD_MARKER if not (Path(folder) / MARKER).exists() and (
        Path(folder) / OLD_MARKER).is_file() else MARKER
    path = Path(folder) / marker
    fix = "choose another --out"
    try:
        body = read_manifest(path, MARKER_FORMAT, MARKER_VERSION)
        check(body, _SPEC, path, fix)
        check_digest(body, DIGEST_KEY, path, fix)
        for name in body["files"]:
            confined_name(name, path)
    except PacktoolError as e:
        raise PacktoolError(f"--overwrite refused: {folder} holds other files, not a packtool "
                            f"export ({e}); choose another --out") from None
    from .._atomic import unexpected

    unexpected(Path(folder), {marker, *body["files"]}, "export")
