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
says how long that took). The packing factor p (segments per pack) drives the advice: a
packed batch holds p times as many sequences, so divide the batch size (or accumulation
steps) by p to keep sequences per optimizer step, or, for small p, keep the batch and use
beta := beta ** p for Adam/LAMB (Krell et al., 2021).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import PacktoolError

DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192)
BARS = " ▏▎▍▌▋▊▉█"
HOPELESS = 0.5  # skip a depth-capped packer in stats when it cannot pass this efficiency
ATTN_RANKS = 8  # attention imbalance: 8 ranks x 1 pack per step


def length_summary(lengths: np.ndarray) -> dict:
    if lengths.size == 0:
        return {"min": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0}
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return {"min": int(lengths.min()), "mean": float(lengths.mean()), "p50": float(p50),
            "p90": float(p90), "p99": float(p99), "max": int(lengths.max())}


def log_histogram(lengths: np.ndarray, n_bins: int = 16) -> list[dict]:
    """Counts in log-spaced bins [lo, hi) over 0..max (0 gets a bin of its own)."""
    if lengths.size == 0:
        return []
    top = int(lengths.max()) + 1
    edges = np.logspace(0, math.log10(max(top, 2)), n_bins + 1)
    edges = np.unique(np.round(edges).astype(np.int64))
    edges = np.concatenate([[0], edges[edges < top], [top]])
    edges = np.unique(edges)
    counts = np.histogram(lengths, bins=edges)[0]
    nz = np.flatnonzero(counts)
    keep = slice(nz[0], nz[-1] + 1) if nz.size else slice(0, 0)  # trim empty ends
    return [{"lo": int(a), "hi": int(b), "count": int(c)}
            for a, b, c in zip(edges[:-1][keep], edges[1:][keep], counts[keep], strict=True)]


def batch_padding_waste(clipped: np.ndarray, seq_len: int, batch_size: int,
                        order: np.ndarray) -> float:
    """1 - real / computed tokens when batches of ``batch_size`` (in ``order``) are padded to
    their longest document (the last batch holds the remainder)."""
    n = clipped.size
    if n == 0:
        return 0.0
    x = clipped[order]
    pad = (-n) % batch_size
    x = np.concatenate([x, np.full(pad, -1, np.int64)]).reshape(-1, batch_size)
    rows = (x >= 0).sum(axis=1)
    computed = int((x.max(axis=1) * rows).sum())
    return 1.0 - int(clipped.sum()) / computed if computed else 0.0


def seq_len_report(lengths: np.ndarray, seq_len: int, batch_size: int = 8, seed: int = 0,
                   algos: list[str] | None = None, algo_options: dict | None = None,
                   overflow: str = "split") -> dict:
    from .metrics import pack_metrics
    from .plan import make_segments

    segs = make_segments(lengths, seq_len, overflow)
    seg = segs.length  # the non-empty segments; the packers get the planner's table
    n = seg.size
    kept = int(seg.sum())
    from .seeds import rng as seeded

    rng = seeded(seed, "stats.batches")
    base = pack_metrics(seg, seq_len, 0)
    rep = {
        "seq_len": seq_len,
        "overflow": overflow,
        "n_overlong": segs.counts["n_overlong"],
        "n_segments": n,
        "padding_waste": 1.0 - kept / (n * seq_len) if n else 0.0,
        "batch_padding_waste": batch_padding_waste(seg, seq_len, batch_size, rng.permutation(n)),
        "batch_padding_waste_grouped": batch_padding_waste(
            seg, seq_len, batch_size, np.argsort(seg, kind="stable")),
        "max_speedup": n * seq_len / kept if kept else 1.0,
        "lower_bound_packs": base["lower_bound_packs"],
        "l2_bound_packs": base["l2_bound_packs"],
        "best_bound_packs": base["best_bound_packs"],
        "tokens": kept,
        "counts": segs.counts,
    }
    if algos:
        rep["algos"] = compare_algos(segs.table_length, seq_len, algos, seed,
                                     algo_options or {})
        lp = [a for a in rep["algos"] if a.get("lp_bound") is not None]
        if lp:
            rep["lp_bound_packs"] = lp[0]["lp_bound"]
            rep["lp_converged"] = lp[0]["lp_converged"]
        rep["best_bound_packs"] = max(rep["lower_bound_packs"], rep["l2_bound_packs"],
                                      rep.get("lp_bound_packs") or 0)
        for a in rep["algos"]:
            if a.get("packs") is not None:
                m = pack_metrics(seg, seq_len, a["packs"], rep.get("lp_bound_packs"),
                                 rep.get("lp_converged"))
                a["gap_to_best_bound"] = m["gap_to_best_bound_percent"]
    return rep


