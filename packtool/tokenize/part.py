"""One part of a tokenize plan, as a job: idempotent and atomic.

    run_part(job)  -> part k's .bin/.boundaries/.mask and .NAME.part.json, renamed into place
                      together (the part manifest last); a part whose files match its part
                      manifest, of the same digest, from inputs whose content hash still
                      matches, is skipped (resume)

Two writers of one part (two array tasks given the same part) serialize on the part's lock:
the second waits, then finds the part finished and skips it.

The tokenizer is loaded once per process, the engine selected (its load-time probe run) once
per run and per Ray worker process, and both reused by every part it writes (:func:`setup`),
so a plan of many small parts pays that fixed cost once: 2,000 one-file parts took 123 s with
a probe per part and a folder listing per part commit, 15-27 s now
(scripts/bench_small_files.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import _locks
from .._atomic import atomic_files
from .._io import sha256_file, write_new
from ..engines import EngineMismatch, early, engine_manifest, mismatch_warning, select_engine
from ..engines.base import Unconfirmed
from ..errors import FormatError, PacktoolError
from ..formats._manifest import manifest_text
from ..formats.tokens import (
    PART_FORMAT,
    PART_VERSION,
    TokenWriter,
    prefix_paths,
    read_part_manifest,
    token_dtype,
    verify_part_files,
)
from ..options import TokenizeOptions
from ..sources import ReadOptions, as_input, content_unchanged
from ..storage import is_url
from ..tokenizer import (
    check_model,
    id_space,
    load_tokenizer,
    plain_json,
    refuse_doubled_specials,
    resolve_tokenizer_path,
    spec_id_space,
    spec_token_id,
    special_token_id,
)
from . import pipeline
from .encode import make_encoder
from .plan import TokenizePlan


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


@lru_cache(maxsize=4)
def _tokenizer(path: str, mtime_ns: int):
    return load_tokenizer(path)


def tokenizer_for(tokenizer: str | Path):
    """The tokenizer, loaded once per process (and again if its file changed)."""
    from ..tokenizer import resolve_tokenizer_path

    path = resolve_tokenizer_path(tokenizer)
    return _tokenizer(str(path), path.stat().st_mtime_ns)


@lru_cache(maxsize=4)
def _tokenizer_facts(path: str, mtime_ns: int, size: int) -> tuple[int, str]:
    """(id space, sha256) of the tokenizer file: per process, not per part (get_vocab alone
    took 0.65 ms a part)."""
    return id_space(_tokenizer(path, mtime_ns)[0]), sha256_file(Path(path))


@lru_cache(maxsize=8)
def _selected(requested: str, check: str, path: str, mtime_ns: int, add_special: bool,
              need_offsets: bool, fallback: str | None):
    tok, tok_path = _tokenizer(path, mtime_ns)
    return select_engine(requested, check, tok_path, tok, add_special,
                         need_offsets=need_offsets, fallback=fallback)


def engine_for(opts: TokenizeOptions, tok_path: Path, need_offsets: bool,
               fallback: str | None):
    """The engine selection for a part: made (engines loaded, the load probe run: ~50 ms
    with fastokens) once per run (:func:`new_run`) or Ray worker process and tokenizer
    file, and handed to each part as a fresh selection with its own check counters. A plan
    of 2,000 one-file parts paid the probe per part: 55 of the 85 ms a part took (cProfile,
    this machine)."""
    return _selected(opts.engine, opts.engine_check, str(tok_path),
                     tok_path.stat().st_mtime_ns, opts.special_tokens, need_offsets,
                     fallback).fresh()


# (tokenizer path, mtime_ns, size, engine, check, bos, eos) -> (facts, selection, reference
# process) of this run's early setup (:func:`_early_setup`): one at most, so one child
_EARLY: dict[tuple, tuple] = {}
_EARLY_OFF: list = []  # non-empty: an early setup failed its confirmation in this run


def new_run() -> None:
    """A run in this process selects its engine afresh (once): what is installed, or a
    test's stand-in engine, may have changed since the last run."""
    _selected.cache_clear()
    end_run()
    _EARLY_OFF.clear()


