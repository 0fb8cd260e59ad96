"""``packtool tokenize`` as a stage: plan the parts, hand them to an executor as jobs
(:mod:`packtool.executors`: here, on Ray, or as array tasks), then write ``PREFIX.json`` from
the parts' own manifests: the commit point. Written once over an output
(:class:`packtool.storage.output.Output`), a local prefix or one in a bucket::

    run         the output's lock; the plan registered in .PREFIX.plan.json
    part job    tokenized where it runs (a folder of its own, beside the prefix or a
                scratch folder for a bucket), its .bin, .boundaries (.mask) published
                (renamed in, or uploaded), .PREFIX.part-K.part.json last
    finalize    every part's record checked, PREFIX.json last (the commit), stale parts
                of ours removed, the plan marker and the retired list removed

Who may write an output at once: a whole run holds the output's lock alone; the array tasks
of one run hold it together, and the plan they share is registered in ``.PREFIX.plan.json``,
so a task or a run with another plan is refused while one is in progress (``--overwrite``
discards it, from a whole run only). ``--overwrite`` lists the previous manifest's parts in
``.PREFIX.retired.json`` (they stay provably ours) and the manifest leaves before the first
new part is published, so no reader ever sees new data under an old manifest, and a run
that fails before its first part leaves the old corpus as it was. Until a part's record is
there, the plan marker vouches for its files; a folder's failed run removes it (its parts
are published whole or not at all), a bucket's keeps it (an upload may stop half-way).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from .. import _signals
from ..errors import FormatError, PacktoolError
from ..executors import Jobs, RunOptions, finished_jobs, run_jobs
from ..formats._manifest import manifest_text
from ..formats.tokens import (
    DATA_SUFFIXES,
    FORMAT,
    PART_MANIFEST_KEYS,
    corpus_manifest,
    part_manifest_path,
    read_corpus_manifest,
    verify_part_files,
)
from ..formats.tokens.ownership import (
    PLAN_FORMAT,
    our_parts,
    plan_marker,
    refuse_foreign,
    retired_list,
)
from ..formats.tokens.schema import IMAGE_KEYS
from ..formats.tokens.writer import GROUP_KEYS
from ..options import TokenizeOptions
from ..storage import default_options
from ..storage.output import Output, open_output
from ..storage.write import run_job
from .part import PartJob, check_part, finished_parts, tokenize_part
from .plan import TokenizePlan, plan_tokenize
from .prepare import new_run
from .result import TokenizeResult, eos_note, group_counts, merge_engines


def tokenize_files(inputs: list[str], tokenizer: str | Path, out: str | Path,
                   options: TokenizeOptions | None = None, progress: bool = False,
                   run: RunOptions | None = None) -> TokenizeResult:
    """Tokenize ``inputs`` (files, directories, globs) into token files at prefix ``out``
    (a local prefix, or a URL).

    The inputs are planned into parts (small files grouped up to ``options.part_bytes``) and
    the parts run in turn with every core; ``run`` runs them as Ray tasks or array tasks
    instead. Parts already finished and verified are skipped (resume). The run holds the
    output's lock throughout (a second run to the same prefix fails at once naming the
    holder); the array tasks of one run hold it together."""
    opts = options or TokenizeOptions()
    run = run or RunOptions()
    run.check()
    opts.check()
    output = open_output(out, default_options())
    output.check_prefix()
    with output.lock(shared=run.one_task) as notes:
        result = _tokenize(inputs, tokenizer, output, opts, progress, run)
    result.warnings[:0] = notes
    result.warnings += eos_note(opts)
    return result


@dataclass(frozen=True)
class PartTask(PartJob):
    """Part ``k`` of ``plan``, made where it runs and published to the output ``path``
    (picklable: a Ray worker or an array task opens the output itself)."""

    path: str
    storage_options: dict

    def output(self) -> Output:
        return open_output(self.path, self.storage_options)


def run_task(task: PartTask, tick) -> tuple[dict, bool]:
    """Make part ``task.k`` exist at the output, verified: (its manifest, True if it was
    already finished and so skipped), or for a bucket the
    :class:`~packtool.storage.write.PendingUpload` that publishes it (it holds the part's lock
    and scratch folder until then). Atomic and
    idempotent; two writers of one part (array tasks) serialize on the part's lock."""
    out, plan, k = task.output(), task.plan, task.k
    part = plan.parts[k]

    def skipped(done: dict) -> dict:
        tick(part.bytes)
        return {**done, "skipped": True}

    def write(folder: Path):
        here = dataclasses.replace(plan, prefix=folder / plan.prefix.name)
        manifest = tokenize_part(dataclasses.replace(task, plan=here), tick)
        # read back: the bytes there are those hashed while writing (crc32 suffices)
        verify_part_files(here.part_prefix(part), manifest["part"], strong=False)
        keys = manifest["part"]["checksums"]
        # what leaves first: an overwritten part's files this one has not (an SFT part's
        # mask), and with --overwrite the manifest being replaced
        stale = [f"{part.name}.{key}" for key in ("mask", *GROUP_KEYS, "tree", *IMAGE_KEYS)
                 if key not in keys]
        retire = [n for n, size in out.place.sizes(stale).items() if size is not None]
        return ([f"{part.name}.{key}" for key in keys], here.part_manifest(part).name,
                manifest, {"report": True, "retire": retire + (
                    [f"{plan.prefix.name}.json"] if task.opts.overwrite else [])})

    return run_job(out, part.name, f".{part.name}.part.lock", f"part {part.name}",
                   lambda: check_part(plan, k, place=out.store_place)[0], skipped, write,
                   lambda: finished_parts(plan, k))


