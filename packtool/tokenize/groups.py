"""Pairs and groups -> sequences: each record's prompt is encoded once and copied before each
of its completions, so every sequence of a group starts with the very same prompt tokens
(what ``pack --share-prompt`` stores once, and ``verify`` checks)::

    record   {"prompt": P, "chosen": C, "rejected": R}
    tokens   [BOS] P C [EOS] | [BOS] P R [EOS]        two documents, one after the other
    mask      0    0 1   1   |  0    0 1   1          the loss on completion tokens only
    roles     chosen         |  rejected              per document (.roles)
    prompt    len(BOS P)     |  len(BOS P)            per document (.prompt)

The prompt and each completion are encoded on their own (as for SFT prompt/completion
records: the tokens the model is trained on are exactly these), ``--eos`` closes each
completion (mask 1: the model learns to stop), ``--bos`` opens each sequence (mask 0).
"""

from __future__ import annotations

import numpy as np


def encode_groups(batch, records, dtype, pick, bos_id, eos_id):
    """(lengths, ids, mask, (roles, prompt lengths, rewards or None)) of the sequences of
    ``records`` (:class:`packtool.sources.groups.GroupRecord`), in order. ``batch(texts,
    add_special, dtype, pick)`` is the engine's encode; ``pick`` (records the sample check
    covers) checks their prompts and their first completions."""
    n_seq = np.fromiter((len(r.completions) for r in records), np.int64, len(records))
    lp, ip = batch([r.prompt for r in records], False, dtype, pick)
    first = np.concatenate([[0], np.cumsum(n_seq)[:-1]]).astype(np.int64)
    lc, ic = batch([c for r in records for c in r.completions], False, dtype,
                   None if pick is None else first[pick])
    extra_p = int(bos_id is not None)
    extra_c = int(eos_id is not None)
    p_len = np.repeat(lp.astype(np.int64) + extra_p, n_seq)
    lengths = p_len + lc + extra_c
    ends = np.cumsum(lengths)
    starts = ends - lengths
    ids = np.empty(int(ends[-1]) if ends.size else 0, dtype)
    mask = np.zeros(ids.size, np.uint8)
    p_starts = np.concatenate([[0], np.cumsum(lp)[:-1]]).astype(np.int64)
    c_starts = np.concatenate([[0], np.cumsum(lc)[:-1]]).astype(np.int64)
    owner = np.repeat(np.arange(len(records)), n_seq)
    for s in range(lengths.size):
        at, r = int(starts[s]), int(owner[s])
        if extra_p:
            ids[at] = bos_id
        n = int(lp[r])
        ids[at + extra_p:at + extra_p + n] = ip[p_starts[r]:p_starts[r] + n]
        at += int(p_len[s])
        m = int(lc[s])
        ids[at:at + m] = ic[c_starts[s]:c_starts[s] + m]
        if extra_c:
            ids[at + m] = eos_id
        mask[at:at + m + extra_c] = 1
    roles = np.fromiter((c for r in records for c in r.roles), np.uint16, int(n_seq.sum()))
    rewards = None
    if records and records[0].rewards is not None:
        rewards = np.fromiter((x for r in records for x in r.rewards), np.float32,
                              int(n_seq.sum()))
    return lengths, ids, mask, (roles, p_len.astype(np.uint32), rewards)
