"""``stats`` of a corpus of pairs or groups (token format version 4): the report of the items
``pack`` plans, one a group of its total length (with ``--share-prompt`` its prompt once plus
each completion: :func:`packtool.pack.pairs.group_lengths`), so the predicted packs are the
packs ``pack`` writes. A group is never split: one longer than a seq_len is dropped and
counted with ``--overflow drop``, and otherwise makes ``pack`` refuse at that seq_len, which
the report says (``refused``) instead of predicting packs of pieces that will never exist."""

from __future__ import annotations

import numpy as np

from .. import conflicts
from ..metrics import packing_factor
from .corpus import ALIGN_OPTIONS, corpus_report


def grouped_report(lengths: np.ndarray, table, share: bool, seq_lens, batch_size: int,
                   algos: list[str], seed: int, options: dict, aligned: dict, source: str,
                   overflow: str) -> dict:
    """The corpus report of a grouped corpus's items, with its ``groups`` figures and, per
    seq_len, the groups over it and whether ``pack`` refuses there."""
    from ..pack.pairs import group_lengths, group_overflow

    conflicts.check({"groups"} | ({"max_docs"} if options.get("max_docs") else set())
                    | ({"align"} if any(aligned.get(k) for k in ALIGN_OPTIONS) else set()))
    overflow = group_overflow(overflow)  # what pack does: "drop" or "refuse"
    items = group_lengths(lengths, table, share)
    rep = corpus_report(items, seq_lens, batch_size, algos, seed, options, source, "drop")
    per_group = np.bincount(table.group, minlength=table.n_groups)  # sequences of each group
    rep["overflow"] = overflow
    rep["groups"] = {"kind": table.kind, "share_prompt": bool(share),
                     "n_groups": table.n_groups, "n_sequences": int(lengths.size),
                     "n_sequence_tokens": int(lengths.sum()), "n_tokens": int(items.sum())}
    for s in rep["seq_lens"]:
        s["overflow"] = overflow
        s["refused"] = overflow == "refuse" and s["n_overlong"] > 0
        if s["refused"]:  # pack writes nothing at this seq_len: no packs to predict
            s.pop("algos", None)
        kept = items <= s["seq_len"]
        for a in s.get("algos", []):  # the costs of items, not of the rows' sequences
            a["attention_imbalance"] = a["attention_imbalance_balanced"] = None
            if a.get("packs") is not None:  # the packing factor counts sequences, as pack's
                a["groups_per_pack"] = a["packing_factor"]
                a["packing_factor"] = packing_factor(int(per_group[kept].sum()), a["packs"])
    return rep


def groups_advice(best: dict, batch_size: int) -> str:
    """What a pack holds in sequences (the packing factor) and groups."""
    factor, per_pack = best["packing_factor"], best["groups_per_pack"]
    return (f"packing factor {factor:.2f}: a pack holds {factor:.2f} sequences in "
            f"{per_pack:.2f} groups; a batch of {batch_size} groups is "
            f"{batch_size / per_pack:.2f} packs (attention costs are not predicted for groups: "
            "run stats on the packed dataset)")


def groups_text(rep: dict) -> list[str]:
    """The lines a grouped corpus report adds to the text report."""
    g = rep["groups"]
    what = "pairs" if g["kind"] == "pairs" else "groups of completions"
    saved = g["n_sequence_tokens"] - g["n_tokens"]
    out = [f"{g['n_groups']:,} {what} of {g['n_sequences']:,} sequences "
           f"({g['n_sequence_tokens']:,} tokens); each group one item of its total length"
           + (f", its prompt stored once (--share-prompt): {g['n_tokens']:,} tokens, "
              f"{100 * saved / max(g['n_sequence_tokens'], 1):.1f}% fewer" if g["share_prompt"]
              else "")]
    for s in rep["seq_lens"]:
        if s["refused"]:
            out.append(f"  at {s['seq_len']:,}: {s['n_overlong']:,} group(s) longer: pack "
                       "refuses (a group is never split); raise --seq-len"
                       + ("" if g["share_prompt"] else ", pass --share-prompt")
                       + " or --overflow drop")
    return out


