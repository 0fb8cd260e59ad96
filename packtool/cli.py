"""The ``packtool`` command: a thin click layer over the library.

Each command parses options, calls one library function and prints its summary; every
:class:`PacktoolError` becomes ``Error: <message>`` and exit code 1. Ctrl-C and SIGTERM
exit 130/143 after the library has removed its temporary files.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from . import __version__
from .errors import PacktoolError
from .export import FORMATS as EXPORT_FORMATS  # a plain tuple; imports nothing heavy


def _run(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except PacktoolError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # disk full, permissions, read-only file systems...
        where = f" {e.filename}" if e.filename else ""
        raise click.ClickException(f"cannot read or write{where}: {e.strerror or e}") from None


def _emit(result, as_json: bool, quiet: bool) -> None:
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1))
    elif not quiet:
        click.echo(result.summary(), err=True)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that temporary files are removed on the way out."""


_TERMINATED = []


def _on_sigterm(signum, frame):
    _TERMINATED.append(signum)  # click turns the exception into Abort: remember why
    raise _Terminated()


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
@click.option("--tokenizer", "-t", required=True, help="A tokenizer.json, or a model folder holding one.")
@click.option("--out", "-o", required=True, help="Output prefix: writes PREFIX.bin, .boundaries, .json.")
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
@click.option("--prompt-field", default=None, help="SFT: key of the prompt (loss is not taken on it).")
@click.option("--completion-field", default=None, help="SFT: key of the completion (loss on it).")
@click.option("--messages-field", default=None,
              help="Chat: key of a [{role, content}, ...] list, rendered with the chat template.")
@click.option("--chat-template", type=click.Path(dir_okay=False), default=None,
              help="Jinja chat template file (default: tokenizer_config.json's, else built-in).")
@click.option("--train-on", type=click.Choice(["assistant", "all"]), default="assistant",
              show_default=True, help="Chat: which tokens the loss mask keeps.")
@click.option("--workers", "-j", type=click.IntRange(0), default=0, show_default=True,
              help="Tokenizer threads (0 = all cores). Output is identical for any value.")
@click.option("--batch-size", type=click.IntRange(1), default=1024, show_default=True,
              help="Documents per tokenizer batch.")
@click.option("--overwrite", is_flag=True, help="Replace existing output files.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def tokenize(inputs, tokenizer, out, text_field, txt_split, bos, eos, special_tokens,
             skip_bad_records, prompt_field, completion_field, messages_field, chat_template,
             train_on, workers, batch_size, overwrite, quiet, as_json):
    """Tokenize JSONL (.jsonl, .jsonl.gz, .jsonl.zst), Parquet and .txt INPUTS into token files.

    INPUTS are files, directories (every supported file inside, sorted) or globs. Every
    record becomes one document, in input order, with its full token sequence. With
    --prompt-field/--completion-field or --messages-field it also writes PREFIX.mask (1 =
    trained on) for supervised fine-tuning.

    \b
    Example:
        packtool tokenize corpus/*.jsonl.zst --tokenizer gpt2/tokenizer.json \\
            --eos '<|endoftext|>' --out out/corpus
        packtool tokenize chats.jsonl --messages-field messages --tokenizer model/ --out out/sft
    """
    from .tokenize import TokenizeOptions, tokenize_files

    opts = TokenizeOptions(text_field=text_field, txt_split=txt_split, skip_bad_records=skip_bad_records,
                           bos=bos, eos=eos, special_tokens=special_tokens, workers=workers,
                           batch_size=batch_size, overwrite=overwrite, prompt_field=prompt_field,
                           completion_field=completion_field, messages_field=messages_field,
                           chat_template=chat_template, train_on=train_on)
    result = _run(tokenize_files, list(inputs), tokenizer, out, opts, progress=not quiet)
    _emit(result, as_json, quiet)


def _algo_choices():
    from .packers import PACKERS

    return list(PACKERS)


@cli.command()
@click.argument("prefixes", nargs=-1, required=True)
@click.option("--seq-len", "-L", type=click.IntRange(1), required=True, help="Tokens per pack.")
@click.option("--algo", "-a", type=click.Choice(_algo_choices()), default="bfd", show_default=True,
              help="Packing algorithm.")
@click.option("--out", "-o", required=True, help="Output directory (must not exist or be empty).")
@click.option("--overflow", type=click.Choice(["split", "truncate", "drop"]), default="split",
              show_default=True, help="What to do with documents longer than --seq-len.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for shuffling and random packers.")
@click.option("--no-shuffle", is_flag=True, help="Keep the algorithm's pack order (FFD/BFD: longest first).")
@click.option("--shard-size", type=click.IntRange(1), default=1 << 27, show_default=True,
              help="Tokens per shard (about).")
@click.option("--max-depth", type=click.IntRange(1), default=None,
              help="Documents per pack for spfhp (default 12) and nnlshp (default 3).")
