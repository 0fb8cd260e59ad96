"""``packtool which NAME=DIR NAME=DIR --schedule ...``: which source documents a step of a
:class:`~packtool.train.mixture.MixtureSampler` saw, or where an input record went, named down
to the input file and record as for one dataset (:mod:`packtool.train.which`)::

    step S (the mixture's schedule, world size, batch size, seed, exhausted)
      -> each rank's (source, row) pairs -> the row's segments -> prefix, input, record

    an input record (FILE:RECORD) -> the source holding it -> its rows
      -> the step and rank that takes each row in the source's epoch E

The schedule is given as the trainer gave it: a JSON object of weights for the whole run
(``{"web": 0.7, "code": 0.3}``) or a list of points (``[[0, {"web": 0.7, "code": 0.3}],
[50000, {"web": 0.5, "code": 0.5}]]``), inline or as a file. Nothing reads a token.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import PacktoolError
from ..formats.packed import open_packed
from .which import Segment, Sources, WhichResult

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
        value = json.loads(raw)
    except ValueError as e:
        raise PacktoolError(f"--schedule {text}: not valid JSON ({e}); give an object of "
                            'weights ({"web": 0.7, "code": 0.3}) or a list of [step, weights] '
                            "points") from None
    if isinstance(value, list):
        return [tuple(p) if isinstance(p, list) else p for p in value]
    return value


class Mixture:
    """The datasets, the sampler the trainer ran (rank 0: every rank's steps are the same
    computation) and each source's documents."""

    def __init__(self, paths: dict[str, str], schedule, *, world_size: int, batch_size: int,
                 seed: int, exhausted: str):
        from .mixture import MixtureSampler

        self.datasets = {n: open_packed(p, checksums=False) for n, p in paths.items()}
        self.paths = paths
        self.sampler = MixtureSampler(self.datasets, schedule, rank=0, world_size=world_size,
                                      batch_size=batch_size, seed=seed, exhausted=exhausted)
        self._sources: dict[str, Sources] = {}
        self.settings = (f"world size {world_size} x batch size {batch_size}, seed {seed}, "
                         f"exhausted {exhausted}")

    def sources(self, name: str) -> Sources:
        if name not in self._sources:
            self._sources[name] = Sources(self.datasets[name])
        return self._sources[name]


def which_mixture_step(paths: dict[str, str], schedule, step: int, rank: int | None = None, *,
                       world_size: int = 1, batch_size: int = 1, seed: int = 0,
                       exhausted: str = "next_epoch") -> WhichResult:
    """The source documents of global ``step`` (every rank, or ``rank``)."""
    m = Mixture(paths, schedule, world_size=world_size, batch_size=batch_size, seed=seed,
                exhausted=exhausted)
    if rank is not None and not 0 <= rank < world_size:
        raise PacktoolError(f"--rank {rank!r}: must be from 0 to {world_size - 1}")
    ranks = m.sampler.which_step(step)
    res = WhichResult(_label(paths), f"step {step}" + (f" rank {rank}" if rank is not None
                                                       else "") + f" ({m.settings})")
    for r in [rank] if rank is not None else range(world_size):
        for name, row in ranks[r]:
            ds = m.datasets[name]
            docs, offs, lens = ds.segments(row)
            at = 0
            for d, o, n in zip(m.sources(name).documents(docs), offs.tolist(), lens.tolist(),
                               strict=True):
                res.segments.append(Segment(row, r, d, (o, o + n), (at, at + n), name))
                at += -(-n // ds.align) * ds.align
    return res


def which_mixture_record(paths: dict[str, str], schedule, spec: str, epoch: int = 0, *,
                         world_size: int = 1, batch_size: int = 1, seed: int = 0,
                         exhausted: str = "next_epoch") -> WhichResult:
    """Where record ``FILE:RECORD`` went: in every source whose corpus holds it (two sources
    packed from one corpus both do), its rows, and the step and rank that takes each row in
    that source's epoch ``epoch``."""
    from .which import parse_record, rows_of

    file, record = parse_record(spec)
    m = Mixture(paths, schedule, world_size=world_size, batch_size=batch_size, seed=seed,
                exhausted=exhausted)
    held = [n for n in m.sampler.names if m.sources(n).inputs_named(file)]
    if not held:
        raise PacktoolError(f"no source of this mixture ({', '.join(m.sampler.names)}) lists "
                            f"the input {file}; inputs are named as tokenize recorded them")
    docs = {n: m.sources(n).find(file, record) for n in held}  # in each source that has it
    res = WhichResult(_label(paths), f"{spec} ("
                      + ", ".join(f"source {n} document {d:,}" for n, d in docs.items())
                      + f") in its epoch {epoch} ({m.settings})")
    for name, doc in docs.items():
        for row, a, b in rows_of(m.datasets[name], doc):
            place = m.sampler.which_row(name, row, epoch)
            res.steps.append({"source": name, "pack": row, "epoch": epoch,
                              "step": None if place is None else place[0],
                              "rank": None if place is None else place[1], "tokens": (a, b)})
    if not res.steps:
        res.question += ": in no row (held out, dropped or empty)"
    return res


def _label(paths: dict[str, str]) -> str:
    return " ".join(f"{n}={p}" for n, p in sorted(paths.items()))

