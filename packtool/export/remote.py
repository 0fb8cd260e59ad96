"""``export --out s3://...``: the export is written on this machine's disk (a scratch folder of
this process, as a local export: temporaries, marker, checks), then published
(:mod:`packtool.storage.publish`) under a lock object: its data objects uploaded and
verified, the marker last (``.packtool-export.json`` in a directory export, the hidden
``.OUT.export.json`` sidecar beside single files): a reader that trusts the marker never
sees an incomplete export. ``--overwrite`` replaces only an export of ours (its marker valid
and listing every object found there); objects of an earlier export that the new one does
not list are removed after the commit. Local disk holds one export while it is uploaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import FormatError, PacktoolError
from ..formats._manifest import check_digest
from ..storage import basename, default_options, parent
from ..storage.place import Place
from ..storage.publish import Published, StoreLock, put_object, remove_leftovers, upload
from ..storage.stage_out import require_url, scratch_dir

MARKERS = (".packtool-export.json", "_packtool-export.json")  # the old name is read too


def _listing(place: Place, prefix: str = "") -> set[str]:
    root = f"{place.root}/{prefix}".rstrip("/")
    return {p[len(root) + 1:] for p in place.fs.find(root)} if place.fs.exists(root) else set()


def _marker_files(place: Place, name: str, where: str) -> set[str]:
    """The files a marker (or sidecar) object of ours lists, or a refusal."""
    try:
        body = json.loads(place.read_bytes(name))
        if not isinstance(body, dict) or not str(body.get("format", "")).startswith(
                "packtool.export"):
            raise ValueError("not a packtool export marker")
        check_digest(body, "marker_sha256", where, "")
        return {f["name"] if isinstance(f, dict) else f for f in body["files"]}
    except (ValueError, KeyError, TypeError, FormatError, FileNotFoundError) as e:
        raise PacktoolError(f"--overwrite refused: {where} is not a packtool export marker "
                            f"({e}); choose another --out") from None


def _check_dir(place: Place, url: str, overwrite: bool) -> set[str]:
    """Objects of a directory export there, proven ours (returned), or a refusal."""
    found = _listing(place)
    if not found:
        return set()
    if not overwrite:
        raise PacktoolError(f"output already exists: {url}; pass --overwrite to replace it")
    marker = next((m for m in MARKERS if m in found), None)
    if marker is None:
        shown = ", ".join(sorted(found)[:5])
        raise PacktoolError(f"--overwrite refused: {url} holds objects that are not a packtool "
                            f"export ({shown}); choose another --out")
    listed = _marker_files(place, marker, f"{url}/{marker}") | {marker}
    extra = sorted(found - listed)
    if extra:
        raise PacktoolError(f"--overwrite refused: {url} holds objects its export marker does "
                            f"not list ({', '.join(extra[:5])}); choose another --out")
    return found


def _check_files(place: Place, url: str, names: set[str], overwrite: bool) -> None:
    """Objects already at the single files' ``names`` are ours (listed by the sidecar), or a
    refusal naming them."""
    objects = {e["name"].rsplit("/", 1)[-1] for e in place.fs.ls(place.root, detail=True)
               if e.get("type") == "file"} if place.fs.exists(place.root) else set()
    found = names & objects
    found.discard(f".{basename(url)}.export.json")
    if not found:
        return
    if not overwrite:
        raise PacktoolError(f"output already exists: {', '.join(place.path(n) for n in found)}"
                            "; pass --overwrite to replace it")
    side = f".{basename(url)}.export.json"
    listed = _marker_files(place, side, str(place.path(side))) if place.is_file(side) else set()
    if not found <= listed:
        raise PacktoolError(f"--overwrite refused: {', '.join(sorted(found - listed))} at "
                            f"{parent(url)} are not a packtool export's (no sidecar lists "
                            "them); move them away or choose another --out")


def export_to_store(write, source, url: str, overwrite: bool, tick, options: dict) -> dict:
    """Run ``write`` (a format's exporter) into a scratch folder, then publish what it wrote
    to ``url``; the exporter's info, with the files as URLs."""
    url = require_url(url)
    storage_options = default_options()
    folder, stem = Place(url, storage_options), basename(url)
    side_place = Place(parent(url), storage_options)
    lock = f".{stem}.export.lock"
    with StoreLock(side_place.fs, f"{side_place.root}/{lock}", str(side_place.path(lock))):
        old = _check_dir(folder, url, overwrite)
        _check_files(side_place, url, {stem, f"{stem}.bin", f"{stem}.idx"}, overwrite)
        with scratch_dir(url) as scratch:
            local = scratch / stem
            info = write(source, local, overwrite=False, tick=tick, **options)
            sent = Published(url)
            if local.is_dir():  # a directory export: data objects, then the marker
                names = sorted(p.relative_to(local).as_posix() for p in local.rglob("*")
                               if p.is_file())
                _send(folder, local, names, [n for n in names if n in MARKERS], sent)
                removed = remove_leftovers(folder.fs, folder.root, set(names),
                                           lambda n: n in old)
                files = [f"{url}/{Path(f).relative_to(local).as_posix()}" for f in info["files"]]
            else:  # single files beside a hidden sidecar, sent last
                names = sorted(p.name for p in scratch.iterdir() if p.is_file()
                               and not p.name.endswith(".lock"))
                _check_files(side_place, url, set(names), overwrite)
                _send(side_place, scratch, names, [n for n in names if n.startswith(".")],
                      sent)
                removed = []
                files = [f"{parent(url)}/{Path(f).name}" for f in info["files"]]
    notes = list(info.get("notes", [])) + [
        f"published to {url}: {sent.uploaded:,} objects uploaded ({sent.bytes_sent / 1e6:,.1f}"
        " MB), each verified, the marker last"
        + (f"; {len(removed):,} objects of the previous export removed" if removed else "")]
    return {**info, "files": files, "notes": notes}


def _send(place: Place, local: Path, names: list[str], last: list[str],
          sent: Published) -> None:
    """The data objects of ``names`` (files under ``local``), then those of ``last`` (the
    markers, small objects: the commit)."""
    upload(place.fs, [(local / n, f"{place.root}/{n}") for n in names if n not in last], sent)
    for n in last:
        put_object(place.fs, f"{place.root}/{n}", (local / n).read_bytes(), str(place.path(n)))