def end_run() -> None:
    """The run is over: its reference process, if it started one, ends."""
    _forget_early()


def _forget_early() -> None:
    while _EARLY:
        _, (_, _, remote) = _EARLY.popitem()
        remote.close()


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def check_part(plan: TokenizePlan, k: int, inputs: bool = True) -> tuple[dict | None, str]:
    """(part manifest, "") when part ``k`` is finished: its manifest exists, is of this plan
    (same digest), every data file has the recorded size and sha256, and (``inputs``) every
    input still has the content hash recorded when it was read; else (None, why). A
    half-written part never passes: its manifest is renamed in last."""
    part = plan.parts[k]
    path = plan.part_manifest(part)
    try:
        m = read_part_manifest(path)
    except FormatError as e:
        return None, str(e)
    if m is None:
        return None, "missing"
    if m["digest"] != part.digest or m["index"] != k:
        return None, "made from other inputs or options (digest differs)"
    try:
        verify_part_files(plan.part_prefix(part), m["part"])
    except FormatError as e:
        return None, f"corrupt: {e}"
    changed = inputs_changed(m["part"]["inputs"]) if inputs else None
    return (None, changed) if changed else (m, "")


def inputs_changed(entries: list[dict]) -> str | None:
    """Why a finished part's inputs no longer are what it was made from (the content hash
    recorded when each was read: a local file's crc32, an object's ETag/version), or None."""
    for entry in entries:
        content = entry.get("content")
        if content is None or not content_unchanged(as_input(entry["path"]), content):
            return f"its input {entry['path']} changed since it was tokenized"
    return None


def run_part(job: PartJob, tick) -> tuple[dict, bool]:
    """Make part ``job.k`` exist, verified: (its part manifest, True if it was already
    finished and so skipped). Atomic and idempotent; concurrent callers for one part
    serialize on its lock."""
    plan, k = job.plan, job.k
    part = plan.parts[k]
    folder = plan.prefix.parent
    with _locks.waiting(folder / f".{part.name}.part.lock", f"part {part.name}"):
        done, _ = check_part(plan, k)
        if done is not None:
            tick(part.bytes)
            return {**done, "skipped": True}, True
        manifest = tokenize_part(job, tick)
        # read back from disk: the bytes there are those hashed while writing (crc32 suffices)
        verify_part_files(plan.part_prefix(part), manifest["part"], strong=False)
        return manifest, False


def tokenize_part(job: PartJob, tick) -> dict:
    """Tokenize one part. A fast engine that differs from the reference on a checked
    document fails the part; its partial output is discarded and, with ``--engine auto``,
    the part starts again with the reference (the manifest's ``engine.fallback`` says why).
    A part started before its reference was loaded (:func:`_early_setup`) whose engine
    then fails its confirmation is made again the ordinary way, as are the run's others."""
    try:
        try:
            return _write_part(job, tick)
        except Unconfirmed:
            _EARLY_OFF.append(True)
            _forget_early()
            return _write_part(job, tick)
    except EngineMismatch as e:
        if job.opts.engine != "auto":
            raise PacktoolError(f"--engine {job.opts.engine}: {e}; use --engine auto or hf"
                                ) from None
        manifest = _write_part(job, tick, fallback=str(e))
        manifest["warnings"].insert(0, mismatch_warning(e))
        return manifest


@dataclass
class Setup:
    """What a part needs besides its inputs: the tokenizer, ids, the encoder, the engine."""

    tok: object
    tok_path: Path
    dtype: object
    meta: dict
    read_opts: ReadOptions
    engine: object
    encode: object
    warnings: list


def _read_opts(opts: TokenizeOptions) -> ReadOptions:
    return ReadOptions(opts.text_field, opts.txt_split, opts.skip_bad_records,
                       prompt_field=opts.prompt_field, completion_field=opts.completion_field,
                       messages_field=opts.messages_field,
                       max_record_bytes=opts.max_record_bytes)


