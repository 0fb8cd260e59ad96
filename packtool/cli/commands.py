"""The commands: each parses its options into the library's option dataclasses, calls one
library function and prints its summary (or ``--json``)."""

from __future__ import annotations

import click

from ..executors import RunOptions
from ..export import FORMATS as EXPORT_FORMATS  # a plain tuple; imports nothing heavy
from ..formats._manifest import manifest_text
from ..options import PackOptions, TokenizeOptions
from .app import cli, emit, run
from .options import (
    build,
    fields,
    flat,
    json_option,
    overwrite_option,
    quiet_option,
    split_paths,
)

RUN_FIELDS = ("executor", "ray_address", "tasks", "task", "finalize")
TOKENIZE_FIELDS = ("text_field", "txt_split", "bos", "eos", "special_tokens",
                   "skip_bad_records", "max_record_bytes", "prompt_field", "completion_field",
                   "messages_field", "chosen_field", "rejected_field", "completions_field",
                   "rewards_field", "tree_field", "chat_template", "train_on", "max_render_chars",
                   "render_timeout", "workers", "batch_size", "engine", "engine_check",
                   "part_bytes", "overwrite", "vision", "images_field", "min_pixels",
                   "max_pixels", "image_check")
PACK_FIELDS = ("seq_len", "algo", "layout", "source_check", "overflow", "seed", "shuffle",
               "shard_size", "tokens", "valid_docs", "valid_fraction", "group_docs", "balance",
               "balance_ranks", "align", "cp", "tp", "sequence_parallel", "fp8", "pad_id",
               "max_docs", "max_images", "max_vision_tokens", "share_prompt", "share_prefix",
               "min_shared", "max_depth", "work_limit", "time_limit", "vsl")
PACKER_FIELDS = ("max_depth", "work_limit", "time_limit")
ALIGN_FIELDS = ("align", "cp", "tp", "sequence_parallel", "fp8", "max_docs")


def local(*paths) -> list:
    """The command's path arguments with ``file://`` URLs as the local paths they name
    (:func:`packtool.storage.local_path`; another host's is refused by name)."""
    from ..storage import local_path

    return run(lambda: [local_path(p) for p in paths])


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--tokenizer", "-t", required=True,
              help="A tokenizer.json, a SentencePiece .model, or a model folder holding one "
                   "(a local path or a URL: s3://, gs://, hf://).")
@click.option("--out", "-o", required=True,
              help="Output prefix: writes PREFIX.json and its parts' .bin, .boundaries "
                   "(folders are made); a URL (s3://bucket/corpus) publishes each part to the "
                   "store, PREFIX.json last.")
@fields(TokenizeOptions, *TOKENIZE_FIELDS)
@fields(RunOptions, *RUN_FIELDS, "ray_cpus")
@click.option("--plan", "show_plan", is_flag=True,
              help="Print the plan (parts, their inputs, bytes) and exit without running it.")
