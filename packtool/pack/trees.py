"""Planning prefix trees (``pack --share-prefix``, packed format version 6): the token trie of
sequences that begin alike, every common beginning of at least ``--min-shared`` tokens
stored once, at any depth, within a group (pairs, ``--completions-field`` groups whose
completions share a beginning) or across plain records (a repeated system prompt, few-shot
exemplars, the turns of one conversation cut into records)::

    records   [S q1 a1]  [S q1 a1 q2 a2]  [S q3 a3]        S: a system prompt
    trie      S ─┬─ q1 a1' ─┬─ a1"          (record 1: its last token, a leaf of its own)
                 │          └─ a1" q2 a2    (record 2)
                 └─ q3 a3                   (record 3)

The trie (:func:`trie`): the records sorted by their tokens, where a token is its id and its
loss-mask bit (``2 id + bit``: a token is shared only if both agree), so the longest common
prefix (LCP) of neighbours gives every shared beginning. Below a node ending at b, records
whose neighbours agree on b + ``min_shared`` tokens more form a run; a run of two or more
becomes a shared node up to their common prefix, capped one token before the shortest
record's end (a record always keeps a leaf of its own: no record ends inside a shared
segment); every other record is a leaf from b on. Plain records are bucketed first by their
first ``min_shared`` tokens (a hash), so only records that can share are ever compared.

A bucket whose trie is over ``--seq-len`` is cut into record sets that fit (each its own
trie, one item to the packer): records taken in trie order while the set's trie grows by
``len - LCP(previous)`` within the row, skipping up to ``LOOKAHEAD`` records that do not
fit for shorter ones that do, so sets fill their rows (counted: ``n_split_trees``). A group
(pair, completions) is never cut: over ``--seq-len`` it is refused, or dropped with
``--overflow drop``, as without trees.

``--min-shared`` (default ``MIN_SHARED``, 16), chosen by measurement: a shared node is one
more segment (a kernel's per-segment work, a mask's block, a row's table entry) for what it
saves, so a default should share what repeats at length and leave chance beginnings alone.
scripts/bench_prefix.py's sweep on 20,000 templated chat records (3-token role headers, 40%
under one of 5 system prompts of 300 tokens, user turns opening with one of 40 Zipf-drawn
2-token phrases; seq_len 4096): --min-shared 1, 2 and 4 made 1,462, 1,282 and 817 shared
segments under 16 tokens (headers and openings: +7%, +6% and +4% segments) to store 1.1%,
1.1% and 1.0% fewer tokens (5,637,624 and 5,642,622 against 5,698,122); from 8 to 64 none,
the same 597 shared segments and tokens. 16 is twice the
longest chance share there (5 tokens) with room for longer templates (Llama 3's headers are
4-5 tokens, a common opening sentence as many again) at no cost in tokens on either corpus.
A prompt shorter than 16 tokens is therefore not shared by ``--share-prefix``
(``--share-prompt`` shares every prompt; ``--min-shared 1`` shares everything).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PacktoolError
from ..formats.packed.schema import ROLE_RECORD, ROLE_SHARED
from .pairs import whole_segments

MIN_SHARED = 16
LOOKAHEAD = 64  # records tried past the first that does not fit a record set's row


def keys_of(ids, mask) -> np.ndarray:
    """A record's trie keys: ``2 id + mask bit`` (int64)."""
    k = np.asarray(ids, np.int64) * 2
    return k + (1 if mask is None else np.asarray(mask, np.int64))


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    ne = np.flatnonzero(a[:n] != b[:n])
    return int(ne[0]) if ne.size else n


def trie(keys: list, min_shared: int) -> list[tuple[int, int, int, int]]:
    """The trie of ``keys`` (one int64 array per record, each of >= 1 token) in pre-order:
    per segment (record it points into, start, end, parent position or -1); a leaf is a
    segment whose record ends at its end, every record exactly one leaf."""
    order = sorted(range(len(keys)), key=lambda i: keys[i].astype(">i8").tobytes())
    lens = [int(keys[i].size) for i in order]
    lcp = [_lcp(keys[order[i]], keys[order[i + 1]]) for i in range(len(order) - 1)]
    out: list[tuple[int, int, int, int]] = []

    def walk(members: list[int], base: int, parent: int) -> None:
        need = base + min_shared
        run_of: dict[int, list[int]] = {}
        run: list[int] = []
        for p in members:  # runs: eligible neighbours agreeing on `need` tokens
            if lens[p] - 1 < need:
                continue
            if run and min(lcp[run[-1]:p]) >= need:
                run.append(p)
            else:
                run = [p]
                run_of[p] = run
        inside = {p for r in run_of.values() if len(r) > 1 for p in r}
        for p in members:
            if p in run_of and len(run_of[p]) > 1:
                r = run_of[p]
                end = min(min(lcp[r[0]:r[-1]]), min(lens[q] for q in r) - 1)
                out.append((order[p], base, end, parent))
                walk(r, end, len(out) - 1)
            elif p not in inside:
                out.append((order[p], base, lens[p], parent))

    walk(list(range(len(order))), 0, -1)
    return out


