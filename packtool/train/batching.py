"""Packs -> model batches: the reader's conventions turned into the keys trainers take.

``collate_numpy`` flattens packs (``open_packed(dir)[i]`` dicts) into one ``[1, N]`` row of
numpy arrays; :mod:`packtool.torch` wraps it for tensors. ``pad_example`` pads a pack (or a
flattened row) for fixed shapes, context parallelism or FP8 (lengths a multiple of k)::

    pack              a0 a1 a2 | b0 b1 b2 b3                 cu_seqlens [0, 3, 7]
    multiple=4        a0 a1 a2 | b0 b1 b2 b3 | P             cu [0, 3, 7, 8]    pad position 0
    pad_to=12         a0 a1 a2 | b0 b1 b2 b3 | P  P  P  P  P cu [0, 3, 7, 12]   positions 0..4
    multiple=4,       a0 a1 a2 P | b0 b1 b2 b3               cu [0, 4, 8]       pad position 3
      per_segment

A row pad is a segment of its own (positions restart at 0), so no kernel lets it attend to a real
token. ``per_segment`` pads every segment to a multiple of k *inside* the segment, after its last
token, as context parallelism needs (each sequence's length a multiple of 2 x cp_size): causal
attention never lets a token see what comes after it, so the real tokens' outputs are unchanged,
and the pad's labels are -100, so the loss is too. Pads always get ``pad_id``, labels -100,
doc_ids -1.
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError

IGNORE_INDEX = -100
PAD_FILL = {"labels": IGNORE_INDEX, "doc_ids": -1}  # input_ids get pad_id; positions computed
PER_TOKEN = ("input_ids", "labels", "position_ids", "doc_ids")


def _check_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise PacktoolError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def pad_example(ex: dict, pad_to: int | None = None, multiple: int | None = None,
                per_segment: bool = False, pad_id: int = 0) -> dict:
    """A copy of ``ex`` (a pack from ``ds[i]``, or anything with cu_seqlens and per-token
    input_ids/labels/position_ids/doc_ids) padded as drawn in the module docstring.

    ``per_segment=True`` (needs ``multiple``) pads every segment to a multiple of ``multiple``;
    then the row is padded to ``pad_to`` (which must be a multiple of ``multiple`` when both are
    given) or, without ``pad_to``, up to the next multiple of ``multiple``.
    """
    if multiple is not None:
        multiple = _check_int("pad multiple", multiple, 1)
    if per_segment and multiple is None:
        raise PacktoolError("per_segment=True pads each segment to a multiple of k: also pass "
                            "the multiple (pad_multiple=k)")
    ex = dict(ex)
    cu = np.asarray(ex["cu_seqlens"], dtype=np.int64)
    keys = [k for k in PER_TOKEN if k in ex]
    if per_segment and multiple > 1 and len(cu) > 1:
        lens = np.diff(cu)
        new_lens = -(-lens // multiple) * multiple
        if (new_lens != lens).any():
            new_cu = np.concatenate([[0], np.cumsum(new_lens)])
            n, n2 = int(cu[-1]), int(new_cu[-1])
            dest = np.arange(n) + np.repeat(new_cu[:-1] - cu[:-1], lens)
            for k in keys:
                v = np.asarray(ex[k])
                if k == "position_ids":  # pads continue their segment's positions
                    first = np.repeat(v[cu[:-1]].astype(np.int64), new_lens)
                    out = (np.arange(n2) - np.repeat(new_cu[:-1], new_lens) + first)
                    ex[k] = out.astype(v.dtype)
                    continue
                out = np.full(n2, pad_id if k == "input_ids" else PAD_FILL[k], dtype=v.dtype)
                out[dest] = v
                ex[k] = out
            cu = new_cu
    n = int(cu[-1])
    target = n if pad_to is None else _check_int("pad_to", pad_to, 0)
    if multiple is not None:
        if pad_to is None:
            target = -(-n // multiple) * multiple
        elif target % multiple:
            raise PacktoolError(f"pad_to {target:,} is not a multiple of the pad multiple "
                                f"{multiple}; use pad_to={-(-target // multiple) * multiple:,}")
    if target < n:
        raise PacktoolError(f"pad_to {target:,} < the row's {n:,} tokens"
                            + (" after per-segment padding" if per_segment else "")
                            + "; raise pad_to (at least seq_len, more with per_segment)")
    if target > n:
        k_pad = target - n
        for k in keys:
            v = np.asarray(ex[k])
            fill = (np.arange(k_pad) if k == "position_ids"
                    else np.full(k_pad, pad_id if k == "input_ids" else PAD_FILL[k]))
            ex[k] = np.concatenate([v, fill.astype(v.dtype)])
        cu = np.append(cu, target)
    ex["cu_seqlens"] = cu.astype(np.int32)
    if "max_seqlen" in ex:  # pad segments count for varlen kernels
        ex["max_seqlen"] = int(np.diff(cu).max()) if len(cu) > 1 else 0
    return ex


def collate_numpy(examples: list[dict], pad_multiple: int | None = None,
                  per_segment: bool = False, pad_id: int = 0) -> dict:
    """Flatten packs into one ``[1, N]`` row with the keys Hugging Face models and
    ``flash_attn_varlen_func`` take: input_ids, labels, position_ids (int64),
    cu_seq_lens_q/k (int32, [S+1]), max_length_q/k (int) and seq_idx (int32, segment of every
    token across the row). Padded examples (``ds.get(i, pad_to=...)``) keep their pad segment.
    ``pad_multiple=k`` pads the row (and, with ``per_segment``, every segment first) to a
    multiple of k; see :func:`pad_example`.
    """
    if not examples:
        raise PacktoolError("collate needs at least one example")
    if per_segment:
        examples = [pad_example(ex, multiple=pad_multiple, per_segment=True, pad_id=pad_id)
                    for ex in examples]
    cus, offset = [np.zeros(1, np.int32)], 0
    for ex in examples:
        cu = np.asarray(ex["cu_seqlens"], dtype=np.int64)
        cus.append((cu[1:] + offset).astype(np.int32))
        offset += int(cu[-1])
    cu = np.concatenate(cus)
    flat = {k: np.concatenate([ex[k] for ex in examples]).astype(np.int64)
            for k in ("input_ids", "labels", "position_ids")}
    if pad_multiple is not None:
        flat = pad_example({**flat, "cu_seqlens": cu}, multiple=pad_multiple, pad_id=pad_id)
        cu = flat.pop("cu_seqlens")
    lens = np.diff(cu)
    max_len = int(lens.max()) if len(lens) else 0
    row = {k: v[None, :] for k, v in flat.items()}
    row.update(
        cu_seq_lens_q=cu, cu_seq_lens_k=cu.copy(), max_length_q=max_len, max_length_k=max_len,
        seq_idx=np.repeat(np.arange(len(lens), dtype=np.int32), lens)[None, :],
    )
    return row
