"""``packtool tokenize`` as a stage: plan the parts, hand them to an executor as jobs
(:mod:`packtool.executors`: here, on Ray, or as array tasks), then write ``PREFIX.json`` from
the parts' own manifests: the commit point.

Who may write an output at once: a whole run holds the output's lock alone; the array tasks
of one run hold it together, and the plan they share is registered in ``.PREFIX.plan.json``,
so a task or a run with another plan is refused while one is in progress (``--overwrite``
discards it, from a whole run only). ``--overwrite`` retires the previous manifest (journaled)
before any data file changes, so no reader ever sees new data under an old manifest.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from .. import _signals
from .._atomic import atomic_files, output_lock, reclaim
from .._io import write_new
from ..errors import FormatError, PacktoolError
from ..executors import Jobs, RunOptions, run_jobs
from ..formats._manifest import manifest_text
from ..formats.tokens import (
    FORMAT,
    part_manifest_path,
    read_corpus_manifest,
    read_part_manifest,
)
from ..options import TokenizeOptions
from ..storage import is_url
from .assemble import assemble, checked_parts
from .part import PartJob, check_part, finished_parts, run_part
from .plan import TokenizePlan, check_out, plan_tokenize
from .prepare import end_run, new_run
from .result import TokenizeResult, eos_note, merge_engines


def tokenize_files(inputs: list[str], tokenizer: str | Path, out: str | Path,
                   options: TokenizeOptions | None = None, progress: bool = False,
                   run: RunOptions | None = None) -> TokenizeResult:
    """Tokenize ``inputs`` (files, directories, globs) into token files at prefix ``out``.

    The inputs are planned into parts (small files grouped up to ``options.part_bytes``) and
    the parts run in turn with every core; ``run`` runs them as Ray tasks or array tasks
    instead. Parts already finished and verified are skipped (resume). The run holds the
    output's lock throughout (a second run to the same prefix fails at once naming the
    holder); the array tasks of one run hold it together."""
    opts = options or TokenizeOptions()
    run = run or RunOptions()
    run.check()
    opts.check()
    try:
        if is_url(out):  # each part made where it runs, then published (tokenize.remote)
            from .remote import tokenize_to_store

            result = tokenize_to_store(inputs, tokenizer, str(out), opts, progress, run)
            result.warnings += eos_note(opts)
            return result
        check_out(out)
        with output_lock(out, shared=run.one_task) as notes:
            result = _tokenize(inputs, tokenizer, out, opts, progress, run)
    finally:
        end_run()  # a reference process this run started (tokenize.prepare) ends with it
    result.warnings[:0] = notes
    result.warnings += eos_note(opts)
    return result


def _tokenize(inputs, tokenizer, out, opts: TokenizeOptions, progress, run: RunOptions
              ) -> TokenizeResult:
    t0 = time.perf_counter()
    new_run()
    plan = plan_tokenize(inputs, tokenizer, out, opts)
    plan.prefix.parent.mkdir(parents=True, exist_ok=True)  # an array task may be first
    # a part's commit is not the output's: a signal before PREFIX.json says what stays
    _signals.commits_to(plan.json_path, lambda: finished_parts(plan, -1))
    try:  # from the retired manifest's writing on: a signal anywhere removes it
        if not run.finalize:
            _begin(plan, opts, run)
        jobs = [PartJob(plan, k, opts) for k in range(len(plan.parts))]
        manifests, skipped = run_jobs(
            Jobs(jobs, run_part, [q.bytes for q in plan.parts], lambda j: j.label(), "tokenize",
                 "B"),
            run, progress)
        if not run.one_task:
            ms = None if run.finalize else [manifests[k] for k in range(len(plan.parts))]
            manifest = finalize_tokenize(plan, ms)
    except BaseException:
        if plan.json_path.exists():  # the old manifest is in place: nothing to vouch for
            with contextlib.suppress(FileNotFoundError):
                _retired(plan).unlink()
        raise
    # what killed writers (a Ray worker killed mid-part, then retried) left beside the
    # parts: removed under the run's exclusive lock, once every part is in
    warnings: list[str] = [] if run.one_task else reclaim(Path(os.path.abspath(plan.prefix)))
    for m in manifests.values():
        warnings += [w for w in m.get("warnings", []) if w not in warnings]
    if run.one_task:
        entries = [manifests[k]["part"] for k in sorted(manifests)]
        engines = [manifests[k]["meta"]["engine"] for k in sorted(manifests)]
        dtype = next(iter(manifests.values()))["meta"]["dtype"] if manifests else "?"
    else:
        entries, dtype = manifest["parts"], manifest["dtype"]
        engines = [manifest["engine"]]
    inputs_meta = [i for e in entries for i in e["inputs"]]
    return TokenizeResult(
        prefix=str(plan.prefix), n_docs=sum(e["n_docs"] for e in entries),
        n_tokens=sum(e["n_tokens"] for e in entries),
        n_empty=sum(e["n_empty"] for e in entries),
        n_skipped=sum(sum(i.get("skipped", {}).values()) for i in inputs_meta),
        dtype=dtype, seconds=time.perf_counter() - t0, inputs=inputs_meta,
        warnings=warnings, n_parts=len(entries) if run.one_task else len(plan.parts),
        n_parts_skipped=skipped, executor=run.describe(),
        engine=merge_engines(engines) if engines else {},
        n_tokens_tokenized=sum(m["part"]["n_tokens"] for m in manifests.values()
                               if not m.get("skipped")))


def _plan_file(plan: TokenizePlan) -> Path:
    return plan.prefix.parent / f".{plan.prefix.name}.plan.json"


def _begin(plan: TokenizePlan, opts: TokenizeOptions, run: RunOptions) -> None:
    """Before any data file changes: refuse what is not ours, register the plan (or find it
    the one in progress), and retire a manifest being overwritten."""
    if plan.json_path.exists() and not opts.overwrite:
        raise PacktoolError(f"output already exists: {plan.json_path}; pass --overwrite to "
                            "replace it or choose another --out")
    if plan.json_path.exists() or plan.json_path.is_symlink():
        try:  # only a manifest of ours (format, schema, digest) is ever replaced
            read_corpus_manifest(plan.json_path)
        except FormatError as e:
            raise PacktoolError(f"--overwrite refused: {plan.json_path} is not a packtool token "
                                f"manifest ({e}); move it away if it is yours, or choose "
                                "another --out") from None
    _refuse_foreign_files(plan)
    registered = _plan_file(plan)
    if run.one_task:  # registered whole (a link: never seen half-written) unless one is
        _register(registered, {"digest": plan.digest, "n_parts": len(plan.parts)})
    try:
        current = json.loads(registered.read_text()) if registered.is_file() else None
    except (OSError, ValueError):
        current = {}
    if current is not None and current.get("digest") != plan.digest:
        if not opts.overwrite or run.one_task:
            raise PacktoolError(
                f"{plan.prefix} is being written from another plan (other inputs, options or "
                f"tokenizer; {registered.name}); finish that run (the same command, or "
                "--finalize after its array tasks) or pass --overwrite to a whole run to "
                "discard it")
        registered.unlink()
        current = None
    if opts.overwrite and plan.json_path.exists():
        _retire(plan)


def _retired(plan: TokenizePlan) -> Path:
    return plan.prefix.parent / f".{plan.prefix.name}.retired.json"


def _our_names(plan: TokenizePlan) -> set[str]:
    """Part names the corpus manifest (or one retired by an interrupted --overwrite) lists,
    under the prefix's current name (a corpus renamed a.* -> b.* still lists a.part-...)."""
    names: set[str] = set()
    for path in (plan.json_path, _retired(plan)):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            meta = json.loads(path.read_text())
            if meta.get("format") != FORMAT:
                continue
            was = (meta.get("plan") or {}).get("prefix") or plan.prefix.name
            for q in meta.get("parts") or [{"name": plan.prefix.name}]:
                name = q["name"]
                if name == was or name.startswith(was + ".part-"):
                    name = plan.prefix.name + name[len(was):]
                names.add(name)
    return names


