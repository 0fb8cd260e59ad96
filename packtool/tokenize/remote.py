"""``tokenize --out s3://bucket/corpus``: the same plan and parts as a local run, each part
written on the disk of the process that runs it (a local run, a Ray worker, an array task:
no shared file system), then published (:mod:`packtool.storage.publish`)::

    run         lock object .corpus.lock (conditional put), then .corpus.plan.json: the
                plan's digest and part names (what vouches for objects at those names)
    part job    tokenized into a scratch folder of this process; corpus.part-00003.bin,
                .boundaries (.mask) uploaded and verified, .corpus.part-00003.part.json
                last (the part's commit); the local files removed
    finalize    every part's record checked, corpus.json put last (the commit), leftover
                objects of ours removed, the plan marker and lock removed

A part whose record is on the store, of this plan's digest, with objects of the sizes it
lists and inputs unchanged (a local file's crc32, an object's ETag/version), is skipped: the
same command after an interruption resumes. Outputs are the same bytes as a local run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from dataclasses import dataclass

from ..errors import FormatError, PacktoolError
from ..executors import Jobs, RunOptions, run_jobs
from ..formats._manifest import check_digest, manifest_text
from ..formats.tokens import DIGEST_KEY, FORMAT, part_manifest_path, read_part_manifest
from ..options import TokenizeOptions
from ..storage import basename, default_options, parent
from ..storage.place import Place
from ..storage.publish import Published, StoreLock, put_object, remove_leftovers, upload
from ..storage.stage_out import scratch_dir
from .assemble import assemble, checked_parts
from .part import PartJob, inputs_changed, run_part
from .plan import TokenizePlan, plan_tokenize
from .prepare import new_run
from .result import TokenizeResult, merge_engines

PLAN_FORMAT = "packtool.tokens.plan"


@dataclass(frozen=True)
class RemotePartJob:
    """Part ``k`` of ``plan`` (its prefix a placeholder: each process writes in a scratch
    folder of its own), published under ``url``."""

    plan: TokenizePlan
    k: int
    opts: TokenizeOptions
    url: str
    storage_options: dict

    def label(self) -> str:
        return f"part {self.k} ({self.plan.parts[self.k].name})"

    def place(self) -> Place:
        return Place(parent(self.url), self.storage_options)


def ours_of(stem: str):
    """The objects of corpus ``stem``: its parts' files and records, its manifest, its plan
    marker and lock."""
    pat = re.compile(rf"^\.?{re.escape(stem)}(?:\.part-[0-9]+)?"
                     r"\.(?:bin|boundaries|mask|json|part\.json|plan\.json|part\.lock|lock)$")
    return lambda name: "/" not in name and bool(pat.match(name))


def check_remote_part(job: RemotePartJob, place: Place) -> tuple[dict | None, str]:
    """(part record, "") when part ``job.k`` is published and its inputs are unchanged,
    else (None, why)."""
    part = job.plan.parts[job.k]
    try:
        m = read_part_manifest(part_manifest_path(job.plan.prefix.parent, part.name).name,
                               place)
    except FormatError as e:
        return None, str(e)
    if m is None:
        return None, "missing"
    if m["digest"] != part.digest or m["index"] != job.k:
        return None, "made from other inputs or options (digest differs)"
    sizes = place.sizes([f"{part.name}.{key}" for key in m["part"]["checksums"]])
    for key, want in m["part"]["checksums"].items():
        size = sizes[f"{part.name}.{key}"]
        if size != want["bytes"]:
            return None, (f"{place.path(f'{part.name}.{key}')} is missing" if size is None else
                          f"{place.path(f'{part.name}.{key}')} has {size:,} bytes, its record "
                          f"{want['bytes']:,}")
    changed = inputs_changed(m["part"]["inputs"])
    return (None, changed) if changed else (m, "")


def run_remote_part(job: RemotePartJob, tick) -> tuple[dict, bool]:
    """Make part ``job.k`` exist on the store, verified: (its record, True if it already
    was). Two writers of one part (array tasks) serialize on the part's lock object."""
    place = job.place()
    part = job.plan.parts[job.k]
    lock = f".{part.name}.part.lock"
    with StoreLock(place.fs, f"{place.root}/{lock}", str(place.path(lock)), wait=True):
        done, _ = check_remote_part(job, place)
        if done is not None:
            tick(part.bytes)
            return {**done, "skipped": True}, True
        with scratch_dir(job.url) as scratch:
            local = dataclasses.replace(job.plan, prefix=scratch / job.plan.prefix.name)
            manifest, _ = run_part(PartJob(local, job.k, job.opts), tick)
            sent = Published(str(place.folder))
            upload(place.fs, [(scratch / (name := f"{part.name}.{key}"),
                               f"{place.root}/{name}") for key in manifest["part"]["checksums"]],
                   sent)
            record = local.part_manifest(part)
            put_object(place.fs, f"{place.root}/{record.name}", record.read_bytes(),
                       str(place.path(record.name)))
    manifest["published"] = dataclasses.asdict(sent)
    return manifest, False


