"""A grouped pack's extra keys (pairs and groups, version 5), derived from its segments'
groups and roles. One row of a shared-prompt pair, prompt P of 3 tokens::

    segment        P P P | C C | R R R
    seg_role        0    |  1  |  2            0: the shared prompt, 1 chosen, 2 rejected
    position_ids   0 1 2 | 3 4 | 3 4 5         each completion continues from the prompt's end
    group_ids      7 7 7 | 7 7 | 7 7 7         -1 outside any group
    seq_ids       -1-1-1 | 0 0 | 1 1 1         the row's sequences, in order (-1: a prompt)
    seg_prompt      -1   |  0  |  0            the segment a completion attends to besides
                                               itself (-1: none): never a sibling

In the plain layout every sequence is one segment (prompt and completion), ``seg_prompt``
all -1 and positions restart per segment as for documents. ``completion_mask`` (1 on the
tokens a sequence's log-probability sums) is the sources' loss mask; ``seq_group`` and
``seq_role`` name each sequence.
"""

from __future__ import annotations

import numpy as np

from ...sources.groups import PROMPT


def group_fields(ex: dict, seg_group, seg_role, mask) -> dict:
    """``ex`` (a derived pack) with the keys drawn above; positions moved on in a shared
    prompt's completions."""
    lengths = np.diff(np.asarray(ex["cu_seqlens"], np.int64))
    group = np.asarray(seg_group, np.int64)
    role = np.asarray(seg_role, np.int64)
    n = lengths.size
    seg_prompt = np.full(n, -1, np.int32)
    last = -1
    for s in range(n):  # a prompt precedes its completions in the row (the planner's order)
        if role[s] == PROMPT:
            last = s
        elif last >= 0 and group[last] == group[s]:
            seg_prompt[s] = last
    is_seq = role != PROMPT
    seq_of_seg = np.where(is_seq, np.cumsum(is_seq) - 1, -1).astype(np.int32)
    shift = np.where(seg_prompt >= 0, lengths[np.maximum(seg_prompt, 0)], 0)
    out = dict(ex)
    out["position_ids"] = ex["position_ids"] + np.repeat(shift, lengths)
    out["group_ids"] = np.repeat(group, lengths)
    out["seq_ids"] = np.repeat(seq_of_seg, lengths)
    out["completion_mask"] = (np.ones(lengths.sum(), np.uint8) if mask is None
                              else np.asarray(mask, np.uint8))
    out["seg_prompt"] = seg_prompt
    out["seq_group"] = group[is_seq]
    out["seq_role"] = role[is_seq].astype(np.int32)
    return out
