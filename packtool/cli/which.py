"""``packtool which``: a step's source documents, or where a record went, for one packed
dataset (PackSampler) or a mixture of several (MixtureSampler)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from ..errors import PacktoolError
from .app import cli, emit, run
from .commands import local
from .options import json_option


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--epoch", type=click.IntRange(0), default=0, show_default=True)
@click.option("--step", type=click.IntRange(0), default=None,
              help="The step whose source documents to name.")
@click.option("--rank", type=click.IntRange(0), default=None, help="Only this rank's packs.")
@click.option("--record", default=None,
              help="FILE:RECORD instead: where this input record (1-based line or row) went.")
@click.option("--world-size", type=click.IntRange(1), default=1, show_default=True,
              help="The sampler's world size.")
@click.option("--batch-size", type=click.IntRange(1), default=1, show_default=True,
              help="The sampler's packs per rank per step.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="The sampler's seed.")
@click.option("--balance", type=click.Choice(["none", "attention"]), default="none",
              show_default=True, help="The sampler's balance.")
@click.option("--drop-last/--no-drop-last", default=True, show_default=True,
              help="The sampler's drop_last (PackSampler's default: leave out the epoch's last "
                   "packs that fill no whole step; --no-drop-last fills it with the first).")
@click.option("--tokens-per-step", type=click.IntRange(1), default=None,
              help="The token-budget sampler's T: each step takes T / L rows of one slot length "
                   "L (PackSampler(..., tokens_per_step=T); no --batch-size).")
@click.option("--curriculum", type=click.Choice(["uniform", "grow-p2"]), default="uniform",
              show_default=True, help="The token-budget sampler's curriculum.")
@click.option("--schedule", default=None, metavar="JSON|FILE",
              help="A mixture (PATHS given as NAME=DIR): MixtureSampler's schedule, weights "
                   "('{\"web\": 0.7, \"code\": 0.3}') or [step, weights] points, inline or "
                   "in a file.")
@click.option("--exhausted", type=click.Choice(["next_epoch", "stop"]), default="next_epoch",
              show_default=True, help="A mixture's exhausted setting.")
@json_option
def which(paths, epoch, step, rank, record, world_size, batch_size, seed, balance, drop_last,
          tokens_per_step, curriculum, schedule, exhausted, as_json):
    """Name the source documents of a training step, or where an input record went.

    PATHS is a packed directory or its URL, or for a MixtureSampler's run every source as
    NAME=DIR with --schedule. From the segment tables and the sources'
    manifests alone (no token is read): source
    prefix, input file, record number (line or row) and token range of every segment of the
    step's packs, as PackSampler (or MixtureSampler) schedules them with the same settings.

    \b
    Example:
        packtool which out/packed --epoch 0 --step 1200 --world-size 8 --batch-size 4
        packtool which out/packed --record data/part-3.jsonl:1042
        packtool which out/vsl --step 40 --world-size 8 --tokens-per-step 524288
        packtool which web=out/web code=out/code --schedule '{"web": 0.7, "code": 0.3}' \\
            --step 1200 --world-size 8 --batch-size 4
    """
    if (step is None) == (record is None):
        raise click.UsageError("give --step (and --epoch) or --record FILE:RECORD")
    from ..train.which import which_record, which_step

    settings = dict(world_size=world_size, batch_size=batch_size, seed=seed)
    if schedule is not None or len(paths) > 1:  # a mixture: one sampler, another rule
        if schedule is None:
            raise click.UsageError("several PATHS are a mixture: give its --schedule (the "
                                   "weights MixtureSampler ran with) and every source as NAME=DIR")
        if balance != "none" or not drop_last or tokens_per_step is not None:
            raise click.UsageError("--balance, --no-drop-last and --tokens-per-step are "
                                   "PackSampler's settings; a MixtureSampler has none of them")
        if step is not None and epoch:
            raise click.UsageError("a mixture's --step counts from the run's start (sources "
                                   "start their epochs at different steps): drop --epoch")
        named = run(parse_sources, paths)
        path = dict(zip(named, local(*named.values()), strict=True))
        settings.update(exhausted=exhausted, schedule=run(parse_schedule, schedule))
    else:
        (path,) = local(*paths)
        settings.update(balance=None if balance == "none" else balance, drop_last=drop_last,
                        tokens_per_step=tokens_per_step, curriculum=curriculum)
    if record is not None:
        result = run(which_record, path, record, epoch, **settings)
    else:
        result = run(which_step, path, epoch, step, rank, **settings)
    emit(result, as_json, False)


NAME = re.compile(r"[A-Za-z0-9_.-]+")


def parse_sources(paths: list[str]) -> dict[str, str]:
    """``NAME=DIR`` arguments as {name: directory}; a name twice or a bare DIR among named
    ones is refused by name."""
    out: dict[str, str] = {}
    for arg in paths:
        name, sep, path = str(arg).partition("=")
        if not sep or not NAME.fullmatch(name) or not path:
            raise PacktoolError(f"{arg!r}: a mixture names every source as NAME=DIR (the names "
                                "the schedule uses: web=packed/web code=packed/code)")
        if name in out:
            raise PacktoolError(f"source {name!r} is given twice ({out[name]} and {path}); "
                                "give each source once")
        out[name] = path
    return out


def parse_schedule(text: str):
    """The ``--schedule`` value: inline JSON, or a file holding it."""
    raw = str(text)
    if not raw.lstrip().startswith(("{", "[")):
        try:
            raw = Path(raw).read_text(encoding="utf-8")
        except OSError as e:
            raise PacktoolError(f"--schedule {text}: not inline JSON and not a readable file "
                                f"({e.strerror or e})") from None
    try:
        return json.loads(raw)  # a point may be a JSON list: check_schedule takes [step, w]
    except ValueError as e:
        raise PacktoolError(f"--schedule {text}: not valid JSON ({e}); give an object of "
                            'weights ({"web": 0.7, "code": 0.3}) or a list of [step, weights] '
                            "points") from None