def _check_existing(place: Place, stem: str, url: str, overwrite: bool) -> None:
    """An existing corpus there needs --overwrite and must be ours (format and digest)."""
    if not place.is_file(f"{stem}.json"):
        return
    if not overwrite:
        raise PacktoolError(f"output already exists: {url}.json; pass --overwrite to replace "
                            "it or choose another --out")
    try:
        meta = json.loads(place.read_bytes(f"{stem}.json"))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError("not a token corpus manifest")
        if meta.get("version", 0) >= 3:
            check_digest(meta, DIGEST_KEY, f"{url}.json", "")
    except (ValueError, FormatError) as e:
        raise PacktoolError(f"{url}.json is not a packtool token corpus ({e}); --overwrite "
                            "replaces only packtool's own output") from None


def _vouched(place: Place, stem: str) -> set[str]:
    """Part names an existing manifest of ours or a plan marker of ours lists."""
    names: set[str] = set()
    for name, key in ((f"{stem}.json", "parts"), (f".{stem}.plan.json", "parts")):
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
            meta = json.loads(place.read_bytes(name))
            if meta.get("format") in (FORMAT, PLAN_FORMAT):
                names |= {q["name"] if isinstance(q, dict) else q for q in meta[key]}
    return names


def _begin(place: Place, plan: TokenizePlan, url: str, opts: TokenizeOptions,
           run: RunOptions) -> None:
    """Before any object changes: what is there is ours or refused, a plan in progress is
    this one (or --overwrite discards it), the plan marker put, an overwritten manifest
    deleted (readers stop seeing the old corpus)."""
    stem = plan.prefix.name
    _check_existing(place, stem, url, opts.overwrite)
    marker = f".{stem}.plan.json"
    if place.is_file(marker):
        current = json.loads(place.read_bytes(marker))
        if current.get("digest") != plan.digest and (not opts.overwrite or run.one_task):
            raise PacktoolError(
                f"{url} is being written from another plan (other inputs, options or "
                f"tokenizer; {marker}); finish that run (the same command, or --finalize "
                "after its array tasks) or pass --overwrite to a whole run to discard it")
    vouched = _vouched(place, stem)
    names = {p[len(place.root) + 1:] for p in place.fs.find(place.root)}
    for q in plan.parts:
        found = [f"{q.name}{s}" for s in (".bin", ".boundaries", ".mask")
                 if f"{q.name}{s}" in names]
        if found and q.name not in vouched and f".{q.name}.part.json" not in names:
            raise PacktoolError(f"{', '.join(place.path(f) for f in found)} exist(s) and no "
                                "packtool manifest lists them: not a packtool output, so not "
                                "replaced even with --overwrite; choose another --out")
    body = {"format": PLAN_FORMAT, "digest": plan.digest,
            "parts": sorted(vouched | {q.name for q in plan.parts})}
    put_object(place.fs, f"{place.root}/{marker}", json.dumps(body).encode(),
               str(place.path(marker)))
    if opts.overwrite and place.is_file(f"{stem}.json") and not run.one_task:
        place.fs.rm_file(f"{place.root}/{stem}.json")


