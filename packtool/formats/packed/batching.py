"""Packs -> model batches: the reader's conventions turned into the keys trainers take.

``collate_numpy`` flattens packs (``open_packed(dir)[i]`` dicts) into one ``[1, N]`` row of
numpy arrays; :mod:`packtool.torch` wraps it for tensors. ``pad_example`` pads a pack (or a
flattened row) for fixed shapes, context parallelism or FP8 (lengths a multiple of k)::

    pack              a0 a1 a2 | b0 b1 b2 b3                 cu_seqlens [0, 3, 7]
    multiple=4        a0 a1 a2 | b0 b1 b2 b3 | P             cu [0, 3, 7, 8]    pad position 0
    pad_to=12         a0 a1 a2 | b0 b1 b2 b3 | P  P  P  P  P cu [0, 3, 7, 12]   positions 0..4
    multiple=4,       a0 a1 a2 P | b0 b1 b2 b3               cu [0, 4, 8]       pad position 3
      per_segment

An aligned pack (``pack --align K``: each segment already followed by its pads, and
``cu_seqlens_padded`` beside the real ``cu_seqlens``) is padded on its padded boundaries: a row pad
is a segment of its own in both arrays, and per-segment padding to a divisor of K changes
nothing.

A row pad is a segment of its own (positions restart at 0), so no kernel lets it attend to a real
token. ``per_segment`` pads every segment to a multiple of k *inside* the segment, after its last
token, as context parallelism needs (each sequence's length a multiple of 2 x cp_size): causal
attention never lets a token see what comes after it, so the real tokens' outputs are unchanged,
and the pad's labels are -100, so the loss is too. Pads always get ``pad_id``, labels -100,
doc_ids -1.
"""

from __future__ import annotations

import numpy as np

from ... import conflicts
from ...errors import PacktoolError
from .groups import tree_shape

IGNORE_INDEX = -100
# input_ids get pad_id; positions computed; a pad is in no group, no sequence, no completion
PAD_FILL = {"labels": IGNORE_INDEX, "doc_ids": -1, "group_ids": -1, "seq_ids": -1,
            "completion_mask": 0}
PER_TOKEN = ("input_ids", "labels", "position_ids", "doc_ids", "group_ids", "seq_ids",
             "completion_mask", "position_ids_3d")
# positions: a pad's are computed (a row pad restarts at 0, a segment's pads continue it);
# ``position_ids_3d`` is a row's mRoPE ids [3, n] (images, packtool.vision), the last axis the
# tokens: padded like every 1-D array, the same pad positions in its three rows
POSITIONS = ("position_ids", "position_ids_3d")


def check_int(name: str, v, lo: int) -> int:
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
        multiple = check_int("pad multiple", multiple, 1)
    if per_segment and multiple is None:
        raise PacktoolError("per_segment=True pads each segment to a multiple of k: also pass "
                            "the multiple (pad_multiple=k)")
    if per_segment and "seq_ids" in ex:
        conflicts.check({"groups", "per_segment"})
    ex = dict(ex)
    aligned = "cu_seqlens_padded" in ex
    cu = np.asarray(ex["cu_seqlens_padded" if aligned else "cu_seqlens"], dtype=np.int64)
    keys = [k for k in PER_TOKEN if k in ex]
    if aligned and per_segment and multiple > 1 and (np.diff(cu) % multiple).any():
        raise PacktoolError(
            f"the pack is aligned to segments of {int(np.gcd.reduce(np.diff(cu)))} tokens, not "
            f"a multiple of {multiple}: pack again with --align {multiple} (or the lcm of both) "
            "instead of padding each segment at load")
    if per_segment and multiple > 1 and len(cu) > 1 and not aligned:
        cu = _pad_segments(ex, cu, keys, multiple, pad_id)
    n = int(cu[-1])
    target = n if pad_to is None else check_int("pad_to", pad_to, 0)
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
            fill = (np.arange(k_pad) if k in POSITIONS
                    else np.full(k_pad, pad_id if k == "input_ids" else PAD_FILL[k]))
            fill = np.broadcast_to(fill.astype(v.dtype), v.shape[:-1] + (k_pad,))
            ex[k] = np.concatenate([v, fill], axis=-1)
        cu = np.append(cu, target)
        if "seq_ids" in ex:  # the row pad's segment: a root of its own, in no tree
            ex.update(tree_fields(ex, cu))
        if aligned:  # the row pad: a segment of its own in the real boundaries too
            real = np.asarray(ex["cu_seqlens"], np.int64)
            ex["cu_seqlens"] = np.append(real, real[-1] + k_pad).astype(np.int32)
    ex["cu_seqlens_padded" if aligned else "cu_seqlens"] = cu.astype(np.int32)
    if "max_seqlen" in ex:  # pad segments count for varlen kernels
        ex["max_seqlen"] = int(np.diff(cu).max()) if len(cu) > 1 else 0
    return ex


