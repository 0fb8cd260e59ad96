"""Whether a folder (or a bucket prefix) is a packed dataset of packtool's own: what
``pack --overwrite`` may replace, and what ``verify`` accepts beside a dataset. A valid
index.json (format, schema, digest), and nothing in the folder but the files it lists (its
held-out split's the same way, under valid/) and packtool's own hidden files."""

from __future__ import annotations

import re

from ...errors import PacktoolError, listing
from .files import read_index
from .schema import INDEX, VALID

# what a bucket holds of a run in progress: lock objects, the plan marker, job entries
HIDDEN = "(?:valid/)?\\.(?:shard|group)-[0-9]+\\.(?:entry\\.json|lock)|\\.packtool[-.].*"
# a packed dataset's data objects (what an earlier run of ours left)
DATA = r"(?:valid/)?(?:shard-[0-9]+(?:-v?[0-9]+)?\.[a-z_]+\.npy|index\.json)"


def owned(folder, place=None) -> None:
    """Prove ``folder`` a packed dataset of ours, a local folder or a bucket alike
    (``place``: its :class:`packtool.storage.place.Place`), else a refusal naming what is
    not ours."""
    from ...storage.place import Place

    place = place if place is not None else Place(folder)
    there = place.names()
    try:
        names = dataset_files(place)
    except PacktoolError as e:
        raise PacktoolError(f"--overwrite only replaces a previous packtool output: "
                            f"{place.folder} is not a packtool packed dataset ({e}); it holds "
                            f"{listing(there)}: choose another --out") from None
    extra = place.unlisted(names, ours_hidden, there)
    if extra:
        raise PacktoolError(f"--overwrite only replaces a previous packtool output: "
                            f"{place.folder} holds files that are not part of the packed "
                            f"dataset it holds ({listing(extra)}); move them away or choose "
                            "another --out")


def dataset_files(place) -> set[str]:
    """Every file a packed dataset's index.json lists (and its held-out split's, under
    valid/), relative to its folder; the index is validated (format, schema, digest)."""
    idx = read_index(place.folder, place)
    names = {INDEX} | {f["name"] for sh in idx["shards"] for f in sh["files"].values()}
    if idx.get("held_out"):
        valid = read_index(place.sub(VALID).folder, place.sub(VALID))
        names |= {f"{VALID}/{n}" for n in
                  {INDEX} | {f["name"] for sh in valid["shards"] for f in sh["files"].values()}}
    return names


def ours_hidden(place, name: str) -> bool:
    """packtool's own hidden files: locally a lock file shaped as its locks are or a dead
    run's temporary; in a bucket, the lock objects, the plan marker and job entries of a run
    in progress (vouched for by the marker)."""
    return place.hidden_ours(name, HIDDEN)


def ours(place, name: str) -> bool:
    """A hidden file of ours, or a data object an earlier run of ours left."""
    return ours_hidden(place, name) or re.fullmatch(DATA, name) is not None