@quiet_option
@json_option
def tokenize(inputs, tokenizer, out, show_plan, quiet, as_json, **kw):
    """Tokenize JSONL (.jsonl, .jsonl.gz, .jsonl.zst), Parquet, Arrow and .txt INPUTS.

    INPUTS are files, directories (every supported file inside, sorted) or globs, local or
    URLs (s3://bucket/raw/, gs://b/*.parquet; docs/STORAGE.md). Every
    record becomes one document, in input order, with its full token sequence. With
    --prompt-field/--completion-field or --messages-field it also writes a loss mask (1 =
    trained on) for supervised fine-tuning. With --chosen-field/--rejected-field (preference
    pairs) or --completions-field (groups, GRPO) every record becomes a group of sequences,
    prompt + each completion, the loss mask on the completions (docs/TRAINING.md). With
    --vision RULE records hold images (chat image parts, or <image> placeholders with
    --images-field): each becomes the model's image tokens, as many as its processor makes
    of the image's size, read from its header (docs/FORMAT.md, version 5).

    The inputs are planned into parts (small files grouped up to --part-bytes; --plan prints
    them), each written and verified on its own: a re-run skips finished parts (resume), and
    --executor ray or --tasks N --task K + --finalize spread them over machines
    (docs/SCALE.md).

    \b
    Example:
        packtool tokenize corpus/*.jsonl.zst --tokenizer gpt2/tokenizer.json \\
            --eos '<|endoftext|>' --out out/corpus
        packtool tokenize chats.jsonl --messages-field messages --tokenizer model/ --out out/sft
      packtool tokenize prefs.jsonl --prompt-field prompt --chosen-field chosen \
          --rejected-field rejected -t model/ --eos '</s>' -o out/pairs
        packtool tokenize vqa.jsonl --prompt-field q --completion-field a \\
            --vision qwen2.5-vl --images-field images -t Qwen2.5-VL-7B/ -o out/vlm
        packtool tokenize shards/ -t tok.json -o out/c --tasks 4 --task $SLURM_ARRAY_TASK_ID
        packtool tokenize shards/ -t tok.json -o out/c --finalize
    """
    from ..tokenize import plan_tokenize, tokenize_files

    opts = build(TokenizeOptions, kw)
    runopts = build(RunOptions, kw)
    tokenizer, out, *inputs = local(tokenizer, out, *inputs)
    if show_plan:
        plan = run(plan_tokenize, list(inputs), tokenizer, out, opts)
        click.echo(manifest_text(plan.to_json()).rstrip("\n") if as_json else plan.summary())
        return
    result = run(tokenize_files, list(inputs), tokenizer, out, opts, progress=not quiet,
                 run=runopts)
    emit(result, as_json, quiet)


@cli.command()
@click.argument("prefixes", nargs=-1, required=True)
@click.option("--out", "-o", required=True,
              help="Output directory (must not exist or be empty), or a URL (s3://bucket/packed: "
                   "each shard published, index.json last).")
@fields(PackOptions, *PACK_FIELDS,
        seq_len={"required": False, "help": "Tokens per pack (required, except with --vsl: "
                 "then MAX)."})
@fields(RunOptions, *RUN_FIELDS)
@overwrite_option
@quiet_option
@json_option
def pack(prefixes, out, overwrite, quiet, as_json, **kw):
    """Pack tokenized PREFIXES (packed together as one corpus) into packs of --seq-len tokens.

    A prefix may carry a repeat factor, PREFIX:FACTOR (0 to 1,000): 2.0 uses every document
    twice, 0.5 a seeded half; copies of a document never share a pack. Or every prefix a
    target share of the packed tokens, PREFIX=SHARE (normalised; not mixed with factors): the
    factors are worked out, for --tokens N in all or for as many tokens as the scarcest
    source gives (none repeated), and the summary shows each share reached beside its target.
    An empty training set is refused, and so is a source that would add nothing to it (its
    factor selects no document, or it has none) unless given as PREFIX:0 (held-out documents
    only). Writes index.json and shards of each pack's segments (source document, offset,
    length); with --layout tokens the packs' tokens too. See docs/FORMAT.md. The sources'
    checksums are verified before the dataset is committed.

    \b
    Example:
        packtool pack out/corpus --seq-len 4096 --algo bfd --out out/packed
        packtool pack out/web:2.0 out/books:0.5 out/code -L 4096 --valid-docs 1000 -o out/mix
        packtool pack out/web=0.7 out/code=0.3 -L 4096 --tokens 2000000000 -o out/mix
        packtool pack out/corpus -L 4096 -o out/packed --tasks 8 --task $SLURM_ARRAY_TASK_ID
        packtool pack out/corpus -L 4096 -o out/packed --finalize
        packtool pack out/corpus -L 8192 --cp 8 --fp8 --max-docs 64 -o out/thd
        packtool pack out/corpus --vsl 256:8192 -o out/vsl
    """
    from ..pack import pack as run_pack

    opts = build(PackOptions, kw)
    runopts = build(RunOptions, kw)
    out, *prefixes = local(out, *prefixes)
    result = run(run_pack, list(prefixes), out, opts, overwrite=overwrite, progress=not quiet,
                 run=runopts)
    emit(result, as_json, quiet)


