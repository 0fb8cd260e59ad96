"""``verify`` of a dataset of pairs or groups (version 4), by its own naive code (the planner's
is never reused): every group's segments sit in one pack, consecutive, a shared prompt first
and the sequences in role order; with ``--source``, the segments are exactly those the
sources make (each sequence whole, or its prompt once and each completion after it), every
token exactly once, and only groups over ``seq_len`` missing, when ``--overflow drop``."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..formats.packed import ValidationError as VerifyError
from .segments import shard_chunks


def check_rows(ds) -> dict:
    """{group: pack} after checking that each group is whole in one pack and in order."""
    where, n = {}, 0
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        ps = np.asarray(sh.pack_seg, np.int64)
        grp = np.asarray(sh.arrays["seg_group"], np.int64)
        role = np.asarray(sh.arrays["seg_role"], np.int64)
        for j in range(ps.size - 1):
            seen = []
            for s in range(int(ps[j]), int(ps[j + 1])):
                g, r = int(grp[s]), int(role[s])
                if seen and seen[-1][0] != g and g in dict(seen):
                    raise VerifyError(f"pack {n + j:,}: the segments of group {g:,} are not "
                                      "consecutive")
                if g in where and where[g] != n + j:
                    raise VerifyError(f"group {g:,} is split across packs {where[g]:,} and "
                                      f"{n + j:,}: a group must sit whole in one row")
                where[g] = n + j
                seen.append((g, r))
            _roles_in_order(seen, n + j)
        n += ps.size - 1
    return where


def _roles_in_order(seen: list, pack: int) -> None:
    by_group: dict = {}
    for g, r in seen:
        by_group.setdefault(g, []).append(r)
    for g, roles in by_group.items():
        body = roles[1:] if roles[0] == 0 else roles
        want = list(range(body[0], body[0] + len(body))) if body else []
        if 0 in body or body != want or (body and body[0] not in (1, 3)):
            raise VerifyError(f"pack {pack:,}: group {g:,} has roles {roles}, expected a "
                              "shared prompt (0) first, then 1, 2 or 3, 4, ...")


def expected_segments(corpora: list, share: bool, seq_len: int, drop: bool
                      ) -> tuple[Counter, Counter]:
    """(document, offset, length) of every segment the sources make, by a loop over groups;
    and what ``drop`` dropped: groups, sequences and their tokens (each sequence whole, its
    prompt included, as index.json counts them)."""
    want: Counter = Counter()
    dropped: Counter = Counter()
    base = 0
    docs = []
    for c in corpora:
        roles, prompt, lengths = c.per_doc("roles"), c.per_doc("prompt"), c.lengths
        docs += [(base + i, int(roles[i]), int(prompt[i]), int(lengths[i]))
                 for i in range(len(c))]
        base += len(c)
    starts = [i for i, d in enumerate(docs) if i == 0 or d[1] in (1, 3)]  # a group's first
    ends = starts[1:] + [len(docs)] if docs else []
    groups = [docs[a:b] for a, b in zip(starts, ends, strict=True)]
    for g in groups:
        p = g[0][2]
        segs = ([(g[0][0], 0, p)] if share else []) + [
            (d, p, n - p) if share else (d, 0, n) for d, _, _, n in g]
        segs = [s for s in segs if s[2] > 0]
        if sum(s[2] for s in segs) > seq_len:
            if not drop:
                raise VerifyError(f"a group of {sum(s[2] for s in segs):,} tokens is over "
                                  f"seq_len {seq_len:,} but the dataset says none was dropped")
            dropped.update(groups=1, sequences=len(g), tokens=sum(d[3] for d in g))
            continue
        want.update(segs)
    return want, dropped


def against_sources(ds, corpora: list) -> dict:
    """Every segment of the packs is one the sources make, each exactly once, and the groups
    index.json says were dropped are those over seq_len; returns what was dropped (verify's
    summary names it)."""
    idx = ds.index
    want, dropped = expected_segments(corpora, idx["groups"]["share_prompt"], int(idx["seq_len"]),
                             idx["overflow"] == "drop")
    got: Counter = Counter()
    for _, _, doc, off, length in shard_chunks(ds):
        got.update(zip(doc.tolist(), off.tolist(), length.tolist(), strict=True))
    if got != want:
        extra, missing = got - want, want - got
        what = (f"segment {next(iter(extra))} is not one the sources make (or is there twice)"
                if extra else f"segment {next(iter(missing))} of the sources is missing")
        raise VerifyError(f"{ds.directory}: {what}; every sequence (shared prompt) must be "
                          "in the packs exactly once")
    said = (idx["groups"].get("n_dropped_groups", 0), idx["n_dropped"], idx["n_dropped_tokens"])
    found = (dropped["groups"], dropped["sequences"], dropped["tokens"])
    if said != found:
        raise VerifyError(f"{ds.directory}: index.json says {said[0]:,} groups ({said[1]:,} "
                          f"sequences, {said[2]:,} tokens) were dropped over seq_len, the "
                          f"sources make it {found[0]:,} ({found[1]:,}, {found[2]:,})")
    return {"n_dropped": found[1], "n_dropped_tokens": found[2], "n_dropped_groups": found[0]}
