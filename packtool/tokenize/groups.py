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

from ..engines.base import wrap_docs


def interleave(lp, ip, lc, ic, dtype):
    """(lengths, ids, mask) of documents each made of a prompt (``lp`` lengths of ``ip``
    ids, mask 0) then a completion (``lc`` of ``ic``, mask 1)."""
    lengths = lp + lc
    owner = np.repeat(np.arange(2 * len(lp)), np.stack([lp, lc], 1).ravel())
    ids = np.empty(int(lengths.sum()), dtype)
    is_c = (owner % 2).astype(bool)
    ids[~is_c], ids[is_c] = ip, ic
    return lengths, ids, is_c.astype(np.uint8)


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
    # each sequence's copy of its record's prompt: a ragged gather from ip
    lps = lp.astype(np.int64)[np.repeat(np.arange(len(records)), n_seq)]
    starts = np.repeat(np.cumsum(lp) - lp, n_seq)
    at = np.repeat(starts - (np.cumsum(lps) - lps), lps) + np.arange(int(lps.sum()))
    lengths, ids, mask = wrap_docs(*interleave(lps, ip[at], lc, ic, dtype),
                                   [] if bos_id is None else [bos_id],
                                   [] if eos_id is None else [eos_id])
    roles = np.fromiter((c for r in records for c in r.roles), np.uint16, int(n_seq.sum()))
    rewards = None
    if records and records[0].rewards is not None:
        rewards = np.fromiter((x for r in records for x in r.rewards), np.float32,
                              int(n_seq.sum()))
    p_len = lps + int(bos_id is not None)
    return lengths, ids, mask, (roles, p_len.astype(np.uint32), rewards)