def prefix_stats(result, paths, lengths_file, seq_lens, algos, options: dict,
                 share_prefix: bool = False, min_shared: int | None = None) -> None:
    """``stats --share-prefix``: ``result``'s report gains ``share_prefix``
    (:func:`prefix_report`), refused as ``pack`` refuses."""
    from ..errors import PacktoolError
    from ..formats.tokens.groups import group_table
    from ..pack import open_sources

    aligned = any(options.get(k) for k in ALIGN_OPTIONS)
    conflicts.check({"share_prefix"} | {k for k in ("vsl", "max_docs", "share_prompt")
                                        if options.get(k)} | ({"align"} if aligned else set()))
    if not share_prefix:
        raise PacktoolError(f"--min-shared {min_shared} sets what --share-prefix shares: add "
                            "--share-prefix, or drop --min-shared")
    if lengths_file or result.report["kind"] == "packed":
        raise PacktoolError("--share-prefix needs the tokens (records that begin alike): "
                            "pass token-file prefixes, not --lengths or a packed dataset")
    corpora = open_sources(list(paths))
    result.report["share_prefix"] = prefix_report(
        corpora, result.lengths, group_table(corpora), seq_lens, options.get("seed", 0),
        options.get("overflow", "split"), min_shared,
        "bfd" if algos in (None, "all") else algos.split(",")[0])


def prefix_report(corpora: list, lengths: np.ndarray, table, seq_lens, seed: int,
                  overflow: str, min_shared: int | None, algo: str) -> dict:
    """``stats --share-prefix``: per seq_len, the packs and tokens ``pack --share-prefix``
    writes, from its own planner (:func:`packtool.pack.trees.plan_trees`, no disk), so the
    prediction is exact: tokens stored against each record whole, and the packs."""
    from ..errors import PacktoolError
    from ..options import PackOptions
    from ..pack.trees import MIN_SHARED, corpus_reader, plan_trees

    read = corpus_reader(corpora)
    out = []
    for L in seq_lens:
        opts = PackOptions(seq_len=int(L), share_prefix=True, min_shared=min_shared,
                           overflow=overflow, seed=seed, algo=algo)
        try:
            lay = plan_trees(lengths, opts, table, read)
        except PacktoolError as e:  # what pack refuses at this seq_len, said
            out.append({"seq_len": int(L), "refused": str(e)})
            continue
        t = lay.trees
        out.append({"seq_len": int(L), "refused": None, "n_packs": lay.n_packs,
                    "n_tokens_flat": t["n_tokens_flat"], "n_tokens": t["n_tokens_stored"],
                    "tokens_saved": t["n_tokens_flat"] - t["n_tokens_stored"],
                    "ratio": t["n_tokens_flat"] / max(t["n_tokens_stored"], 1),
                    "efficiency": t["n_tokens_stored"] / max(lay.n_packs * int(L), 1),
                    "n_trees": t["n_trees"], "n_split_trees": t["n_split_trees"],
                    "n_shared_segments": t["n_shared_segments"],
                    "n_dropped": lay.counts["n_dropped"]})
    return {"min_shared": min_shared or MIN_SHARED, "algo": algo, "seq_lens": out}


def prefix_text(rep: dict) -> list[str]:
    """The lines ``stats --share-prefix`` adds to the text report."""
    t = rep["share_prefix"]
    out = [f"--share-prefix (--min-shared {t['min_shared']}, {t['algo']}): what pack writes"]
    for s in t["seq_lens"]:
        if s["refused"]:
            out.append(f"  at {s['seq_len']:,}: pack refuses: {s['refused']}")
            continue
        out.append(f"  at {s['seq_len']:,}: {s['n_packs']:,} packs, {s['n_tokens']:,} tokens "
                   f"stored of {s['n_tokens_flat']:,} ({s['ratio']:.2f}x fewer, "
                   f"{s['tokens_saved']:,} saved), efficiency {s['efficiency']:.4f}, "
                   f"{s['n_trees']:,} trees ({s['n_split_trees']:,} record sets cut to fit)")
    return out
