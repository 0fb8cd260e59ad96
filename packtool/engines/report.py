"""What a run's engine was, for the manifest and the summary: which engine ran, what its check
found, and why each faster engine was not used (:mod:`.select` made the choice)."""

from __future__ import annotations

from .base import EngineMismatch
from .select import LOADERS, Selection


def engine_manifest(sel: Selection) -> dict:
    """The manifest's ``engine`` entry: what ran, what it was checked against (``reference``:
    the library and version that define the right tokens), what the check found, and why
    each faster engine was not used (``not_used``: engine -> reason)."""
    entry = {"name": sel.engine.name, "version": sel.engine.version, "requested": sel.requested,
             "reference": sel.reference_name, "check": sel.check, "family": sel.family}
    if sel.reference is not None:
        entry["checked_docs"] = sel.checked_docs
        entry["checked_tokens"] = sel.checked_tokens
        entry["result"] = "identical"
    if sel.reasons:
        entry["not_used"] = sel.reasons
    if sel.fallback:
        entry["fallback"] = sel.fallback
    return entry


def engine_summary(entry: dict, tokens_per_second: float | None = None) -> str:
    """One line for the run's summary from a manifest ``engine`` entry: the engine, its speed,
    and why a faster one was not used, e.g. ``engine fastokens 0.3.5 (12.1M tokens/s; sample
    check: 277 documents identical); not used: gigatoken: not installed``."""
    speed = f"{tokens_per_second / 1e6:.1f}M tokens/s" if tokens_per_second else None
    against = f" against {entry['reference']}" if entry.get("reference") else ""
    check = (f"{entry['check']} check{against}: {entry['checked_docs']:,} documents "
             f"{entry['result']}" if "checked_docs" in entry else None)
    detail = "; ".join(x for x in (speed, check) if x)
    line = f"engine {entry['name']} {entry['version']}" + (f" ({detail})" if detail else "")
    if entry.get("fallback"):
        line += f"; fell back to the reference: {_short(entry['fallback'])}"
    if entry.get("not_used"):
        line += "; not used: " + "; ".join(f"{name}: {_short(why)}"
                                           for name, why in entry["not_used"].items())
    return line


def _short(reason: str) -> str:
    """A reason's gist: the engine's own name and version dropped, cut at 90 characters."""
    words = reason.split(" ")
    if words[0] in LOADERS:
        reason = " ".join(words[2 if len(words) > 2 and words[1][:1].isdigit() else 1:])
    return reason if len(reason) <= 90 else reason[:87] + "..."


def mismatch_warning(e: EngineMismatch) -> str:
    return f"{e}; tokenizing again with the reference"
