"""The group structure of a corpus of pairs or groups (version 4), checked and laid out for
the packer: each document is one sequence; a group is a run of consecutive documents that
starts at a chosen (role 1) or a first completion (role 3) and goes on with a rejected (2)
or the next completion (3 + k + 1). Every sequence of a group starts with its prompt
(``.prompt`` tokens), the same tokens in each: that is what lets ``pack --share-prompt``
keep one copy. Nothing here trusts the files: a role out of order, a prompt longer than
its sequence, or prompts that differ inside a group is refused by name."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import FormatError
from .schema import FIX

CHOSEN, REJECTED, FIRST = 1, 2, 3


@dataclass
class GroupTable:
    """Per document of the corpora (in order): its group's index (global), its role code,
    and its prompt's tokens; per group its first document and its size."""

    group: np.ndarray    # int64 per document
    role: np.ndarray     # uint16 per document
    prompt: np.ndarray   # int64 per document
    first: np.ndarray    # int64 per group, then the document count
    kind: str
    rewards: np.ndarray | None = None  # float32 per document, or None

    @property
    def n_groups(self) -> int:
        return int(self.first.size) - 1


def check_roles(roles: np.ndarray, where) -> np.ndarray:
    """The group start of each document (bool), or a FormatError naming the first document
    whose role breaks the order."""
    roles = np.asarray(roles, np.int64)
    starts = (roles == CHOSEN) | (roles == FIRST)
    prev = np.concatenate([[-1], roles[:-1]])
    ok = starts | ((roles == REJECTED) & (prev == CHOSEN)) | ((roles > FIRST) & (prev == roles - 1))
    pairs_open = (roles == CHOSEN) & (np.concatenate([roles[1:], [-1]]) != REJECTED)
    bad = np.flatnonzero(~ok | (roles < 1) | pairs_open)
    if bad.size:
        i = int(bad[0])
        raise FormatError(f"{where}: document {i:,} has role {int(roles[i])} after "
                          f"{int(prev[i])}: a pair is chosen (1) then rejected (2), a group's "
                          f"completions count 3, 4, ... from its first; {FIX}")
    return starts


def group_table(corpora: list) -> GroupTable | None:
    """The group layout of ``corpora`` (all of pairs/groups of one kind, else refused; None
    when none is grouped), checked: roles in order, every prompt within its sequence."""
    kinds = {(c.groups or {}).get("kind") for c in corpora}
    if kinds == {None}:
        return None
    if None in kinds or len(kinds) > 1:
        names = ", ".join(f"{c.prefix} ({(c.groups or {}).get('kind') or 'documents'})"
                          for c in corpora)
        raise FormatError(f"the sources mix pairs, groups and plain documents ({names}); "
                          "pack each kind on its own")
    roles, prompt = [], []
    for c in corpora:
        r, p = c.per_doc("roles"), c.per_doc("prompt")
        check_roles(r, c.prefix)
        ln = c.lengths
        over = np.flatnonzero(p.astype(np.int64) > ln)
        if over.size:
            i = int(over[0])
            raise FormatError(f"{c.prefix}: document {i:,} has a prompt of {int(p[i]):,} "
                              f"tokens but holds {int(ln[i]):,}; {FIX}")
        roles.append(r)
        prompt.append(p.astype(np.int64))
    role = np.concatenate(roles)
    starts = (role == CHOSEN) | (role == FIRST)
    group = np.cumsum(starts) - 1
    first = np.concatenate([np.flatnonzero(starts), [role.size]]).astype(np.int64)
    p = np.concatenate(prompt)
    if (p != p[first[:-1]][group]).any():
        i = int(np.flatnonzero(p != p[first[:-1]][group])[0])
        raise FormatError(f"document {i:,}: its prompt length differs from its group's first "
                          f"sequence's; {FIX}")
    rewards = None
    if all((c.groups or {}).get("rewards") for c in corpora):
        rewards = np.concatenate([c.per_doc("rewards") for c in corpora])
    return GroupTable(group.astype(np.int64), role, p, first, kinds.pop(), rewards)


def check_prompts_equal(corpus, table: GroupTable, limit: int | None = None) -> None:
    """Every sequence of a group starts with the very tokens of its group's first (what the
    shared-prompt layout stores once): a full read of the prompts (``verify``)."""
    n = table.n_groups if limit is None else min(limit, table.n_groups)
    for g in range(n):
        a, b = int(table.first[g]), int(table.first[g + 1])
        k = int(table.prompt[a])
        head = np.asarray(corpus[a][:k])
        for d in range(a + 1, b):
            if not np.array_equal(np.asarray(corpus[d][:k]), head):
                raise FormatError(f"{corpus.prefix}: document {d:,} does not start with the "
                                  f"prompt of its group {g:,}; {FIX}")
