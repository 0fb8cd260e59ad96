"""Stage 1: raw corpora -> token files (``PREFIX.bin``, ``PREFIX.boundaries``, ``PREFIX.json``).

A run is a plan of parts (:mod:`packtool.scale`: by default one part per input file), each
written by the pipeline below on its own and committed atomically, so a run resumes and
spreads over machines (``--executor ray``, ``--tasks N --task K``).

The pipeline keeps every core busy on tokenizing and memory flat::

    reader thread                 worker threads (--workers)            calling thread
    files -> records -> batches   tokenizers encode_batch_fast (GIL     in-order: write .bin and
    (bounded queue)          ->   released) + ids -> numpy          ->  .boundaries, hash both

Batches are cut by count and by bytes, and at most ``2 * workers`` are in flight, so peak
memory depends on the batch size, not on the corpus. Results are written in input order,
so the output is byte-identical whatever the worker count or batch size. With a fast engine
(``packtool.engines``), the calling thread also picks, in input order, the documents whose ids
checker threads compare with the reference tokenizer beside the pipeline. Each worker runs
the tokenizer's own batch call with the Rust-side thread pool switched off
(``TOKENIZERS_PARALLELISM=false`` during the run): the worker threads are the parallelism.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ._atomic import atomic_files
from ._io import sha256_file
from ._progress import progress_bar
from .engines import (
    EngineMismatch,
    engine_manifest,
    flatten,
    mismatch_warning,
    sample_picks,
    select_engine,
)
from .errors import PacktoolError
from .formats.tokens import TokenWriter, prefix_paths, token_dtype
from .sources import (
    DEFAULT_MAX_RECORD_BYTES,
    InputStats,
    ReadOptions,
    expand_inputs,
    file_kind,
    iter_documents,
)
from .tokenizer import (
    id_space,
    load_tokenizer,
    refuse_doubled_specials,
    special_token_id,
)

# Tokenizing one record takes about 120x its size in memory (the tokenizers library's
# per-token structures): a 20.4 MB JSONL line peaked at 2.48 GB RSS. The reader warns once per
# run about a record past this size, with the figure, before the memory is spent.
MEMORY_PER_RECORD_BYTE = 120
LONG_RECORD_WARN_BYTES = 8 << 20


@dataclass
class TokenizeOptions:
    text_field: str = "text"
    txt_split: str = "file"
    skip_bad_records: bool = False
    bos: str | None = None
    eos: str | None = None
    special_tokens: bool = False
    workers: int = 0            # 0 = all cores
    batch_size: int = 1024      # documents per batch
    batch_bytes: int = 8 << 20  # ... or this many bytes of text, whichever comes first
    overwrite: bool = False
    prompt_field: str | None = None      # SFT: document = prompt + completion, loss on completion
    completion_field: str | None = None
    messages_field: str | None = None    # chat: rendered with a chat template, loss on assistant
    chat_template: str | None = None     # a Jinja file overriding tokenizer_config.json's
    train_on: str = "assistant"          # or "all"
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES  # a larger record is a bad record
    long_record_warn_bytes: int = LONG_RECORD_WARN_BYTES
    max_render_chars: int = 1 << 25      # chat: a rendered conversation's limit (packtool.chat)
    render_timeout: float = 10.0         # chat: seconds one rendering may take
    engine: str = "auto"                 # see packtool.engines
    engine_check: str = "sample"         # or "full", "off"


@dataclass
class TokenizeResult:
    prefix: str
    n_docs: int
    n_tokens: int
    n_empty: int
    n_skipped: int
    dtype: str
    seconds: float
    inputs: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    n_parts: int = 1
    n_parts_skipped: int = 0        # parts found finished and verified (resume)
    executor: str = "local"
    part: dict | None = field(default=None, repr=False)  # one part's manifest (run_part)
    n_tokens_tokenized: int | None = None  # by this run (skipped parts excluded); None: all

    @property
    def tokens_per_second(self) -> float:
        done = self.n_tokens if self.n_tokens_tokenized is None else self.n_tokens_tokenized
        return done / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        skipped = f", {self.n_skipped:,} bad records skipped" if self.n_skipped else ""
        if self.executor == "finalize":
            return (f"{self.prefix}: {self.n_docs:,} documents, {self.n_tokens:,} tokens "
                    f"({self.dtype}) in {self.n_parts} parts, every part checked (sha256); "
                    f"manifest written in {self.seconds:.1f}s")
        return (
            f"{self.prefix}: {self.n_docs:,} documents, {self.n_tokens:,} tokens ({self.dtype}), "
            f"{self.n_empty:,} empty{skipped} in {self.seconds:.1f}s "
            f"({self.tokens_per_second / 1e6:.2f}M tokens/s tokenized)"
            + (f"; {self.n_parts} parts ({self.executor})" if self.n_parts > 1 else "")
            + (f", {self.n_parts_skipped} already finished and verified, skipped"
               if self.n_parts_skipped else "")
        ) + "".join(f"\nwarning: {w}" for w in self.warnings)

    def to_json(self) -> dict:
        d = asdict(self)
        d["tokens_per_second"] = self.tokens_per_second
        return d


_DONE = object()


def _record_size(record) -> int:
    """Characters in a record: a text, a (prompt, completion) pair or a message list."""
    if isinstance(record, str):
        return len(record)
    if isinstance(record, tuple):
        return sum(len(x) for x in record)
    return sum(len(m["content"]) + len(m["role"]) for m in record)


class _Reader(threading.Thread):
    """Reads every input in order and queues batches of texts, cut by count and bytes."""

    def __init__(self, paths, read_opts, batch_size, batch_bytes, maxsize, warn_bytes=None):
        super().__init__(daemon=True, name="packtool-reader")
        self.warn_bytes = warn_bytes
        self.paths, self.read_opts = paths, read_opts
        self.batch_size, self.batch_bytes = batch_size, batch_bytes
        self.queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self.stats: list[InputStats] = []
        self.bytes_read = 0
        self.stop = threading.Event()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _progress(self, n: int) -> None:
        self.bytes_read += n

    def run(self) -> None:
        try:
            batch, nbytes = [], 0
            for path in self.paths:
                stats = InputStats(path=str(path), kind=file_kind(path))
                self.stats.append(stats)
                unit = "row" if stats.kind in ("parquet", "arrow") else "line"
                for text in iter_documents(path, self.read_opts, stats, self._progress):
                    batch.append(text)
                    size = _record_size(text)
                    nbytes += size
                    if self.warn_bytes is not None and size >= self.warn_bytes:
                        self.warn_bytes = None  # once per run
                        print(
                            f"packtool: warning: {path} {unit} {stats.record}: a "
                            f"{size / 1e6:.1f} MB record; tokenizing it takes about "
                            f"{MEMORY_PER_RECORD_BYTE}x its size in memory "
                            f"(~{size * MEMORY_PER_RECORD_BYTE / 1e9:.1f} GB); lower "
                            "--max-record-bytes to refuse such records", file=sys.stderr)
                    if len(batch) >= self.batch_size or nbytes >= self.batch_bytes:
                        if not self._put((batch, self.bytes_read)):
                            return
                        batch, nbytes = [], 0
            if batch and not self._put((batch, self.bytes_read)):
                return
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._put(e)


@contextlib.contextmanager
def _rust_parallelism_off():
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


_flatten = flatten


def _add_bos_eos(lengths, ids, mask, dtype, bos_id, eos_id):
    """Insert BOS (mask 0) / EOS (mask 1: the model must learn to stop) around each document."""
    n_extra = (bos_id is not None) + (eos_id is not None)
    if not n_extra:
        return lengths, ids, mask
    lengths = lengths + n_extra
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
    out_mask = None if mask is None else np.empty(len(out), np.uint8)
    keep = np.ones(len(out), dtype=bool)
    for tid, where, m in ((bos_id, ends - lengths, 0), (eos_id, ends - 1, 1)):
        if tid is not None:
            out[where] = tid
            keep[where] = False
            if out_mask is not None:
                out_mask[where] = m
    out[keep] = ids
    if out_mask is not None:
        out_mask[keep] = mask
    return lengths, out, out_mask


def make_encoder(tokenizer, dtype: np.dtype, add_special: bool, bos_id, eos_id,
                 mode: str = "text", renderer=None, engine=None):
    """Return ``encode(records) -> (lengths int64, tokens dtype, loss mask uint8 or None)``.

    text: the tokens of each string. prompt_completion: prompt tokens then completion tokens,
    each encoded on its own (exactly what the model is trained on), mask 1 on the completion.
    messages: (text, trained character spans) pairs, as the reader renders them (or as
    ``renderer`` renders message lists here), encoded with offsets; mask 1 on the tokens that
    overlap a trained span. ``engine``: a ``packtool.engines.Selection`` for text and
    prompt/completion (default: ``tokenizer``); ``pick``: the records its sample check covers.
    """
    if engine is None:
        def batch(texts, special, dt, pick=None):
            return _flatten(tokenizer.encode_batch_fast(texts, add_special_tokens=special), dt)
    else:
        batch = engine.encode

    def encode(records, pick=None):
        if mode == "text":
            lengths, ids = batch(records, add_special, dtype, pick)
            mask = None
        elif mode == "prompt_completion":
            lp, ip = batch([r[0] for r in records], False, dtype, pick)
            lc, ic = batch([r[1] for r in records], False, dtype, pick)
            lengths = lp + lc
            owner = np.repeat(np.arange(2 * len(records)), np.stack([lp, lc], 1).ravel())
            ids = np.empty(int(lengths.sum()), dtype)
            mask = np.empty(ids.size, np.uint8)
            is_c = (owner % 2).astype(bool)
            ids[~is_c], ids[is_c] = ip, ic
            mask[:] = is_c
        else:
            rendered = records if renderer is None else [renderer(r) for r in records]
            encs = tokenizer.encode_batch([t for t, _ in rendered], add_special_tokens=False)
            lengths, ids = _flatten(encs, dtype)
            mask = np.zeros(ids.size, np.uint8)
            pos = 0
            for (_, spans), e in zip(rendered, encs, strict=True):
                if spans and len(e):
                    offs = np.array(e.offsets, dtype=np.int64).reshape(-1, 2)
                    m = np.zeros(len(e), bool)
                    for a, b in spans:
                        m |= (offs[:, 1] > a) & (offs[:, 0] < b)
                        m |= (offs[:, 0] == offs[:, 1]) & (offs[:, 0] >= a) & (offs[:, 0] < b)
                    mask[pos:pos + len(e)] = m
                pos += len(e)
        return _add_bos_eos(lengths, ids, mask, dtype, bos_id, eos_id)

    return encode


def tokenize_files(inputs: list[str], tokenizer: str | Path, out: str | Path,
                   options: TokenizeOptions | None = None, progress: bool = False,
                   run=None, part_bytes: int | None = None) -> TokenizeResult:
    """Tokenize ``inputs`` (files, directories, globs) into token files at prefix ``out``.

    The inputs are planned into parts (one per file by default; ``part_bytes`` groups small
    files) and the parts run in turn with every core; ``run`` (a
    :class:`packtool.plan.RunOptions`) runs them as Ray tasks or array tasks instead. Parts
    already finished and verified are skipped (resume)."""
    from .scale import tokenize as run_plan

    return run_plan(inputs, tokenizer, out, options or TokenizeOptions(), progress=progress,
                    run=run, part_bytes=part_bytes)


def tokenize_part(paths: list[Path], tokenizer: str | Path, part_prefix: Path,
                  opts: TokenizeOptions, part_info: dict, progress=False) -> TokenizeResult:
    """Tokenize one part: ``paths`` into ``part_prefix``.{bin,boundaries,mask} and its part
    manifest ``part_info["manifest"]`` (written last, all renamed into place together).

    A fast engine that differs from the reference on a checked document fails the part; its
    partial output is discarded and, with ``--engine auto``, the part starts again with the
    reference (the manifest's ``engine.fallback`` says why)."""
    try:
        return _tokenize_files(paths, tokenizer, part_prefix, opts, progress,
                               part_info=part_info)
    except EngineMismatch as e:
        if opts.engine != "auto":
            raise PacktoolError(f"--engine {opts.engine}: {e}; use --engine auto or hf") from None
        result = _tokenize_files(paths, tokenizer, part_prefix, opts, progress,
                                 fallback=str(e), part_info=part_info)
        result.warnings.insert(0, mismatch_warning(e))  # printed with the summary
        return result


def check_options(opts: TokenizeOptions) -> None:
    """The option checks that need no input or tokenizer: run before a plan is made."""
    if opts.max_record_bytes < 1:
        raise PacktoolError(f"--max-record-bytes {opts.max_record_bytes}: must be at least 1 "
                            f"(default {DEFAULT_MAX_RECORD_BYTES:,})")
    if opts.batch_size < 1 or opts.workers < 0:
        raise PacktoolError("--batch-size and --workers must be at least 1")
    mode = ReadOptions(opts.text_field, prompt_field=opts.prompt_field,
                       completion_field=opts.completion_field,
                       messages_field=opts.messages_field).mode
    if mode == "prompt_completion" and not (opts.prompt_field and opts.completion_field):
        raise PacktoolError("--prompt-field and --completion-field go together; pass both")
    if mode == "messages" and (opts.prompt_field or opts.completion_field):
        raise PacktoolError("--messages-field cannot be combined with "
                            "--prompt-field/--completion-field")
    if mode == "messages" and (opts.bos or opts.eos):
        raise PacktoolError("with --messages-field the chat template writes the special tokens; "
                            "drop --bos/--eos (or put them in the template)")
    if mode != "text" and opts.special_tokens:
        raise PacktoolError("--special-tokens applies to plain text; with prompt/completion use "
                            "--bos/--eos, with messages the chat template")


def _tokenize_files(inputs, tokenizer, out, opts: TokenizeOptions, progress,
                    fallback: str | None = None, part_info: dict | None = None
                    ) -> TokenizeResult:
    t0 = time.perf_counter()
    check_options(opts)
    paths = expand_inputs(inputs)
    tok, tok_path = load_tokenizer(tokenizer)
    bos_id = special_token_id(tok, opts.bos, "--bos") if opts.bos else None
    eos_id = special_token_id(tok, opts.eos, "--eos") if opts.eos else None
    vocab_size = id_space(tok)
    dtype = token_dtype(vocab_size)
    workers = opts.workers or os.cpu_count() or 1
    read_opts = ReadOptions(opts.text_field, opts.txt_split, opts.skip_bad_records,
                            prompt_field=opts.prompt_field, completion_field=opts.completion_field,
                            messages_field=opts.messages_field,
                            max_record_bytes=opts.max_record_bytes)
    mode = read_opts.mode
    if opts.special_tokens and (bos_id is not None or eos_id is not None):
        refuse_doubled_specials(tok, opts, bos_id, eos_id)
    template_from, warnings = None, []
    if mode == "messages":  # rendered by the reader: a failure is a record of a file and line
        from .chat import BUILTIN, ChatRenderer, load_template

        source, template_from, variables = load_template(tok_path, opts.chat_template)
        read_opts.render = ChatRenderer(source, variables, opts.train_on, template_from,
                                        opts.max_render_chars, opts.render_timeout)
        if template_from == BUILTIN:
            warnings.append(
                f"{tok_path.parent} has no chat template (no chat_template in "
                "tokenizer_config.json): used packtool's built-in chat template (<|role|> "
                "headers, EOS after assistant turns); pass --chat-template FILE to choose one")
    engine = select_engine(opts.engine, opts.engine_check, tok_path, tok, opts.special_tokens,
                           need_offsets=mode == "messages", fallback=fallback)
    encode = make_encoder(tok, dtype, opts.special_tokens, bos_id, eos_id, mode, engine=engine)
    prefix = Path(out)  # not a directory: checked by tokenize_files
    files = prefix_paths(prefix)
    with_mask = mode != "text"
    outputs_resolved = {p.resolve() for p in files.values()}
    for p in paths:
        if p.resolve() in outputs_resolved:
            raise PacktoolError(f"input {p} is also an output of --out {out}; choose another --out")
    total_bytes = sum(p.stat().st_size for p in paths)

    # the part's manifest goes last: a part whose manifest exists has all its files. The
    # commit's lock and journal get a name of their own (not an output's, and not the run's
    # output lock, which a Ray driver may hold while its workers write parts)
    manifest_path = Path(part_info["manifest"])
    outputs = ([files["bin"], files["boundaries"]] + ([files["mask"]] if with_mask else [])
               + [manifest_path])
    stale = [] if with_mask else [files["mask"]]  # an overwritten SFT part's mask goes too
    key = prefix.with_name(f"{prefix.name}.part-commit")
    with atomic_files(outputs, True, key=key, remove=stale, label=prefix) as tmp:
        keys = ["bin", "boundaries"] + (["mask"] if with_mask else []) + ["json"]
        writer = TokenWriter(dict(zip(keys, tmp, strict=True)), with_mask)
        reader = _Reader(paths, read_opts, opts.batch_size, opts.batch_bytes, maxsize=2 * workers,
                         warn_bytes=opts.long_record_warn_bytes)
        own_bar = not hasattr(progress, "update")  # else the caller's bar over all parts
        bar = progress_bar(total_bytes, "tokenize", "B", progress) if own_bar else progress
        bar_base = bar.n if bar is not None else 0
        pool = ThreadPoolExecutor(workers, "packtool-tok")
        try:
            with _rust_parallelism_off(), engine.checking(workers):
                reader.start()
                pending: deque = deque()
                done = False
                n_submitted, longest = 0, 0  # the sample check's picks, made in input order
                while not done or pending:
                    while not done and len(pending) < 2 * workers:
                        item = reader.queue.get()
                        if item is _DONE:
                            done = True
                        elif isinstance(item, BaseException):
                            raise item
                        else:
                            texts, bytes_read = item
                            pick = None
                            if engine.check == "sample":
                                sizes = np.fromiter(map(_record_size, texts), np.int64,
                                                    count=len(texts))
                                pick, longest = sample_picks(n_submitted, sizes, longest)
                            n_submitted += len(texts)
                            pending.append((pool.submit(encode, texts, pick), bytes_read))
                    if not pending:
                        break
                    future, bytes_read = pending.popleft()
                    writer.write(*future.result())
                    if bar is not None:
                        bar.update(bar_base + bytes_read - bar.n)
                        el = max(time.perf_counter() - t0, 1e-9)
                        bar.set_postfix_str(f"{writer.n_docs / el:,.0f} docs/s, "
                                            f"{writer.n_tokens / el / 1e6:.2f}M tok/s",
                                            refresh=False)
        except BaseException:
            reader.stop.set()
            # no waiting for a worker still inside a tokenizer call: the CLI exits without
            # joining it (os._exit), so a runaway batch cannot hold up Ctrl-C or SIGTERM
            pool.shutdown(wait=False, cancel_futures=True)
            writer.abort()
            raise
        finally:
            if bar is not None and own_bar:
                bar.close()
        pool.shutdown()
        reader.join()
        seconds = time.perf_counter() - t0
        inputs_meta = [s.to_json() for s in reader.stats]
        entry = writer.finish(prefix.name, inputs_meta)
        manifest = {**part_info["header"], "part": entry, "meta": {
            "dtype": dtype.name,
            "vocab_size": vocab_size,
            "tokenizer": {"path": str(tok_path), "sha256": sha256_file(tok_path)},
            "bos_id": bos_id,
            "eos_id": eos_id,
            "options": {
                "text_field": opts.text_field,
                "txt_split": opts.txt_split,
                "skip_bad_records": opts.skip_bad_records,
                "max_record_bytes": opts.max_record_bytes,
                "bos": opts.bos,
                "eos": opts.eos,
                "special_tokens": opts.special_tokens,
                "mode": mode,
                "prompt_field": opts.prompt_field,
                "completion_field": opts.completion_field,
                "messages_field": opts.messages_field,
                "chat_template": template_from,
                "train_on": opts.train_on if mode == "messages" else None,
            },
            "engine": engine_manifest(engine),
        }}
        tmp[-1].write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")

    n_skipped = sum(sum(s.skipped.values()) for s in reader.stats)
    return TokenizeResult(
        prefix=str(prefix), n_docs=entry["n_docs"], n_tokens=entry["n_tokens"],
        n_empty=entry["n_empty"],
        n_skipped=n_skipped, dtype=dtype.name, seconds=seconds, inputs=inputs_meta,
        warnings=warnings, part=manifest,
    )
