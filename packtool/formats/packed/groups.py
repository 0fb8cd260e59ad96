"""A grouped pack's extra keys (pairs and groups, version 5; prefix trees, version 6),
derived from its segments' groups, roles and parents. One row of a depth-3 tree of a group
of three completions (segment 0 the prompt, 1 a beginning completions 1 and 2 share)::

    segment        P P P | S S | C | D D | E E       seg_up (stored): 0 1 1 2 4
    seg_role        0    |  0  | 3 |  4  |  5       0: a shared segment (no record ends there)
    seg_parent      -1   |  0  | 1 |  1  |  0       the parent's index in the row, -1 a root
    seg_end          5   |  4  | 3 |  4  |  5       one past the segment's subtree (pre-order)
    position_ids   0 1 2 | 3 4 | 5 | 5 6 | 3 4       continuing from the parent path's end
    tree_in        0 0 0 | 1 1 | 2 | 3 3 | 4 4       the token's segment
    tree_out       5 5 5 | 4 4 | 3 | 4 4 | 5 5       its seg_end
    seq_ids       -1-1-1 |-1-1 | 0 | 1 1 | 2 2       the sequence (leaf) a token's segment ends

A key k is visible to a query q iff ``k <= q and tree_in[k] <= tree_in[q] < tree_out[k]``:
its own segment's earlier tokens and every ancestor's, never a sibling's. A plain row (every
segment a root) has tree_out = tree_in + 1, the per-document causal mask. Version 5's shared
prompts (``--share-prompt`` before version 6) have no ``seg_up``: a prompt (role 0) is the
parent of its group's completions after it (:func:`ups_from_roles`). ``seg_prompt`` is
``seg_parent`` (its name before trees). ``completion_mask`` (1 on the tokens a sequence's
log-probability sums) is the sources' loss mask; ``seq_group``, ``seq_role``, ``seq_leaf``
(its leaf segment) and ``seq_doc`` (its source document) name each sequence.
"""

from __future__ import annotations

import numpy as np

from .schema import ROLE_SHARED


def ups_from_roles(seg_group, seg_role) -> np.ndarray:
    """A version-5 row's ``seg_up``: a completion's parent is its group's shared prompt
    (role 0) earlier in the row, if any."""
    group, role = np.asarray(seg_group, np.int64), np.asarray(seg_role, np.int64)
    up = np.zeros(role.size, np.int64)
    last = -1
    for s in range(role.size):  # a prompt precedes its completions in the row
        if role[s] == ROLE_SHARED:
            last = s
        elif last >= 0 and group[last] == group[s]:
            up[s] = s - last
    return up


def tree_shape(seg_up, lengths) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seg_parent, seg_end, tokens before each segment on its parent path) of a row whose
    segments are in pre-order."""
    up = np.asarray(seg_up, np.int64)
    n = up.size
    idx = np.arange(n, dtype=np.int64)
    parent = np.where(up > 0, idx - up, -1)
    end = idx + 1
    for s in range(n - 1, 0, -1):  # a subtree ends where its last descendant's does
        if parent[s] >= 0 and end[s] > end[parent[s]]:
            end[parent[s]] = end[s]
    before = np.zeros(n, np.int64)
    for s in range(n):
        if parent[s] >= 0:
            before[s] = before[parent[s]] + lengths[parent[s]]
    return parent.astype(np.int32), end.astype(np.int32), before


def group_fields(ex: dict, seg_group, seg_role, mask, seg_up=None) -> dict:
    """``ex`` (a derived pack) with the keys drawn above; ``seg_up`` None: a version-5 row's,
    from its roles."""
    lengths = np.diff(np.asarray(ex["cu_seqlens"], np.int64))
    group = np.asarray(seg_group, np.int64)
    role = np.asarray(seg_role, np.int64)
    up = ups_from_roles(group, role) if seg_up is None else np.asarray(seg_up, np.int64)
    parent, end, before = tree_shape(up, lengths)
    is_seq = role != ROLE_SHARED
    seq_of_seg = np.where(is_seq, np.cumsum(is_seq) - 1, -1).astype(np.int32)
    seg_index = np.arange(lengths.size, dtype=np.int32)
    out = dict(ex)
    out["position_ids"] = ex["position_ids"] + np.repeat(before, lengths)
    out["group_ids"] = np.repeat(group, lengths)
    out["seq_ids"] = np.repeat(seq_of_seg, lengths)
    out["completion_mask"] = (np.ones(lengths.sum(), np.uint8) if mask is None
                              else np.asarray(mask, np.uint8))
    out["seg_prompt"] = parent
    out["seg_parent"] = parent
    out["seg_end"] = end
    out["tree_in"] = np.repeat(seg_index, lengths)
    out["tree_out"] = np.repeat(end, lengths)
    out["seq_group"] = group[is_seq]
    out["seq_role"] = role[is_seq].astype(np.int32)
    out["seq_leaf"] = np.flatnonzero(is_seq).astype(np.int32)
    if "source_docs" in ex:
        out["seq_doc"] = np.asarray(ex["source_docs"], np.int64)[is_seq]
    return out
