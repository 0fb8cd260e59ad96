"""``pack --group-docs G`` at corpus scale: each job plans *and* writes one group of G
consecutive documents, so no process ever holds the whole corpus's lengths::

    driver    streaming passes over the boundaries: per source its non-empty count; the
              mixture's held-out and extra-copy documents drawn as bitmaps
              (:func:`packtool.pack.selection.selection_bits`: the global plan's draws, never
              8 bytes a document); one job per group with its slice of those bitmaps.
              Memory: O(groups) + 2 bits a document.
    job g     lengths of its documents read from the boundaries, planned on their own (packs
              shuffled in the group with the seed's stream keyed by g), shards
              shard-GGGGG-KKK written with the group's entry .group-GGGGG.entry.json (counts,
              the length histogram, per-source use; its schema in
              :mod:`packtool.pack.entries`) last. Memory: O(G + one shard).
    finalize  index.json from the group entries, in order: counts and histograms add up, so
              the efficiency and the L1/L2 bounds are those of the whole dataset.

Packs are shuffled within each group; the training sampler shuffles across the dataset. The
documents a group holds out or repeats are the global plan's, so a grouped dataset holds the
same segments as a global one (its packs differ: each group is packed on its own).
Measured on synthetic corpora (scripts/bench_scale_memory.py): see docs/SCALE.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._io import write_new
from ..formats.packed import VALID, ShardWriter, attention_costs
from ..formats.tokens import read_lengths_range
from ..options import PackOptions
from . import entries as fe
from .meta import histogram
from .plan import plan_pack
from .selection import get_bits, selection_bits
from .shards import Target, entry_name, gatherer, length_chunks, sources


@dataclass(frozen=True)
class GroupJob:
    """Group ``g``: global documents lo..hi-1; ``held``/``extra``: bitmaps of its documents
    (``np.packbits``, bitorder little, bit i = document lo+i) held out / given one more copy,
    or None when the plan draws none; ``whole``: floor(factor) per source."""

    g: int
    lo: int
    hi: int
    held: np.ndarray | None
    extra: np.ndarray | None
    whole: tuple[int, ...]
    base: tuple[int, ...]        # first global document of each source, then the total
    options: PackOptions
    target: Target
    digest: str
    n_tokens: int = 0            # the group's source tokens (for the progress bar)

    def label(self) -> str:
        return f"group {self.g} (documents {self.lo:,}..{self.hi - 1:,})"


def group_jobs(corpora, factors: list[float], options: PackOptions, target: Target,
               digest: str) -> list[GroupJob]:
    sizes = [len(c) for c in corpora]
    base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    held, extra = selection_bits(length_chunks(corpora), sizes, factors, options,
                                 [str(c.prefix) for c in corpora])
    g_size = options.group_docs
    jobs = []
    for g, lo in enumerate(range(0, int(base[-1]), g_size)):
        hi = min(lo + g_size, int(base[-1]))
        h, e = (None if b is None else np.packbits(get_bits(b, lo, hi), bitorder="little")
                for b in (held, extra))
        jobs.append(GroupJob(g, lo, hi, h, e, tuple(int(f) for f in factors),
                             tuple(int(b) for b in base), options, target, digest,
                             _token_offset(corpora, hi) - _token_offset(corpora, lo)))
    return jobs


def _token_offset(corpora, d: int) -> int:
    """Tokens of the documents before global document ``d`` (two boundary reads)."""
    total = 0
    for c in corpora:
        for q in c.parts:
            if d <= 0:
                return total
            if d < len(q):
                return total + int(q.ends[d - 1])
            total += int(q.entry["n_tokens"])
            d -= len(q)
    return total


def _repeats(job: GroupJob) -> tuple[np.ndarray | None, np.ndarray]:
    """(copies per document of the group, or None for "each once"; held-out mask)."""
    n = job.hi - job.lo
    held, extra = (np.zeros(n, bool) if b is None else get_bits(b, 0, n)
                   for b in (job.held, job.extra))
    if all(w == 1 for w in job.whole) and not extra.any() and not held.any():
        return None, held
    reps = np.zeros(n, np.int64)
    for k, w in enumerate(job.whole):
        a, b = max(job.base[k], job.lo), min(job.base[k + 1], job.hi)
        if b > a:
            reps[a - job.lo:b - job.lo] = w
    reps[extra] += 1
    reps[held] = 0
    return reps, held


def _split_stats(layout, job: GroupJob, shards: list[dict]) -> dict:
    """What the finalize step adds up for one split of one group."""
    hist = histogram(layout)
    costs = attention_costs(layout.ordered_lengths(), layout.seg_first)
    ranks = job.options.balance_ranks
    n8 = costs.size // ranks * ranks
    blocks = costs[:n8].reshape(-1, ranks)
    mean = blocks.mean(axis=1) if n8 else np.zeros(0)
    ok = mean > 0
    ratio = float((blocks.max(axis=1)[ok] / mean[ok]).sum()) if ok.any() else 0.0
    used_tokens = np.zeros(len(job.base) - 1, np.int64)
    used_docs = np.zeros(len(job.base) - 1, np.int64)
    for a in range(0, layout.order.size, 1 << 20):
        doc, off, length = layout.segments(a, a + (1 << 20))
        which = np.searchsorted(np.asarray(job.base), doc + job.lo, side="right") - 1
        used_tokens += np.bincount(which, weights=length, minlength=used_tokens.size
                                   ).astype(np.int64)
        used_docs += np.bincount(which[off == 0], minlength=used_docs.size)
    return {"shards": shards, "n_packs": layout.n_packs, "counts": layout.counts,
            "hist": {str(v): int(c) for v, c in enumerate(hist) if c},
            "report": layout.report.to_json(), "imbalance": [ratio, int(ok.sum())],
            "tokens_used": used_tokens.tolist(), "docs_used": used_docs.tolist()}


def write_group(job: GroupJob, tick) -> tuple[int, list[str]]:
    """Plan and write group ``job`` into its folder (the job's own): its shards, then its
    entry (the stage holds the job's lock, skips a group already written and publishes the
    files). Returns (the group's number, its files' names): finalize reads the entries from
    where they were published, and an executor keeps every job's result (a group's entry
    holds its length histogram, ~40 KB: 0.3 B a document at 10^5-document groups)."""
    folder = Path(job.target.staging)
    entry = _plan_and_write(job, folder, tick)
    write_new(folder / entry_name(job), json.dumps(entry))
    return job.g, [(f"{VALID}/" if split == "valid" else "") + f["name"]
                   for split, stats in entry["splits"].items() for sh in stats["shards"]
                   for f in sh["files"].values()]


def _plan_and_write(job: GroupJob, tmp: Path, tick) -> dict:
    t = job.target
    corpora = sources(t.prefixes)
    lengths = read_lengths_range(corpora, job.lo, job.hi)
    opts = job.options.replace(group_docs=None)
    repeats, held = _repeats(job)
    layouts = {"train": plan_pack(lengths, opts, repeats, shuffle_key=(job.g,))}
    if held.any():
        layouts = {"valid": plan_pack(lengths, opts, held.astype(np.int64),
                                      shuffle_key=(job.g,)), **layouts}
    gather = gatherer(corpora) if t.layout == "tokens" else None
    writer = ShardWriter(tmp, t.dtypes, t.layout, t.mask_storage, gather)
    splits = {}
    for split, layout in layouts.items():
        shards = []
        for k in range(layout.n_shards):
            packs, segs = layout.shard(k)
            first = layout.seg_first[packs.start:packs.stop + 1] - segs.start
            doc, off, length = layout.segments(segs.start, segs.stop)
            entry = writer.write(k, first, doc + job.lo, off, length, tick)
            shards.append(_rename(tmp, entry, split, job.g, k))
        splits[split] = _split_stats(layout, job, shards)
    return fe.group_entry(job.digest, job.g, splits)


def _rename(tmp: Path, entry: dict, split: str, g: int, k: int) -> dict:
    """Name a group's shard after the group: shard-GGGGG-KKK (valid ones with a v)."""
    name = f"shard-{g:05d}-{'v' if split == 'valid' else ''}{k:03d}"
    files, sub = {}, tmp / VALID if split == "valid" else tmp
    sub.mkdir(exist_ok=True)
    for array, f in entry["files"].items():
        new = f["name"].replace(entry["name"], name, 1)
        os.replace(tmp / f["name"], sub / new)
        files[array] = {**f, "name": new}
    return {**entry, "name": name, "files": files}


