"""What ``index.json`` says besides the format's own keys and the shards: the options, the
counts and figures of the plan, and per source where it is and what the packs use of it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import PacktoolError
from ..formats.packed import VALID, mask_storage, v2_dtypes
from ..formats.packed.costs import COST_RATIO
from ..metrics import histogram_metrics
from ..options import Order
from ..storage import local_file, relative
from .pairs import group_overflow
from .plan import PackLayout, PackOptions

METRIC_KEYS = ("efficiency", "lower_bound_packs", "gap_percent", "l2_bound_packs",
               "lp_bound_packs", "lp_converged", "best_bound_packs",
               "gap_to_best_bound_percent", "packing_factor")


def balance_entry(order: Order) -> dict | None:
    if order.balance == "none":
        return None
    return {"objective": order.balance, "ranks": order.balance_ranks}


def histogram(layout: PackLayout, chunk: int = 1 << 22) -> np.ndarray:
    """How many segments have each length 0..seq_len (over every copy round), a chunk at a
    time (bincount of the whole table made an int64 copy of it: 8 B a document, 4 s at 1e8)."""
    size = layout.options.seq_len + 1
    out = np.zeros(size, np.int64)
    for r in layout.rounds:
        for a in range(0, r.table_length.size, chunk):
            out += np.bincount(r.table_length[a:a + chunk], minlength=size)
    return out


def metrics(layout: PackLayout) -> dict:
    rep = layout.report
    seqs = None
    if getattr(layout, "trees", None):  # a shared segment: a segment, not a sequence
        r = layout.rounds[0]
        seqs = int(np.count_nonzero((r.table_length > 0) & (r.role != 0)))
    return histogram_metrics(histogram(layout), layout.options.seq_len, layout.n_packs,
                             rep.lp_bound, rep.lp_converged, seqs)


def storage(corpora: list, options: PackOptions, longest: int) -> dict:
    """The dtypes and mask storage of a dataset of these sources (``longest``: their longest
    document), from bounds known before any pack is made (so every task of a distributed run
    picks the same)."""
    token_dtype = max((c.dtype for c in corpora), key=lambda d: d.itemsize)
    vocab = max(int(c.meta.get("vocab_size") or 0) for c in corpora) or 1
    n_docs = sum(len(c) for c in corpora)
    dtypes = v2_dtypes(token_dtype=token_dtype, seq_len=options.seq_len, n_docs=n_docs,
                       max_doc_len=longest,
                       max_shard_tokens=options.shard_size + options.seq_len)
    if options.share_prefix and not any(c.groups for c in corpora):  # a record set's index
        dtypes["group"] = dtypes["document"]
    elif any(c.groups for c in corpora):  # a segment's group: one index over the sources
        from ..formats.packed.schema import narrowest

        dtypes["group"] = narrowest(max(sum(c.groups["n_groups"] for c in corpora if c.groups)
                                        - 1, 1))
    has_mask = any(c.has_mask for c in corpora)
    stored = None
    if has_mask:
        stored = "source" if options.layout == "index" else mask_storage(token_dtype, vocab)
    return {"dtypes": {k: np.dtype(v).str for k, v in dtypes.items()},
            "token_dtype": token_dtype.name, "vocab_size": vocab, "loss_mask": has_mask,
            "mask_storage": stored, **align_entry(options, corpora, vocab)}


def align_entry(options: PackOptions, corpora: list, vocab: int) -> dict:
    """index.json's alignment keys (none without alignment, so an unaligned dataset's index
    is what it was): K, the pads' token id, and the parallel sizes that set K."""
    k = options.alignment
    if k == 1:
        return {}
    pad, pad_from = ((options.pad_id, "option") if options.pad_id is not None
                     else default_pad_id(corpora))
    if pad >= vocab:
        raise PacktoolError(f"--pad-id {pad:,} is outside the sources' id space of {vocab:,} "
                            f"tokens; pass an id below {vocab:,} (the tokenizer's pad or eos)")
    return {"align": k, "pad_id": int(pad), "pad_from": pad_from,
            "parallel": {"cp": options.cp, "tp": options.tp,
                         "sequence_parallel": options.sequence_parallel, "fp8": options.fp8}}


