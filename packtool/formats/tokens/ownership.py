"""Whether token files at a prefix are packtool's own: what ``tokenize --overwrite`` may
replace. Data files at a part's name are ours only when a manifest of ours vouches for them:
the corpus's ``PREFIX.json``, the list an interrupted --overwrite retired
(``.PREFIX.retired.json``), the plan marker of a run in progress (``.PREFIX.plan.json``), or
the part's own record."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ...errors import FormatError, PacktoolError
from .reader import read_part_manifest
from .schema import DATA_SUFFIXES, FORMAT, part_manifest_path

PLAN_FORMAT = "packtool.tokens.plan"


def plan_marker(stem: str) -> str:
    return f".{stem}.plan.json"


def retired_list(stem: str) -> str:
    return f".{stem}.retired.json"


def our_parts(place, stem: str) -> set[str]:
    """Part names the corpus manifest (or one retired by an interrupted --overwrite, or the
    plan marker of a run in progress in a bucket) lists, under the prefix's current name (a
    corpus renamed a.* -> b.* still lists a.part-...)."""
    names: set[str] = set()
    for name in (f"{stem}.json", retired_list(stem), plan_marker(stem)):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            meta = json.loads(place.read_bytes(name))
            if meta.get("format") == PLAN_FORMAT:
                names |= {n for n in meta.get("parts", []) if isinstance(n, str)}
                continue
            if meta.get("format") != FORMAT:
                continue
            was = (meta.get("plan") or {}).get("prefix") or stem
            for q in meta.get("parts") or [{"name": stem}]:
                n = q["name"]
                if n == was or n.startswith(was + ".part-"):
                    n = stem + n[len(was):]
                names.add(n)
    return names


def refuse_foreign(place, stem: str, parts: list[str]) -> None:
    """Data files at a part's name are ours only when a manifest of ours (the corpus's, a
    retired one, or the part's own) vouches for them; anything else is the user's, never
    replaced, even with --overwrite."""
    listed, there = our_parts(place, stem), place.names()
    for name in parts:
        found = [f"{name}{s}" for s in DATA_SUFFIXES if f"{name}{s}" in there]
        if not found or name in listed:
            continue
        record = part_manifest_path(Path("."), name).name
        try:
            ours = read_part_manifest(record, place) is not None
        except FormatError:
            ours = False
        if not ours:
            raise PacktoolError(f"{', '.join(str(place.path(f)) for f in found)} exist(s) "
                                "and no packtool manifest lists them: not a packtool output, "
                                "so not replaced even with --overwrite; move them away or "
                                "choose another --out")
