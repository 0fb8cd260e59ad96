"""``PREFIX.json`` from the finished parts' own manifests, wherever they are (a local folder,
:mod:`.stage`, a local folder or a store): every part checked, their settings equal, the
corpus manifest built."""

from __future__ import annotations

from ..errors import PacktoolError
from ..formats.tokens import PART_MANIFEST_KEYS, corpus_manifest
from .plan import TokenizePlan
from .result import merge_engines


def checked_parts(plan: TokenizePlan, check) -> list[dict]:
    """Every part's manifest (``check(k)`` -> (manifest or None, why)), or an error naming
    each part that is missing or corrupt."""
    manifests, bad = [], []
    for k, q in enumerate(plan.parts):
        m, why = check(k)
        if m is None:
            bad.append(f"part {q.index} ({q.name}): {why}")
        manifests.append(m)
    if bad:
        shown = "; ".join(bad[:20]) + (f"; and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise PacktoolError(
            f"{len(bad)} of {len(plan.parts)} parts of {plan.prefix} are not finished: "
            f"{shown}. Run the tasks that own them again (or the same command without "
            "--finalize): finished parts are skipped, these are redone")
    return manifests


def assemble(plan: TokenizePlan, manifests: list[dict]) -> tuple[dict, list]:
    """``PREFIX.json`` of the finished parts (made with the same settings, else refused),
    and the parts reused from an earlier plan (inputs added, removed or changed elsewhere),
    whose own manifests still name that plan: [(part, manifest naming this plan)], to be
    committed with it."""
    metas = [m["meta"] for m in manifests]
    meta = {k: v for k, v in metas[0].items() if k != "engine"}
    for q, m in zip(plan.parts, metas, strict=True):
        other = {k: v for k, v in m.items() if k != "engine"}
        if other != meta:
            diff = sorted(k for k in set(other) | set(meta) if other.get(k) != meta.get(k))
            raise PacktoolError(f"part {q.index} ({q.name}) was made with other settings "
                                f"than part 0 ({', '.join(diff)} differ); delete its files "
                                f"({q.name}.*) and run it again")
    meta["engine"] = merge_engines([m["engine"] for m in metas])
    # each part's own manifest as it will be on disk (this plan's digest): PREFIX.json
    # records the digest of each, binding them to it
    bodies = [{**{k: m[k] for k in PART_MANIFEST_KEYS}, "plan_digest": plan.digest}
              for m in manifests]  # (a run's extras: warnings, seconds, published... left)
    manifest = corpus_manifest(meta, [m["part"] for m in manifests], plan.manifest_entry(),
                               bodies)
    moved = [(q, body) for q, m, body in zip(plan.parts, manifests, bodies, strict=True)
             if m["plan_digest"] != plan.digest]
    return manifest, moved