def _pad_segments(ex: dict, cu: np.ndarray, keys: list, multiple: int, pad_id: int
                  ) -> np.ndarray:
    """Every segment of ``ex`` (in place) padded to a multiple of ``multiple``; the new
    boundaries."""
    lens = np.diff(cu)
    new_lens = -(-lens // multiple) * multiple
    if not (new_lens != lens).any():
        return cu
    new_cu = np.concatenate([[0], np.cumsum(new_lens)])
    n, n2 = int(cu[-1]), int(new_cu[-1])
    dest = np.arange(n) + np.repeat(new_cu[:-1] - cu[:-1], lens)
    for k in keys:
        v = np.asarray(ex[k])
        if k in POSITIONS:  # pads continue their segment's positions, real tokens keep theirs
            first = np.repeat(v[..., cu[:-1]].astype(np.int64), new_lens, axis=-1)
            out = (np.arange(n2) - np.repeat(new_cu[:-1], new_lens) + first).astype(v.dtype)
        else:
            out = np.full(n2, pad_id if k == "input_ids" else PAD_FILL[k], dtype=v.dtype)
        out[..., dest] = v
        ex[k] = out
    return new_cu


def _check_collate(examples, pad_multiple, per_segment, max_docs) -> int | None:
    """What collate_numpy refuses before it starts (by the conflict table's names)."""
    if not examples:
        raise PacktoolError("collate needs at least one example")
    if max_docs is not None:
        max_docs = check_int("max_docs", max_docs, 1)
        if pad_multiple is not None and not per_segment:
            conflicts.check({"collate_max_docs", "row_pad"}, f"max_docs={max_docs}, "
                            f"pad_multiple={pad_multiple}")
        _check_max_docs(examples, max_docs)
    if per_segment and "seq_ids" in examples[0]:
        conflicts.check({"groups", "per_segment"})
    return max_docs


def collate_numpy(examples: list[dict], pad_multiple: int | None = None,
                  per_segment: bool = False, pad_id: int = 0,
                  max_docs: int | None = None) -> dict:
    """Flatten packs into one ``[1, N]`` row with the keys Hugging Face models and
    ``flash_attn_varlen_func`` take: input_ids, labels, position_ids (int64),
    cu_seq_lens_q/k (int32, [S+1]), max_length_q/k (int) and seq_idx (int32, segment of every
    token across the row). Padded examples (``ds.get(i, pad_to=...)``) keep their pad segment.
    ``pad_multiple=k`` pads the row (and, with ``per_segment``, every segment first) to a
    multiple of k; see :func:`pad_example`.

    Aligned packs (``pack --align K``): cu_seq_lens_q/k count the real tokens (Transformer
    Engine's ``cu_seqlens``) and ``cu_seqlens_padded`` says where each segment starts in the
    row; max_length_q/k are the longest padded segment (a bound for either); seq_idx covers
    the pads with their segment.

    ``max_docs=K`` (``pack --max-docs K``): cu_seq_lens_q/k (and cu_seqlens_padded) have
    B x K + 1 entries for B packs (the last offset repeated: empty segments, which varlen kernels
    skip), max_length_q/k the longest pack's length (a bound; an int that changes per batch is a
    recompile per batch, ms-swift #9798): one shape for a run of packs padded to one length.
    """
    max_docs = _check_collate(examples, pad_multiple, per_segment, max_docs)
    if per_segment:
        examples = [pad_example(ex, multiple=pad_multiple, per_segment=True, pad_id=pad_id)
                    for ex in examples]
    aligned = any("cu_seqlens_padded" in ex for ex in examples)
    cu, cup = _offsets(examples, "cu_seqlens"), _offsets(examples, "cu_seqlens_padded")
    flat = {k: np.concatenate([ex[k] for ex in examples], axis=-1).astype(np.int64)
            for k in ("input_ids", "labels", "position_ids", "position_ids_3d")
            if k in examples[0]}
    if pad_multiple is not None:
        flat = pad_example({**flat, "cu_seqlens": cu, **({"cu_seqlens_padded": cup}
                                                        if aligned else {})},
                           multiple=pad_multiple, pad_id=pad_id)
        cu = flat.pop("cu_seqlens")
        cup = flat.pop("cu_seqlens_padded", cu)
    lens = np.diff(cup)
    max_len = int(lens.max()) if len(lens) else 0
    seq_idx = np.repeat(np.arange(len(lens), dtype=np.int32), lens)[None, :]
    if max_docs is not None:
        cu, cup = (_fixed(c, len(examples) * max_docs) for c in (cu, cup))
        max_len = max(len(ex["input_ids"]) for ex in examples)  # a bound: one value, one compile
    row = {k: v[..., None, :] for k, v in flat.items()}  # [1, N]; mRoPE ids [3, 1, N]
    if "image_grid_thw" in examples[0]:
        row.update(_image_keys(examples))
    row.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu.copy(), max_length_q=max_len,
               max_length_k=max_len, seq_idx=seq_idx)
    if "seq_ids" in examples[0]:  # pairs and groups (packtool.formats.packed.groups)
        row.update(_group_keys(examples, row["input_ids"].shape[1], cup))
        row["tree_in"], row["tree_out"] = row["tree_in"][None, :], row["tree_out"][None, :]
    if aligned:
        row["cu_seqlens_padded"] = cup
    return row


