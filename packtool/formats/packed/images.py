"""A packed row's images, read from its source corpora (tokens format version 5, ``tokenize
--vision``): nothing about an image is copied into the packed dataset, a row finds its images
through its segments (source document, offset, length), as it finds its tokens::

    segments      a (doc 7, 0, 12)        b (doc 3, 0, 9)       c (doc 9, 0, 6)
    tokens        t [v v v v] t t t ...   t t [v v] t [v v v]   t t t t t t
    image_refs    img 7.0                 img 3.0  img 3.1                   (row order)
    image_grid_thw [1,4,4]                [1,2,4]  [1,2,6]
    position_ids_3d [3, N]: each segment's stored mRoPE ids, restarting at 0 per segment

A segment that is a piece of a longer document (``--overflow split``) starts at a text token,
whose three ids are equal, so its ids moved down by that value are the ids of the piece alone
(mRoPE is shift-equivariant: text continues from the largest id, an image starts at the next
one); ``pack`` never cuts inside an image. A document of a source without images (a text
corpus mixed in) has the text rule's ids, its positions in all three rows.
"""

from __future__ import annotations

import numpy as np

from ...errors import FormatError


def has_images(sources) -> tuple[bool, bool]:
    """(any source holds images, any holds mRoPE positions)."""
    vision = [c.vision for c in sources if c.vision]
    return bool(vision), any(v.get("mrope") for v in vision)


def row_images(sources, seg_doc, seg_offset, seg_length, mrope: bool) -> dict:
    """``image_grid_thw`` [k, 3] (int64), ``image_refs`` (k dicts) and, with ``mrope``,
    ``position_ids_3d`` [3, N] (int64) of a row whose segments are (``seg_doc``,
    ``seg_offset``, ``seg_length``), documents numbered across ``sources`` in order."""
    base = np.cumsum([0] + [len(c) for c in sources])
    grids, refs, pos = [], [], []
    for doc, off, n in zip(np.asarray(seg_doc).tolist(), np.asarray(seg_offset).tolist(),
                           np.asarray(seg_length).tolist(), strict=True):
        k = int(np.searchsorted(base, doc, side="right") - 1)
        corpus, local = sources[k], doc - int(base[k])
        if corpus.vision:
            im = corpus.images(local)
            span = np.asarray(im["span"], np.int64).reshape(-1, 2)
            inside = (span[:, 0] >= off) & (span.sum(axis=1) <= off + n)
            cut = ~inside & (span[:, 0] < off + n) & (span.sum(axis=1) > off)
            if cut.any():
                raise FormatError(f"document {doc} of {corpus.prefix}: a segment "
                                  f"[{off}, {off + n}) cuts image {int(np.argmax(cut))}; "
                                  "the dataset was not packed by packtool: pack it again")
            grids.append(np.asarray(im["grid"], np.int64).reshape(-1, 3)[inside])
            refs += [r for r, keep in zip(im["refs"], inside.tolist(), strict=True) if keep]
        if mrope:
            pos.append(_positions(corpus, local, off, n))
    out = {"image_grid_thw": np.concatenate(grids) if grids else np.zeros((0, 3), np.int64),
           "image_refs": refs}
    if mrope:
        out["position_ids_3d"] = (np.concatenate(pos, axis=1) if pos
                                  else np.zeros((3, 0), np.int64))
    return out


def _positions(corpus, doc: int, off: int, n: int) -> np.ndarray:
    """[3, n] mRoPE ids of tokens ``off .. off + n`` of ``doc``, as the piece alone has them."""
    if not (corpus.vision and corpus.vision.get("mrope")):
        return np.broadcast_to(np.arange(n, dtype=np.int64), (3, n)).copy()
    p = np.asarray(corpus.positions3(doc)[:, off:off + n], np.int64)
    if off and n:
        if not (p[0, 0] == p[1, 0] == p[2, 0]):
            raise FormatError(f"document {doc} of {corpus.prefix}: a segment starts at token "
                              f"{off}, inside an image; pack it again")
        p = p - p[0, 0]
    return p