def _finalize(place: Place, plan: TokenizePlan, jobs: list, manifests: list | None,
              url: str) -> tuple[dict, list[str]]:
    if manifests is None:
        manifests = checked_parts(plan, lambda k: check_remote_part(jobs[k], place))
    manifest, moved = assemble(plan, manifests)
    stem = plan.prefix.name
    for q, body in moved:
        name = part_manifest_path(plan.prefix.parent, q.name).name
        put_object(place.fs, f"{place.root}/{name}",
                   manifest_text(body, ensure_ascii=False).encode(),
                   str(place.path(name)))
    put_object(place.fs, f"{place.root}/{stem}.json",
               manifest_text(manifest, ensure_ascii=False).encode(),
               f"{url}.json")
    keep = {f"{stem}.json", f".{stem}.lock"}
    for q in manifest["parts"]:
        keep |= {f"{q['name']}.{key}" for key in q["checksums"]}
        keep.add(part_manifest_path(plan.prefix.parent, q["name"]).name)
    removed = remove_leftovers(place.fs, place.root, keep, ours_of(stem))
    return manifest, [n for n in removed if not n.endswith((".plan.json", ".lock"))]


def tokenize_to_store(inputs, tokenizer, url: str, opts: TokenizeOptions, progress: bool,
                      run: RunOptions):
    from ..storage.stage_out import require_url

    url = require_url(url)
    t0 = time.perf_counter()
    new_run()
    options = default_options()
    place, stem = Place(parent(url), options), basename(url)
    plan = plan_tokenize(inputs, tokenizer, url, opts)  # its prefix: the name alone
    jobs = [RemotePartJob(plan, k, opts, url, options) for k in range(len(plan.parts))]
    lock = contextlib.nullcontext() if run.one_task else StoreLock(
        place.fs, f"{place.root}/.{stem}.lock", str(place.path(f".{stem}.lock")))
    with lock:
        if not run.finalize:
            _begin(place, plan, url, opts, run)
        results, skipped = run_jobs(
            Jobs(jobs, run_remote_part, [q.bytes for q in plan.parts], lambda j: j.label(),
                 "tokenize", "B"), run, progress)
        removed: list[str] = []
        if not run.one_task:
            ms = None if run.finalize else [results[k] for k in range(len(plan.parts))]
            manifest, removed = _finalize(place, plan, jobs, ms, url)
    entries = ([results[k]["part"] for k in sorted(results)] if run.one_task
               else manifest["parts"])
    engines = ([results[k]["meta"]["engine"] for k in sorted(results)] if run.one_task
               else [manifest["engine"]])
    sent = [results[k].get("published") for k in results if results[k].get("published")]
    note = (f"published to {url}: {sum(p['uploaded'] for p in sent):,} objects uploaded "
            f"({sum(p['bytes_sent'] for p in sent) / 1e6:,.1f} MB), each verified"
            + (f"; {len(removed):,} leftover objects of an earlier run removed" if removed
               else ""))
    warnings = []
    for m in results.values():
        warnings += [w for w in m.get("warnings", []) if w not in warnings]
    inputs_meta = [i for e in entries for i in e["inputs"]]
    return TokenizeResult(
        prefix=url, n_docs=sum(e["n_docs"] for e in entries),
        n_tokens=sum(e["n_tokens"] for e in entries),
        n_empty=sum(e["n_empty"] for e in entries),
        n_skipped=sum(sum(i.get("skipped", {}).values()) for i in inputs_meta),
        dtype=(manifest["dtype"] if not run.one_task else
               next(iter(results.values()))["meta"]["dtype"] if results else "?"),
        seconds=time.perf_counter() - t0, inputs=inputs_meta, warnings=warnings,
        n_parts=len(entries) if run.one_task else len(plan.parts), n_parts_skipped=skipped,
        executor=run.describe(), engine=merge_engines(engines) if engines else {},
        n_tokens_tokenized=sum(m["part"]["n_tokens"] for m in results.values()
                               if not m.get("skipped")),
        published=note)
