"""What a part of a tokenize run needs besides its inputs (:class:`Setup`): the tokenizer,
the id space and dtype, the special tokens' ids, the encoder and the engine selection, made
once per process (the tokenizer, and the selection with its load probe: per run and per
Ray worker process) and handed to each part (:mod:`.part`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .._io import sha256_file
from ..engines import select_engine
from ..engines.tokenizer import (
    id_space,
    load_tokenizer,
    refuse_doubled_specials,
    resolve_tokenizer_path,
    special_token_id,
)
from ..formats.tokens import token_dtype
from ..options import TokenizeOptions
from ..sources import ReadOptions
from ..storage import local_file
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


def new_run() -> None:
    """A run in this process selects its engine afresh (once): what is installed, or a
    test's stand-in engine, may have changed since the last run."""
    _selected.cache_clear()


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
    from ..sources.groups import extract_group

    return ReadOptions(opts.text_field, opts.txt_split, opts.skip_bad_records,
                       prompt_field=opts.prompt_field, completion_field=opts.completion_field,
                       messages_field=opts.messages_field,
                       max_record_bytes=opts.max_record_bytes, chosen_field=opts.chosen_field,
                       rejected_field=opts.rejected_field,
                       completions_field=opts.completions_field,
                       rewards_field=opts.rewards_field, tree_field=opts.tree_field,
                       group=extract_group if opts.group_kind else None)


def _meta(tokenizer, tok_path: Path, tok_sha256: str, vocab_size: int, dtype, bos_id, eos_id,
          opts: TokenizeOptions, template_from) -> dict:
    return {"dtype": dtype.name, "vocab_size": vocab_size,
            "tokenizer": {"path": str(tok_path) if local_file(tokenizer) else str(tokenizer),
                          "sha256": tok_sha256},
            "bos_id": bos_id, "eos_id": eos_id,
            "options": {"text_field": opts.text_field, "txt_split": opts.txt_split,
                        "skip_bad_records": opts.skip_bad_records,
                        "max_record_bytes": opts.max_record_bytes, "bos": opts.bos,
                        "eos": opts.eos, "special_tokens": opts.special_tokens,
                        "mode": opts.mode, "prompt_field": opts.prompt_field,
                        "completion_field": opts.completion_field,
                        "messages_field": opts.messages_field, "chat_template": template_from,
                        "train_on": opts.train_on if opts.mode == "messages" else None,
                        **{k: getattr(opts, k) for k in GROUP_FIELDS if getattr(opts, k)}}}


GROUP_FIELDS = ("chosen_field", "rejected_field", "completions_field", "rewards_field",
                "tree_field")


def setup(tokenizer: str | Path, opts: TokenizeOptions, fallback: str | None = None) -> Setup:
    """What a part needs: the tokenizer loaded and the engine selected (once per process,
    :func:`tokenizer_for` and :func:`engine_for`), the ids, dtype and encoder."""
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
    elif opts.group_kind and opts.messages_field:  # a chat prompt: rendered in the reader too
        from ..chat import chat_renderer

        renderer, template_from, warnings = chat_renderer(tok_path, opts)
        read_opts.render_prompt = renderer.prompt
    engine = engine_for(opts, tok_path, mode == "messages", fallback)
    encode = make_encoder(tok, dtype, opts.special_tokens, bos_id,
                          None if mode == "messages" else eos_id, mode, engine=engine)
    if opts.tree_field:  # records tagged with their tree id: packtool.sources.records
        from .encode import tree_encoder

        encode = tree_encoder(encode)
    meta = _meta(tokenizer, tok_path, tok_sha256, vocab_size, dtype, bos_id, eos_id, opts,
                 template_from)
    return Setup(tok, tok_path, dtype, meta, read_opts, engine, encode, warnings)
