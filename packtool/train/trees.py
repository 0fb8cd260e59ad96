"""The prefix tree of a packed row: which token sees which, and which logit predicts which.

A row of shared prefixes (``pack --share-prompt``, depth 1; ``--share-prefix``, any depth) is
a forest of segments in pre-order: a parent before its children, each subtree's segments
contiguous. ``seg_parent`` (per segment, -1 for a root; a depth-1 batch's ``seg_prompt``)
says it all; ``seg_end`` (one past a segment's last descendant) makes a subtree an interval,
and the per-token ``tree_in`` (the token's segment) and ``tree_out`` (its ``seg_end``) make
an attention entry two comparisons and causality (the ancestor-causal mask)::

    segment      0: P P P | 1: S S | 2: A A | 3: B | 4: C C      P prompt, S a shared part,
    seg_parent      -1    |   0    |   1    |  1  |   0          A and B branch after S,
    seg_end          5    |   4    |   3    |  4  |   5          C straight after P
    key k visible to query q  iff  k <= q  and  tree_in[k] <= tree_in[q] < tree_out[k]
    B sees P, S and B; never A (tree_out[A] = 3 <= tree_in[B] = 3), nor C

A plain row is the forest of roots alone (``tree_out = tree_in + 1``): the per-document
causal mask. Which logit predicts a token: the one before it in its segment, or, for a
segment's first token, its parent's last one (the row's previous token is a sibling's)::

    row          P0 P1 P2 | S0 S1 | A0 A1 | B0 | C0 C1
    predicted from:  P0 P1 |  P2 S0 | S1 A0 | S1 |  P2 C0

A sequence (one record, one completion) is the path from a root to its leaf segment: its
summed log-probability adds every segment's tokens on that path, so a token shared by n
sequences is computed once and counted n times, exactly as the sequences alone.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import PacktoolError
from ..formats.packed.groups import tree_shape
from ..formats.packed.schema import ROLE_RECORD  # a plain record's leaf: keyed by its path

__all__ = ["ROLE_RECORD", "Tree", "allowed", "is_shared", "predecessors", "row_tree"]
BOUNDARY_KEYS = ("cu_seq_lens_q_padded", "cu_seqlens_padded", "cu_seq_lens_q", "cu_seqlens")


def as_numpy(v):
    return np.asarray(v.detach().cpu() if hasattr(v, "detach") else v)


class Tree(NamedTuple):
    """A row's forest: ``cu`` segment boundaries [S + 1], ``seg`` each token's segment [T],
    ``parent`` and ``end`` per segment (int64)."""

    cu: np.ndarray
    seg: np.ndarray
    parent: np.ndarray
    end: np.ndarray

    @property
    def tree_in(self) -> np.ndarray:
        return self.seg

    @property
    def tree_out(self) -> np.ndarray:
        return self.end[self.seg]

    def ancestors(self, s: int) -> list:
        """``s`` and its ancestors, root first."""
        out = []
        while s >= 0:
            out.append(s)
            s = int(self.parent[s])
        return out[::-1]


def parents(batch: dict, n_segments: int) -> np.ndarray:
    """Each segment's parent (int64, -1 a root): ``seg_parent``, else a depth-1 batch's
    ``seg_prompt``, else all roots."""
    key = "seg_parent" if "seg_parent" in batch else "seg_prompt"
    if batch.get(key) is None:
        return np.full(n_segments, -1, np.int64)
    p = as_numpy(batch[key]).astype(np.int64).ravel()
    if p.size != n_segments:
        raise PacktoolError(f"{key} has {p.size} entries for {n_segments} segments: collate "
                            "grouped packs with collate_numpy/collate_tensors")
    return p


def subtree_ends(parent: np.ndarray) -> np.ndarray:
    """``seg_end`` of a forest given in pre-order; a parent list that is not one (a parent
    after its child, or a subtree broken by another segment) is refused by name, since an
    interval mask would then let a segment see what is not its ancestor."""
    n = parent.size
    if n and ((parent < -1) | (parent >= np.arange(n))).any():
        s = int(np.flatnonzero((parent < -1) | (parent >= np.arange(n)))[0])
        raise PacktoolError(f"segment {s} has parent {int(parent[s])}: a parent must come "
                            "before its children in the row (pre-order); pass the row's own "
                            "seg_parent")
    for s in range(1, n):  # pre-order: a parent is the segment before, or one of its ancestors
        p, a = parent[s], s - 1
        while a >= 0 and a != p:
            a = parent[a]
        if a != p:
            raise PacktoolError(f"segment {s}'s parent {int(p)} is not segment {s - 1} nor one "
                                f"of its ancestors: the row is not in pre-order (a subtree's "
                                "segments contiguous); pass the row's own seg_parent")
    up = np.where(parent >= 0, np.arange(n) - parent, 0)
    return tree_shape(up, np.zeros(n, np.int64))[1].astype(np.int64)


def row_tree(batch: dict) -> Tree:
    """The forest of a collated one-row batch (or a pack), checked: ``seg_end`` where the
    batch has one must be the one its ``seg_parent`` implies."""
    key = next((k for k in BOUNDARY_KEYS if k in batch), None)
    if key is None:
        raise PacktoolError("a packed row needs its segment boundaries (cu_seq_lens_q, or a "
                            f"pack's cu_seqlens); got keys {sorted(batch)}")
    cu = as_numpy(batch[key]).astype(np.int64).ravel()
    lens = np.diff(cu)
    parent = parents(batch, cu.size - 1)
    end = subtree_ends(parent)
    if batch.get("seg_end") is not None:
        given = as_numpy(batch["seg_end"]).astype(np.int64).ravel()
        if given.shape != end.shape or (given != end).any():
            raise PacktoolError("seg_end does not match seg_parent (a subtree's end moved "
                                "without its parents, or the reverse): collate grouped packs "
                                "with collate_numpy/collate_tensors")
    has_child = np.zeros(parent.size, bool)
    has_child[parent[parent >= 0]] = True
    if (has_child & (lens == 0)).any():
        s = int(np.flatnonzero(has_child & (lens == 0))[0])
        raise PacktoolError(f"segment {s} is empty and has children: a child's first token "
                            "is predicted from its parent's last; pass the row's own "
                            "boundaries")
    return Tree(cu, np.repeat(np.arange(cu.size - 1), lens), parent, end)


def is_shared(batch: dict) -> bool:
    """Whether a batch's segments attend to others (shared prompts or prefixes)."""
    key = "seg_parent" if "seg_parent" in batch else "seg_prompt"
    v = batch.get(key)
    return v is not None and bool((as_numpy(v) >= 0).any())