@click.option("--time-limit", type=click.FloatRange(0), default=None,
              help="Seconds for the optimal packer's LP (default 5); then the best so far.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output directory.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def pack(prefixes, seq_len, algo, out, overflow, seed, no_shuffle, shard_size, max_depth,
         time_limit, overwrite, quiet, as_json):
    """Pack tokenized PREFIXES (packed together as one corpus) into packs of --seq-len tokens.

    Writes shards of .npy arrays (tokens, position_ids, doc_ids, cu_seqlens, source
    documents and offsets) and an index.json; see docs/FORMAT.md.

    \b
    Example:
        packtool pack out/corpus --seq-len 4096 --algo bfd --out out/packed
    """
    from .pack import pack_corpus

    result = _run(pack_corpus, list(prefixes), out, seq_len, algo, seed=seed, overflow=overflow,
                  shuffle=not no_shuffle, shard_size=shard_size, max_depth=max_depth,
                  time_limit=time_limit, overwrite=overwrite, progress=not quiet)
    _emit(result, as_json, quiet)


@cli.command()
@click.argument("directory")
@click.option("--source", "-s", "sources", multiple=True,
              help="Token-file prefix the dataset was packed from (repeat, in order): also check "
                   "that every source token appears exactly once, in order.")
def verify(directory, sources):
    """Check a packed DIRECTORY: checksums, shapes, every invariant, optionally the sources.

    Exit 0 with one OK line, or 1 naming the first violation.

    \b
    Example:
        packtool verify out/packed --source out/corpus
    """
    from .verify import verify_packed

    click.echo(_run(verify_packed, directory, list(sources)))


@cli.command()
@click.argument("paths", nargs=-1)
@click.option("--lengths", "lengths_file", type=click.Path(dir_okay=False),
              help="Report on lengths alone: a .npy of document lengths or a length,count CSV.")
@click.option("--seq-len", "-L", "seq_lens", type=click.IntRange(1), multiple=True,
              help="Sequence length to evaluate (repeat; default 512 1024 2048 4096 8192).")
@click.option("--batch-size", "-b", type=click.IntRange(1), default=8, show_default=True,
              help="Batch size for the dynamic-padding figures.")
@click.option("--algos", default=None, help="'all' or a comma list of packers to compare.")
@click.option("--max-depth", type=click.IntRange(1), default=None, help="For spfhp/nnlshp.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG: length histogram and padding waste per seq_len.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def stats(paths, lengths_file, seq_lens, batch_size, algos, max_depth, seed, plot_path, as_json):
    """Padding waste, what packing saves and how each packer does.

    PATHS are token-file prefixes (one corpus), or one packed directory; or pass
    --lengths FILE instead.

    \b
    Example:
        packtool stats out/corpus --seq-len 2048 --algos all
        packtool stats --lengths lengths.csv -L 512 --algos bfd,spfhp --json
        packtool stats out/packed
    """
    from . import stats as st

    def run():
        import numpy as np

        if paths and lengths_file:
            raise PacktoolError("give token-file prefixes / a packed directory, or --lengths, not both")
        if len(paths) == 1 and (Path(paths[0]) / "index.json").is_file():
            rep = st.packed_report(paths[0])
            return rep, None, st.render_packed(rep)
        if lengths_file:
            from .lengths import load_lengths

            lengths, source = load_lengths(lengths_file), lengths_file
        elif paths:
            from .pack import open_sources

            corpora = open_sources(list(paths))
            lengths = np.concatenate([c.lengths for c in corpora])
            source = ", ".join(paths)
        else:
            raise PacktoolError("nothing to report on: pass token-file prefixes, a packed directory or --lengths FILE")
        rep = st.corpus_report(lengths, seq_lens or st.DEFAULT_SEQ_LENS, batch_size,
                               st.parse_algos(algos), seed, {"max_depth": max_depth}, source)
        return rep, lengths, st.render_corpus(rep)

    rep, lengths, text = _run(run)
    if plot_path:
        if lengths is None:
            raise click.ClickException("--plot draws a corpus report; pass token files or --lengths")
        _run(st.plot_corpus, rep, lengths, plot_path)
    if as_json:
        click.echo(json.dumps(rep, indent=1))
    else:
        click.echo(text)


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
@click.option("--overwrite", is_flag=True, help="Replace a previous export at --out.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
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
@click.option("--seq-len", "-L", type=click.IntRange(1), default=512, show_default=True)
@click.option("--algo", "-a", type=click.Choice(_algo_choices()), default="bfd", show_default=True)
def demo(fixtures, out, seq_len, algo):
    """Run the whole job on the bundled corpus: tokenize, pack, verify, report.

    \b
    Example:
        packtool demo --out demo-out
    """
    from .demo import run_demo

    _run(run_demo, fixtures, out, seq_len, algo, echo=click.echo)


def main() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        cli.main(prog_name="packtool", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        if _TERMINATED:
            click.echo("Terminated: no output was written.", err=True)
            sys.exit(143)
        click.echo("Interrupted: no output was written.", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
