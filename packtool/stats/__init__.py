"""``packtool stats``: what padding costs on a corpus, what packing saves, which packer to use.

For a token corpus (or bare lengths), per sequence length L, documents become *segments*
under ``--overflow`` exactly as ``pack`` makes them (default ``split``: a document of n > L
tokens is ceil(n / L) segments), so every figure describes the pipeline ``pack`` would run:

    padding_waste        1 - tokens / (segments * L)        every segment padded to L
    batch_padding_waste  the same for batches of B padded to their longest segment, in
                         random order (``_grouped``: sorted by length, the best case)
    max_speedup          segments * L / tokens              padded steps / perfectly packed steps
    lower_bound_packs    ceil(tokens / L)                   L1; also L2 (and LP with optimal)

``algos`` runs each registered packer on the segments (nothing is written; the same call as
``pack``, so ``packs`` equals what ``pack`` writes with the same options and seed) and ranks
them by packs, then time. Kernels are compiled before the clock starts (``compile_seconds``
says how long that took). The packing factor p (sequences per pack, :mod:`packtool.metrics`)
drives the advice: a packed batch holds p times as many sequences, so divide the batch size
(or accumulation steps) by p to keep sequences per optimizer step, or, for small p, keep the
batch and use beta := beta ** p for Adam/LAMB (Krell et al., 2021).

Modules: :mod:`.corpus` the corpus report and the packers compared, :mod:`.packed` a packed
dataset's report, :mod:`.groups` a corpus of pairs or groups, :mod:`.render` the reports as
text (and the length plot).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import conflicts
from .._progress import shown
from ..errors import PacktoolError
from ..storage import is_url, kind_of
from .corpus import (
    ALIGN_OPTIONS,
    DEFAULT_SEQ_LENS,
    advice,
    batch_padding_waste,
    compare_algos,
    corpus_report,
    parse_algos,
    seq_len_report,
    step_plan_report,
)
from .packed import packed_report
from .render import plot_corpus, render_corpus, render_packed

__all__ = ["DEFAULT_SEQ_LENS", "StatsResult", "advice", "batch_padding_waste", "compare_algos",
           "corpus_report", "packed_report", "parse_algos", "plot_corpus", "render_corpus",
           "render_packed", "seq_len_report", "stats"]

@dataclass
class StatsResult:
    report: dict
    lengths: np.ndarray | None   # for --plot (corpus reports only)

    def summary(self) -> str:
        text = (render_packed if self.report["kind"] == "packed" else render_corpus)(self.report)
        v = self.report.get("vsl")
        if v:
            from ..pack.result import vsl_lines

            text += "\n" + "\n".join(vsl_lines(v, v["n_tokens"])).replace(
                "  vsl", ("" if self.report["kind"] == "packed" else "predicted: ") + "vsl", 1)
        sp = self.report.get("step_plan")
        if sp:
            text += (f"\nstep plan ({sp['steps']} step(s) of {sp['sequences_per_step']:,} "
                     f"sequences, {sp['world_size']} ranks, micro-batches of "
                     f"{sp['max_tokens']:,} tokens): {sp['micro_batches'][0]}-"
                     f"{sp['micro_batches'][1]} micro-batches per rank, rank attention cost "
                     f"max/mean {sp['cost_imbalance'][0]:.4f} (worst {sp['cost_imbalance'][1]:.4f})"
                     f", tokens {sp['token_imbalance'][0]:.4f}, "
                     f"{sp['ms_per_plan']:.1f} ms a plan")
        return text

    def to_json(self) -> dict:
        return self.report


def stats(paths: list[str], lengths_file: str | None = None, seq_lens=(), batch_size: int = 8,
          algos: str | None = None, progress: bool = False, step_plan: str | None = None,
          **options) -> StatsResult:
    """:func:`report`, and with ``step_plan`` ("WORLD:MAX_TOKENS[:SEQS]") the lengths planned
    as training steps (:func:`step_plan_report`); with ``share_prefix`` (and ``min_shared``)
    the packs and tokens ``pack --share-prefix`` writes (:func:`.groups.prefix_stats`)."""
    prefix = {k: options.pop(k) for k in ("share_prefix", "min_shared") if k in options}
    result = report(paths, lengths_file, seq_lens, batch_size, algos, progress, **options)
    if prefix.get("share_prefix") or prefix.get("min_shared") is not None:
        from .groups import prefix_stats

        with shown(progress):
            prefix_stats(result, paths, lengths_file, seq_lens or DEFAULT_SEQ_LENS, algos,
                         options, **prefix)
    if step_plan is not None:
        if result.report["kind"] == "packed" or "groups" in result.report:
            raise PacktoolError("--step-plan plans plain sequences from their lengths: pass "
                                "token files of documents or --lengths (a corpus of pairs or "
                                "groups: packtool.plan_step(lengths, groups=...) in the step)")
        result.report["step_plan"] = step_plan_report(result.lengths, step_plan,
                                                      options.get("seed", 0))
    return result


def report(paths: list[str], lengths_file: str | None = None, seq_lens=(), batch_size: int = 8,
           algos: str | None = None, progress: bool = False, **options) -> StatsResult:
    """``packtool stats``: a packed directory, token-file prefixes, or a lengths file.
    ``options``: seed, overflow, share_prompt (pairs and groups: packtool.stats.groups), the
    packer options (max_depth, work_limit, max_docs...) and the alignment (align, cp, tp,
    sequence_parallel, fp8: as ``pack`` takes them; with them or max_docs and no ``algos``,
    bfd, pack's default, predicts the packs);
    ``progress``: a packer that runs long (optimal, nnlshp) shows it on stderr."""
    if paths and lengths_file:
        raise PacktoolError("give token-file prefixes / a packed directory, or --lengths, not both")
    if len(paths) == 1 and (kind_of(paths[0]) == "packed" or (  # a folder, or a URL of one
            not is_url(paths[0]) and Path(paths[0]).is_dir())):
        return StatsResult(packed_report(paths[0]), None)
    table = None
    if lengths_file:
        from ..lengths import load_lengths

        lengths, source = load_lengths(lengths_file), lengths_file
    elif paths:
        from ..formats.tokens.groups import group_table
        from ..pack import open_sources

        corpora = open_sources(list(paths))
        lengths = np.concatenate([c.lengths for c in corpora])
        source = ", ".join(paths)
        table = group_table(corpora)
    else:
        raise PacktoolError("nothing to report on: pass token-file prefixes, a packed directory "
                            "or --lengths FILE")
    seed, overflow = options.pop("seed", 0), options.pop("overflow", "split")
    vsl, share = options.pop("vsl", None), options.pop("share_prompt", False)
    aligned = {k: options.pop(k) for k in ALIGN_OPTIONS if k in options}
    names = parse_algos(algos)
    grouped = bool(paths) and table is not None  # what pack would refuse, refused alike:
    conflicts.check({"groups" if grouped else "plain"} | ({"vsl"} if vsl and grouped else set())
                    | ({"share_prompt"} if share else set()))
    if grouped:  # pairs and groups: packtool.stats.groups
        from .groups import grouped_report

        with shown(progress):
            rep = grouped_report(lengths, table, share, seq_lens or DEFAULT_SEQ_LENS,
                                 batch_size, names, seed, options, aligned, source, overflow)
        return StatsResult(rep, lengths)  # --plot refuses it (plot_corpus)
    if not names and (options.get("max_docs") or any(aligned.values())):
        names = ["bfd"]  # pack's default: the packs it would write, predicted
    with shown(progress):
        rep = corpus_report(lengths, seq_lens or DEFAULT_SEQ_LENS, batch_size, names, seed,
                            options, source, overflow, aligned)
    if vsl is not None:
        from ..options import parse_vsl
        from ..pack.vsl import predict

        rep["vsl"] = predict(lengths, parse_vsl(vsl), seed)
    return StatsResult(rep, lengths)
