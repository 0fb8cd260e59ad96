"""Records with images -> tokens: each image's placeholder, tokenized as the model's image
token (once), is repeated as many times as the image has vision tokens; the loss mask is 0 on
them; each document's images (grid, span, reference) and, for an mRoPE rule, its 3-D
positions go beside the tokens (:class:`packtool.formats.tokens.writer.ImageBatch`)::

    text      "<|vision_start|><|image_pad|><|vision_end|>What is it?"   (reader)
    encoded   S P E What is it ?                                          (tokenizer)
    expanded  S P P P ... P E What is it ?      P repeated 391 times for a 640x480 image
    span      (1, 391)  grid (1, 34, 46)        pos3: packtool.vision.rope
"""

from __future__ import annotations

import numpy as np

from ..errors import PacktoolError
from ..formats.tokens.writer import ImageBatch
from ..vision.rope import mrope_batch


def vision_encoder(encode, rule, image_id: int):
    """``encode`` (records -> lengths, ids, mask) for records that are
    :class:`packtool.vision.images.VisionDoc`: their documents encoded, then expanded."""

    def run(records, pick=None):
        lengths, ids, mask = encode([r.doc for r in records], pick)[:3]
        if mask is None:
            mask = np.ones(ids.size, np.uint8)
        return expand(records, lengths, ids, mask, rule, image_id)

    return run


def expand(records, lengths, ids, mask, rule, image_id: int):
    """(lengths, ids, mask, None, None, ImageBatch) with every image token repeated to its count."""
    at = np.flatnonzero(ids == image_id)
    counts = np.fromiter((len(r.images) for r in records), np.int64, len(records))
    owner = np.searchsorted(np.cumsum(lengths), at, side="right")
    found = np.bincount(owner, minlength=len(records))
    if not np.array_equal(found, counts):
        d = int(np.flatnonzero(found != counts)[0])
        raise PacktoolError(
            f"a document of {counts[d]} images tokenized to {found[d]} image tokens: the "
            f"tokenizer splits or merges {rule.image_token!r}; use the model's own tokenizer, "
            "which has it as one special token")
    n = np.fromiter((im.n_tokens for r in records for im in r.images), np.int64, at.size)
    repeat = np.ones(ids.size, np.int64)
    repeat[at] = n
    ids, mask = np.repeat(ids, repeat), np.repeat(mask, repeat)
    mask[ids == image_id] = 0
    lengths = lengths + np.bincount(owner, weights=n - 1, minlength=len(records)).astype(
        np.int64)
    starts = np.cumsum(lengths) - lengths
    first = at + np.concatenate([[0], np.cumsum(n - 1)[:-1]]).astype(np.int64)
    spans = np.stack([first - starts[owner], n], 1) if at.size else np.empty((0, 2), np.int64)
    grids = np.array([im.grid for r in records for im in r.images], np.uint32).reshape(-1, 3)
    pos3 = (mrope_batch(lengths, counts, spans, grids, merge=rule.merge) if rule.mrope
            else None)
    refs = [im.ref for r in records for im in r.images]
    return lengths, ids, mask, None, None, ImageBatch(counts, grids, spans, refs, pos3)