def _retire(plan: TokenizePlan) -> None:
    """Before an --overwrite: a hidden ``.PREFIX.retired.json`` lists the parts the old
    manifest vouches for, so that their files stay provably ours once that manifest leaves
    (with the first new part's commit, journaled with it: readers never see new data under
    it) until the new manifest is in place."""
    retired = _retired(plan)
    names = sorted(_our_names(plan))
    with contextlib.suppress(FileNotFoundError):
        retired.unlink()
    write_new(retired, json.dumps({"format": FORMAT, "parts": [{"name": n} for n in names]}))


def _register(path: Path, body: dict) -> None:
    """Write ``path`` atomically unless it exists: a temporary of this pid, hard-linked to
    ``path`` (which fails if another task got there first), then removed."""
    from .._atomic import temp_name

    tmp = temp_name(path)
    write_new(tmp, json.dumps(body))
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def _refuse_foreign_files(plan: TokenizePlan) -> None:
    """Data files at a part's name are ours only when a manifest of ours (the corpus's, a
    retired one, or the part's own) vouches for them; anything else is the user's, never
    replaced, even with --overwrite."""
    listed = _our_names(plan)
    for q in plan.parts:
        found = [f"{plan.part_prefix(q)}{s}" for s in (".bin", ".boundaries", ".mask")
                 if Path(f"{plan.part_prefix(q)}{s}").exists()
                 or Path(f"{plan.part_prefix(q)}{s}").is_symlink()]
        if not found or q.name in listed:
            continue
        try:
            ours = read_part_manifest(plan.part_manifest(q)) is not None
        except FormatError:
            ours = False
        if not ours:
            raise PacktoolError(f"{', '.join(found)} exist(s) and no packtool manifest lists "
                                "them: not a packtool output, so not replaced even with "
                                "--overwrite; move them away or choose another --out")


