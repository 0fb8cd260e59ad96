"""The ``packtool`` command: a thin click layer over the library.

Each command parses options, calls one library function and prints its summary; every
:class:`PacktoolError` becomes ``Error: <message>`` and exit code 1. Ctrl-C and SIGTERM
exit 130/143 after the library has removed its temporary files.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from . import __version__
from .errors import PacktoolError
from .export import FORMATS as EXPORT_FORMATS  # a plain tuple; imports nothing heavy


def _run(fn, *args, **kwargs):
    import errno

    from ._atomic import final_name

    try:
        return fn(*args, **kwargs)
    except PacktoolError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # disk full, permissions, read-only file systems...
        where = f" {final_name(e.filename)}" if e.filename else ""  # the output, not a temp
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            import shutil

            free = shutil.disk_usage(Path(e.filename).parent).free if e.filename else None
            raise click.ClickException(
                f"no space left on device writing{where or ' the output'}"
                + (f" ({free:,} bytes free there)" if free is not None else "")
                + "; free space or choose another --out") from None
        raise click.ClickException(f"cannot read or write{where}: {e.strerror or e}") from None


def _emit(result, as_json: bool, quiet: bool, out=None) -> None:
    """Every command's result: JSON on stdout with --json, else its summary (on ``out``:
    stdout for verify/stats, whose summary is the answer; stderr for the others)."""
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1))
    elif not quiet:
        click.echo(result.summary(), err=out != "stdout")


# options every command spells the same way
overwrite_option = click.option("--overwrite", is_flag=True,
                                help="Replace an existing output (only a packtool output).")
quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print the result as JSON on stdout.")
seed_option = click.option("--seed", type=int, default=0, show_default=True,
                           help="Seed for shuffling and random packers.")
overflow_option = click.option(
    "--overflow", type=click.Choice(["split", "truncate", "drop"]), default="split",
    show_default=True, help="Documents longer than --seq-len: split into pieces, keep the first "
    "seq_len tokens, or drop them (always counted).")


def scale_options(fn):
    """How a run spreads over machines (packtool.scale, docs/SCALE.md)."""
    for opt in reversed((
        click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
                     show_default=True,
                     help="local: the parts in turn with every core; ray: one Ray task per "
                          "part (pip install 'packtool[ray]')."),
        click.option("--ray-address", default=None,
                     help="Ray cluster to join (auto, ray://HOST:10001); default: start a "
                          "local instance."),
        click.option("--tasks", type=click.IntRange(1), default=None,
                     help="Array jobs: the number of tasks sharing the plan (with --task)."),
        click.option("--task", type=click.IntRange(0), default=None,
                     help="Array jobs: run only this task's share (0-based; Slurm: "
                          "$SLURM_ARRAY_TASK_ID)."),
        click.option("--finalize", is_flag=True,
                     help="Array jobs: after every task, check every part and write the "
                          "manifest (names the missing or corrupt parts otherwise)."),
    )):
        fn = opt(fn)
    return fn


def seq_len_option(multiple: bool = False, **kw):
    if multiple:
        return click.option("--seq-len", "-L", "seq_lens", type=click.IntRange(1, 2**31 - 1),
                            multiple=True, help="Sequence length to evaluate (repeat; default "
                            "512 1024 2048 4096 8192).")
    return click.option("--seq-len", "-L", type=click.IntRange(1, 2**31 - 1),
                        required="default" not in kw, help="Tokens per pack.", **kw)


def _algo_names() -> list[str]:
    from .packers import PACKERS  # names only: the kernels load when a packer runs

    return list(PACKERS)


def algo_option(**kw):
    return click.option("--algo", "-a", type=click.Choice(_algo_names()), default="bfd",
                        show_default=True, help="Packing algorithm.", **kw)


def packer_options(fn):
    """The options some packers read; one a packer does not read is refused, not ignored."""
    for opt in reversed((
        click.option("--max-depth", type=click.IntRange(1), default=None,
                     help="spfhp (default 12), nnlshp (default 3): documents per pack at most."),
        click.option("--work-limit", type=click.IntRange(0), default=None,
                     help="optimal: pricing work budget in DP cells (default 4e9, ~4 s at "
                          "L=4096); the result is reproducible."),
        click.option("--time-limit", type=click.FloatRange(0), default=None,
                     help="optimal: also stop after this many seconds (the result may then "
                          "differ between runs; the index records that)."),
    )):
        fn = opt(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="packtool")
def cli():
    """Turn raw text corpora into packed, padding-free LLM training data.

    \b
    Example:
        packtool tokenize data/ --tokenizer model/ --eos '<|eos|>' --out out/corpus
        packtool pack out/corpus --seq-len 4096 --algo bfd --out out/packed
        packtool verify out/packed --source out/corpus
        packtool stats out/corpus --algos all
    """


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--tokenizer", "-t", required=True,
              help="A tokenizer.json, or a model folder holding one.")
@click.option("--out", "-o", required=True,
              help="Output prefix: writes PREFIX.bin, .boundaries, .json (folders are made).")
@click.option("--text-field", default="text", show_default=True,
              help="JSON key / Parquet column with the text; dots reach nested keys (meta.body).")
@click.option("--txt-split", type=click.Choice(["file", "line", "blank-line"]), default="file",
              show_default=True, help="How .txt files divide into documents.")
@click.option("--bos", default=None, help="Special token to prepend to every document, e.g. '<s>'.")
@click.option("--eos", default=None, help="Special token to append to every document, e.g. '</s>'.")
@click.option("--special-tokens", is_flag=True,
              help="Apply the tokenizer's own post-processor template (off by default).")
@click.option("--skip-bad-records", is_flag=True,
              help="Skip (and count) records with invalid JSON/UTF-8 or a missing text field.")
@click.option("--max-record-bytes", type=click.IntRange(1), default=None,
              help="Largest record in bytes (default 64 MiB); a larger one is a bad record. "
                   "Tokenizing a record takes ~120x its size in memory.")
@click.option("--prompt-field", default=None,
              help="SFT: key of the prompt (loss is not taken on it).")
@click.option("--completion-field", default=None, help="SFT: key of the completion (loss on it).")
@click.option("--messages-field", default=None,
              help="Chat: key of a [{role, content}, ...] list, rendered with the chat template.")
@click.option("--chat-template", type=click.Path(dir_okay=False), default=None,
              help="Jinja chat template file (default: tokenizer_config.json's, else built-in).")
@click.option("--train-on", type=click.Choice(["assistant", "all"]), default="assistant",
              show_default=True, help="Chat: which tokens the loss mask keeps.")
@click.option("--max-render-chars", type=click.IntRange(1), default=1 << 25, show_default=True,
              help="Chat: refuse a conversation whose template rendering exceeds this size.")
@click.option("--render-timeout", type=click.FloatRange(0, min_open=True), default=10.0,
              show_default=True, help="Chat: seconds one template rendering may take.")
@click.option("--workers", "-j", type=click.IntRange(0), default=0, show_default=True,
              help="Tokenizer threads (0 = all cores). Output is identical for any value.")
@click.option("--batch-size", type=click.IntRange(1), default=1024, show_default=True,
              help="Documents per tokenizer batch.")
@click.option("--engine", type=click.Choice(["auto", "hf", "gigatoken", "fastokens", "tokie"]),
              default="auto",
              show_default=True,
              help="Tokenizer engine: hf = the tokenizers library (the reference); auto = the "
                   "fastest installed engine for the tokenizer's family that matches it "
                   "(pip install 'packtool[fast]').")
@click.option("--engine-check", type=click.Choice(["sample", "full", "off"]), default="sample",
              show_default=True,
              help="Compare a fast engine with the reference on a sample of documents, on all "
                   "of them, or not at all (a load-time probe always runs).")
@scale_options
@click.option("--ray-cpus", type=click.IntRange(1), default=1, show_default=True,
              help="--executor ray: CPUs (tokenizer threads) per part's task.")
@click.option("--part-bytes", type=click.IntRange(1), default=None,
              help="Group consecutive small input files into parts of up to this many bytes "
                   "(default: one part per file; a file is never split).")
@click.option("--plan", "show_plan", is_flag=True,
              help="Print the plan (parts, their inputs, bytes) and exit without running it.")
@overwrite_option
@quiet_option
@json_option
def tokenize(inputs, tokenizer, out, text_field, txt_split, bos, eos, special_tokens,
             skip_bad_records, max_record_bytes, prompt_field, completion_field, messages_field,
             chat_template, train_on, max_render_chars, render_timeout, workers, batch_size,
             engine, engine_check, executor, ray_address, tasks, task, finalize, ray_cpus,
             part_bytes, show_plan, overwrite, quiet, as_json):
    """Tokenize JSONL (.jsonl, .jsonl.gz, .jsonl.zst), Parquet, Arrow and .txt INPUTS.

    INPUTS are files, directories (every supported file inside, sorted) or globs. Every
    record becomes one document, in input order, with its full token sequence. With
    --prompt-field/--completion-field or --messages-field it also writes PREFIX.mask (1 =
    trained on) for supervised fine-tuning.

    The inputs are planned into parts (one per file; --plan prints them), each written and
    verified on its own: a re-run skips finished parts (resume), and --executor ray or
    --tasks N --task K + --finalize spread them over machines (docs/SCALE.md).

    \b
    Example:
        packtool tokenize corpus/*.jsonl.zst --tokenizer gpt2/tokenizer.json \\
            --eos '<|endoftext|>' --out out/corpus
        packtool tokenize chats.jsonl --messages-field messages --tokenizer model/ --out out/sft
        packtool tokenize shards/ -t tok.json -o out/c --tasks 4 --task $SLURM_ARRAY_TASK_ID
        packtool tokenize shards/ -t tok.json -o out/c --finalize
    """
    from .tokenize import TokenizeOptions, tokenize_files

    opts = TokenizeOptions(text_field=text_field, txt_split=txt_split,
                           skip_bad_records=skip_bad_records,
                           bos=bos, eos=eos, special_tokens=special_tokens, workers=workers,
                           batch_size=batch_size, overwrite=overwrite, prompt_field=prompt_field,
                           completion_field=completion_field, messages_field=messages_field,
                           chat_template=chat_template, train_on=train_on,
                           max_render_chars=max_render_chars, render_timeout=render_timeout,
                           engine=engine, engine_check=engine_check)
    if max_record_bytes is not None:
        opts.max_record_bytes = max_record_bytes
    if show_plan:
        from .scale import plan_tokenize

        plan = _run(plan_tokenize, list(inputs), tokenizer, out, opts, part_bytes)
        click.echo(json.dumps(plan.to_json(), indent=1) if as_json else plan.summary())
        return
    from .plan import RunOptions

    run = RunOptions(executor, ray_address, ray_cpus, tasks=tasks, task=task, finalize=finalize)
    result = _run(tokenize_files, list(inputs), tokenizer, out, opts, progress=not quiet,
                  run=run, part_bytes=part_bytes)
    _emit(result, as_json, quiet)
    if quiet or as_json:  # the summary, when printed, carries them
        for w in result.warnings:
            click.echo(f"warning: {w}", err=True)


@cli.command()
@click.argument("prefixes", nargs=-1, required=True)
@seq_len_option()
@algo_option()
@click.option("--out", "-o", required=True, help="Output directory (must not exist or be empty).")
@overflow_option
@seed_option
@click.option("--no-shuffle", is_flag=True,
              help="Keep the algorithm's pack order (FFD/BFD: longest first).")
@click.option("--shard-size", type=click.IntRange(1), default=1 << 27, show_default=True,
              help="Tokens per shard (about).")
@click.option("--valid-docs", type=click.IntRange(1), default=None,
              help="Hold out this many whole documents (seeded, per source in proportion) and "
                   "pack them into OUT/valid.")
@click.option("--valid-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None, help="Hold out this fraction of each source's documents instead.")
@click.option("--group-docs", type=click.IntRange(1), default=None,
              help="Pack consecutive groups of this many documents independently (bounds "
                   "the packer's memory and time at 1e9 documents; docs/SCALE.md: its cost).")
@packer_options
@scale_options
@overwrite_option
@quiet_option
@json_option
def pack(prefixes, seq_len, algo, out, overflow, seed, no_shuffle, shard_size, valid_docs,
         valid_fraction, group_docs, max_depth, work_limit, time_limit, executor, ray_address,
         tasks, task, finalize, overwrite, quiet, as_json):
    """Pack tokenized PREFIXES (packed together as one corpus) into packs of --seq-len tokens.

    A prefix may carry a repeat factor, PREFIX:FACTOR: 2.0 uses every document twice, 0.5 a
    seeded half; copies of a document never share a pack. Writes shards of .npy arrays
    (tokens, position_ids, doc_ids, cu_seqlens, source documents and offsets) and an
    index.json; see docs/FORMAT.md. The sources' checksums are verified before anything is
    written.

    \b
    Example:
        packtool pack out/corpus --seq-len 4096 --algo bfd --out out/packed
        packtool pack out/web:2.0 out/books:0.5 out/code -L 4096 --valid-docs 1000 -o out/mix
        packtool pack out/corpus -L 4096 -o out/packed --tasks 8 --task $SLURM_ARRAY_TASK_ID
        packtool pack out/corpus -L 4096 -o out/packed --finalize
    """
    from .pack import pack as run_pack
    from .plan import PackOptions, RunOptions

    opts = PackOptions(seq_len, algo, overflow, seed, not no_shuffle, shard_size,
                       max_depth=max_depth, work_limit=work_limit, time_limit=time_limit,
                       valid_docs=valid_docs, valid_fraction=valid_fraction,
                       group_docs=group_docs)
    run = RunOptions(executor, ray_address, tasks=tasks, task=task, finalize=finalize)
    _emit(_run(run_pack, list(prefixes), out, opts, overwrite=overwrite, progress=not quiet,
               run=run), as_json, quiet)


@cli.command()
@click.argument("path")
@click.option("--source", "-s", "sources", multiple=True,
              help="Token-file prefix the dataset was packed from (repeat, in order): also check "
                   "that every source token appears exactly as the overflow policy says.")
@json_option
def verify(path, sources, as_json):
    """Check a packed directory (checksums, shapes, every invariant, optionally the sources)
    or a token-corpus PREFIX (manifest, sizes, boundaries, checksums).

    Exit 0 with one OK line, or 1 naming the first violation.

    \b
    Example:
        packtool verify out/packed --source out/corpus
        packtool verify out/corpus
    """
    from .verify import verify as run_verify

    _emit(_run(run_verify, path, list(sources)), as_json, False, out="stdout")


@cli.command()
@click.argument("paths", nargs=-1)
@click.option("--lengths", "lengths_file", type=click.Path(dir_okay=False),
              help="Report on lengths alone: a .npy of document lengths or a length,count CSV.")
@seq_len_option(multiple=True)
@click.option("--batch-size", "-b", type=click.IntRange(1), default=8, show_default=True,
              help="Batch size for the dynamic-padding figures.")
@click.option("--algos", default=None, help="'all' or a comma list of packers to compare.")
@overflow_option
@packer_options
@seed_option
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG: length histogram and padding waste per seq_len.")
@json_option
def stats(paths, lengths_file, seq_lens, batch_size, algos, overflow, max_depth, work_limit,
          time_limit, seed, plot_path, as_json):
    """Padding waste, what packing saves and how each packer does.

    PATHS are token-file prefixes (one corpus), or one packed directory; or pass
    --lengths FILE instead. Documents longer than a seq_len are counted as --overflow
    makes them, the same as pack, so predicted packs are the packs pack writes.

    \b
    Example:
        packtool stats out/corpus --seq-len 2048 --algos all
        packtool stats --lengths lengths.csv -L 512 --algos bfd,spfhp --json
        packtool stats out/packed
    """
    from . import stats as st

    result = _run(st.stats, list(paths), lengths_file, seq_lens, batch_size, algos, seed=seed,
                  overflow=overflow, max_depth=max_depth, work_limit=work_limit,
                  time_limit=time_limit)
    if plot_path:
        if result.lengths is None:
            raise click.ClickException("--plot draws a corpus report; pass token files or "
                                       "--lengths")
        _run(st.plot_corpus, result.report, result.lengths, plot_path)
    _emit(result, as_json, False, out="stdout")


@cli.command()
@click.argument("src")
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS), default="parquet",
              show_default=True,
              help="Target format; docs/EXPORT.md says which trainer reads which.")
@click.option("--out", "-o", required=True,
              help="megatron: a prefix (writes OUT.bin, OUT.idx); parquet*: a .parquet file or "
                   "a directory; llmc, mds: a directory.")
@click.option("--shard-tokens", type=click.IntRange(1), default=None,
              help="llmc: tokens per shard (default 100,000,000, as llm.c's fineweb.py).")
@click.option("--eos-id", type=click.IntRange(0), default=None,
              help="llmc: end-of-text id written before each document, for corpora "
                   "tokenized without --eos (GPT-2: 50256).")
@click.option("--copy", "copy_bin", is_flag=True,
              help="megatron from a corpus: copy the .bin instead of hard-linking it.")
@overwrite_option
@quiet_option
@json_option
def export(src, fmt, out, shard_tokens, eos_id, copy_bin, overwrite, quiet, as_json):
    """Export SRC, a token-file prefix or a packed directory, in a trainer's native format.

    \b
    megatron        Megatron-LM/NeMo .bin/.idx    corpus or packed
    llmc            llm.c/nanoGPT uint16 shards   corpus
    mds             MosaicML Streaming            packed
    parquet         Hugging Face datasets         packed
    parquet-packed  Megatron-Bridge packed SFT    packed

    \b
    Example:
        packtool export out/corpus --format megatron --out out/mega/corpus
        packtool export out/corpus --format llmc --out out/llmc --shard-tokens 100000000
        packtool export out/packed --format mds --out out/mds
        packtool export out/packed --format parquet-packed --out out/packed.idx.parquet
    """
    from .export import export as run_export

    result = _run(run_export, src, fmt, out, overwrite=overwrite, progress=not quiet,
                  shard_tokens=shard_tokens, eos_id=eos_id, link=not copy_bin)
    _emit(result, as_json, quiet)


@cli.command()
@click.option("--fixtures", type=click.Path(file_okay=False), default=None,
              help="Folder with tokenizer/ and corpus/ (default: the repository's fixtures/).")
@click.option("--out", "-o", default="demo-out", show_default=True, help="Where to write.")
@seq_len_option(default=512, show_default=True)
@algo_option()
def demo(fixtures, out, seq_len, algo):
    """Run the whole job on the bundled corpus: tokenize, pack, verify, report.

    \b
    Example:
        packtool demo --out demo-out
    """
    from .demo import run_demo

    _run(run_demo, fixtures, out, seq_len, algo, echo=click.echo)


def main() -> None:
    """Run the CLI, then leave with ``os._exit`` once the library has removed its temporaries:
    a worker thread still inside a tokenizer call or a runaway template cannot hold the exit
    (the interpreter would join it), and a signal during interpreter shutdown cannot turn a
    finished run into a death by signal."""
    import os
    import signal

    from . import _signals

    _signals.install()  # before any heavy import: a signal during one is never lost
    code = 0
    try:
        cli.main(prog_name="packtool", standalone_mode=False)
        _signals.hold()
        _signals.check()
    except (click.exceptions.Abort, KeyboardInterrupt):
        _signals.hold()
        term = bool(_signals.received) and _signals.received[-1] == signal.SIGTERM
        what = "Terminated" if term else "Interrupted"
        if _signals.after_commit():  # past the point of no return: say so, do not claim less
            click.echo(f"{what} after the output was complete: it is in place.", err=True)
        else:
            click.echo(f"{what}: no output was written.", err=True)
        code = 143 if term else 130
    except click.ClickException as e:
        _signals.hold()
        e.show()
        code = e.exit_code
    except click.exceptions.Exit as e:
        _signals.hold()
        code = e.exit_code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
