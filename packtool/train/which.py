"""``packtool which``: which source documents a training step saw, and where an input record
went, from the dataset's segment tables and the sources' manifests alone (no token is read,
no boundaries file is opened)::

    step S of epoch E (the sampler's schedule: world size, batch size, seed, balance)
      -> packs of each rank -> their segments (document, offset, length)
      -> source prefix, part, input file, record number (line or row), token range

    an input record (FILE:RECORD) -> its document -> the packs holding its segments
      -> the epoch's step and rank of each

A mixture (``packtool which web=DIR code=DIR --schedule ...``) is asked the same of the
MixtureSampler's steps, each row named by its source.

Documents are named by :mod:`.records`. Measured (scripts/bench_which.py): see
docs/TRAINING.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import PacktoolError
from ..formats.packed import open_packed
from ..formats.packed.batching import check_int
from .records import (  # noqa: F401  (record_number, document_of: also from here)
    Document,
    Sources,
    document_of,
    parse_record,
    record_number,
    rows_of,
)


@dataclass
class Segment:
    pack: int
    rank: int | None
    document: Document
    tokens: tuple[int, int]   # the segment's token range in the document [start, end)
    position: tuple[int, int]  # and in the pack's row (an aligned row: from its padded start)
    source: str | None = None  # a mixture's source name


@dataclass
class WhichResult:
    path: str
    question: str
    segments: list[Segment] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # reverse: where a record went

    def summary(self) -> str:
        lines = [f"{self.path}: {self.question}"]
        for s in self.segments:
            d = s.document
            where = (f"{d.input} {'record' if d.record else ''} {d.record or ''}".rstrip()
                     if d.input else f"part {d.part}")
            rank = f"rank {s.rank} " if s.rank is not None else ""
            rank += f"{s.source} row" if s.source is not None else "pack"
            lines.append(f"  {rank} {s.pack:,} tokens {s.position[0]}..{s.position[1]}: "
                         f"{d.source} document {d.doc:,} ({where}), tokens "
                         f"{s.tokens[0]:,}..{s.tokens[1]:,}")
        for st in self.steps:
            where = (f"step {st['step']} rank {st['rank']}" if st["step"] is not None else
                     "never taken (the mixture stops first, or gives its source weight 0)"
                     if "source" in st else "left out (drop_last, or fewer than a step of its "
                     "length left: no step of the epoch takes it)")
            what = f"{st['source']} row" if "source" in st else "pack"
            lines.append(f"  {what} {st['pack']:,} (tokens {st['tokens'][0]:,}..{st['tokens'][1]:,}"
                         f" of the document): epoch {st['epoch']} {where}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return asdict(self)


def open_sampler(path, epoch: int = 0, *, world_size: int = 1, batch_size: int = 1,
                 seed: int = 0, balance: str | None = None, drop_last: bool = True,
                 tokens_per_step: int | None = None, curriculum: str = "uniform",
                 schedule=None, exhausted: str = "next_epoch"):
    """(The sampler at rank 0 (every rank computes the same steps), {source name, or None for
    one dataset: the packed dataset}, the settings as shown). ``path``: one packed directory,
    or with ``schedule`` a mixture's {name: directory}. Refused: a step of more packs than
    the dataset holds (work would grow with the number typed: ``--world-size 2**62`` would
    deal 2**62 slots); the sampler's own refusals (a world size that does not divide T / L)."""
    from .mixture import MixtureSampler
    from .sampler import PackSampler

    for name, v, lo in (("epoch", epoch, 0), ("world-size", world_size, 1),
                        ("batch-size", batch_size, 1), ("seed", seed, 0)):
        check_int(f"--{name}", v, lo)
    if schedule is not None:
        data = {n: open_packed(p, checksums=False) for n, p in path.items()}
        return MixtureSampler(data, schedule, rank=0, world_size=world_size,
                              batch_size=batch_size, seed=seed, exhausted=exhausted), data, (
            f"world size {world_size} x batch size {batch_size}, seed {seed}, exhausted "
            f"{exhausted}")
    ds = open_packed(path, checksums=False)  # structure checked; no full read for a lookup
    if tokens_per_step is not None:
        if batch_size != 1 or not drop_last:
            raise PacktoolError("--batch-size and --no-drop-last do not apply with "
                                "--tokens-per-step (a step takes T / L rows of one length)")
        return PackSampler(ds, rank=0, world_size=world_size, seed=seed, balance=balance,
                           tokens_per_step=tokens_per_step, curriculum=curriculum), {None: ds}, (
            f"world size {world_size}, {tokens_per_step:,} tokens a step, curriculum "
            f"{curriculum}")
    _fits(len(ds), world_size, batch_size, drop_last)
    return PackSampler(ds, rank=0, world_size=world_size, batch_size=batch_size, seed=seed,
                       drop_last=bool(drop_last), balance=balance), {None: ds}, (
        f"world size {world_size} x batch size {batch_size} "
        + ("with drop_last" if drop_last else "without drop_last"))


