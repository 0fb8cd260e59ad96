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