@cli.command(context_settings={"allow_extra_args": True})
@click.argument("path")
@click.option("--source", "-s", "sources", multiple=True,
              help="Token-file prefixes (or URLs) the dataset was packed from, in order: "
                   "--source a,b or --source a --source b; also check that every source token "
                   "appears exactly as the overflow policy says.")
@json_option
@click.pass_context
def verify(ctx, path, sources, as_json):
    """Check a packed directory (checksums, shapes, every invariant, optionally the sources)
    or a token-corpus PREFIX (manifest, sizes, boundaries, checksums); either may be a URL.

    Exit 0 with one OK line, or 1 naming the first violation.

    \b
    Example:
        packtool verify out/packed --source out/corpus
        packtool verify out/corpus
    """
    from ..verify import verify as run_verify

    if ctx.args:  # `verify P --source a b`: b is not a second source, say how to give it
        raise click.UsageError(
            f"verify checks one PATH ({path}) but got {' '.join(ctx.args)} too"
            + ("; give several sources as --source a,b or --source a --source b" if sources
               else ""))
    path, *sources = local(path, *split_paths(sources, "--source"))
    emit(run(run_verify, path, sources), as_json, False)


@cli.command()
@click.argument("paths", nargs=-1)
@click.option("--lengths", "lengths_file", type=click.Path(dir_okay=False),
              help="Report on lengths alone: a local .npy of document lengths or a "
                   "length,count CSV (a small file: copy it here from a store).")
@fields(PackOptions, "seq_len", "overflow", *PACKER_FIELDS, *ALIGN_FIELDS, "seed", "vsl",
        "share_prompt", "share_prefix", "min_shared",
        vsl={"help": "Also predict the rows pack --vsl MIN:MAX writes: rows per length, "
             "remnant rows and their share of the tokens."},
        seq_len={"required": False, "multiple": True, "type": ("ints", 1, 2**31 - 1),
                 "help": "Sequence lengths to evaluate: -L 512,2048 or -L 512 -L 2048 "
                 "(default 512 1024 2048 4096 8192)."})
@click.option("--batch-size", "-b", type=click.IntRange(1), default=8, show_default=True,
              help="Batch size for the dynamic-padding figures.")
@click.option("--algos", default=None, help="'all' or a comma list of packers to compare.")
@click.option("--step-plan", "step_plan", metavar="WORLD:MAX_TOKENS[:SEQS]",
              help="Also plan the lengths as training steps (packtool.plan_step): WORLD "
                   "ranks, micro-batches of MAX_TOKENS tokens, SEQS sequences a step (default "
                   "all): micro-batches per rank and max/mean rank cost and tokens.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG here (a local file: a picture to look at, not a dataset): "
                   "length histogram and padding waste per seq_len.")
@json_option
def stats(paths, lengths_file, batch_size, algos, plot_path, as_json, seq_len, step_plan,
          **kw):
    """Padding waste, what packing saves and how each packer does.

    PATHS are token-file prefixes (one corpus), or one packed directory, local or URLs; or pass
    --lengths FILE instead. Documents longer than a seq_len are counted as --overflow
    makes them, the same as pack, so predicted packs are the packs pack writes.

    \b
    Example:
        packtool stats out/corpus --seq-len 2048 --algos all
        packtool stats out/corpus -L 4096 --align 16 --max-docs 8
        packtool stats out/corpus --vsl 256:8192
        packtool stats --lengths lengths.csv -L 512 --algos bfd,spfhp --json
        packtool stats --lengths lengths.npy --step-plan 64:16384:8192
        packtool stats out/packed
    """
    from .. import stats as st

    result = run(st.stats, local(*paths), lengths_file, flat(seq_len), batch_size, algos,
                 progress=True, step_plan=step_plan, **kw)
    if plot_path:
        if result.lengths is None:
            raise click.ClickException("--plot draws a corpus report; pass token files or "
                                       "--lengths")
        run(st.plot_corpus, result.report, result.lengths, plot_path)
    emit(result, as_json, False)


