"""``verify`` of a dataset of prefix trees (packed format version 6), by its own naive code
(the planner's trie and its sort are never reused): in every row, each leaf's path from its
root tiles its document (offsets 0, then each segment starting where its parent ended, the
last ending at the document's end), so a shared segment holds the very tokens and mask bits
of every record below it; a tree (one ``seg_group``) sits whole in one row. With
``--source``, every record of the sources is a leaf exactly once (only those over seq_len
missing, with ``--overflow drop``), the tokens are the sources', and each tree's shape is
the trie of its records recomputed here: records grouped by a dict of their next
``min_shared`` (id, mask) tokens below each node, a class of two or more becoming a node up
to their common prefix, one token short of the shortest record's end.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..formats.packed import ValidationError as VerifyError


def rows(ds):
    """Per row: (pack, segment arrays as lists: doc, offset, length, parent, group, role)."""
    n = 0
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        ps = np.asarray(sh.pack_seg, np.int64).tolist()
        doc = np.asarray(sh.seg_doc, np.int64).tolist()
        off = np.asarray(sh.seg_offset, np.int64).tolist()
        ln = np.asarray(sh.seg_length, np.int64).tolist()
        up = ds.seg_ups(sh).tolist()
        grp = np.asarray(sh.arrays["seg_group"], np.int64).tolist()
        role = np.asarray(sh.arrays["seg_role"], np.int64).tolist()
        for j in range(len(ps) - 1):
            a, b = ps[j], ps[j + 1]
            parent = [(s - a - up[s]) if up[s] else -1 for s in range(a, b)]
            yield n + j, doc[a:b], off[a:b], ln[a:b], parent, grp[a:b], role[a:b]
        n += len(ps) - 1


def shapes(ds, doc_length) -> tuple[dict, dict]:
    """({tree: set of (leaf documents below, start, end)}, {leaf document: (tree, role)}),
    after checking each tree is whole in one row, every leaf ends its document, and every
    segment points into a document below it at its place on the path (start = offset)."""
    shape: dict = defaultdict(set)
    leaves: dict = {}
    where: dict = {}
    for pack, doc, off, ln, parent, grp, role in rows(ds):
        n = len(doc)
        start, below = [0] * n, [set() for _ in range(n)]
        has_child = [False] * n
        for s in range(n):
            if parent[s] >= 0:
                start[s] = start[parent[s]] + ln[parent[s]]
                has_child[parent[s]] = True
            if where.setdefault(grp[s], pack) != pack:
                raise VerifyError(f"tree {grp[s]:,} is split across packs {where[grp[s]]:,} "
                                  f"and {pack:,}: a tree sits whole in one row")
        for s in range(n):
            if has_child[s]:
                continue
            d = doc[s]
            if (doc_length is not None and off[s] + ln[s] != doc_length(d)) or d in leaves:
                raise VerifyError(f"pack {pack:,}: document {d:,}'s leaf ends at "
                                  f"{off[s] + ln[s]:,}, the document at "
                                  f"{doc_length(d) if doc_length else '?'}"
                                  + (" (and it is a leaf twice)" if d in leaves else ""))
            leaves[d] = (grp[s], role[s])
            p = s
            while p >= 0:
                below[p].add(d)
                p = parent[p]
        for s in range(n):
            if off[s] != start[s] or doc[s] not in below[s]:
                raise VerifyError(f"pack {pack:,} segment {s}: points at offset {off[s]:,} of "
                                  f"document {doc[s]:,}, but its path starts it at "
                                  f"{start[s]:,} in documents {sorted(below[s])[:4]}")
            shape[grp[s]].add((frozenset(below[s]), start[s], start[s] + ln[s]))
    return shape, leaves


def naive_trie(recs: dict, m: int) -> set:
    """The trie of records ``recs`` (document -> tuple of trie keys) as a set of (records
    below, start, end): module docstring."""
    out: set = set()

    def node(docs: list, base: int) -> None:
        classes: dict = defaultdict(list)
        for d in docs:
            if len(recs[d]) - 1 >= base + m:
                classes[recs[d][base:base + m]].append(d)
        shared: set = set()
        for cls in classes.values():
            if len(cls) < 2:
                continue
            cap = min(len(recs[d]) for d in cls) - 1
            end = base + m
            while end < cap and len({recs[d][end] for d in cls}) == 1:
                end += 1
            out.add((frozenset(cls), base, end))
            shared.update(cls)
            node(cls, end)
        for d in docs:
            if d not in shared:
                out.add((frozenset([d]), base, len(recs[d])))

    node(list(recs), 0)
    return out


def against_sources(ds, corpora: list) -> dict:
    """Every record of the sources a leaf exactly once (or dropped over seq_len, as
    index.json counts), and each tree the trie of its records recomputed (module
    docstring); returns what was dropped."""
    from ..formats.tokens.groups import group_table

    idx = ds.index
    m, seq_len = idx["trees"]["min_shared"], int(idx["seq_len"])
    lengths = np.concatenate([np.asarray(c.lengths, np.int64) for c in corpora])
    shape, leaves = shapes(ds, lambda d: int(lengths[d]))
    table = group_table(corpora)
    key = _keys(corpora)
    for tree, got in shape.items():
        docs = [d for d, (t, _) in leaves.items() if t == tree]
        want = naive_trie({d: key(d) for d in docs}, m)
        if got != want:
            raise VerifyError(f"{ds.directory}: tree {tree:,} (documents {sorted(docs)[:6]}) "
                              "is not the trie of its records: recomputed, it has "
                              f"{sum(e - s for _, s, e in want):,} tokens in {len(want)} "
                              f"segments, the packs {sum(e - s for _, s, e in got):,} in "
                              f"{len(got)}")
    for d, (tree, role) in leaves.items():
        want_role = 65535 if table is None else int(table.role[d])
        if role != want_role or (table is not None and tree != int(table.group[d])):
            raise VerifyError(f"document {d:,}: its leaf says tree {tree:,} role {role}, the "
                              f"sources make it role {want_role}")
    missing = [d for d in range(lengths.size) if lengths[d] and d not in leaves]
    if table is None and any(lengths[d] <= seq_len for d in missing):
        d = next(d for d in missing if lengths[d] <= seq_len)
        raise VerifyError(f"document {d:,} ({int(lengths[d]):,} tokens, within seq_len) is "
                          "in no pack: every record must be a leaf exactly once")
    said = (idx["n_dropped"], idx["n_dropped_tokens"])
    found = (len(missing), int(lengths[missing].sum()) if missing else 0)
    if said != found or (missing and idx["overflow"] != "drop"):
        raise VerifyError(f"{ds.directory}: index.json says {said[0]:,} records ({said[1]:,} "
                          f"tokens) were dropped, the packs miss {found[0]:,} ({found[1]:,})")
    out = {"n_dropped": found[0], "n_dropped_tokens": found[1]}
    if table is not None:
        out["n_dropped_groups"] = len({int(table.group[d]) for d in missing})
    return out


def _keys(corpora: list):
    """document -> tuple of (2 id + mask bit), read by plain indexing of each part."""
    parts = [q for c in corpora for q in c.parts]
    base = np.cumsum([0] + [len(q) for q in parts])

    def key(d: int) -> tuple:  # one document's two boundary reads (doc_span's, made once)
        k = int(np.searchsorted(base, d, side="right")) - 1
        q, j = parts[k], d - int(base[k])
        a, b = (int(q.ends[j - 1]) if j else 0), int(q.ends[j])
        ids = np.asarray(q.tokens[a:b], np.int64)
        bit = np.ones(b - a, np.int64) if q.mask is None else np.asarray(q.mask[a:b], np.int64)
        return tuple((2 * ids + bit).tolist())

    return key