def compare_algos(seg_lengths: np.ndarray, seq_len: int, algos: list[str], seed: int = 0,
                  algo_options: dict | None = None) -> list[dict]:
    """Run each packer on the segments as ``pack`` would; kernels compiled before timing."""
    from ._numba import compile_seconds
    from .metrics import pack_metrics
    from .packers import PACKERS, PackerOptions, depth_capped_efficiency, run_packer
    from .sampler import step_imbalance

    given = {k: v for k, v in (algo_options or {}).items() if v not in (None, False)}
    unread = set(given) - set().union(*(PACKERS[a].options for a in algos))
    if unread:
        raise PacktoolError(f"none of the packers compared reads "
                            f"{', '.join('--' + k.replace('_', '-') for k in sorted(unread))}")
    rows = []
    nonempty = np.asarray(seg_lengths)[np.asarray(seg_lengths) > 0]
    for algo in algos:
        opts = PackerOptions(seed=seed, **{k: v for k, v in given.items()
                                           if k in PACKERS[algo].options})
        depth = opts.max_depth or {"nnlshp": 3, "spfhp": 12}.get(algo)
        if algo == "nnlshp" and nonempty.size:
            cap = depth_capped_efficiency(nonempty, seq_len, depth)
            if cap < HOPELESS:
                rows.append({"algo": algo, "packs": None, "skipped": (
                    f"at --max-depth {depth} no packing can pass {100 * cap:.1f}% efficiency "
                    f"(documents average {nonempty.mean():,.0f} tokens, L = {seq_len:,}); "
                    "raise --max-depth or use bfd/optimal")})
                continue
        with compile_seconds() as spent:  # kernels compile on first use: timed apart
            run_packer(np.array([1, 2, 3], np.int64), 4, algo, opts)  # load/compile kernels
            warm = spent()
            t0 = time.perf_counter()
            packing = run_packer(seg_lengths, seq_len, algo, opts)
            seconds = time.perf_counter() - t0 - (spent() - warm)
        compile_time = spent()
        rep = packing.report
        m = pack_metrics(seg_lengths, seq_len, rep.n_packs)
        placed = packing.packs >= 0
        costs = np.bincount(packing.packs[placed], weights=seg_lengths[placed].astype(
            np.float64) ** 2, minlength=rep.n_packs)
        rows.append({
            "algo": algo, "packs": rep.n_packs, "efficiency": m["efficiency"],
            "gap": m["gap_percent"], "packing_factor": m["packing_factor"],
            "seconds": seconds, "compile_seconds": compile_time,
            "attention_imbalance": step_imbalance(costs, ATTN_RANKS, seed=seed),
            "attention_imbalance_balanced": step_imbalance(costs, ATTN_RANKS, balanced=True,
                                                           seed=seed),
            **({"lp_bound": rep.lp_bound, "lp_converged": rep.lp_converged}
               if rep.lp_bound is not None else {}),
            **({"warnings": rep.warnings} if rep.warnings else {}),
        })
    rows.sort(key=lambda r: (r["packs"] is None, r["packs"] or 0, r.get("seconds", 0)))
    return rows


