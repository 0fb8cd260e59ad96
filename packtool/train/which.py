"""``packtool which``: which source documents a training step saw, and where an input record
went, from the dataset's segment tables and the sources' manifests alone (no token is read,
no boundaries file is opened)::

    step S of epoch E (the sampler's schedule: world size, batch size, seed, balance)
      -> packs of each rank -> their segments (document, offset, length)
      -> source prefix, part, input file, record number (line or row), token range

    an input record (FILE:RECORD) -> its document -> the packs holding its segments
      -> the epoch's step and rank of each

A mixture (``packtool which web=DIR code=DIR --schedule ...``, a MixtureSampler's run) is
asked the same: a step's (source, row) pairs per rank, and a record's rows in every source
whose corpus holds it, with the step and rank that takes each in the source's epoch.

A record number is what the reader counted: the line of a JSONL record (blank lines and
skipped bad records count as lines), the row of a Parquet/Arrow record, the line or paragraph
start of a ``.txt`` record. Measured (scripts/bench_which.py): see docs/TRAINING.md.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import PacktoolError
from ..formats.packed import open_packed, source_location
from ..storage.place import place_of


@dataclass
class Document:
    """Where a global document of a packed dataset came from."""

    doc: int                  # global over the dataset's sources
    source: str               # the source corpus's prefix
    input: str | None         # the input file (None: the manifest lists none)
    record: int | None        # its line or row in that file (1-based; None: not recorded)
    part: str                 # the corpus part holding it


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


class Sources:
    """The sources' manifests, read as JSON only: global document -> input file and record."""

    def __init__(self, ds):
        self.entries = []   # per source: (prefix, first global doc, parts, inputs table)
        base = 0
        for src in ds.index["sources"]:
            meta = None
            for p in source_location(ds.directory, src):  # local or in a store
                place, stem = place_of(p, ds.place.storage_options, ds.place.cache_if_any())
                if place.is_file(f"{stem}.json"):
                    meta = json.loads(place.read_bytes(f"{stem}.json"))
                    break
            self.entries.append((src["prefix"], base, _inputs(meta, src)))
            base += int(src["n_docs"])
        self.bases = np.array([e[1] for e in self.entries] + [base], np.int64)

    def document(self, doc: int) -> Document:
        return self.documents(np.array([doc], np.int64))[0]

    def documents(self, docs: np.ndarray) -> list[Document]:
        """Where each of the global documents ``docs`` came from (vectorised: a step of 8 x 4
        packs holds thousands of segments)."""
        docs = np.asarray(docs, np.int64)
        src = np.searchsorted(self.bases, docs, side="right") - 1
        out = []
        for k, d, local in zip(src.tolist(), docs.tolist(), (docs - self.bases[src]).tolist(),
                               strict=True):
            prefix, _, table = self.entries[k]
            if table is None:
                out.append(Document(d, prefix, None, None, "?"))
                continue
            i = int(np.searchsorted(table["first"], local, side="right")) - 1
            rec = table["records"][i](local - int(table["first"][i]))
            out.append(Document(d, prefix, table["inputs"][i].get("path"), rec,
                                table["parts"][i]))
        return out

    def find(self, path: str, record: int) -> int:
        """The global document of ``record`` of input file ``path``."""
        hits = self.inputs_named(path)
        if not hits:
            raise PacktoolError(f"no source of this dataset lists the input {path}; the inputs "
                                "are named as tokenize recorded them (see the corpus manifest's "
                                "inputs), or by any path to the same file")
        if len(hits) > 1:
            names = "; ".join(f"{inp.get('path')} (source {prefix})" for prefix, _, inp in hits)
            raise PacktoolError(f"--record {path}: {len(hits)} inputs match: {names}; name one "
                                "by its path as the manifest records it")
        prefix, first, inp = hits[0]
        return first + document_of(inp, record, prefix)

    def inputs_named(self, path: str) -> list[tuple[str, int, dict]]:
        """(source prefix, its first global document, input) of every input that is ``path``:
        recorded as ``path`` or the same file once both are resolved (absolute, relative to the
        current directory, ``./x``, symlinks; a recorded relative path is taken from here too),
        else, for none, recorded under the base name ``path``."""
        want = _resolved(path)
        same, named = [], []
        for prefix, base, table in self.entries:
            for i, inp in enumerate(table["inputs"] if table is not None else []):
                rec = inp.get("path")
                if not isinstance(rec, str):
                    continue
                hit = (prefix, base + int(table["first"][i]), inp)
                if rec == path or _resolved(rec) == want:
                    same.append(hit)
                elif Path(rec).name == path:
                    named.append(hit)
        return same or named


def _resolved(path: str) -> str:
    """``path`` as one spelling per file: a URL as given, a local path made absolute with its
    symlinks followed (it need not exist here)."""
    if "://" in path:
        return path
    return os.path.realpath(os.path.expanduser(path))


