"""``verify`` of the attention costs index.json stores per shard (``cost_classes`` and
``costs_sha256``: what a balanced sampler deals by), recomputed by verify's own code from
the segment tables, never by the reader's :func:`packtool.formats.packed.layout.attention_costs`
that wrote them, so that a wrong cost cannot vouch for itself.

A row's cost is what its attention mask computes, in the unit of x^2 per causal document of
x tokens (2 x attended pairs - x: x (x + 1) / 2 pairs). With ``--share-prompt`` a completion of
c tokens after its group's prompt of p also attends to the prompt's p tokens: p c pairs more,
2 p c in that unit (the prompt itself counted once, p^2). A row holding a prompt of 40 tokens
and completions of 10 and 20 costs 40^2 + 10^2 + 20^2 + 2 * 40 * (10 + 20) = 4,500, where the
segments alone (each a document) give 2,100.

Rows with images (index.json's ``cost_vision``: 1.0) add the vision encoder's attention, which
runs per image frame: t (h w)^2 for an image of grid (t, h, w), summed over the images whose
tokens lie inside the row's segments (read here from each document's own image table): a row
of 40 text tokens around one image of grid (1, 4, 6) (6 image tokens) costs 40^2 + 24^2.
"""

from __future__ import annotations

import numpy as np

from ..formats.packed import ValidationError as VerifyError


def prompt_seen(ds, k: int) -> np.ndarray:
    """Per segment of shard ``k``: the tokens of its group's shared prompt earlier in its row
    that it attends to (0 for a prompt, a plain sequence, or a dataset without shared
    prompts), by a loop over rows."""
    sh = ds.shard(k)
    if "seg_up" in sh.arrays:  # version 6: every ancestor's tokens
        return _ancestors_seen(sh)
    seen = np.zeros(len(sh.seg_length), np.float64)
    if not (ds.index.get("groups") or {}).get("share_prompt"):
        return seen
    ps = np.asarray(sh.pack_seg, np.int64)
    x = np.asarray(sh.seg_length, np.int64)
    grp = np.asarray(sh.arrays["seg_group"], np.int64)
    role = np.asarray(sh.arrays["seg_role"], np.int64)
    for j in range(ps.size - 1):
        prompt: dict = {}  # group -> its prompt's tokens in this row
        for s in range(int(ps[j]), int(ps[j + 1])):
            if role[s] == 0:
                prompt[int(grp[s])] = int(x[s])
            else:
                seen[s] = prompt.get(int(grp[s]), 0)
    return seen


def _ancestors_seen(sh) -> np.ndarray:
    """Per segment of a tree shard: its ancestors' tokens, by a walk up each parent chain."""
    ps = np.asarray(sh.pack_seg, np.int64).tolist()
    x = np.asarray(sh.seg_length, np.int64).tolist()
    up = np.asarray(sh.arrays["seg_up"], np.int64).tolist()
    seen = np.zeros(len(x), np.float64)
    for j in range(len(ps) - 1):
        for s in range(ps[j], ps[j + 1]):
            p, a = s, 0
            while up[p]:
                p -= up[p]
                a += x[p]
            seen[s] = a
    return seen


def vision_seen(ds, k: int) -> np.ndarray:
    """Per pack of shard ``k``: sum of t (h w)^2 over the images inside its segments, by a
    loop over segments and each document's images (0 without ``cost_vision``)."""
    sh = ds.shard(k)
    ps = np.asarray(sh.pack_seg, np.int64)
    out = np.zeros(ps.size - 1, np.float64)
    if not ds.index.get("cost_vision"):
        return out
    sources = ds.sources()
    base = np.cumsum([0] + [len(c) for c in sources]).tolist()
    for j in range(ps.size - 1):
        for s in range(int(ps[j]), int(ps[j + 1])):
            doc, off = int(sh.seg_doc[s]), int(sh.seg_offset[s])
            src = max(i for i, b in enumerate(base[:-1]) if b <= doc)
            if not sources[src].vision:
                continue
            im = sources[src].images(doc - base[src])
            for (a, n), (t, h, w) in zip(np.asarray(im["span"]).tolist(),
                                         np.asarray(im["grid"]).tolist(), strict=True):
                if off <= a and a + n <= off + int(sh.seg_length[s]):
                    out[j] += float(t * (h * w) ** 2)
    return out


def shard_costs(ds, k: int) -> np.ndarray:
    """Per pack of shard ``k``: sum over its segments of x^2 + 2 x (prompt seen), plus its
    images' t (h w)^2 where the index's classes count them."""
    sh = ds.shard(k)
    ps = np.asarray(sh.pack_seg, np.int64)
    x = np.asarray(sh.seg_length, np.float64)
    pack = np.repeat(np.arange(ps.size - 1), np.diff(ps))
    costs = np.bincount(pack, weights=x * x + 2.0 * x * prompt_seen(ds, k),
                        minlength=ps.size - 1)
    return costs + vision_seen(ds, k) if ds.index.get("cost_vision") else costs


def check_stored_costs(ds) -> None:
    """The cost classes index.json stores are those of each shard's packs (checked last: a
    shard's content against the sources says more)."""
    from ..formats.packed.costs import shard_entry

    ratio = ds.index.get("cost_ratio")
    for k, entry in enumerate(ds.index["shards"]):
        if ratio is None or "cost_classes" not in entry:
            continue
        want = shard_entry(shard_costs(ds, k), ratio)
        for key in ("cost_classes", "costs_sha256"):
            if entry.get(key) != want[key]:
                raise VerifyError(f"{ds.directory}/index.json: {entry['name']}'s {key} is not "
                                  "its packs' (re-run packtool pack)")