def _early_setup(tokenizer: str | Path, opts: TokenizeOptions, big: bool) -> Setup | None:
    """The setup of a part that starts before its reference is loaded (:mod:`packtool.engines
    .early`), or None where the ordinary :func:`setup` must run: text mode without the
    post-processor, ``--engine`` auto or gigatoken (gigatoken first for the family), check
    sample or off, a ``tokenizer.json``, and a part of at least ``early.MIN_BYTES`` (``big``)
    or a run whose early engine is already confirmed. Everything taken from the file here
    (the id space, ``--bos``/``--eos`` ids, the family) is confirmed against the reference
    before the part commits."""
    if (_EARLY_OFF or opts.mode != "text" or opts.special_tokens
            or opts.engine not in ("auto", "gigatoken")
            or opts.engine_check not in ("sample", "off")):
        return None
    tok_path = resolve_tokenizer_path(tokenizer)
    if tok_path.suffix == ".model":
        return None
    key = (str(tok_path), *_stamp(tok_path), opts.engine, opts.engine_check, opts.bos,
           opts.eos)
    hit = _EARLY.get(key)
    if hit is not None:
        (vocab_size, tok_sha256, bos_id, eos_id), proto, _ = hit
        sel = proto.fresh()
    else:
        if not big:
            return None
        from ..engines.early import ReferenceProcess
        from ..engines.select import early_selection

        try:
            remote = ReferenceProcess(tok_path, tuple(t for t in (opts.bos, opts.eos) if t))
        except OSError:
            return None
        try:
            sel = None
            _, spec, tok_sha256 = plain_json(tok_path)
            check_model(spec, tok_path)
            vocab_size = spec_id_space(spec)
            ids = {t: spec_token_id(spec, t) for t in (opts.bos, opts.eos) if t}
            if None not in ids.values():
                sel = early_selection(opts.engine, opts.engine_check, tok_path, spec,
                                      remote.engine)
        except (OSError, ValueError, PacktoolError):  # the ordinary path says what is wrong
            sel = None
        if sel is None:
            remote.close()
            return None
        bos_id, eos_id = ids.get(opts.bos), ids.get(opts.eos)
        sel.confirm_early(lambda: remote.confirm(sel.engine, vocab_size, ids))
        _forget_early()  # another tokenizer or options (a Ray worker's earlier run): one child
        _EARLY[key] = ((vocab_size, tok_sha256, bos_id, eos_id), sel, remote)
    dtype = token_dtype(vocab_size)
    encode = make_encoder(None, dtype, False, bos_id, eos_id, "text", engine=sel)
    meta = _meta(tokenizer, tok_path, tok_sha256, vocab_size, dtype, bos_id, eos_id, opts, None)
    return Setup(None, tok_path, dtype, meta, _read_opts(opts), sel, encode, [])


def _meta(tokenizer, tok_path: Path, tok_sha256: str, vocab_size: int, dtype, bos_id, eos_id,
          opts: TokenizeOptions, template_from) -> dict:
    return {"dtype": dtype.name, "vocab_size": vocab_size,
            "tokenizer": {"path": str(tokenizer) if is_url(tokenizer) else str(tok_path),
                          "sha256": tok_sha256},
            "bos_id": bos_id, "eos_id": eos_id,
            "options": {"text_field": opts.text_field, "txt_split": opts.txt_split,
                        "skip_bad_records": opts.skip_bad_records,
                        "max_record_bytes": opts.max_record_bytes, "bos": opts.bos,
                        "eos": opts.eos, "special_tokens": opts.special_tokens,
                        "mode": opts.mode, "prompt_field": opts.prompt_field,
                        "completion_field": opts.completion_field,
                        "messages_field": opts.messages_field, "chat_template": template_from,
                        "train_on": opts.train_on if opts.mode == "messages" else None}}