def _inputs(meta: dict | None, src: dict) -> dict | None:
    if meta is None:
        return None
    parts = meta.get("parts") or [{"name": Path(src["prefix"]).name,
                                   "inputs": meta.get("inputs", []),
                                   "n_docs": meta.get("n_docs", 0)}]
    inputs, first, names, at = [], [], [], 0
    for q in parts:
        for inp in q.get("inputs", []):
            inputs.append(inp)
            first.append(at)
            names.append(q["name"])
            at += int(inp.get("n_docs", 0))
    return {"inputs": inputs, "first": np.array(first or [0], np.int64), "parts": names,
            "records": [_record_numbers(inp) for inp in inputs]}


def _record_numbers(inp: dict):
    """local document -> its record number (1-based), made once per input file: the
    (local+1)-th number that is not a gap (skipped record, blank line); None when blank lines
    were counted but not located (a corpus written before packtool recorded them)."""
    if inp.get("blank_lines") and "blank_records" not in inp:
        return lambda local: None
    gaps = _gaps(inp)
    before = gaps - np.arange(gaps.size)  # non-gap numbers up to each gap, plus one
    return lambda local: int(local + 1 + np.searchsorted(before, local + 1, side="right"))


def _gaps(inp: dict) -> np.ndarray:
    """Record numbers that are not documents (skipped bad records, blank lines), sorted."""
    gaps = list(inp.get("skipped_records", [])) + list(inp.get("blank_records", []))
    return np.sort(np.array(gaps, np.int64))


def record_number(inp: dict, local: int) -> int | None:
    """The record number (1-based) of the file's ``local``-th document: its position plus the
    non-documents (gaps) before it."""
    return _record_numbers(inp)(local)


def document_of(inp: dict, record: int, prefix: str) -> int:
    gaps = _gaps(inp)
    if record in set(gaps.tolist()):
        raise PacktoolError(f"{inp.get('path')} record {record} is not a document (a blank line "
                            f"or a record skipped as bad; see {prefix}.json)")
    local = record - 1 - int(np.searchsorted(gaps, record))
    if not 0 <= local < int(inp.get("n_docs", 0)):
        raise PacktoolError(f"{inp.get('path')} has {inp.get('n_docs', 0):,} documents; record "
                            f"{record} is not one of them")
    return local


def _sampler(ds, epoch, world_size: int, batch_size: int, seed: int, balance: str | None,
             drop_last: bool, tokens_per_step: int | None = None, curriculum: str = "uniform"):
    """The PackSampler ``which`` answers for, after checking what the command line gave: the
    sampler takes no step of more packs than the dataset holds with drop_last, and without it
    fills one with repeats; ``which`` refuses both rather than deal ``G`` slots (work that grows
    with the number typed, not with the data: ``--world-size 2**62`` would allocate 2**62).
    With ``tokens_per_step``, the token-budget sampler (a step's rows follow from T / L; it
    refuses a world size that does not divide them)."""
    from .sampler import PackSampler

    for name, v, lo in (("epoch", epoch, 0), ("world-size", world_size, 1),
                        ("batch-size", batch_size, 1), ("seed", seed, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise PacktoolError(f"--{name} must be an integer >= {lo}, got {v!r}")
    if tokens_per_step is not None:
        if batch_size != 1 or not drop_last:
            raise PacktoolError("--batch-size and --no-drop-last do not apply with "
                                "--tokens-per-step (a step takes T / L rows of one length)")
        return PackSampler(ds, rank=0, world_size=world_size, seed=seed, balance=balance,
                           tokens_per_step=tokens_per_step, curriculum=curriculum)
    n, g = len(ds), world_size * batch_size
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
    return PackSampler(ds, rank=0, world_size=world_size, batch_size=batch_size, seed=seed,
                       drop_last=bool(drop_last), balance=balance)


def _settings(world_size, batch_size, drop_last, tokens_per_step=None,
              curriculum="uniform") -> str:
    if tokens_per_step is not None:
        return (f"world size {world_size}, {tokens_per_step:,} tokens a step, curriculum "
                f"{curriculum}")
    return (f"world size {world_size} x batch size {batch_size} "
            + ("with drop_last" if drop_last else "without drop_last"))


def which_step(path, epoch: int, step: int, rank: int | None = None, *, world_size: int = 1,
               batch_size: int = 1, seed: int = 0, balance: str | None = None,
               drop_last: bool = True, tokens_per_step: int | None = None,
               curriculum: str = "uniform") -> WhichResult:
    """The source documents of ``step`` of ``epoch`` (every rank, or ``rank``), as the
    sampler with these settings schedules them (``tokens_per_step``: the token-budget
    sampler's). A step the sampler never takes is refused."""
    ds = open_packed(path, checksums=False)  # structure checked; no full read for a lookup
    sampler = _sampler(ds, epoch, world_size, batch_size, seed, balance, drop_last,
                       tokens_per_step, curriculum)
    shown = _settings(world_size, batch_size, drop_last, tokens_per_step, curriculum)
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, (int, np.integer))
                             or not 0 <= rank < world_size):
        raise PacktoolError(f"--rank {rank!r}: must be from 0 to {world_size - 1}")
    n_steps = sampler.steps_in(epoch)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) \
            or not 0 <= step < n_steps:
        left = len(sampler.left_out(epoch)) if drop_last else 0
        raise PacktoolError(
            f"step {step}: the sampler takes steps 0..{n_steps - 1} of epoch {epoch} at "
            f"{shown}"
            + (f"; it leaves out the epoch's last {left:,} packs (fewer than a step), "
               "--no-drop-last fills a last step with the epoch's first packs instead"
               if left and step == n_steps and tokens_per_step is None else ""))
    row = sampler.schedule_row(epoch, step)
    sources = Sources(ds)
    res = WhichResult(str(path), f"epoch {epoch} step {step}"
                      + (f" rank {rank}" if rank is not None else "")
                      + f" ({shown}, seed {seed}, balance {balance or 'none'})")
    for r in ([rank] if rank is not None else range(world_size)):
        for pack in row[r].tolist():
            _add_segments(res, ds, sources, pack, r)
    return res