def _tokenize(inputs, tokenizer, out: Output, opts: TokenizeOptions, progress,
              run: RunOptions) -> TokenizeResult:
    t0 = time.perf_counter()
    new_run()
    plan = plan_tokenize(inputs, tokenizer, out, opts)
    stem = plan.prefix.name
    out.make_place()  # an array task may be first
    removed: list[str] = []
    # a part's commit is not the output's: PREFIX.json is (the parts stay for a re-run)
    out.commits_to(f"{stem}.json", lambda: finished_jobs("part"), lambda: finished_parts(plan, -1))
    try:  # from the retired list's writing on: a failure before the commit removes it
        if not run.finalize:
            _begin(out, plan, opts, run)
        tasks = [PartTask(plan, k, opts, str(out.path), out.place.storage_options or {})
                 for k in range(len(plan.parts))]
        manifests, skipped = run_jobs(
            Jobs(tasks, run_task, [q.bytes for q in plan.parts], lambda j: j.label(),
                 "tokenize", "B"), run, progress)
        if not run.one_task:
            ms = None if run.finalize else [manifests[k] for k in range(len(plan.parts))]
            manifest, removed = finalize_tokenize(plan, out, ms)
    except BaseException:
        with contextlib.suppress(Exception):  # a store that is down: the error is the one above
            if out.place.is_file(f"{stem}.json"):  # the old manifest is there: nothing to vouch
                out.remove([retired_list(stem)])       # for
            if not run.one_task:
                out.abandon([plan_marker(stem)])
        raise
    # what killed writers (a Ray worker killed mid-part, then retried) left beside the
    # parts: removed under the run's exclusive lock, once every part is in
    warnings: list[str] = [] if run.one_task else out.reclaim()
    for m in manifests.values():
        warnings += [w for w in m.get("warnings", []) if w not in warnings]
    if run.one_task:
        entries = [manifests[k]["part"] for k in sorted(manifests)]
        engines = [manifests[k]["meta"]["engine"] for k in sorted(manifests)]
        dtype = next(iter(manifests.values()))["meta"]["dtype"] if manifests else "?"
    else:
        entries, dtype, engines = manifest["parts"], manifest["dtype"], [manifest["engine"]]
    inputs_meta = [i for e in entries for i in e["inputs"]]
    return TokenizeResult(
        prefix=str(out.path),
        n_docs=sum(e["n_docs"] for e in entries),
        n_tokens=sum(e["n_tokens"] for e in entries),
        n_empty=sum(e["n_empty"] for e in entries),
        n_skipped=sum(sum(i.get("skipped", {}).values()) for i in inputs_meta),
        dtype=dtype, seconds=time.perf_counter() - t0, inputs=inputs_meta,
        warnings=warnings, n_parts=len(entries) if run.one_task else len(plan.parts),
        n_parts_skipped=skipped, executor=run.describe(),
        engine=merge_engines(engines) if engines else {},
        n_tokens_tokenized=sum(m["part"]["n_tokens"] for m in manifests.values()
                               if not m.get("skipped")),
        published=_published(out, manifests, removed),
        groups=group_counts(opts.group_kind, entries),
        images={k: sum(e.get(k, 0) for e in entries) for k in ("n_images", "n_vision_tokens")}
        if opts.vision else None)


def _published(out: Output, manifests: dict, removed: list[str]) -> str | None:
    sent = [m["published"] for m in manifests.values() if m.get("published")]
    return out.published(
        f"{sum(p['uploaded'] for p in sent):,} objects uploaded "
        f"({sum(p['bytes_sent'] for p in sent) / 1e6:,.1f} MB), each verified"
        + (f"; {len(removed):,} leftover objects of an earlier run removed" if removed else ""))