def _group_keys(examples: list[dict], n_tokens: int, cu: np.ndarray) -> dict:
    """The grouped packs' keys end to end: sequence and segment indices moved on by the
    packs before; a row pad (beyond the packs' tokens) in no group and no sequence, a root
    segment of its own (:func:`tree_fields`)."""
    out = {}
    seq_base = np.cumsum([0] + [len(ex["seq_group"]) for ex in examples])[:-1]
    seg_base = np.cumsum([0] + [len(ex["cu_seqlens"]) - 1 for ex in examples])[:-1]
    seq = [np.where(ex["seq_ids"] >= 0, ex["seq_ids"] + b, -1)
           for ex, b in zip(examples, seq_base, strict=True)]
    for key, parts, fill in (("group_ids", [ex["group_ids"] for ex in examples], -1),
                             ("seq_ids", seq, -1),
                             ("completion_mask", [ex["completion_mask"] for ex in examples], 0)):
        v = np.concatenate(parts).astype(np.int64)
        out[key] = np.concatenate([v, np.full(n_tokens - v.size, fill, np.int64)])[None, :]
    out["seq_group"] = np.concatenate([ex["seq_group"] for ex in examples]).astype(np.int64)
    out["seq_role"] = np.concatenate([ex["seq_role"] for ex in examples]).astype(np.int32)
    for key in ("seq_leaf", "seq_doc"):  # the reader's trees (version 6): leaf moves on
        if all(key in ex for ex in examples):
            out[key] = np.concatenate([
                np.asarray(ex[key], np.int64) + (b if key == "seq_leaf" else 0)
                for ex, b in zip(examples, seg_base, strict=True)])
    parent = [np.asarray(ex["seg_parent"] if "seg_parent" in ex else ex["seg_prompt"],
                         np.int64) for ex in examples]
    out["seg_parent"] = np.concatenate([np.where(p >= 0, p + b, -1)
                                        for p, b in zip(parent, seg_base, strict=True)])
    if all("seg_prompt" in ex for ex in examples):
        out["seg_prompt"] = out["seg_parent"]
    out.update(tree_fields(out, cu))
    return out


