"""The reports as text (and the length plot)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import PacktoolError
from .corpus import advice
from .groups import groups_advice, groups_text, prefix_text

BARS = " ▏▎▍▌▋▊▉█"

def _bar(value: float, width: int) -> str:
    full = value * width
    n = int(full)
    frac = int((full - n) * 8)
    return ("█" * n + (BARS[frac] if frac and n < width else "")).ljust(width)


def render_corpus(rep: dict) -> str:
    L = rep["length"]
    unit = "groups" if "groups" in rep else "documents"  # a group is one item to the packer
    out = [
        f"{rep['source'] or 'lengths'}: {rep['n_docs']:,} {unit}, {rep['n_tokens']:,} "
        f"tokens, {rep['n_empty']:,} empty",
        *(groups_text(rep) if "groups" in rep else []),
        *(prefix_text(rep) if "share_prefix" in rep else []),
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
    policy = ("refused, as pack does (a group is never cut; --overflow drop drops them)"
              if rep["overflow"] == "refuse" else f"--overflow {rep['overflow']} (as pack does)")
    out += ["", f"{unit} longer than seq_len: {policy}",
            f"{'seq_len':>8} {'overlong':>10} {'segments':>10} {'pad waste':>10} "
            f"{'batch' + str(B):>9} {'grouped':>8} {'max speedup':>12} {'min packs':>12}"]
    for s in rep["seq_lens"]:
        out.append(f"{s['seq_len']:>8,} {s['n_overlong']:>10,} {s['n_segments']:>10,} "
                   f"{100 * s['padding_waste']:>9.2f}% {100 * s['batch_padding_waste']:>8.2f}% "
                   f"{100 * s['batch_padding_waste_grouped']:>7.2f}% "
                   f"{s['max_speedup']:>11.3f}x "
                   f"{s.get('best_bound_packs', s['lower_bound_packs']):>12,}")
    for s in rep["seq_lens"]:
        if "align" in s:
            out.append(f"  at {s['seq_len']:,}: segments aligned to {s['align']} add "
                       f"{s['align_tokens']:,} pad tokens ({100 * s['align_overhead']:.2f}% of "
                       f"the tokens); L1 bound {s['lower_bound_packs_aligned']:,} packs aligned")
    for s in rep["seq_lens"]:
        if "algos" in s:
            out += _render_algos(s, B, rep.get("groups"))
    return "\n".join(out)


def _costs(a: dict, s: dict) -> list[str]:
    """What the alignment and the --max-docs cap cost a packer, in packs."""
    out = []
    both = "packs_unaligned" in a and "packs_uncapped" in a
    if "packs_unaligned" in a:
        out.append(f"aligned to {s['align']}{' and capped' if both else ''}: {a['packs']:,} "
                   f"packs vs {a['packs_unaligned']:,} "
                   f"{'neither aligned nor capped' if both else 'unaligned'} "
                   f"(+{a['packs'] - a['packs_unaligned']:,})")
    if "packs_uncapped" in a:
        out.append(f"--max-docs cap: {a['packs']:,} packs vs {a['packs_uncapped']:,} uncapped"
                   f"{', aligned alike' if both else ''} "
                   f"(+{a['packs'] - a['packs_uncapped']:,})")
    return [f"  {a['algo']}: " + "; ".join(out)] if out else []


def _render_algos(s: dict, batch_size: int, groups: dict | None = None) -> list[str]:
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
                   f"{a['compile_seconds']:>8.3f} " + _attn(a))
        notes += _costs(a, s) + [f"  warning: {w}" for w in a.get("warnings", [])]
    out.append("  attn 8x1: max/mean rank attention cost (sum of squared segment lengths), "
               "8 ranks x 1 pack per step,")
    out.append("  mean over steps: shuffled -> PackSampler(balance='attention')")
    best = next((a for a in s["algos"] if a.get("packs") is not None), None)
    if best and groups:
        out.append(f"  {groups_advice(best, batch_size)}")
    elif best:
        out.append(f"  advice: {advice(best['packing_factor'], batch_size)}")
    return out + notes


def _attn(a: dict) -> str:
    if a["attention_imbalance"] is None:  # a grouped corpus: its items are not segments
        return f"{'-':>13}"
    return f"{a['attention_imbalance']:>6.2f}->{a['attention_imbalance_balanced']:.2f}"


def _overflow_line(rep: dict) -> str:
    """What the overflow policy did; a group is never cut, so for pairs and groups only what
    was dropped (an index written before 2026-11-27 records "split" for "refuse")."""
    if not rep.get("groups"):
        return (f"overflow ({rep['overflow']}): {rep['n_overlong']:,} over-long documents; "
                f"split {rep['n_split']:,} into {rep['n_split_pieces']:,} pieces, truncated "
                f"{rep['n_truncated']:,} (-{rep['n_truncated_tokens']:,} tokens), dropped "
                f"{rep['n_dropped']:,} ({rep['n_dropped_tokens']:,} tokens); "
                f"{rep['n_empty']:,} empty documents skipped")
    policy = "drop" if rep["overflow"] == "drop" else "refuse"
    return (f"overflow ({policy}): groups over seq_len "
            + (f"dropped whole: {rep['groups']['n_dropped_groups']:,} groups "
               f"({rep['n_dropped']:,} sequences, {rep['n_dropped_tokens']:,} tokens)"
               if policy == "drop" else "refused (none was packed or cut)")
            + f"; {rep['n_empty']:,} empty sequences skipped")


def render_packed(rep: dict) -> str:
    from ..metrics import bounds_text

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
        *([f"segments aligned to {rep['align']}: {rep['n_align_tokens']:,} pad tokens of id "
           f"{rep['pad_id']} ({100 * rep['n_align_tokens'] / max(rep['n_tokens'], 1):.2f}%; "
           "pack fill counts them)"] if rep.get("align") else []),
        _overflow_line(rep),
    ]
    for src in rep["sources"]:
        factor = 1.0 if src["factor"] is None else src["factor"]
        lines.append(f"source {src['prefix']}: x{factor:g}, {src['docs_used'] or 0:,} of "
                     f"{src['n_docs']:,} documents, {src['tokens_used'] or 0:,} tokens used of "
                     f"{src['n_tokens']:,}, {100 * (src['token_share'] or 0):.2f}% of the "
                     "packed tokens")
    if rep.get("groups"):
        g = rep["groups"]
        lines.append(f"{g['kind']}: {g['n_groups_packed']:,} groups whole in their rows "
                     f"({g['n_dropped_groups']:,} dropped over --seq-len), {g['n_sequences']:,}"
                     " sequences" + (f", {g['n_shared_prompts']:,} prompts stored once "
                                     "(--share-prompt)" if g["share_prompt"] else ""))
    if rep.get("images"):
        v = rep["images"]
        ip = v["images_per_row"]
        lines += [f"images: {v['n_images']:,} ({v['n_image_tokens']:,} image tokens, "
                  f"{100 * v['vision_token_share']:.1f}% of the tokens), per row: min "
                  f"{ip['min']:.0f}  p50 {ip['p50']:.0f}  mean {ip['mean']:.2f}  max "
                  f"{ip['max']:.0f}",
                  f"vision encoder: {100 * v['vision_cost_share']:.1f}% of the cost (sum of "
                  f"patches^2 beside sum l^2); its max/mean rank shuffled "
                  f"{v['vision_imbalance']:.2f}, balanced on text "
                  f"{v['vision_imbalance_balanced_on_text']:.2f}, both balanced on both "
                  f"{v['total_imbalance_balanced']:.2f}"]
    if rep.get("held_out"):
        h = rep["held_out"]
        lines.append(f"held out: {h['n_docs_held_out']:,} documents in {h['path']}/ "
                     f"({h['n_packs']:,} packs, {h['n_tokens']:,} tokens)")
    return "\n".join(lines)


def plot_corpus(rep: dict, lengths: np.ndarray, path: str | Path) -> None:
    if "groups" in rep:  # its figures are of groups, the lengths of sequences
        raise PacktoolError("--plot draws documents' lengths; a corpus of pairs or groups is "
                            "reported as groups: drop --plot")
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
