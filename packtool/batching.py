"""Packs -> model batches: the reader's conventions turned into the keys trainers take.

``collate_numpy`` flattens packs (``open_packed(dir)[i]`` dicts) into one ``[1, N]`` row of
numpy arrays; :mod:`packtool.torch` wraps it for tensors.
"""

from __future__ import annotations

import numpy as np

from .errors import PacktoolError


def collate_numpy(examples: list[dict]) -> dict:
    """Flatten packs into one ``[1, N]`` row with the keys Hugging Face models and
    ``flash_attn_varlen_func`` take: input_ids, labels, position_ids (int64),
    cu_seq_lens_q/k (int32, [S+1]), max_length_q/k (int) and seq_idx (int32, segment of every
    token across the row). Padded examples (``ds.get(i, pad_to=...)``) keep their pad segment.
    """
    if not examples:
        raise PacktoolError("collate needs at least one example")
    cus, offset = [np.zeros(1, np.int32)], 0
    for ex in examples:
        cu = np.asarray(ex["cu_seqlens"], dtype=np.int64)
        cus.append((cu[1:] + offset).astype(np.int32))
        offset += int(cu[-1])
    cu = np.concatenate(cus)
    lens = np.diff(cu)
    max_len = int(lens.max()) if len(lens) else 0
    row = {k: np.concatenate([ex[k] for ex in examples])[None, :].astype(np.int64)
           for k in ("input_ids", "labels", "position_ids")}
    row.update(
        cu_seq_lens_q=cu, cu_seq_lens_k=cu.copy(), max_length_q=max_len, max_length_k=max_len,
        seq_idx=np.repeat(np.arange(len(lens), dtype=np.int32), lens)[None, :],
    )
    return row
