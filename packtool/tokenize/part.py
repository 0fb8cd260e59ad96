"""One part of a tokenize plan, as a job: idempotent and atomic.

    tokenize_part(job) -> part k's .bin/.boundaries/.mask and .NAME.part.json (the part
                          manifest last), in the folder the stage gives it
    check_part(plan, k) -> its manifest when a part's files match it, of the same digest,
                          from inputs whose content hash still matches (resume skips it)

The stage (:mod:`.stage`) runs and publishes a part (:func:`packtool.storage.write.run_job`).

The tokenizer is loaded once per process, the engine selected (its load-time probe run) once
per run and per Ray worker process, and both reused by every part it writes (:mod:`.prepare`),
so a plan of many small parts pays that fixed cost once: 2,000 one-file parts took 123 s with
a probe per part and a folder listing per part commit, 15-27 s now
(scripts/bench_small_files.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .._io import write_new
from ..engines import EngineMismatch, engine_manifest, mismatch_warning
from ..errors import FormatError, PacktoolError
from ..formats._manifest import manifest_text
from ..formats.tokens import (
    PART_FORMAT,
    PART_VERSION,
    TokenWriter,
    prefix_paths,
    read_part_manifest,
    verify_part_files,
)
from ..formats.tokens.schema import IMAGE_KEYS
from ..options import TokenizeOptions
from ..sources import as_input, content_unchanged
from . import pipeline
from .plan import TokenizePlan
from .prepare import setup


@dataclass(frozen=True)
class PartJob:
    """Part ``k`` of ``plan``, with the options: what an executor runs."""

    plan: TokenizePlan
    k: int
    opts: TokenizeOptions

    @property
    def part(self):
        return self.plan.parts[self.k]

    def label(self) -> str:
        return f"part {self.k} ({self.part.name})"


def check_part(plan: TokenizePlan, k: int, place=None) -> tuple[dict | None, str]:
    """(part manifest, "") when part ``k`` is finished: its manifest exists, is of this plan
    (same digest), every data file matches its record, and every input still has
    the content hash recorded when it was read; else (None, why). A half-written part never
    passes: its manifest is put last. Locally (``place`` None) every file's size and sha256
    are checked; in a bucket (``place``: the output's), each object's size (reading them back
    would cost a download; their MD5 was checked on upload)."""
    part = plan.parts[k]
    try:
        m = (read_part_manifest(plan.part_manifest(part)) if place is None else
             read_part_manifest(plan.part_manifest(part).name, place))
    except FormatError as e:
        return None, str(e)
    if m is None:
        return None, "missing"
    if m["digest"] != part.digest or m["index"] != k:
        return None, "made from other inputs or options (digest differs)"
    problem = _files_problem(plan, part, m["part"], place)
    if problem:
        return None, problem
    changed = inputs_changed(m["part"]["inputs"])
    return (None, changed) if changed else (m, "")


def _files_problem(plan: TokenizePlan, part, record: dict, place) -> str | None:
    if place is None:
        try:
            verify_part_files(plan.part_prefix(part), record)
        except FormatError as e:
            return f"corrupt: {e}"
        return None
    sizes = place.sizes([f"{part.name}.{key}" for key in record["checksums"]])
    for key, want in record["checksums"].items():
        size, where = sizes[f"{part.name}.{key}"], place.path(f"{part.name}.{key}")
        if size != want["bytes"]:
            return (f"{where} is missing" if size is None else
                    f"{where} has {size:,} bytes, its record {want['bytes']:,}")
    return None


def inputs_changed(entries: list[dict]) -> str | None:
    """Why a finished part's inputs no longer are what it was made from (the content hash
    recorded when each was read: a local file's crc32, an object's ETag/version), or None."""
    for entry in entries:
        content = entry.get("content")
        if content is None or not content_unchanged(as_input(entry["path"]), content):
            return f"its input {entry['path']} changed since it was tokenized"
    return None


def tokenize_part(job: PartJob, tick) -> dict:
    """Tokenize one part. A fast engine that differs from the reference on a checked
    document fails the part; its partial output is discarded and, with ``--engine auto``,
    the part starts again with the reference (the manifest's ``engine.fallback`` says why).
    The progress of a part made again counts its input once."""
    tick = _Once(tick)
    try:
        return _write_part(job, tick)
    except EngineMismatch as e:
        if job.opts.engine != "auto":
            raise PacktoolError(f"--engine {job.opts.engine}: {e}; use --engine auto or hf"
                                ) from None
        manifest = _write_part(job, tick.again(), fallback=str(e))
        manifest["warnings"].insert(0, mismatch_warning(e))
        return manifest


class _Once:
    """A progress callback for a part that may be read again: bytes already counted by an
    earlier attempt are not counted twice."""

    def __init__(self, tick):
        self.tick, self.counted, self.seen = tick, 0, 0

    def __call__(self, n: int) -> None:
        self.seen += n
        if self.seen > self.counted:
            self.tick(self.seen - self.counted)
            self.counted = self.seen

    def again(self) -> _Once:
        self.seen = 0
        return self


def finished_parts(plan: TokenizePlan, but: int) -> str | None:
    """The parts of ``plan`` finished on disk (their manifests, of this plan's digest, in
    place), ``but`` one: what a failed run leaves for the next to resume from."""
    def done_(q) -> bool:
        try:
            m = read_part_manifest(plan.part_manifest(q))
        except FormatError:
            return False
        return m is not None and m["digest"] == q.digest

    done = [q.name for q in plan.parts if q.index != but and done_(q)]
    if not done:
        return None
    shown = ", ".join(done[:3]) + (f" and {len(done) - 3} more" if len(done) > 3 else "")
    return f"{len(done)} finished part(s) of it ({shown})"


def data_keys(opts: TokenizeOptions) -> list[str]:
    """The data files a part of this run writes: .bin, .boundaries, and the loss mask (all but
    plain text), a pair's or group's roles and prompt lengths, and its rewards."""
    keys = ["bin", "boundaries"] + (["mask"] if opts.mode != "text" or opts.vision else [])
    if opts.group_kind:
        keys += ["roles", "prompt"] + (["rewards"] if opts.rewards_field else [])
    if opts.vision:  # images: per document, per image; 3-D positions for an mRoPE rule
        from ..vision import RULES

        keys += [k for k in IMAGE_KEYS if k != "pos3" or RULES[opts.vision].mrope]
    return keys + (["tree"] if opts.tree_field else [])


def _write_part(job: PartJob, tick, fallback: str | None = None) -> dict:
    """The part's files and, last, its manifest, into the folder ``job.plan.prefix`` names
    (the job's own: the stage publishes them, :func:`packtool.storage.write.run_job`)."""
    t0 = time.perf_counter()
    plan, opts, part = job.plan, job.opts, job.part
    s = setup(plan.tokenizer, opts, fallback)
    paths = [as_input(p) for p in part.inputs]
    files = prefix_paths(plan.part_prefix(part))
    workers = opts.workers or os.cpu_count() or 1
    keys = data_keys(opts)
    with_mask = "mask" in keys
    writer = TokenWriter({k: files[k] for k in keys}, with_mask)
    reader = pipeline.Reader(paths, s.read_opts, opts.batch_size, opts.batch_bytes,
                             maxsize=2 * workers, warn_bytes=opts.long_record_warn_bytes)
    try:
        pipeline.run(reader, s.encode, writer, s.engine, workers, tick)
    except BaseException:
        writer.abort()
        raise
    entry = writer.finish(part.name, job.k, part.digest, [st.to_json() for st in reader.stats])
    manifest = {"format": PART_FORMAT, "version": PART_VERSION, "index": job.k,
                "digest": part.digest, "plan_digest": plan.digest, "part": entry,
                "meta": {**s.meta, "engine": engine_manifest(s.engine)}}
    write_new(plan.part_manifest(part), manifest_text(manifest, ensure_ascii=False))
    manifest["warnings"] = list(s.warnings)
    manifest["seconds"] = time.perf_counter() - t0
    return manifest