def setup(tokenizer: str | Path, opts: TokenizeOptions, fallback: str | None = None,
          big: bool = False) -> Setup:
    """What a part needs: :func:`_early_setup` where it applies (``big``: the part is at
    least ``early.MIN_BYTES``), else the tokenizer loaded and the engine selected here."""
    if fallback is None:
        early = _early_setup(tokenizer, opts, big)
        if early is not None:
            return early
    tok, tok_path = tokenizer_for(tokenizer)
    bos_id = special_token_id(tok, opts.bos, "--bos") if opts.bos else None
    eos_id = special_token_id(tok, opts.eos, "--eos") if opts.eos else None
    vocab_size, tok_sha256 = _tokenizer_facts(str(tok_path), *_stamp(tok_path))
    dtype = token_dtype(vocab_size)
    mode = opts.mode
    read_opts = _read_opts(opts)
    if opts.special_tokens and (bos_id is not None or eos_id is not None):
        refuse_doubled_specials(tok, opts, bos_id, eos_id)
    template_from, warnings = None, []
    if mode == "messages":  # rendered by the reader: a failure is a record of a file and line
        from ..chat import chat_renderer

        read_opts.render, template_from, warnings = chat_renderer(tok_path, opts)
    engine = engine_for(opts, tok_path, mode == "messages", fallback)
    encode = make_encoder(tok, dtype, opts.special_tokens, bos_id,
                          None if mode == "messages" else eos_id, mode, engine=engine)
    meta = _meta(tokenizer, tok_path, tok_sha256, vocab_size, dtype, bos_id, eos_id, opts,
                 template_from)
    return Setup(tok, tok_path, dtype, meta, read_opts, engine, encode, warnings)


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


def _write_part(job: PartJob, tick, fallback: str | None = None) -> dict:
    plan, opts, part = job.plan, job.opts, job.part
    t0 = time.perf_counter()
    s = setup(plan.tokenizer, opts, fallback, big=part.bytes >= early.MIN_BYTES)
    paths = [as_input(p) for p in part.inputs]
    files = prefix_paths(plan.part_prefix(part))
    with_mask = opts.mode != "text"
    workers = opts.workers or os.cpu_count() or 1
    # the part's manifest goes last: a part whose manifest exists has all its files. The
    # commit's lock and journal get a name of their own (not an output's, and not the run's
    # output lock, which a Ray driver may hold while its workers write parts)
    outputs = ([files["bin"], files["boundaries"]] + ([files["mask"]] if with_mask else [])
               + [plan.part_manifest(part)])
    stale = [] if with_mask else [files["mask"]]  # an overwritten SFT part's mask goes too
    if opts.overwrite:  # the manifest being replaced leaves in the first part's commit
        stale.append(plan.json_path)
    prefix = plan.part_prefix(part)
    key = prefix.with_name(f"{prefix.name}.part-commit")
    with atomic_files(outputs, True, key=key, remove=stale, label=plan.prefix, scan=False,
                      kept=lambda: finished_parts(plan, job.k)) as tmp:
        keys = ["bin", "boundaries"] + (["mask"] if with_mask else []) + ["json"]
        writer = TokenWriter(dict(zip(keys, tmp, strict=True)), with_mask)
        reader = pipeline.Reader(paths, s.read_opts, opts.batch_size, opts.batch_bytes,
                                 maxsize=2 * workers, warn_bytes=opts.long_record_warn_bytes)
        try:
            pipeline.run(reader, s.encode, writer, s.engine, workers, tick)
        except BaseException:
            writer.abort()
            raise
        entry = writer.finish(part.name, job.k, part.digest,
                              [st.to_json() for st in reader.stats])
        manifest = {"format": PART_FORMAT, "version": PART_VERSION, "index": job.k,
                    "digest": part.digest, "plan_digest": plan.digest, "part": entry,
                    "meta": {**s.meta, "engine": engine_manifest(s.engine)}}
        write_new(tmp[-1], manifest_text(manifest, ensure_ascii=False))
    manifest["warnings"] = list(s.warnings)
    manifest["seconds"] = time.perf_counter() - t0
    return manifest