@cli.command()
@click.argument("src")
@click.option("--format", "fmt", type=click.Choice(EXPORT_FORMATS), default="parquet",
              show_default=True,
              help="Target format; docs/EXPORT.md says which trainer reads which.")
@click.option("--out", "-o", required=True,
              help="megatron: a prefix (writes OUT.bin, OUT.idx); parquet*: a .parquet file or "
                   "a directory; llmc, mds: a directory. A URL publishes the export there, "
                   "its marker last.")
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
    """Export SRC, a token-file prefix or a packed directory (local or a URL), in a trainer's
    native format.

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
    from ..export import export as run_export

    src, out = local(src, out)
    result = run(run_export, src, fmt, out, overwrite=overwrite, progress=not quiet,
                 shard_tokens=shard_tokens, eos_id=eos_id, link=not copy_bin)
    emit(result, as_json, quiet)


@cli.command()
@click.option("--fixtures", type=click.Path(file_okay=False), default=None,
              help="Local folder with tokenizer/ and corpus/ (default: the repository's "
                   "fixtures/; the demo runs on this machine).")
@click.option("--out", "-o", default="demo-out", show_default=True, help="Where to write.")
@fields(PackOptions, "seq_len", "algo",
        seq_len={"required": False, "help": "Tokens per pack (default 512)."})
def demo(fixtures, out, seq_len, algo):
    """Run the whole job on the bundled corpus: tokenize, pack, verify, report.

    \b
    Example:
        packtool demo --out demo-out
    """
    from .demo import run_demo

    run(run_demo, fixtures, out, seq_len or 512, algo, echo=click.echo)


@cli.command()
@click.option("--arch", "archs", default=None, metavar="TYPES",
              help="Model types to check, comma-separated (transformers' model_type: llama, "
                   "gpt2, mistral, ...), or 'all' (default, unless --config is given: llama, "
                   "gpt2, mistral, qwen2, gemma2, mixtral, qwen2_moe, qwen3_next, "
                   "granitemoehybrid, and the vision-language qwen2_vl, qwen2_5_vl, qwen3_vl).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Also check the model of this config.json (a local file), shrunk to tiny "
                   "sizes keeping its layer types, sliding window, experts and state-space "
                   "settings.")
@json_option
def conformance(archs, config_path, as_json):
    """Check that a model sees packed rows exactly as each document alone, before training.

    Builds a tiny random model of each architecture on CPU (no download), packs documents of
    several lengths into one row and compares its logits with each document run alone, through
    every input path: position ids only, the flash-attention kwargs (cu_seq_lens_q/k, through
    packtool's reference varlen attention), a FlexAttention block mask, seq_idx (state-space
    and linear-attention models), and a control that must leak. Vision-language models
    (qwen2_vl, qwen2_5_vl, qwen3_vl) pack documents of 1-3 generated images each, with mRoPE
    position ids restarting per document, and add a 4-D mask path. Prints the largest |logit
    difference| per path and a verdict, exact (<= 1e-4; 1e-5 with images), leaks or
    unsupported; exits 1 when an architecture has no exact path. Needs torch and
    transformers (docs/TRAINING.md).

    \b
    Example:
        packtool conformance --arch llama,gpt2,mistral
        packtool conformance --arch qwen2_vl,qwen2_5_vl,qwen3_vl
        packtool conformance --config my-model/config.json --json
    """
    from ..train import conformance as cf

    names = run(cf.parse_archs, archs) if archs is not None else None
    result = run(cf.conformance, names, config_path)
    # the verdict: on stdout when all pass, else the error line (stderr, exit 1)
    click.echo(manifest_text(result.to_json()).rstrip("\n") if as_json
               else result.summary(verdict=result.ok))
    if not result.ok:
        raise click.ClickException(result.verdict_line())