def finalize_tokenize(plan: TokenizePlan, manifests: list[dict] | None = None) -> dict:
    """Write ``PREFIX.json`` once every part of ``plan`` is finished. ``manifests`` (from
    the run just made, each read back from disk) skip the re-check; without them every
    part is checked in full (sha256 of every file, and its inputs' content) and a missing
    or corrupt one refused, by name."""
    if manifests is None:
        manifests = checked_parts(plan, lambda k: check_part(plan, k))
    manifest, moved = assemble(plan, manifests)
    paths = [plan.part_manifest(q) for q, _ in moved] + [plan.json_path]
    # the commit and its clean-up are one step for a signal: one that arrives before the
    # commit undoes it; one after it waits until nothing stale (old parts, the plan, the
    # retired manifest) is left beside the new manifest, then ends the run
    with _signals.deferred():
        with atomic_files(paths, True, key=plan.json_path) as tmps:
            for tmp, (_, body) in zip(tmps, moved, strict=False):
                write_new(tmp, manifest_text(body, ensure_ascii=False))
            write_new(tmps[-1], manifest_text(manifest, ensure_ascii=False))
        _remove_stale_parts(plan)
        for done in (_plan_file(plan), _retired(plan)):
            with contextlib.suppress(FileNotFoundError):
                done.unlink()
    _signals.check()
    return manifest


def _remove_stale_parts(plan: TokenizePlan) -> None:
    """Parts of an earlier plan at this prefix (their part manifests, or the manifest an
    --overwrite retired, say so) that this plan does not list: removed once the new manifest
    is in place, so no orphan data stays."""
    keep = {q.name for q in plan.parts}
    folder, stem = plan.prefix.parent, plan.prefix.name
    names = {m.name[1:-len(".part.json")] for m in folder.glob(f".{stem}*.part.json")}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        names |= {q["name"] for q in json.loads(_retired(plan).read_text())["parts"]}
    for name in names - keep:
        if not (name == stem or name.startswith(f"{stem}.part-")):
            continue
        for s in (".bin", ".boundaries", ".mask"):
            with contextlib.suppress(FileNotFoundError):
                (folder / f"{name}{s}").unlink()
        with contextlib.suppress(FileNotFoundError):
            part_manifest_path(folder, name).unlink()
