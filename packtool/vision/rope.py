"""mRoPE positions of one document: the 3-row (temporal, height, width) position ids that
Qwen2-VL, Qwen2.5-VL and Qwen3-VL compute with ``get_rope_index`` (transformers), made here
per document so that a packed row restarts them at every document (tests/test_vision.py:
equal to each model's ``get_rope_index`` on the document alone)::

    tokens    T  T  S  I  I  I  I  I  I  E  T         an image of grid (1, 4, 6), merge 2:
    temporal  0  1  2  3  3  3  3  3  3  6  7         2 x 3 = 6 image tokens, each at
    height    0  1  2  3  3  3  4  4  4  6  7         (t, h, w) = 3 + (0, row, column);
    width     0  1  2  3  4  5  3  4  5  6  7         the text after goes on at
                                                      3 + max(h, w) / merge = 6

Text tokens (and the vision start/end tokens around an image) count on by one in all three
rows; a still image's temporal index is 0 (no temporal scaling for images).
"""

from __future__ import annotations

import numpy as np


def mrope_positions(n_tokens: int, image_spans, grids, *, merge: int) -> np.ndarray:
    """int32 ``[3, n_tokens]`` positions of a document of ``n_tokens`` whose images occupy
    ``image_spans`` ``[k, 2]`` (offset of the first image token, count), in order, with
    patch grids ``grids`` ``[k, 3]`` (t, h, w). A span whose count is not t*h*w/merge**2, or
    that overlaps the one before, is a ValueError."""
    pos = np.empty((3, n_tokens), np.int32)
    cur = prev = 0
    for (start, count), (t, h, w) in zip(np.asarray(image_spans, np.int64).reshape(-1, 2),
                                         np.asarray(grids, np.int64).reshape(-1, 3),
                                         strict=True):
        start, count = int(start), int(count)
        lh, lw, t = int(h) // merge, int(w) // merge, int(t)
        if count != t * lh * lw or start < prev or start + count > n_tokens:
            raise ValueError(f"image span ({start}, {count}) does not fit grid ({t}, {h}, {w}) "
                             f"after offset {prev} in {n_tokens} tokens")
        pos[:, prev:start] = np.arange(cur, cur + start - prev, dtype=np.int32)
        cur += start - prev
        span = pos[:, start:start + count].reshape(3, t, lh, lw)
        span[0] = cur + np.arange(t, dtype=np.int32)[:, None, None]
        span[1] = cur + np.arange(lh, dtype=np.int32)[None, :, None]
        span[2] = cur + np.arange(lw, dtype=np.int32)[None, None, :]
        cur += max(lh, lw)
        prev = start + count
    pos[:, prev:] = np.arange(cur, cur + n_tokens - prev, dtype=np.int32)
    return pos


def mrope_batch(lengths, counts, spans, grids, *, merge: int) -> np.ndarray:
    """int32 ``[n_tokens, 3]`` positions of consecutive documents (``lengths``), document
    d holding ``counts[d]`` of the images ``spans``/``grids`` (in order, spans local to their
    document): :func:`mrope_positions` of each, made in one pass of array arithmetic (a
    batch of 1,000 one-image records: ~25x faster than a call a document)."""
    lengths = np.asarray(lengths, np.int64)
    spans = np.asarray(spans, np.int64).reshape(-1, 2)
    grids = np.asarray(grids, np.int64).reshape(-1, 3)
    n = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    doc = np.repeat(np.arange(len(lengths)), np.asarray(counts, np.int64))
    first, count = starts[doc] + spans[:, 0], spans[:, 1]
    lh, lw = grids[:, 1] // merge, grids[:, 2] // merge
    # a text token's position: its offset in the document, less what the images before it
    # in the document saved (count tokens took max(lh, lw) positions); an image that ends
    # its document saves nothing (no token of its document follows)
    if n == 0:
        return np.empty((0, 3), np.int32)
    inside = spans[:, 0] + count < lengths[doc]
    saved = np.zeros(n, np.int64)
    np.add.at(saved, (first + count)[inside], (count - np.maximum(lh, lw))[inside])
    total = np.cumsum(saved)
    before = np.repeat(total[np.minimum(starts, n - 1)], lengths)  # saved[start] is 0
    text = np.arange(n) - np.repeat(starts, lengths) - (total - before)
    pos = np.repeat(text[:, None], 3, 1)
    if count.size:  # image token k: base + (k // (lh lw), k // lw % lh, k % lw)
        img = np.repeat(np.arange(count.size), count)
        k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        at = np.repeat(first, count) + k
        base = np.repeat(text[first], count)
        hw, w_, h_ = (lh * lw)[img], lw[img], lh[img]
        pos[at] = base[:, None] + np.stack([k // hw, k // w_ % h_, k % w_], 1)
    return pos.astype(np.int32)