def parse_algos(spec: str | None) -> list[str]:
    from .packers import PACKERS

    if not spec:
        return []
    if spec == "all":
        return list(PACKERS)
    names = [a.strip() for a in spec.split(",") if a.strip()]
    unknown = [a for a in names if a not in PACKERS]
    if unknown:
        raise PacktoolError(f"unknown packer(s) {', '.join(unknown)}; "
                            f"choose from {', '.join(PACKERS)} or 'all'")
    return names


def corpus_report(lengths: np.ndarray, seq_lens=DEFAULT_SEQ_LENS, batch_size: int = 8,
                  algos: list[str] | None = None, seed: int = 0,
                  algo_options: dict | None = None, source: str = "",
                  overflow: str = "split") -> dict:
    """The full report for a corpus given its document lengths (JSON-ready dict)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if batch_size < 1:
        raise PacktoolError(f"--batch-size must be >= 1, got {batch_size}")
    if not seq_lens or min(seq_lens) < 1:
        raise PacktoolError("--seq-len values must be positive")
    return {
        "kind": "corpus",
        "source": source,
        "overflow": overflow,
        "n_docs": int(lengths.size),
        "n_tokens": int(lengths.sum()),
        "n_empty": int((lengths == 0).sum()),
        "length": length_summary(lengths),
        "histogram": log_histogram(lengths),
        "batch_size": batch_size,
        "seq_lens": [seq_len_report(lengths, int(L), batch_size, seed, algos, algo_options,
                                    overflow) for L in seq_lens],
    }


@dataclass
class StatsResult:
    report: dict
    lengths: np.ndarray | None   # for --plot (corpus reports only)

    def summary(self) -> str:
        if self.report["kind"] == "packed":
            return render_packed(self.report)
        return render_corpus(self.report)

    def to_json(self) -> dict:
        return self.report


def stats(paths: list[str], lengths_file: str | None = None, seq_lens=(), batch_size: int = 8,
          algos: str | None = None, **options) -> StatsResult:
    """``packtool stats``: a packed directory, token-file prefixes, or a lengths file.
    ``options``: seed, overflow and the packer options (max_depth, work_limit...)."""
    if paths and lengths_file:
        raise PacktoolError("give token-file prefixes / a packed directory, or --lengths, not both")
    if len(paths) == 1 and Path(paths[0]).is_dir():
        return StatsResult(packed_report(paths[0]), None)
    if lengths_file:
        from .lengths import load_lengths

        lengths, source = load_lengths(lengths_file), lengths_file
    elif paths:
        from .pack import open_sources

        corpora = open_sources(list(paths))
        lengths = np.concatenate([c.lengths for c in corpora])
        source = ", ".join(paths)
    else:
        raise PacktoolError("nothing to report on: pass token-file prefixes, a packed directory "
                            "or --lengths FILE")
    seed, overflow = options.pop("seed", 0), options.pop("overflow", "split")
    rep = corpus_report(lengths, seq_lens or DEFAULT_SEQ_LENS, batch_size, parse_algos(algos),
                        seed, options, source, overflow)
    return StatsResult(rep, lengths)


def packed_report(directory: str | Path) -> dict:
    """Report for a packed dataset from index.json and the small per-pack arrays only."""
    from .formats.packed import open_packed

    ds = open_packed(directory)
    idx = ds.index
    seg_per_pack, fill = [], []
    for k in range(ds.n_shards):  # the segment tables only: no token is read
        sh = ds.shard(k)
        seg_per_pack.append(np.diff(np.asarray(sh.pack_seg, np.int64)))
        fill.append(np.diff(sh.po))
    seg_per_pack = np.concatenate(seg_per_pack) if seg_per_pack else np.empty(0, np.int64)
    fill = np.concatenate(fill) / idx["seq_len"] if fill else np.empty(0)
    keys = ("n_packs", "n_tokens", "n_segments", "efficiency", "lower_bound_packs", "gap_percent",
            "l2_bound_packs", "lp_bound_packs", "lp_converged", "best_bound_packs",
            "gap_to_best_bound_percent",
            "packing_factor", "seq_len", "algo", "overflow", "layout", "n_docs", "n_empty",
            "n_overlong",
            "n_split", "n_split_pieces", "n_truncated", "n_truncated_tokens", "n_dropped",
            "n_dropped_tokens")
    rep = {"kind": "packed", "source": str(directory), **{k: idx.get(k) for k in keys}}
    rep["sources"] = [{k: src.get(k) for k in ("prefix", "n_docs", "n_tokens", "factor",
                                               "docs_used", "tokens_used", "token_share")}
                      for src in idx["sources"]]
    rep["held_out"] = idx.get("held_out")
    values, counts = np.unique(seg_per_pack, return_counts=True)
    rep["segments_per_pack"] = {**_dist(seg_per_pack), "counts": {
        str(int(v)): int(c) for v, c in zip(values, counts, strict=True)}}
    rep["pack_fill"] = _dist(fill)
    from .sampler import attention_costs, step_imbalance

    costs = attention_costs(ds)
    rep["attention_imbalance"] = step_imbalance(costs, ATTN_RANKS)
    rep["attention_imbalance_balanced"] = step_imbalance(costs, ATTN_RANKS, balanced=True)
    return rep


def _dist(x: np.ndarray) -> dict:
    if x.size == 0:
        return {"min": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "max": 0}
    p10, p50, p90 = np.percentile(x, [10, 50, 90])
    return {"min": float(x.min()), "p10": float(p10), "mean": float(x.mean()), "p50": float(p50),
            "p90": float(p90), "max": float(x.max())}


def advice(packing_factor: float, batch_size: int) -> str:
    """How to keep sequences per optimizer step when a pack holds p sequences.

    Divide the batch by p, but never below one pack; Krell et al.'s beta := beta^p only for
    p <= 4 (beyond it beta1 would fall under 0.66, which is no longer momentum)."""
    p = packing_factor
    if p <= 1:
        return "" if p <= 0 else "packing factor 1.00: packs hold one sequence; nothing changes."
    head = f"packing factor {p:.2f}: a packed batch holds {p:.2f}x the sequences. "
    per_step = batch_size / p
    if per_step < 1:
        return head + (
            f"A batch of {batch_size} sequences is less than one pack: train on 1 pack per "
            f"step ({p:.1f} sequences; scale the learning rate for it) or lower --seq-len so a "
            f"pack holds about {batch_size} sequences.")
    text = head + (f"To keep sequences per optimizer step, divide the batch size or "
                   f"accumulation steps by {p:.2f} (batch {batch_size} -> {max(1, round(per_step))}"
                   f" packs)")
    if p <= 4:
        text += (f"; or keep the batch and set beta1 := 0.9^p = {0.9 ** p:.4f}, "
                 f"beta2 := 0.999^p = {0.999 ** p:.5f} (Adam/LAMB)")
    return text + "."


# ---------------------------------------------------------------- text rendering


def _bar(value: float, width: int) -> str:
    full = value * width
    n = int(full)
    frac = int((full - n) * 8)
    return ("█" * n + (BARS[frac] if frac and n < width else "")).ljust(width)


def render_corpus(rep: dict) -> str:
    L = rep["length"]
    out = [
        f"{rep['source'] or 'lengths'}: {rep['n_docs']:,} documents, {rep['n_tokens']:,} "
        f"tokens, {rep['n_empty']:,} empty",
        f"length: min {L['min']:,}  mean {L['mean']:,.1f}  p50 {L['p50']:,.0f}  "
        f"p90 {L['p90']:,.0f}  p99 {L['p99']:,.0f}  max {L['max']:,}",
        "",
        "length histogram (log-spaced bins)",
    ]
    top = max((b["count"] for b in rep["histogram"]), default=0) or 1
    for b in rep["histogram"]:
        out.append(f"  {b['lo']:>8,}-{b['hi'] - 1:<8,} {_bar(b['count'] / top, 40)} "
                   f"{b['count']:,}")
    B = rep["batch_size"]
    out += ["", f"documents longer than seq_len: --overflow {rep['overflow']} (as pack does)",
            f"{'seq_len':>8} {'overlong':>10} {'segments':>10} {'pad waste':>10} "
            f"{'batch' + str(B):>9} {'grouped':>8} {'max speedup':>12} {'min packs':>12}"]
    for s in rep["seq_lens"]:
        out.append(f"{s['seq_len']:>8,} {s['n_overlong']:>10,} {s['n_segments']:>10,} "
                   f"{100 * s['padding_waste']:>9.2f}% {100 * s['batch_padding_waste']:>8.2f}% "
                   f"{100 * s['batch_padding_waste_grouped']:>7.2f}% "
                   f"{s['max_speedup']:>11.3f}x "
                   f"{s.get('best_bound_packs', s['lower_bound_packs']):>12,}")
    for s in rep["seq_lens"]:
        if "algos" in s:
            out += _render_algos(s, B)
    return "\n".join(out)


def _render_algos(s: dict, batch_size: int) -> list[str]:
    lp = ""
    if s.get("lp_bound_packs") is not None:
        lp = f", LP {s['lp_bound_packs']:,}" + ("" if s.get("lp_converged") else
                                                " (LP not converged: Farley's bound)")
    out = ["", f"packers at seq_len {s['seq_len']:,} (best first; lower bounds: L1 "
               f"{s['lower_bound_packs']:,}, L2 {s['l2_bound_packs']:,}{lp}; best "
               f"{s['best_bound_packs']:,} packs)",
           f"  {'algo':<11} {'packs':>12} {'efficiency':>11} {'gap L1':>9} {'gap best':>9} "
           f"{'factor':>7} {'seconds':>8} {'compile':>8} {'attn 8x1':>13}"]
    notes = []
    for a in s["algos"]:
        if a.get("packs") is None:
            notes.append(f"  {a['algo']}: skipped: {a['skipped']}")
            continue
        out.append(f"  {a['algo']:<11} {a['packs']:>12,} {100 * a['efficiency']:>10.3f}% "
                   f"{a['gap']:>8.3f}% {a['gap_to_best_bound']:>8.3f}% "
                   f"{a['packing_factor']:>7.2f} {a['seconds']:>8.3f} "
                   f"{a['compile_seconds']:>8.3f} {a['attention_imbalance']:>6.2f}->"
                   f"{a['attention_imbalance_balanced']:.2f}")
        notes += [f"  warning: {w}" for w in a.get("warnings", [])]
    out.append("  attn 8x1: max/mean rank attention cost (sum of squared segment lengths), "
               "8 ranks x 1 pack per step,")
    out.append("  mean over steps: shuffled -> PackSampler(balance='attention')")
    best = next(a for a in s["algos"] if a.get("packs") is not None) if any(
        a.get("packs") is not None for a in s["algos"]) else None
    if best:
        out.append(f"  advice: {advice(best['packing_factor'], batch_size)}")
    return out + notes


def render_packed(rep: dict) -> str:
    from .metrics import bounds_text

    sp, f = rep["segments_per_pack"], rep["pack_fill"]
    lines = [
        f"{rep['source']}: {rep['n_packs']:,} packs of {rep['seq_len']:,} ({rep['algo']}), "
        f"{rep['n_tokens']:,} tokens in {rep['n_segments']:,} segments",
        f"efficiency {100 * rep['efficiency']:.3f}%, {bounds_text(rep)}, packing factor "
        f"{rep['packing_factor']:.2f}",
        f"segments per pack: min {sp['min']:.0f}  p50 {sp['p50']:.0f}  mean {sp['mean']:.2f}  "
        f"p90 {sp['p90']:.0f}  max {sp['max']:.0f}",
        f"pack fill: min {100 * f['min']:.1f}%  p10 {100 * f.get('p10', 0):.1f}%  "
        f"p50 {100 * f['p50']:.1f}%  mean {100 * f['mean']:.2f}%",
        f"attention cost, 8 ranks x 1 pack per step, mean max/mean rank: shuffled "
        f"{rep['attention_imbalance']:.2f}, PackSampler(balance='attention') "
        f"{rep['attention_imbalance_balanced']:.2f}",
        f"overflow ({rep['overflow']}): {rep['n_overlong']:,} over-long documents; split "
        f"{rep['n_split']:,} into {rep['n_split_pieces']:,} pieces, truncated "
        f"{rep['n_truncated']:,} (-{rep['n_truncated_tokens']:,} tokens), dropped "
        f"{rep['n_dropped']:,} ({rep['n_dropped_tokens']:,} tokens); {rep['n_empty']:,} empty "
        "documents skipped",
    ]
    for src in rep["sources"]:
        factor = 1.0 if src["factor"] is None else src["factor"]
        lines.append(f"source {src['prefix']}: x{factor:g}, {src['docs_used'] or 0:,} of "
                     f"{src['n_docs']:,} documents, {src['tokens_used'] or 0:,} tokens used of "
                     f"{src['n_tokens']:,}, {100 * (src['token_share'] or 0):.2f}% of the "
                     "packed tokens")
    if rep.get("held_out"):
        h = rep["held_out"]
        lines.append(f"held out: {h['n_docs_held_out']:,} documents in {h['path']}/ "
                     f"({h['n_packs']:,} packs, {h['n_tokens']:,} tokens)")
    return "\n".join(lines)


def plot_corpus(rep: dict, lengths: np.ndarray, path: str | Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PacktoolError("--plot needs matplotlib: pip install 'packtool[plot]'") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    pos = lengths[lengths > 0]
    if pos.size:
        bins = np.unique(np.round(np.logspace(0, math.log10(pos.max() + 1), 60)))
        ax1.hist(pos, bins=bins, color="#4c72b0")
    ax1.set_xscale("log")
    if pos.size:
        ax1.set_xlim(max(pos.min() / 1.5, 0.8),
                     1.3 * max(int(pos.max()), max(s["seq_len"] for s in rep["seq_lens"])))
    ax1.set_xlabel("document length (tokens)")
    ax1.set_ylabel("documents")
    ax1.set_title(f"{rep['n_docs']:,} documents, {rep['n_tokens']:,} tokens")
    for k, s in enumerate(rep["seq_lens"]):
        ax1.axvline(s["seq_len"], color="#c44e52", ls="--", lw=1)
        ax1.text(s["seq_len"], ax1.get_ylim()[1] * (0.97 - 0.06 * (k % 2)), f" L={s['seq_len']}",
                 color="#c44e52", fontsize=8, va="top")
    x = np.arange(len(rep["seq_lens"]))
    w = 0.27
    bars = [("padding_waste", "pad to seq_len"),
            ("batch_padding_waste", f"batch {rep['batch_size']}, random"),
            ("batch_padding_waste_grouped", f"batch {rep['batch_size']}, grouped")]
    for k, (key, label) in enumerate(bars):
        ax2.bar(x + (k - 1) * w, [100 * s[key] for s in rep["seq_lens"]], w, label=label)
    ax2.set_xticks(x, [str(s["seq_len"]) for s in rep["seq_lens"]])
    ax2.set_xlabel("seq_len")
    ax2.set_ylabel("padding waste (% of computed tokens)")
    ax2.set_title("what padding wastes (packing: ~0%)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