def trie_size(keys: list, min_shared: int) -> int:
    return sum(e - s for _, s, e, _ in trie(keys, min_shared))


@dataclass
class TreeTable:
    """Segments of every tree, tree after tree, each in pre-order."""

    doc: list
    offset: list
    length: list
    up: list
    role: list
    group: list
    item: list

    def add(self, keys: list, docs: list, roles: list, group: int, item: int,
            min_shared: int) -> int:
        """Tree ``item`` of records ``keys`` (documents ``docs``, leaf roles ``roles``):
        its stored tokens."""
        segs = trie(keys, min_shared)
        first = len(self.doc)
        for pos, (r, s, e, parent) in enumerate(segs):
            leaf = e == keys[r].size  # a shared node ends before each of its records' ends
            self.doc.append(docs[r])
            self.offset.append(s)
            self.length.append(e - s)
            self.up.append(pos - parent if parent >= 0 else 0)
            self.role.append(roles[r] if leaf else ROLE_SHARED)
            self.group.append(group)
            self.item.append(item)
        return sum(self.length[first:])


def tree_segments(lengths: np.ndarray, read, table, options, tree_ids=None) -> tuple:
    """(segments, item per entry, item lengths, index.json's ``trees``) of a corpus packed
    with --share-prefix: one tree a group (``table``, a GroupTable), or the record sets of
    plain records, bucketed by their first tokens or (``tree_ids``, tokenize --tree-field)
    by their tree id. ``read(doc)`` gives a document's trie keys."""
    lengths = np.asarray(lengths, np.int64)
    m, seq_len = int(options.min_shared or MIN_SHARED), int(options.seq_len)
    t = TreeTable([], [], [], [], [], [], [])
    items: list[int] = []
    over = lengths > seq_len
    if table is None and over.any() and options.overflow != "drop":
        d = int(np.flatnonzero(over)[0])
        raise PacktoolError(f"{int(over.sum()):,} record(s) longer than --seq-len {seq_len:,}: "
                            f"document {d:,} holds {int(lengths[d]):,} tokens; --share-prefix "
                            "never cuts a record (its leaf would lose its beginning): raise "
                            "--seq-len, or pass --overflow drop to drop such records (counted)")
    n_split = 0
    dropped_groups = 0
    if table is not None:
        for g in range(table.n_groups):
            docs = [d for d in range(int(table.first[g]), int(table.first[g + 1]))
                    if lengths[d] > 0]
            size = t.add([read(d) for d in docs], docs, [int(table.role[d]) for d in docs],
                         g, len(items), m) if docs else 0
            if size > seq_len:
                if options.overflow != "drop":
                    raise PacktoolError(
                        f"group {g:,} (documents {int(table.first[g]):,}-"
                        f"{int(table.first[g + 1]) - 1:,}) holds {size:,} tokens with its "
                        f"prefixes shared, over --seq-len {seq_len:,}; a group is never split "
                        "or truncated: raise --seq-len, or pass --overflow drop to drop such "
                        "groups (counted)")
                dropped_groups += 1
                _drop_last_item(t, len(items))
                over[int(table.first[g]):int(table.first[g + 1])] = True
                continue
            if docs:
                items.append(size)
    else:
        for docs in (buckets(lengths, over, read, m) if tree_ids is None
                     else id_buckets(lengths, over, tree_ids)):
            sets = record_sets(docs, read, seq_len, m)
            n_split += len(sets) > 1
            for rs in sets:
                keys = [read(d) for d in rs]
                items.append(t.add(keys, rs, [ROLE_RECORD] * len(rs), len(items),
                                   len(items), m))
                if items[-1] > seq_len:  # a planner bug never reaches disk
                    raise RuntimeError("a record set over --seq-len")
    segs = whole_segments(lengths, over, seq_len, *(np.asarray(c, np.int64) for c in (
        t.length, t.doc, t.offset, t.group)), np.asarray(t.role, np.uint16),
        np.asarray(t.up, np.int64), dropped_groups)
    kept = lengths[~over]
    source = "groups" if table is not None else "records" if tree_ids is None else "tree_field"
    trees = {"source": source, "min_shared": m,
             "n_trees": len(items), "n_split_trees": n_split,
             "n_shared_segments": int(np.count_nonzero(segs.role == ROLE_SHARED)),
             "n_tokens_flat": int(kept.sum()), "n_tokens_stored": int(segs.table_length.sum())}
    return segs, np.asarray(t.item, np.int64), np.asarray(items, np.int64), trees


