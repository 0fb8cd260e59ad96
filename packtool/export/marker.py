"""The small manifest every export carries beside the trainer's own files.

It names what was exported from where, and marks the output as ours, so --overwrite
replaces a previous export but never someone else's files. A directory export holds
``.packtool-export.json``: trainers ignore it (they glob *.bin, *.parquet or read
index.json), and it is a hidden file: pyarrow's and Hugging Face's directory discovery skip
it, and so does a glob, which the old name did not escape
(``datasets.load_dataset("parquet", data_files="DIR/*")`` read ``_packtool-export.json`` as
a Parquet shard and failed; exports written under the old name are still ours to replace).
An export of single files (Megatron's ``PREFIX.bin``/``PREFIX.idx``, one ``OUT.parquet``)
has a hidden sidecar ``.KEY.export.json`` instead, published last with them (its digest over
its content), listing each file with the size and modification time it was committed with:
--overwrite replaces only files it lists, unchanged; a user's own ``m.bin`` at that name is
refused, by name.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import PacktoolError, listing
from ..formats._manifest import (
    check,
    check_digest,
    confined_name,
    count,
    digest,
    list_of,
    manifest_text,
    obj,
    one_of,
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
    return _write(directory / MARKER, MARKER_FORMAT, MARKER_VERSION, fmt, source, files, extra)


def _write(path: Path, form: str, version: int, fmt: str, source, files: list, extra: dict
           ) -> int:
    """A marker or sidecar at ``path``, its digest over its content; returns its bytes."""
    from .._io import write_new

    src = getattr(source, "directory", None) or getattr(source, "prefix", None)
    body = {"format": form, "version": version, "export_format": fmt, "source": str(src),
            "files": files, **extra}
    body[DIGEST_KEY] = digest(body, DIGEST_KEY)
    text = manifest_text(body)
    write_new(path, text)
    return len(text.encode())


def _read(place, name: str, form: str, version: int, spec, fix: str) -> dict:
    """A marker or sidecar read from ``place`` and proven: format, schema, digest."""
    path = place.path(name)
    body = read_manifest(path, form, version, place.reader)
    check(body, spec, path, fix)
    check_digest(body, DIGEST_KEY, path, fix)
    return body


def export_owned(place) -> None:
    """Prove the folder of ``place`` (a :class:`packtool.storage.place.Place`: a local folder
    or a bucket's) an export of ours: a valid marker (format, schema, digest) and
    nothing in the folder but the marker and the files it lists (and packtool's own hidden
    files); an export made before the marker was renamed is proven by its marker under the
    old name."""
    there = place.names()
    marker = OLD_MARKER if MARKER not in there and OLD_MARKER in there else MARKER
    try:
        body = _read(place, marker, MARKER_FORMAT, MARKER_VERSION, _SPEC, "choose another --out")
        for name in body["files"]:
            confined_name(name, place.path(marker))
    except PacktoolError as e:
        raise PacktoolError(f"--overwrite refused: {place.folder} holds other files "
                            f"({listing(there)}), not a packtool export ({e}); choose another "
                            "--out") from None
    extra = place.unlisted({marker, *body["files"]}, _hidden_ours, there)
    if extra:
        raise PacktoolError(f"--overwrite only replaces a previous packtool output: "
                            f"{place.folder} holds files that are not part of the export it "
                            f"holds ({listing(extra)}); move them away or choose another --out")


def _hidden_ours(place, name: str) -> bool:
    """A lock or a dead run's temporary packtool left (locally, shaped as its are; in a
    bucket, a lock object)."""
    return place.hidden_ours(name, r"\.(?:[^/]*\.)?lock")


# ------------------------------------------------------------- exports of single files
SIDECAR_FORMAT, SIDECAR_VERSION = "packtool.export.files", 1
_FILE = obj({"name": string(True), "bytes": count(), "mtime_ns": count()})
_SIDECAR = obj({"export_format": string(True), "source": string(), "files": list_of(_FILE),
                DIGEST_KEY: string(True), "format": one_of(SIDECAR_FORMAT)})


def sidecar_path(key: Path) -> Path:
    """The hidden manifest of a single-file export whose output is ``key``."""
    return key.with_name(f".{key.name}.export.json")


def write_sidecar(folder: Path, side: str, fmt: str, source) -> None:
    """The sidecar ``side`` of a single-file export written into ``folder``, listing every
    file there with its size and modification time (which the rename into place keeps)."""
    files = [{"name": p.name, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
             for p in sorted(folder.iterdir()) if p.name != side
             and stat.S_ISREG((st := os.lstat(p)).st_mode)]
    _write(folder / side, SIDECAR_FORMAT, SIDECAR_VERSION, fmt, source, files, {})


def files_owned(side: str, found: list, place) -> None:
    """Prove the files ``found`` at an export's names our previous export: its sidecar
    ``side`` is valid (format, schema, digest) and lists each, a regular file of the size
    (and, where the folder keeps one, the modification time) it was committed with; names in
    ``place`` (a local folder or a bucket's). Else a refusal naming them."""
    names = ", ".join(str(place.path(p)) for p in found if p != side) or str(side)
    fix = "move them away if they are yours, remove them if not, or choose another --out"
    try:
        if place.is_link(side) or not place.is_file(side):
            raise PacktoolError(f"no {side} beside them says packtool wrote them")
        body = _read(place, side, SIDECAR_FORMAT, SIDECAR_VERSION, _SIDECAR, fix)
        listed = {f["name"]: f for f in body["files"]}
        states = place.file_states([n for n in found if n != side])
        for name in found:
            if name == side:
                continue
            f = listed.get(name)
            if f is None:
                raise PacktoolError(f"{side} does not list {name}")
            state = states[name]
            if state is None or state != (f["bytes"], f["mtime_ns"] if state[1] is not None
                                          else None):
                raise PacktoolError(f"{name} changed since packtool exported it (its size or "
                                    f"modification time differ from {side})")
    except PacktoolError as e:
        raise PacktoolError(f"--overwrite refused for {names}: not provably packtool's "
                            f"export ({e}); {fix}") from None