def tree_fields(ex: dict, cu: np.ndarray) -> dict:
    """``seg_parent`` (and ``seg_prompt`` where ``ex`` has it) for the segments of ``cu``,
    the ones past ``ex``'s (row pads) roots, and ``seg_end``, ``tree_in``, ``tree_out`` made
    from them (:mod:`packtool.train.trees`): one derivation, so a row's tree arrays never
    disagree with its parents however it was padded or collated."""
    n = len(cu) - 1
    parent = np.asarray(ex["seg_parent"] if "seg_parent" in ex else ex["seg_prompt"], np.int64)
    parent = np.concatenate([parent, np.full(n - parent.size, -1, np.int64)])
    lengths = np.diff(np.asarray(cu, np.int64))
    idx = np.arange(n, dtype=np.int64)
    end = tree_shape(np.where(parent >= 0, idx - parent, 0), lengths)[1].astype(np.int64)
    tin = np.repeat(idx, lengths)
    out = {"seg_parent": parent.astype(np.int32), "seg_end": end.astype(np.int32),
           "tree_in": tin.astype(np.int32), "tree_out": end[tin].astype(np.int32)}
    if "seg_prompt" in ex:
        out["seg_prompt"] = out["seg_parent"]
    return out


def _image_keys(examples: list[dict]) -> dict:
    """The packs' images in row order: ``image_grid_thw`` [k, 3] (int64, the model's key) and
    ``image_refs`` (a list: where each image's bytes are, :mod:`packtool.train.vision` loads
    them)."""
    grids = [np.asarray(ex["image_grid_thw"], np.int64).reshape(-1, 3) for ex in examples]
    refs = [r for ex in examples for r in ex.get("image_refs", ())]
    out = {"image_grid_thw": np.concatenate(grids), "image_refs": refs}
    if all("image_source" in ex for ex in examples):
        out["image_source"] = np.concatenate([np.asarray(ex["image_source"], np.int64)
                                              for ex in examples])
    return out


def _offsets(examples: list[dict], key: str) -> np.ndarray:
    """The examples' ``key`` boundaries (``cu_seqlens`` where one has no ``key``: an
    unaligned pack's padded boundaries are its real ones) end to end, int32."""
    cus, offset = [np.zeros(1, np.int32)], 0
    for ex in examples:
        cu = np.asarray(ex.get(key, ex["cu_seqlens"]), dtype=np.int64)
        cus.append((cu[1:] + offset).astype(np.int32))
        offset += int(cu[-1])
    return np.concatenate(cus)


def _check_max_docs(examples: list[dict], max_docs: int) -> None:
    for j, ex in enumerate(examples):
        n = len(ex["cu_seqlens"]) - 1
        if n > max_docs:
            raise PacktoolError(
                f"example {j} of the batch holds {n} segments > max_docs {max_docs}: pack with "
                f"--max-docs {max_docs} (a pack padded by pad_to holds one segment more: pass "
                f"max_docs={max_docs + 1} then), or raise max_docs")


def _fixed(cu: np.ndarray, n_segments: int) -> np.ndarray:
    """``cu`` extended to ``n_segments + 1`` entries by repeating its last offset."""
    return np.concatenate([cu, np.full(n_segments + 1 - cu.size, cu[-1], cu.dtype)])