def default_pad_id(corpora: list) -> tuple[int, str]:
    """The id alignment pads carry when --pad-id is not given, and where it came from
    (index.json's ``pad_from``, which ``verify --source`` recomputes): the tokenizer's pad
    token (its tokenizer_config.json beside the tokenizer.json the corpus recorded), else its
    eos token ("tokenizer"), else the eos id tokenize appended (--eos: "eos"). Pads are
    never trained on (labels -100) nor seen by a real token (they follow it, under a causal
    mask), so any id in the vocabulary is correct; these are the ids a model's embedding
    expects there."""
    meta = corpora[0].meta
    found = _config_special(meta.get("tokenizer", {}).get("path"))
    if found is not None:
        return found, "tokenizer"
    if meta.get("eos_id") is not None:
        return int(meta["eos_id"]), "eos"
    raise PacktoolError(
        f"--align: no pad id known for {corpora[0].prefix} (its tokenizer "
        f"{meta.get('tokenizer', {}).get('path')!r} has no readable tokenizer_config.json "
        "with a pad or eos token, and it was tokenized without --eos): pass --pad-id ID")


def _config_special(path) -> int | None:
    """The pad (else eos) token's id from the tokenizer_config.json beside a local
    tokenizer.json, looked up in that tokenizer.json's added tokens (None if either is
    missing)."""
    import json

    tok = local_file(str(path)) if path else None
    if tok is None:
        return None
    try:
        config = json.loads((tok.parent / "tokenizer_config.json").read_text())
        added = {t["content"]: int(t["id"]) for t in
                 json.loads(tok.read_text()).get("added_tokens", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    for key in ("pad_token", "eos_token"):
        name = config.get(key) if isinstance(config, dict) else None
        name = name.get("content") if isinstance(name, dict) else name
        if isinstance(name, str) and name in added:
            return added[name]
    return None


def index_meta(layout: PackLayout, corpora: list, factors: list[float], split: str,
               held_out: dict | None, folder: Path, stored: dict) -> dict:
    """Everything index.json says besides the format's own keys and the shards."""
    opts, rep = layout.options, layout.report
    return {"layout": opts.layout, "seq_len": opts.seq_len, "algo": opts.algo,
            "algo_options": rep.options, "balance": balance_entry(opts.order), "seed": opts.seed,
            "shuffle": opts.shuffle, "overflow": recorded_overflow(layout), **stored,
            "group_docs": opts.group_docs, "n_packs": layout.n_packs, **layout.counts,
            **metrics(layout), "attention_imbalance": imbalance(layout), "cost_ratio": COST_RATIO,
            **({"cost_vision": 1.0} if any(c.vision for c in corpora) else {}),
            "solver": rep.to_json(),
            "split": split, "held_out": held_out,
            "sources": source_entries(layout, corpora, factors, folder), **vsl_entry(layout),
            **({"groups": layout.groups} if getattr(layout, "groups", None) else {}),
            **({"trees": layout.trees} if getattr(layout, "trees", None) else {})}


def recorded_overflow(layout: PackLayout) -> str:
    """What index.json (and pack's --json) records of --overflow: the option as given, or for
    pairs and groups, which are never cut, what was done with one over --seq-len: "refuse"
    (the default ``split`` too) or "drop"."""
    grouped = getattr(layout, "groups", None) or getattr(layout, "trees", None)
    return group_overflow(layout.options.overflow) if grouped else layout.options.overflow


def vsl_entry(layout: PackLayout) -> dict:
    """index.json's ``vsl`` key for a --vsl plan (none otherwise: a fixed-length dataset's
    index is what it was): rows per slot length, remnant rows, slot tokens."""
    vsl = layout.options.rows.vsl_bounds
    if vsl is None:
        return {}
    from .vsl import row_table, slot_lengths

    tokens = layout.pack_lengths()
    return {"vsl": row_table(slot_lengths(tokens, vsl[0]), tokens, layout.pack_nseg, vsl)}


def imbalance(layout: PackLayout, ranks: int | None = None) -> float | None:
    """Mean over blocks of ``ranks`` consecutive packs of max/mean attention cost: what one
    pack per rank per step costs in stragglers (docs/TRAINING.md), from the packs' costs
    the layout keeps (:meth:`PackLayout.pack_sums`)."""
    ranks = ranks or layout.options.balance_ranks
    costs = layout.pack_sums()[1]
    blocks = costs[:costs.size // ranks * ranks].reshape(-1, ranks)
    mean = blocks.mean(axis=1)
    ok = mean > 0
    return float((blocks.max(axis=1)[ok] / mean[ok]).sum()) / int(ok.sum()) if ok.any() \
        else None


HOLDOUT_RULE = 2  # 2: packtool.pack.mixture.holdout_counts (exact, never a source's last document)


def held_out_entry(options: PackOptions, v: dict) -> dict:
    return {"path": VALID, "valid_docs": options.valid_docs,
            "valid_fraction": options.valid_fraction, "rule": HOLDOUT_RULE,
            "n_docs_held_out": int(sum(s["docs_used"] for s in v["sources"])),
            "n_packs": v["n_packs"], "n_tokens": v["n_tokens"]}


def source_entries(layout: PackLayout, corpora: list, factors: list[float],
                   folder: Path) -> list[dict]:
    """Per source: where it is (as given, and relative to the dataset's folder ``folder``,
    so that moving both together keeps the link), what it had, its repeat factor, and what
    the packs use of it (document copies, tokens, and the share of all packed tokens),
    counted per copy round over the source's range of the segment table."""
    base = np.cumsum([0] + [len(c) for c in corpora]).astype(np.int64)
    tokens = np.zeros(len(corpora), np.int64)
    docs = np.zeros(len(corpora), np.int64)
    for r in layout.rounds:
        if hasattr(r, "group"):  # grouped: entries carry their document (packtool.pack.pairs)
            src = np.searchsorted(base, r.doc, side="right") - 1
            tokens += np.bincount(src, weights=r.table_length, minlength=len(corpora)).astype(
                np.int64)
            whole = (r.table_length > 0) & (r.role > 0)  # a sequence, not a shared prompt
            docs += np.bincount(src[whole], minlength=len(corpora))
            continue
        extra = np.concatenate([[0], np.cumsum(r.split_pieces - 1)])[
            np.searchsorted(r.split_docs, base, side="left")]
        first = base + extra  # each source's first table entry, then the end
        for k in range(len(corpora)):
            span = r.table_length[first[k]:first[k + 1]]
            tokens[k] += int(span.sum(dtype=np.int64))
            docs[k] += int(np.count_nonzero(span)) - int(extra[k + 1] - extra[k])
    all_tokens = max(int(tokens.sum()), 1)
    return [{**source_entry(c, folder), "factor": factors[k], "docs_used": int(docs[k]),
             "tokens_used": int(tokens[k]), "token_share": float(tokens[k]) / all_tokens}
            for k, c in enumerate(corpora)]


def source_entry(c, folder: Path) -> dict:
    prefix = local_file(c.prefix) or c.prefix
    return {"prefix": str(prefix), "path": relative(prefix, folder),
            "manifest_sha256": c.file_sha256,
            "n_docs": len(c), "n_tokens": c.n_tokens, "dtype": c.dtype.name,
            "tokenizer_sha256": c.meta["tokenizer"]["sha256"]}


def group_index_meta(combined: dict, options: PackOptions, corpora: list, factors: list[float],
                     split: str, held_out: dict | None, folder: Path, stored: dict) -> dict:
    """index.json's body for a dataset planned group by group (packtool.pack.streamed): the
    groups' counts, histograms and per-source use added up."""
    from ..packers import PackerReport

    seq_len = options.seq_len
    report = PackerReport(**{**combined["report"], "n_packs": combined["n_packs"],
                             "lp_value": None, "lp_bound": None, "lp_converged": None,
                             "warnings": combined["warnings"]})
    tokens, docs = combined["tokens_used"], combined["docs_used"]
    all_tokens = max(int(sum(tokens)), 1)
    sources = [{**source_entry(c, folder), "factor": factors[k], "docs_used": int(docs[k]),
                "tokens_used": int(tokens[k]), "token_share": tokens[k] / all_tokens}
               for k, c in enumerate(corpora)]
    return {"layout": options.layout, "seq_len": seq_len, "algo": options.algo,
            "algo_options": report.options, "balance": balance_entry(options.order),
            "seed": options.seed, "shuffle": options.shuffle,
            "overflow": options.overflow, **stored, "group_docs": options.group_docs,
            "n_packs": combined["n_packs"], **combined["counts"],
            **histogram_metrics(combined["hist"], seq_len, combined["n_packs"]),
            "attention_imbalance": combined["imbalance"], "solver": report.to_json(),
            "split": split, "held_out": held_out, "sources": sources}
