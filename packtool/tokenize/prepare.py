"""What a part of a tokenize run needs besides its inputs (:class:`Setup`): the tokenizer,
the id space and dtype, the special tokens' ids, the encoder and the engine selection, made
once per process (the tokenizer, and the selection with its load probe: per run and per
Ray worker process) and handed to each part (:mod:`.part`).

A large part whose engine would be gigatoken starts before its reference is loaded
(:func:`_early_setup`, :mod:`packtool.engines.early`): the reference loads in a child
process, this run's one, which ends with the run (:func:`end_run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .._io import sha256_file
from ..engines import early, select_engine
from ..formats.tokens import token_dtype
from ..options import TokenizeOptions
from ..sources import ReadOptions
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
from .encode import make_encoder


@lru_cache(maxsize=4)
def _tokenizer(path: str, mtime_ns: int):
    return load_tokenizer(path)


def tokenizer_for(tokenizer: str | Path):
    """The tokenizer, loaded once per process (and again if its file changed)."""
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
_IN_RUN: list = []     # non-empty: a run this process drives (new_run .. end_run)


def new_run() -> None:
    """A run in this process selects its engine afresh (once): what is installed, or a
    test's stand-in engine, may have changed since the last run."""
    _selected.cache_clear()
    end_run()
    _EARLY_OFF.clear()
    _IN_RUN.append(True)


def end_run() -> None:
    """The run is over: its reference process, if it started one, ends. A Ray worker never
    starts one (its parts run outside new_run .. end_run), so none outlives its run."""
    _IN_RUN.clear()
    _forget_early()


def early_failed() -> None:
    """An early start failed its confirmation: this run's parts are made the ordinary way."""
    _EARLY_OFF.append(True)
    _forget_early()


def _forget_early() -> None:
    while _EARLY:
        _, (_, _, remote) = _EARLY.popitem()
        remote.close()


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


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
    .early`), or None where the ordinary :func:`setup` must run: a run this process drives
    (:func:`new_run`; not a Ray worker's part), text mode without the post-processor,
    ``--engine`` auto or gigatoken (gigatoken first for the family), check sample or off, a
    BPE ``tokenizer.json``, and a part of at least ``early.MIN_BYTES`` (``big``), or a run
    whose early engine is already confirmed. Everything taken from the file here (the id
    space, ``--bos``/``--eos`` ids, the family) is confirmed against the reference before
    the part commits."""
    if (not _IN_RUN or _EARLY_OFF or opts.mode != "text" or opts.special_tokens
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
        proto.confirmed()  # the first part's confirmation (Unconfirmed: the ordinary way)
        sel = proto.fresh()
    elif not big:
        return None
    else:
        started = _start_early(tok_path, key, opts)
        if started is None:
            return None
        (vocab_size, tok_sha256, bos_id, eos_id), sel = started
    dtype = token_dtype(vocab_size)
    encode = make_encoder(None, dtype, False, bos_id, eos_id, "text", engine=sel)
    meta = _meta(tokenizer, tok_path, tok_sha256, vocab_size, dtype, bos_id, eos_id, opts, None)
    return Setup(None, tok_path, dtype, meta, _read_opts(opts), sel, encode, [])


def _start_early(tok_path: Path, key: tuple, opts: TokenizeOptions):
    """The reference process started, gigatoken loaded from the file, the confirmation
    started: ((id space, sha256, bos id, eos id), selection), kept in ``_EARLY`` for the
    run's other parts; or None (the child ended) where the file needs the ordinary path."""
    try:
        remote = early.ReferenceProcess(tok_path, tuple(t for t in (opts.bos, opts.eos) if t))
    except OSError:
        return None
    kept = False
    try:
        _, spec, tok_sha256 = plain_json(tok_path)
        if not isinstance(spec.get("model"), dict) or spec["model"].get("type") != "BPE":
            return None  # tokenizers infers a missing type: the ordinary path decides
        check_model(spec, tok_path)
        vocab_size = spec_id_space(spec)
        ids = {t: spec_token_id(spec, t) for t in (opts.bos, opts.eos) if t}
        if None in ids.values():
            return None
        sel = early.early_selection(opts.engine, opts.engine_check, tok_path, spec,
                                    remote.engine)
        if sel is None:
            return None
        facts = (vocab_size, tok_sha256, ids.get(opts.bos), ids.get(opts.eos))
        sel.confirm_early(lambda: remote.confirm(sel.engine, vocab_size, ids, sel.family))
        _forget_early()  # one child: another tokenizer's or options' ends
        _EARLY[key] = (facts, sel, remote)
        kept = True
        return facts, sel
    except Exception:  # whatever is wrong with the file, the ordinary path says it
        return None
    finally:
        if not kept:
            remote.close()


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
        started = _early_setup(tokenizer, opts, big)
        if started is not None:
            return started
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
