"""What a part of a tokenize run needs besides its inputs (:class:`Setup`): the tokenizer,
the id space and dtype, the special tokens' ids, the encoder and the engine selection, made
once per process (the tokenizer, and the selection with its load probe: per run and per
Ray worker process) and handed to each part (:mod:`.part`).
"""

from __future__ import annotations

import dataclasses
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
from .encode import make_encoder, tree_encoder


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


@dataclass
class Setup:
    """What a part needs besides its inputs: the manifest's settings, the encoder, the engine."""

    meta: dict
    read_opts: ReadOptions
    engine: object
    encode: object
    warnings: list


def _read_opts(opts: TokenizeOptions) -> ReadOptions:
    from ..sources.groups import extract_group

    vision = None
    if opts.vision:  # a new one a part: it knows the file it reads
        from ..vision import RULES
        from ..vision.images import VisionReader

        vision = VisionReader(RULES[opts.vision], opts.images_field, opts.min_pixels,
                              opts.max_pixels, opts.image_check or "sha256")
    same = {f.name: getattr(opts, f.name) for f in dataclasses.fields(ReadOptions)
            if hasattr(opts, f.name)}  # the record fields and limits, by their own names
    return ReadOptions(**{**same, "vision": vision},
                       group=extract_group if opts.group_kind else None)


# the manifest's options, in this order, then the chat template and the group fields given
OPTIONS = ("text_field", "txt_split", "skip_bad_records", "max_record_bytes", "bos", "eos",
           "special_tokens", "mode", "prompt_field", "completion_field", "messages_field")
GROUP_FIELDS = ("chosen_field", "rejected_field", "completions_field", "rewards_field",
                "tree_field")


def _vision(tok, opts: TokenizeOptions, encode):
    """The encoder that expands images, and the manifest's ``images`` settings: the rule's
    tokens must be the tokenizer's own (one id each)."""
    from ..vision import RULES
    from .images import vision_encoder

    rule = RULES[opts.vision]
    ids = {}
    for name, token in (("image_token_id", rule.image_token),
                        ("vision_start_id", rule.start_token),
                        ("vision_end_id", rule.end_token)):
        ids[name] = None if token is None else special_token_id(
            tok, token, f"--vision {opts.vision}'s {token}")
    fixed = rule.fixed > 0
    settings = {"rule": rule.name, "patch": rule.patch, "merge": rule.merge,
                "min_pixels": None if fixed else opts.min_pixels or rule.min_pixels,
                "max_pixels": None if fixed else opts.max_pixels or rule.max_pixels,
                **ids, "mrope": rule.mrope, "images_field": opts.images_field,
                "image_check": opts.image_check or "sha256"}
    return vision_encoder(encode, rule, ids["image_token_id"]), settings


def setup(tokenizer: str | Path, opts: TokenizeOptions, fallback: str | None = None) -> Setup:
    """What a part needs: the tokenizer loaded and the engine selected (once per process,
    :func:`tokenizer_for` and :func:`engine_for`), the ids, dtype and encoder."""
    tok, tok_path = tokenizer_for(tokenizer)
    bos_id = special_token_id(tok, opts.bos, "--bos") if opts.bos else None
    eos_id = special_token_id(tok, opts.eos, "--eos") if opts.eos else None
    st = tok_path.stat()
    vocab_size, tok_sha256 = _tokenizer_facts(str(tok_path), st.st_mtime_ns, st.st_size)
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
        encode = tree_encoder(encode)
    meta = {"dtype": dtype.name, "vocab_size": vocab_size,
            "tokenizer": {"path": str(tok_path) if local_file(tokenizer) else str(tokenizer),
                          "sha256": tok_sha256},
            "bos_id": bos_id, "eos_id": eos_id,
            "options": {**{k: getattr(opts, k) for k in OPTIONS}, "chat_template": template_from,
                        "train_on": opts.train_on if mode == "messages" else None,
                        **{k: getattr(opts, k) for k in GROUP_FIELDS if getattr(opts, k)}}}
    if opts.vision:
        encode, meta["images"] = _vision(tok, opts, encode)
    return Setup(meta, read_opts, engine, encode, warnings)