def _fits(n: int, world_size: int, batch_size: int, drop_last: bool) -> None:
    g = world_size * batch_size
    if world_size > n:
        raise PacktoolError(
            f"world size {world_size:,} > {n:,} packs: every rank would get a pack of its own "
            "only with a pack per rank; "
            + ("with drop_last the sampler takes no step; " if drop_last else
               "without drop_last every step would hand most ranks repeats of the same packs; ")
            + f"give the world size the trainer runs (at most {n:,} for this dataset)")
    if g > n:
        raise PacktoolError(
            f"world size {world_size:,} x batch size {batch_size:,} = {g:,} packs a step > "
            f"{n:,} packs: "
            + ("with drop_last the sampler takes no step" if drop_last else
               "without drop_last the epoch's one step would repeat its packs to fill it")
            + f"; give the trainer's settings (a batch size of at most {n // world_size:,} at "
              f"world size {world_size:,})")


def _label(path, data: dict) -> str:
    return str(path) if None in data else " ".join(f"{n}={p}" for n, p in sorted(path.items()))


def _shown(shown: str, data: dict, settings: dict) -> str:
    """The settings as a question shows them (one dataset's: with its seed and balance)."""
    return shown if None not in data else \
        f"{shown}, seed {settings.get('seed', 0)}, balance {settings.get('balance') or 'none'}"


def which_step(path, epoch: int, step: int, rank: int | None = None, **settings) -> WhichResult:
    """The source documents of ``step`` of ``epoch`` (every rank, or ``rank``), as the
    sampler with these settings (:func:`open_sampler`) schedules them; a mixture's step counts
    from the run's start. A step the sampler never takes is refused."""
    sampler, data, shown = open_sampler(path, epoch, **settings)
    world_size = settings.get("world_size", 1)
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, (int, np.integer))
                             or not 0 <= rank < world_size):
        raise PacktoolError(f"--rank {rank!r}: must be from 0 to {world_size - 1}")
    try:
        ranks = sampler.which(step, epoch)  # an IndexError: a step the epoch does not take
    except IndexError:
        n_steps = sampler.steps_in(epoch)
        left = len(sampler.left_out(epoch)) if settings.get("drop_last", True) else 0
        raise PacktoolError(
            f"step {step}: the sampler takes steps 0..{n_steps - 1} of epoch {epoch} at "
            f"{shown}"
            + (f"; it leaves out the epoch's last {left:,} packs (fewer than a step), "
               "--no-drop-last fills a last step with the epoch's first packs instead"
               if left and step == n_steps and settings.get("tokens_per_step") is None else "")
        ) from None
    sources = {n: Sources(ds) for n, ds in data.items()}
    res = WhichResult(_label(path, data), ("" if None not in data else f"epoch {epoch} ")
                      + f"step {step}" + (f" rank {rank}" if rank is not None else "")
                      + f" ({_shown(shown, data, settings)})")
    for r in ([rank] if rank is not None else range(world_size)):
        for item in ranks[r]:
            name, row = item if None not in data else (None, item)
            _add_segments(res, data[name], sources[name], row, r, name)
    return res


def _add_segments(res: WhichResult, ds, sources: Sources, row: int, rank: int,
                  source: str | None = None) -> None:
    """The segments of ``row`` of ``ds``, named down to input file and record."""
    docs, offs, lens = ds.segments(row)
    at = 0
    for d, o, n in zip(sources.documents(docs), offs.tolist(), lens.tolist(), strict=True):
        res.segments.append(Segment(row, rank, d, (o, o + n), (at, at + n), source))
        at += -(-n // ds.align) * ds.align  # an aligned row: the next after the pads


def which_record(path, spec: str, epoch: int = 0, **settings) -> WhichResult:
    """Where record ``FILE:RECORD`` went: its packs (a mixture's: in every source whose corpus
    holds it; two sources packed from one corpus both do), and the step and rank of each in
    ``epoch`` (a mixture's: that source's epoch): every place the sampler yields it (without
    drop_last a pack of the epoch's first ones also fills the last step; with it, a pack of
    the left-out tail has none)."""
    file, rec = parse_record(spec)
    sampler, data, shown = open_sampler(path, epoch, **settings)
    sources = {n: Sources(ds) for n, ds in data.items()}
    if None in data:
        docs = {None: sources[None].find(file, rec)}
        named = f"document {docs[None]:,}) in epoch {epoch}"
    else:
        docs = {n: src.find(file, rec) for n, src in sources.items() if src.inputs_named(file)}
        if not docs:
            raise PacktoolError(f"no source of this mixture ({', '.join(sorted(data))}) lists "
                                f"the input {file}; inputs are named as tokenize recorded them")
        named = ", ".join(f"source {n} document {d:,}" for n, d in docs.items()) + \
            f") in its epoch {epoch}"
    res = WhichResult(_label(path, data), f"{spec} ({named} ({_shown(shown, data, settings)})")
    for name, doc in docs.items():
        for row, a, b in rows_of(data[name], doc):  # by the inverse permutation
            for st, r in sampler.where(row, name, epoch) or [(None, None)]:
                res.steps.append({**({"source": name} if name else {}), "pack": row,
                                  "epoch": epoch, "step": st, "rank": r, "tokens": (a, b)})
    if not res.steps:
        res.question += ": in no pack (held out, dropped, empty or not sampled by the mixture)"
    return res