class SplitTotals:
    """One split's figures over every group, folded in group order as the entries are
    checked, so finalize holds the shards' entries (what index.json lists) and one
    histogram, never every group's entry (~40 KB each: 4 GB at 10^5 groups)."""

    def __init__(self, seq_len: int):
        self.shards, self.n_packs, self.counts = [], 0, {}
        self.hist = np.zeros(seq_len + 1, np.int64)  # segments per length
        self.report, self.warnings, self.ratio, self.blocks = None, {}, 0.0, 0
        self.tokens_used = self.docs_used = None
        self.parts = 0

    def add(self, part: dict) -> None:
        self.parts += 1
        self.shards += part["shards"]
        self.n_packs += part["n_packs"]
        for k, v in part["counts"].items():
            self.counts[k] = self.counts.get(k, 0) + v
        for v, c in part["hist"].items():
            self.hist[int(v)] += c
        self.report = self.report or part["report"]
        self.warnings.update(dict.fromkeys(part["report"].get("warnings", [])))
        self.ratio += part["imbalance"][0]
        self.blocks += part["imbalance"][1]
        used = (np.asarray(part["tokens_used"], np.int64), np.asarray(part["docs_used"], np.int64))
        self.tokens_used = used[0] if self.tokens_used is None else self.tokens_used + used[0]
        self.docs_used = used[1] if self.docs_used is None else self.docs_used + used[1]

    def result(self) -> dict | None:
        """What index.json's figures are made from (None if no group has this split)."""
        if not self.parts:
            return None
        return {"shards": self.shards, "n_packs": self.n_packs, "counts": self.counts,
                "hist": self.hist, "report": self.report, "warnings": list(self.warnings),
                "imbalance": self.ratio / self.blocks if self.blocks else None,
                "tokens_used": self.tokens_used.tolist(), "docs_used": self.docs_used.tolist()}
