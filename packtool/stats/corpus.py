"""Figures of a token corpus (or bare lengths) per sequence length: padding waste, what packing
saves, the packers compared, and the batch/optimizer advice (the package docstring says how
each is computed)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from ..errors import PacktoolError

DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192)
HOPELESS = 0.5  # skip a depth-capped packer in stats when it cannot pass this efficiency
ATTN_RANKS = 8  # attention imbalance: 8 ranks x 1 pack per step
ALIGN_OPTIONS = ("align", "cp", "tp", "sequence_parallel", "fp8")  # of options.Alignment


def alignment_at(seq_len: int, aligned: dict | None) -> int:
    """The alignment ``pack`` would use at ``seq_len`` with these options (checked as pack
    checks them: a --seq-len that is not a multiple of it is refused by name)."""
    from ..options import Alignment

    padding = Alignment(**(aligned or {}))
    padding.check(seq_len)
    return padding.k

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
    edges = np.round(np.logspace(0, math.log10(max(top, 2)), n_bins + 1)).astype(np.int64)
    edges = np.unique(np.concatenate([[0], edges[edges < top], [top]]))
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
                   overflow: str = "split", aligned: dict | None = None) -> dict:
    """One seq_len's figures. ``aligned`` (align, cp, tp, sequence_parallel, fp8): the
    packers get the segments rounded up to the alignment, as ``pack`` gives them, and the
    report says what the alignment costs (pad tokens; packs against the unaligned ones)."""
    from ..formats.packed.layout import align_up
    from ..metrics import pack_metrics
    from ..pack.plan import make_segments
    from ..seeds import rng

    k = alignment_at(seq_len, aligned)
    segs = make_segments(lengths, seq_len, overflow)
    seg = segs.length  # the non-empty segments; the packers get the planner's table
    n = seg.size
    kept = int(seg.sum())
    base = pack_metrics(seg, seq_len, 0)
    rep = {
        "seq_len": seq_len,
        "overflow": overflow,
        "n_overlong": segs.counts["n_overlong"],
        "n_segments": n,
        "padding_waste": 1.0 - kept / (n * seq_len) if n else 0.0,
        "batch_padding_waste": batch_padding_waste(
            seg, seq_len, batch_size, rng(seed, "stats.batches").permutation(n)),
        "batch_padding_waste_grouped": batch_padding_waste(
            seg, seq_len, batch_size, np.argsort(seg, kind="stable")),
        "max_speedup": n * seq_len / kept if kept else 1.0,
        "lower_bound_packs": base["lower_bound_packs"],
        "l2_bound_packs": base["l2_bound_packs"],
        "best_bound_packs": base["best_bound_packs"],
        "tokens": kept,
        "counts": segs.counts,
    }
    if k > 1:
        padded = int(align_up(seg, k).sum())
        rep.update(align=k, align_tokens=padded - kept,
                   align_overhead=(padded - kept) / kept if kept else 0.0,
                   lower_bound_packs_aligned=-(-padded // seq_len))
    if algos:
        rep["algos"] = compare_algos(segs.table_length, seq_len, algos, seed,
                                     algo_options or {}, k)
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
                  algo_options: dict | None = None, align: int = 1) -> list[dict]:
    """Run each packer on the segments as ``pack`` would (rounded up to ``align``); kernels
    compiled before timing. With ``align`` > 1 each row also gives the plain packs, neither
    aligned nor capped (``packs_unaligned``), with ``max_docs`` those without the cap, aligned
    as asked (``packs_uncapped``): what each costs in packs."""
    from .._numba import compile_seconds
    from .._progress import shown
    from ..formats.packed.balance import step_imbalance
    from ..formats.packed.layout import align_up
    from ..metrics import pack_metrics
    from ..packers import PACKERS, PackerOptions, run_packer

    given = {k: v for k, v in (algo_options or {}).items() if v not in (None, False)}
    unread = set(given) - set().union(*(PACKERS[a].options for a in algos))
    if unread:
        raise PacktoolError(f"none of the packers compared reads "
                            f"{', '.join('--' + k.replace('_', '-') for k in sorted(unread))}")
    rows = []
    real = np.asarray(seg_lengths)
    seg_lengths = align_up(real, align)
    nonempty = np.asarray(seg_lengths)[np.asarray(seg_lengths) > 0]
    for algo in algos:
        opts = PackerOptions(seed=seed, **{k: v for k, v in given.items()
                                           if k in PACKERS[algo].options})
        skipped = _skipped(algo, given, opts, nonempty, seq_len)
        if skipped:
            rows.append({"algo": algo, "packs": None, "skipped": skipped})
            continue
        with compile_seconds() as spent:  # kernels compile on first use: timed apart
            with shown(False):  # no progress line: it named this warm-up's L=4, not -L
                run_packer(np.array([1, 2, 3], np.int64), 4, algo, opts)  # compile kernels
            warm = spent()
            t0 = time.perf_counter()
            packing = run_packer(seg_lengths, seq_len, algo, opts)
            seconds = time.perf_counter() - t0 - (spent() - warm)
        compile_time = spent()
        rep = packing.report
        m = pack_metrics(real, seq_len, rep.n_packs)
        placed = packing.packs >= 0
        costs = np.bincount(packing.packs[placed], weights=real[placed].astype(
            np.float64) ** 2, minlength=rep.n_packs)
        rows.append({**_costs_of(real, seg_lengths, seq_len, algo, opts, align),
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


def _costs_of(real, seg_lengths, seq_len: int, algo: str, opts, align: int) -> dict:
    """The packs without the alignment, and without the --max-docs cap: what each costs."""
    from ..packers import run_packer

    out = {}
    if align > 1:  # plain: neither the alignment nor the cap
        out["packs_unaligned"] = run_packer(real, seq_len, algo, replace(
            opts, max_docs=None)).report.n_packs
    if opts.max_docs:
        out["packs_uncapped"] = run_packer(seg_lengths, seq_len, algo, replace(
            opts, max_docs=None)).report.n_packs
    return out


def _skipped(algo: str, given: dict, opts, nonempty: np.ndarray, seq_len: int) -> str | None:
    """Why ``algo`` is left out of the comparison (a pair pack refuses, or an nnlshp depth
    that cannot reach a useful efficiency), or None."""
    from ..packers import PACKERS, depth_capped_efficiency

    if given.get("max_docs") and "max_docs" not in PACKERS[algo].options:
        return ("it takes no --max-docs (pack refuses the pair); its --max-depth caps "
                "documents per pack" if algo in ("spfhp", "nnlshp") else
                "it takes no --max-docs (pack refuses the pair)")
    depth = opts.max_depth or {"nnlshp": 3, "spfhp": 12}.get(algo)
    if algo == "nnlshp" and nonempty.size:
        cap = depth_capped_efficiency(nonempty, seq_len, depth)
        if cap < HOPELESS:
            return (f"at --max-depth {depth} no packing can pass {100 * cap:.1f}% efficiency "
                    f"(documents average {nonempty.mean():,.0f} tokens, L = {seq_len:,}); "
                    "raise --max-depth or use bfd/optimal")
    return None


def parse_algos(spec: str | None) -> list[str]:
    from ..packers import PACKERS

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
                  overflow: str = "split", aligned: dict | None = None) -> dict:
    """The full report for a corpus given its document lengths (JSON-ready dict)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if batch_size < 1:
        raise PacktoolError(f"--batch-size must be >= 1, got {batch_size}")
    if not seq_lens or min(seq_lens) < 1:
        raise PacktoolError("--seq-len values must be positive")
    from ..packers import check_seq_len_memory

    check_seq_len_memory(max(seq_lens), algos or [])
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
                                    overflow, aligned) for L in seq_lens],
    }


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