def _drop_last_item(t: TreeTable, item: int) -> None:
    while t.item and t.item[-1] == item:
        for col in (t.doc, t.offset, t.length, t.up, t.role, t.group, t.item):
            col.pop()


def buckets(lengths: np.ndarray, skip: np.ndarray, read, m: int) -> list[list[int]]:
    """Plain records in buckets of like first ``m`` tokens (ids and mask bits; a record of
    <= m tokens alone), in document order of each bucket's first record."""
    by_head: dict[bytes, list[int]] = {}
    out: list[list[int]] = []
    for d in range(lengths.size):
        if skip[d] or lengths[d] == 0:
            continue
        if lengths[d] <= m:
            out.append([d])
            continue
        head = read(d)[:m].tobytes()
        if head not in by_head:
            by_head[head] = []
            out.append(by_head[head])
        by_head[head].append(d)
    return out


def id_buckets(lengths: np.ndarray, skip: np.ndarray, tree_ids) -> list[list[int]]:
    """Plain records in buckets of one tree id each (tokenize --tree-field), in document
    order of each bucket's first record."""
    by_id: dict[int, list[int]] = {}
    for d in np.flatnonzero(~skip & (lengths > 0)).tolist():
        by_id.setdefault(int(tree_ids[d]), []).append(d)
    return list(by_id.values())


def record_sets(docs: list[int], read, seq_len: int, m: int) -> list[list[int]]:
    """A bucket's records in sets whose tries fit ``seq_len`` (module docstring)."""
    if len(docs) == 1:
        return [docs]
    keys = {d: read(d) for d in docs}
    rest = sorted(docs, key=lambda d: keys[d].astype(">i8").tobytes())
    order = {d: i for i, d in enumerate(rest)}
    if trie_size([keys[d] for d in rest], m) <= seq_len:
        return [docs]
    sets = []
    while rest:  # `rest` stays in trie order: what a set leaves is a subsequence of it
        cur, skipped, size, misses = [rest[0]], [], int(keys[rest[0]].size), 0
        for i in range(1, len(rest)):
            d = rest[i]
            grow = int(keys[d].size) - _lcp(keys[cur[-1]], keys[d])
            if size + grow <= seq_len:
                cur.append(d)
                size += grow
                continue
            skipped.append(d)
            misses += 1
            if misses > LOOKAHEAD:
                skipped += rest[i + 1:]
                break
        while len(cur) > 1 and trie_size([keys[d] for d in cur], m) > seq_len:
            d = cur.pop()  # the estimate ignores min_shared and the cap
            skipped.insert(next((j for j, e in enumerate(skipped) if order[e] > order[d]),
                                len(skipped)), d)
        sets.append(sorted(cur))
        rest = skipped
    return sets


def corpus_reader(corpora: list):
    """``read(doc) -> trie keys`` of a global document over ``corpora`` (the last few
    kept: a tree's records are read again when its segments are laid out)."""
    base = np.cumsum([0] + [len(c) for c in corpora]).astype(np.int64)
    cache: dict[int, np.ndarray] = {}

    def read(d: int) -> np.ndarray:
        if d not in cache:
            if len(cache) > 4096:
                cache.clear()
            k = int(np.searchsorted(base, d, side="right")) - 1
            c, j = corpora[k], d - int(base[k])
            cache[d] = keys_of(c[j], c.doc_mask(j) if c.has_mask else None)
        return cache[d]

    return read


def plan_trees(lengths: np.ndarray, options, table, read):
    """The layout of ``pack --share-prefix``: each tree (a group, or a record set) one item
    of its trie's size, its segments in pre-order together in its row. ``read``: the
    sources (a list of corpora) or ``read(doc) -> trie keys``."""
    from .pairs import group_overflow, layout_of

    options.check()
    group_overflow(options.overflow)
    ids = None
    if isinstance(read, list):  # tokenize --tree-field: records bucketed by their tree id
        if table is None and read and all(c.meta.get("tree_field") for c in read):
            ids = np.concatenate([np.asarray(c.per_doc("tree")) for c in read])
        read = corpus_reader(read)
    segs, item, items, trees = tree_segments(lengths, read, table, options, ids)
    groups = None if table is None else {
        "kind": table.kind, "share_prompt": False, "n_groups": table.n_groups,
        "n_dropped_groups": segs.n_dropped_groups}
    return layout_of(segs, item, items, options, groups, trees)