# ------------------------------------------------------------------------ ownership
def _begin(out: Output, plan: TokenizePlan, opts: TokenizeOptions, run: RunOptions) -> None:
    """Before any data file changes: refuse what is not ours, register the plan (or find it
    the one in progress), and list the parts of a manifest being overwritten."""
    place, stem = out.place, plan.prefix.name
    manifest = f"{stem}.json"
    if place.exists(manifest):
        if not opts.overwrite:
            raise PacktoolError(f"output already exists: {place.path(manifest)}; pass "
                                "--overwrite to replace it or choose another --out")
        try:  # only a manifest of ours (format, schema, digest) is ever replaced
            read_corpus_manifest(manifest, place)
        except FormatError as e:
            raise PacktoolError(f"--overwrite refused: {place.path(manifest)} is not a "
                                f"packtool token manifest ({e}); move it away if it is yours, "
                                "or choose another --out") from None
    refuse_foreign(out.place, stem, [q.name for q in plan.parts])
    out.claim_plan(plan_marker(stem), {
        "format": PLAN_FORMAT, "digest": plan.digest, "n_parts": len(plan.parts),
        "parts": sorted(our_parts(out.place, stem) | {q.name for q in plan.parts})},
        run, opts.overwrite)
    if opts.overwrite and place.exists(manifest):
        _retire(out, plan)


def _retire(out: Output, plan: TokenizePlan) -> None:
    """Before an --overwrite: ``.PREFIX.retired.json`` lists the parts the old manifest
    vouches for, so that their files stay provably ours once that manifest leaves (with
    the first new part) until the new manifest is in place."""
    stem = plan.prefix.name
    out.put(retired_list(stem), json.dumps({"format": FORMAT, "parts": [
        {"name": n} for n in sorted(our_parts(out.place, stem))]}).encode())


# ------------------------------------------------------------------------- finalize
def checked_parts(plan: TokenizePlan, out: Output) -> list[dict]:
    """Every part's manifest (:func:`packtool.tokenize.part.check_part`), or an error naming
    each part that is missing or corrupt."""
    manifests, bad = [], []
    for k, q in enumerate(plan.parts):
        m, why = check_part(plan, k, place=out.store_place)
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


def finalize_tokenize(plan: TokenizePlan, out: Output | None = None,
                      manifests: list[dict] | None = None) -> tuple[dict, list[str]]:
    """Write ``PREFIX.json`` once every part of ``plan`` is finished: (the manifest, the
    stale objects removed). ``manifests`` (from the run just made, each read back) skip the
    re-check; without them every part is checked (locally the sha256 of every file, and
    its inputs' content) and a missing or corrupt one refused, by name."""
    out = out or open_output(plan.prefix)
    if manifests is None:
        manifests = checked_parts(plan, out)
    manifest, moved = assemble(plan, manifests)
    stem = plan.prefix.name
    files = [(part_manifest_path(Path("."), q.name).name,
              manifest_text(body, ensure_ascii=False).encode()) for q, body in moved]
    files.append((f"{stem}.json", manifest_text(manifest, ensure_ascii=False).encode()))
    # the commit and its clean-up are one step for a signal: one that arrives before the
    # commit undoes it; one after it waits until nothing stale (old parts, the plan, the
    # retired list) is left beside the new manifest, then ends the run
    with _signals.deferred():
        out.commit(files)
        removed = _remove_stale_parts(plan, out)
        out.remove([plan_marker(stem), retired_list(stem)])
    _signals.check()
    return manifest, removed


def _remove_stale_parts(plan: TokenizePlan, out: Output) -> list[str]:
    """Parts of an earlier plan at this prefix (their part records, or the list an
    --overwrite retired, say so) that this plan does not list: removed once the new
    manifest is in place, so no orphan data stays."""
    keep, stem = {q.name for q in plan.parts}, plan.prefix.name
    there = out.place.names()
    names = {n[1:-len(".part.json")] for n in there
             if n.startswith(f".{stem}") and n.endswith(".part.json")}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        names |= {q["name"] for q in
                  json.loads(out.place.read_bytes(retired_list(stem)))["parts"]}
    stale = []
    for name in sorted(names - keep):
        if name == stem or name.startswith(f"{stem}.part-"):
            stale += [f"{name}{s}" for s in DATA_SUFFIXES if f"{name}{s}" in there]
            stale.append(part_manifest_path(Path("."), name).name)
    return [n for n in out.remove(stale) if not n.startswith(".")]
