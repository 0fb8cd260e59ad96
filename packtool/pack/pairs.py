"""Planning a corpus of pairs or groups (token format version 4): every group is one item to
the packer, of its total length, so a group is never split across rows (nor ranks), and its
sequences sit together in their row, in order::

    plain layout     [ P C ][ P R ]            each sequence a segment: prompt + completion
    --share-prompt   [ P ][ C ][ R ]           the prompt once (role 0), then each completion
                                               (offset len(P) in its document)

A group longer than ``--seq-len`` cannot be split or truncated (its sequences would lose their
prompt or each other): it is refused unless ``--overflow drop``, which drops it and counts it.
Sharing stores P + C + R against 2P + C + R: with the prompt a third of P + C + R, a quarter
fewer tokens (scripts/bench_preference.py: 24.3% on 20,000 such pairs, 19.8% on
UltraFeedback-shaped ones, prompt 25%); of a group of G completions, (G - 1) x P tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import conflicts
from ..errors import PacktoolError
from ..formats.tokens.groups import GroupTable
from ..packers import run_packer
from .plan import (
    PackLayout,
    PackOptions,
    balanced_rank,
    order_segments,
    shard_starts,
    shuffle_rank,
)

PROMPT_ROLE = 0


@dataclass
class GroupSegments:
    """The segments of grouped documents, in group order (a shared prompt before its
    completions): a :class:`packtool.pack.plan.Segments` to the layout, whose table entries
    carry their document and offset explicitly, and their group and role."""

    table_length: np.ndarray   # int64 per entry (0: in a dropped group)
    doc: np.ndarray            # int64 per entry
    offset: np.ndarray         # int64 per entry
    group: np.ndarray          # int64 per entry
    role: np.ndarray           # uint16 per entry (0: a shared prompt)
    seq_len: int
    counts: dict = field(default_factory=dict)
    split_docs: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    split_pieces: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    n_dropped_groups: int = 0  # over seq_len with --overflow drop (not a group of 0 tokens)
    up: np.ndarray | None = None  # a tree's: entries back to the parent, within its item

    def locate(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = np.asarray(index, np.int64)
        return self.doc[index], self.offset[index]


def group_lengths(lengths: np.ndarray, table: GroupTable, share: bool) -> np.ndarray:
    """Each group's tokens as the packer sees it (one item a group): the sum of its
    sequences, or with ``share`` its prompt once plus each completion (``stats`` predicts
    the packs from these)."""
    lengths = np.asarray(lengths, np.int64)
    body = lengths - table.prompt if share else lengths
    items = np.bincount(table.group, weights=body, minlength=table.n_groups).astype(np.int64)
    if share and table.n_groups:
        items += table.prompt[table.first[:-1]]
    return items


def group_overflow(overflow: str) -> str:
    """What ``--overflow`` does to pairs and groups, which are never cut: "drop" (dropped and
    counted) or "refuse" (the default ``split`` too); ``truncate`` is refused by name."""
    if overflow == "truncate":
        conflicts.check({"groups", "truncate"})
    return "drop" if overflow == "drop" else "refuse"


def group_segments(lengths: np.ndarray, table: GroupTable, share: bool, seq_len: int,
                   overflow: str) -> tuple[GroupSegments, np.ndarray, np.ndarray]:
    """(segments, item per entry, item lengths): the table entries in group order and each
    group's tokens as the packer sees them; an over-long group refused or (``drop``)
    dropped."""
    lengths = np.asarray(lengths, np.int64)
    n_docs, n_groups = lengths.size, table.n_groups
    p_first = table.prompt[table.first[:-1]] if n_groups else np.zeros(0, np.int64)
    body = lengths - table.prompt if share else lengths
    items = group_lengths(lengths, table, share)
    over = np.flatnonzero(items > seq_len)
    if over.size and overflow != "drop":
        g = int(over[0])
        raise PacktoolError(
            f"{over.size:,} group(s) longer than --seq-len {seq_len:,}: group {g:,} (documents "
            f"{int(table.first[g]):,}-{int(table.first[g + 1]) - 1:,}) holds {int(items[g]):,} "
            f"tokens{' with its prompt shared' if share else ''}; a group is never split or "
            "truncated: raise --seq-len, " + ("" if share else "pass --share-prompt, ")
            + "or pass --overflow drop to drop such groups (counted)")
    doc = np.arange(n_docs, dtype=np.int64)
    if share:  # before each group's first document, its prompt
        at = table.first[:-1] + np.arange(n_groups)
        n = n_docs + n_groups
        is_p = np.zeros(n, bool)
        is_p[at] = True
        seg_doc, seg_off = np.empty(n, np.int64), np.empty(n, np.int64)
        seg_doc[is_p], seg_doc[~is_p] = table.first[:-1], doc
        seg_off[is_p], seg_off[~is_p] = 0, table.prompt
        seg_len = np.where(is_p, 0, 0).astype(np.int64)
        seg_len[is_p], seg_len[~is_p] = p_first, body
        group = table.group[seg_doc]
        role = np.where(is_p, PROMPT_ROLE, table.role[seg_doc]).astype(np.uint16)
    else:
        seg_doc, seg_off, seg_len = doc, np.zeros(n_docs, np.int64), lengths.copy()
        group, role = table.group, table.role.astype(np.uint16)
    dropped = np.isin(group, over)
    seg_len[dropped] = 0
    items[over] = 0
    up = None
    if share:  # a completion's parent: its group's prompt, unless that is empty
        kc = np.cumsum(seg_len > 0)
        pe = at[table.group[seg_doc]]
        up = np.where(~is_p & (seg_len > 0) & (seg_len[pe] > 0), kc - kc[pe], 0)
    segs = whole_segments(lengths, np.isin(table.group, over), seq_len, seg_len, seg_doc,
                          seg_off, group, role, up, int(over.size))
    return segs, group, items


def whole_segments(lengths: np.ndarray, dropped: np.ndarray, seq_len: int, length, doc,
                   offset, group, role, up, n_dropped_groups: int) -> GroupSegments:
    """The :class:`GroupSegments` of items never cut, with make_segments' counts: the
    documents ``dropped`` (over --seq-len, or in a group that is) dropped whole."""
    n = int(dropped.sum())
    counts = {"n_docs": int(lengths.size), "n_empty": int(np.count_nonzero(lengths == 0)),
              "n_overlong": n, "n_split": 0, "n_split_pieces": 0, "n_truncated": 0,
              "n_truncated_tokens": 0, "n_dropped": n,
              "n_dropped_tokens": int(lengths[dropped].sum()),
              "n_segments": int(np.count_nonzero(length)), "n_tokens": int(length.sum())}
    return GroupSegments(length, doc, offset, group, role, seq_len, counts,
                         n_dropped_groups=n_dropped_groups, up=up)


def plan_grouped(lengths: np.ndarray, options: PackOptions, table: GroupTable) -> PackLayout:
    """The layout of a grouped corpus: groups packed as items, each group's segments
    together in its row, in order; packs shuffled and sharded as :func:`plan_pack` does."""
    options.check()
    group_overflow(options.overflow)
    segs, item, items = group_segments(lengths, table, options.share_prompt, options.seq_len,
                                       options.overflow)
    groups = {"kind": table.kind, "share_prompt": bool(options.share_prompt),
              "n_groups": table.n_groups, "n_dropped_groups": segs.n_dropped_groups}
    trees = None
    if options.share_prompt:  # the depth-1 tree: a prompt, each completion its child
        kept = segs.table_length > 0
        trees = {"source": "groups", "min_shared": None,
                 "n_trees": int(table.n_groups - segs.n_dropped_groups), "n_split_trees": 0,
                 "n_shared_segments": int(np.count_nonzero(kept & (segs.role == PROMPT_ROLE))),
                 "n_tokens_flat": int(lengths.sum() - segs.counts["n_dropped_tokens"]),
                 "n_tokens_stored": int(segs.table_length.sum())}
    return layout_of(segs, item, items, options, groups, trees)


def layout_of(segs, item: np.ndarray, items: np.ndarray, options: PackOptions,
              groups: dict | None, trees: dict | None) -> PackLayout:
    """The layout of items (groups, trees) of table entries ``segs`` (``item`` per entry,
    ``items`` each item's tokens): packed whole, each item's entries together in its row in
    table order; packs shuffled and sharded as :func:`plan_pack` does."""
    packing = run_packer(items, options.seq_len, options.algo, options.packer_options())
    n_packs = packing.report.n_packs
    packs = packing.packs[item]
    packs[segs.table_length == 0] = -1
    rank = shuffle_rank(n_packs, options.order)
    if options.balance == "attention" and n_packs:
        rank = balanced_rank(rank, packs, [segs], options.balance_ranks)
    order, pack_nseg = order_segments(packs, rank, n_packs,
                                       np.int32 if packs.size < 2**31 else np.int64)
    layout = PackLayout(options, segs.counts, [segs], order, pack_nseg, np.zeros(1, np.int64),
                        packing.report)
    layout.groups, layout.trees = groups, trees
    pack_len = layout.pack_lengths()
    if n_packs and int(pack_len.max()) > options.seq_len:  # a packer bug never reaches disk
        raise RuntimeError(f"packer {options.algo} made a pack of {int(pack_len.max())} "
                           f"> {options.seq_len} tokens")
    layout.shard_starts = shard_starts(pack_len, options.shard_size)
    return layout


def shard_groups(layout: PackLayout, segs: slice) -> tuple:
    """(group, role, seg_up or None) of a shard's segments in output order."""
    r = layout.rounds[0]
    idx = layout.order[segs]
    return r.group[idx], r.role[idx], None if r.up is None else r.up[idx]
