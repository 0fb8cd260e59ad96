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
    """``image_grid_thw`` [k, 3] (int64), ``image_refs`` (k dicts), ``image_source`` (k: the
    source corpus of each, whose manifest :func:`packtool.vision.images.load_ref` takes) and,
    with ``mrope``,
    ``position_ids_3d`` [3, N] (int64) of a row whose segments are (``seg_doc``,
    ``seg_offset``, ``seg_length``), documents numbered across ``sources`` in order."""
    base = np.cumsum([0] + [len(c) for c in sources])
    grids, refs, pos, src = [], [], [], []
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
            src.append(np.full(int(inside.sum()), k, np.int64))
        if mrope:
            pos.append(_positions(corpus, local, off, n))
    out = {"image_grid_thw": np.concatenate(grids) if grids else np.zeros((0, 3), np.int64),
           "image_refs": refs,
           "image_source": np.concatenate(src) if src else np.zeros(0, np.int64)}
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


def image_cost(grid) -> np.ndarray:
    """The vision encoder's attention cost of images of ``grid`` [k, 3] (t, h, w): attention
    runs over each frame's h x w patches, so t (h w)^2 (an image: its patches squared)."""
    g = np.asarray(grid, np.int64).reshape(-1, 3)
    return (g[:, 0] * (g[:, 1] * g[:, 2]) ** 2).astype(np.float64)


class ImageTable:
    """Every image of the sources as flat arrays, made once (16 bytes an image and 8 a
    document): each image's place in the sources' token stream and its cost and tokens, so
    a segment's images are a range found by two binary searches, nothing parsed.
    :meth:`segment_sums` gives per segment (images, image tokens, vision cost)."""

    def __init__(self, sources):
        starts, coords, costs, tokens, base = [], [], [], [], 0
        for q in (q for c in sources for q in c.parts):
            ends = np.asarray(q.ends, np.int64)
            first = base + np.concatenate([[0], ends[:-1]])
            starts.append(first)
            im = q.per_doc("images")
            if im is not None and len(im):
                doc = np.repeat(np.arange(len(q)), np.diff(np.asarray(im, np.int64), prepend=0))
                span = np.asarray(q.per_doc("img_span"), np.int64).reshape(-1, 2)
                coords.append(first[doc] + span[:, 0])
                tokens.append(span[:, 1])
                costs.append(image_cost(q.per_doc("img_grid")).astype(np.int64))
            base += int(ends[-1]) if ends.size else 0
        self.doc_start = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        self.coord = np.concatenate(coords) if coords else np.zeros(0, np.int64)
        self.cum = {k: np.concatenate([[0], np.cumsum(np.concatenate(v))]) if v else  # exact
                    np.zeros(1, np.int64) for k, v in (("tokens", tokens), ("cost", costs))}

    def segment_sums(self, seg_doc, seg_offset, seg_length) -> dict:
        """Per segment: ``images``, ``tokens`` (image tokens) and ``cost`` (:func:`image_cost`
        summed) of the images inside it."""
        lo = self.doc_start[np.asarray(seg_doc, np.int64)] + np.asarray(seg_offset, np.int64)
        a = np.searchsorted(self.coord, lo, side="left")
        b = np.searchsorted(self.coord, lo + np.asarray(seg_length, np.int64), side="left")
        return {"images": b - a, "tokens": (self.cum["tokens"][b] - self.cum["tokens"][a]),
                "cost": (self.cum["cost"][b] - self.cum["cost"][a]).astype(np.float64)}

    def pack_sums(self, pack_seg, seg_doc, seg_offset, seg_length) -> dict:
        """:meth:`segment_sums` summed per pack (``pack_seg``: each pack's first segment,
        then the segment count)."""
        at = np.asarray(pack_seg[:-1], np.int64)
        return {k: np.add.reduceat(v, at) if v.size else v for k, v in
                self.segment_sums(seg_doc, seg_offset, seg_length).items()}