def step_plan_report(lengths: np.ndarray, spec: str, seed: int = 0) -> dict:
    """``--step-plan WORLD:MAX_TOKENS[:SEQS]``: the lengths planned as training steps of SEQS
    sequences (default: all of them in one step) over WORLD ranks, micro-batches of at most
    MAX_TOKENS tokens (:mod:`packtool.packers.step`, what ``packtool.plan_step`` computes):
    micro-batches per rank, max/mean rank attention cost and tokens (mean and worst over the
    steps), and the CPU time of one plan (the kernels' loading or compiling not counted)."""
    from ..packers.step import plan_lengths

    parts = spec.split(":")
    try:
        world, max_tokens, *rest = (int(p.replace(",", "")) for p in parts)
        per_step = rest[0] if rest else len(lengths)
    except ValueError:
        world = -1
    if len(parts) not in (2, 3) or world < 1 or max_tokens < 1 or per_step < 1:
        raise PacktoolError(f"--step-plan {spec!r}: give WORLD:MAX_TOKENS[:SEQS], e.g. "
                            "--step-plan 64:16384 (64 ranks, micro-batches of 16,384 tokens) "
                            "or 64:16384:8192 (steps of 8,192 sequences)")
    figures = []
    plan_lengths(np.ones(1, np.int64), max_tokens=1, world_size=1)  # load the kernels first
    for start in range(0, len(lengths), per_step):
        t = time.process_time()
        p = plan_lengths(lengths[start:start + per_step], max_tokens=max_tokens,
                         world_size=world, seed=seed)
        figures.append((p.m, p.imbalance(p.costs), p.imbalance(p.tokens),
                        time.process_time() - t))
    m, cost, tok, cpu = (np.array(f, np.float64) for f in zip(*figures, strict=True))
    return {"world_size": world, "max_tokens": max_tokens, "sequences_per_step": per_step,
            "steps": len(figures), "micro_batches": [int(m.min()), int(m.max())],
            "cost_imbalance": [float(cost.mean()), float(cost.max())],
            "token_imbalance": [float(tok.mean()), float(tok.max())],
            "ms_per_plan": float(cpu.mean() * 1e3)}