def _add_segments(res: WhichResult, ds, sources: Sources, row: int, rank: int,
                  source: str | None = None) -> None:
    """The segments of ``row`` of ``ds``, named down to input file and record."""
    docs, offs, lens = ds.segments(row)
    at = 0
    for d, o, n in zip(sources.documents(docs), offs.tolist(), lens.tolist(), strict=True):
        res.segments.append(Segment(row, rank, d, (o, o + n), (at, at + n), source))
        at += -(-n // ds.align) * ds.align  # an aligned row: the next after the pads


def which_record(path, spec: str, epoch: int = 0, *, world_size: int = 1, batch_size: int = 1,
                 seed: int = 0, balance: str | None = None, drop_last: bool = True,
                 tokens_per_step: int | None = None, curriculum: str = "uniform") -> WhichResult:
    """Where record ``FILE:RECORD`` went: its packs, and the step and rank of each in
    ``epoch`` (every place the sampler yields the pack: without drop_last a pack of the epoch's
    first ones also fills the last step; with it, a pack of the left-out tail has none)."""
    file, rec = parse_record(spec)
    ds = open_packed(path, checksums=False)
    sampler = _sampler(ds, epoch, world_size, batch_size, seed, balance, drop_last,
                       tokens_per_step, curriculum)
    sources = Sources(ds)
    doc = sources.find(file, rec)
    shown = _settings(world_size, batch_size, drop_last, tokens_per_step, curriculum)
    res = WhichResult(str(path), f"{spec} (document {doc:,}) in epoch {epoch} "
                      f"({shown}, seed {seed}, balance {balance or 'none'})")
    found = rows_of(ds, doc)
    for pack, a, b in found:  # each pack's step by the inverse permutation: no schedule built
        for st, r in sampler.places(pack, epoch) or [(None, None)]:
            res.steps.append({"pack": pack, "epoch": epoch, "step": st, "rank": r,
                              "tokens": (a, b)})
    if not res.steps:
        res.question += ": in no pack (held out, dropped, empty or not sampled by the mixture)"
    return res


def parse_record(spec: str) -> tuple[str, int]:
    """``FILE:RECORD`` as (file, 1-based record number)."""
    file, sep, rec = str(spec).rpartition(":")
    if not sep or not file or not re.fullmatch(r"[0-9]+", rec) or int(rec) < 1:
        raise PacktoolError(f"--record {spec!r}: expected FILE:RECORD, the input file and a "
                            "1-based line or row number in ASCII digits (data/part-3.jsonl:1042)")
    return file, int(rec)


def rows_of(ds, doc: int) -> list[tuple[int, int, int]]:
    """(pack, first token, end token) of every segment of global document ``doc``, from the
    segment tables alone."""
    found, base = [], 0
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        for s in np.flatnonzero(np.asarray(sh.seg_doc) == doc).tolist():
            j = int(np.searchsorted(np.asarray(sh.pack_seg), s, side="right")) - 1
            off, n = int(sh.seg_offset[s]), int(sh.seg_length[s])
            found.append((base + j, off, off + n))
        base += sh.n_packs
    return found


# ------------------------------------------------------------------ a mixture
# ``packtool which NAME=DIR NAME=DIR --schedule ...``: the same questions of a MixtureSampler's
# steps, a step's rows named by source; the schedule as the trainer gave it (a JSON object of
# weights, or a list of [step, weights] points, inline or as a file).

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
            _add_segments(res, m.datasets[name], m.sources(name), row, r, name)
    return res


def which_mixture_record(paths: dict[str, str], schedule, spec: str, epoch: int = 0, *,
                         world_size: int = 1, batch_size: int = 1, seed: int = 0,
                         exhausted: str = "next_epoch") -> WhichResult:
    """Where record ``FILE:RECORD`` went: in every source whose corpus holds it (two sources
    packed from one corpus both do), its rows, and the step and rank that takes each row in
    that source's epoch ``epoch``."""
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