def allowed(batch: dict) -> np.ndarray:
    """The boolean [T, T] ancestor-causal attention of a one-row batch (query, key)."""
    t = row_tree(batch)
    tin, tout = t.tree_in, t.tree_out
    q = np.arange(tin.size)
    return ((q[None, :] <= q[:, None]) & (tin[None, :] <= tin[:, None])
            & (tin[:, None] < tout[None, :]))


def predecessors(batch: dict, tree: Tree | None = None) -> np.ndarray:
    """For every token, the row position whose logits predict it (-1: none, a root's first
    token)."""
    t = row_tree(batch) if tree is None else tree
    pos = np.arange(t.seg.size)
    out = pos - 1
    first = pos == t.cu[t.seg]
    p = t.parent[t.seg[first]]
    out[first] = np.where(p >= 0, t.cu[np.maximum(p, 0) + 1] - 1, -1)
    return out


def sequence_leaves(batch: dict, tree: Tree) -> np.ndarray:
    """Each sequence's leaf segment: ``seq_leaf``, else the segment of its tokens."""
    n = as_numpy(batch["seq_group"]).size
    if batch.get("seq_leaf") is not None:
        leaf = as_numpy(batch["seq_leaf"]).astype(np.int64).ravel()
    else:
        seq = as_numpy(batch["seq_ids"]).astype(np.int64).ravel()
        at = np.flatnonzero(seq >= 0)
        leaf = np.full(n, -1, np.int64)
        leaf[seq[at][::-1]] = tree.seg[at][::-1]  # the first token of each
    if leaf.size != n or (leaf < 0).any() or (leaf >= tree.parent.size).any():
        raise PacktoolError(f"the batch's {n} sequences do not each name a leaf segment of its "
                            f"{tree.parent.size}: collate grouped packs with collate_numpy")
    return leaf


def on_path(tree: Tree, leaves: np.ndarray) -> np.ndarray:
    """bool [n_sequences, S]: segment s lies on sequence j's path (an ancestor of its leaf,
    or the leaf)."""
    s = np.arange(tree.parent.size)
    return (s[None, :] <= leaves[:, None]) & (leaves[:, None] < tree.end[None, :])


def path_of(tree: Tree, leaf: int) -> tuple:
    """A leaf's place in its tree: its index among its siblings at each depth below the
    root (the key of a plain record's sequence)."""
    out = []
    for s in tree.ancestors(leaf)[1:]:
        sib = np.flatnonzero(tree.parent[:s] == tree.parent[s])
        out.append(int(sib.size))
    return tuple(out)
