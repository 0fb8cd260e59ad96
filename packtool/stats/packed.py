"""Figures of a packed dataset, from its index and segment tables (no token is read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .corpus import ATTN_RANKS


def packed_report(directory: str | Path) -> dict:
    """Report for a packed dataset from index.json and the small per-pack arrays only."""
    from ..formats.packed import open_packed
    from ..formats.packed.layout import align_up

    ds = open_packed(directory)
    idx = ds.index
    seg_per_pack, fill = [], []
    n_seqs = 0
    for k in range(ds.n_shards):  # the segment tables only: no token is read
        sh = ds.shard(k)
        if "seg_role" in sh.arrays:  # pairs and groups: a sequence is a segment of role > 0
            n_seqs += int(np.count_nonzero(np.asarray(sh.arrays["seg_role"]) > 0))
        seg_per_pack.append(np.diff(np.asarray(sh.pack_seg, np.int64)))
        if ds.align > 1:  # a row's fill counts its pads: what the kernels compute
            fill.append(np.add.reduceat(align_up(sh.seg_length, ds.align),
                                        np.asarray(sh.pack_seg[:-1], np.int64))
                        if sh.n_packs else np.zeros(0, np.int64))
        else:
            fill.append(np.diff(sh.po))
    seg_per_pack = np.concatenate(seg_per_pack) if seg_per_pack else np.empty(0, np.int64)
    fill = np.concatenate(fill) / idx["seq_len"] if fill else np.empty(0)
    keys = ("n_packs", "n_tokens", "n_segments", "efficiency", "lower_bound_packs", "gap_percent",
            "l2_bound_packs", "lp_bound_packs", "lp_converged", "best_bound_packs",
            "gap_to_best_bound_percent", "packing_factor", "seq_len", "algo", "overflow",
            "layout", "n_docs", "n_empty", "n_overlong", "n_split", "n_split_pieces",
            "n_truncated", "n_truncated_tokens", "n_dropped", "n_dropped_tokens") + (
                ("align", "pad_id", "n_align_tokens") if ds.align > 1 else ())
    rep = {"kind": "packed", "source": str(directory), **{k: idx.get(k) for k in keys}}
    rep["sources"] = [{k: src.get(k) for k in ("prefix", "n_docs", "n_tokens", "factor",
                                               "docs_used", "tokens_used", "token_share")}
                      for src in idx["sources"]]
    rep["held_out"] = idx.get("held_out")
    if ds.vsl is not None:  # rows per slot length: a row's fill is against its own slot
        rep["vsl"] = {**idx["vsl"], "n_tokens": idx["n_tokens"]}
        fill = np.concatenate([np.diff(ds.shard(k).po) for k in range(ds.n_shards)]
                              or [np.empty(0)]) / np.maximum(ds.row_lengths(), 1)
    if idx.get("groups"):
        g = idx["groups"]
        rep["groups"] = {**g, "n_groups_packed": g["n_groups"] - g["n_dropped_groups"],
                         "n_sequences": n_seqs,
                         "n_shared_prompts": rep["n_segments"] - n_seqs}
    values, counts = np.unique(seg_per_pack, return_counts=True)
    rep["segments_per_pack"] = {**_dist(seg_per_pack), "counts": {
        str(int(v)): int(c) for v, c in zip(values, counts, strict=True)}}
    rep["pack_fill"] = _dist(fill)
    from ..formats.packed.balance import attention_costs, step_imbalance

    costs = attention_costs(ds, vision=0.0)  # the language term (images: image_report)
    rep["attention_imbalance"] = step_imbalance(costs, ATTN_RANKS)
    rep["attention_imbalance_balanced"] = step_imbalance(costs, ATTN_RANKS, balanced=True)
    if ds.images[0]:
        rep["images"] = image_report(ds, costs)
    return rep


def image_report(ds, costs: np.ndarray) -> dict:
    """Rows with images: images per row, the image tokens' share of the tokens, the vision
    encoder's share of the cost (sum of t (h w)^2 over images beside sum l^2), and the step
    imbalance of the vision cost and of both together (8 ranks, balanced on both)."""
    from ..formats.packed.balance import step_imbalance

    im = ds.image_sums()
    total = costs + im["cost"]
    n_tokens = max(int(ds.index["n_tokens"]), 1)
    return {"n_images": int(im["images"].sum()), "n_image_tokens": int(im["tokens"].sum()),
            "images_per_row": _dist(im["images"]),
            "vision_token_share": float(im["tokens"].sum() / n_tokens),
            "vision_cost_share": float(im["cost"].sum() / max(total.sum(), 1.0)),
            "vision_imbalance": step_imbalance(im["cost"], ATTN_RANKS),
            "vision_imbalance_balanced_on_text": _imbalance_on(costs, im["cost"]),
            "total_imbalance_balanced": step_imbalance(total, ATTN_RANKS, balanced=True)}


def _imbalance_on(order_by: np.ndarray, costs: np.ndarray) -> float:
    """The step imbalance of ``costs`` when the steps are balanced on ``order_by`` (what a
    sampler balancing on text alone leaves of the vision work)."""
    from ..formats.packed.balance import balance_steps, like_cost_order
    from ..seeds import rng

    g = ATTN_RANKS
    if not len(costs) or not costs.any():
        return 1.0
    order = like_cost_order(rng(0, "stats.imbalance").permutation(len(costs)), order_by, g)
    order = np.resize(order, -(-len(order) // g) * g)
    slots = balance_steps(order_by[order].reshape(-1, g), g, 1).reshape(-1, g)
    steps = np.take_along_axis(costs[order].reshape(-1, g), slots, axis=1)
    mean = steps.mean(axis=1)
    ok = mean > 0
    return float((steps.max(axis=1)[ok] / mean[ok]).mean())


def _dist(x: np.ndarray) -> dict:
    if x.size == 0:
        return {"min": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "max": 0}
    p10, p50, p90 = np.percentile(x, [10, 50, 90])
    return {"min": float(x.min()), "p10": float(p10), "mean": float(x.mean()), "p50": float(p50),
            "p90": float(p90), "max": float(x.max())}
