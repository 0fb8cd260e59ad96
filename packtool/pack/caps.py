"""``--max-images`` / ``--max-vision-tokens``: caps on what a row holds beside its tokens.

A packer fills rows by language tokens (``--seq-len``; an image's tokens are language tokens
too). A row's vision encoder work is another budget: its images (each encoded on its own, so
a row of 40 small images is 40 encoder calls) and their patches. The caps are kept after the
packer, by any packer: a row over a cap keeps its documents in the packer's order while all
caps hold, and the documents it cannot keep are placed again, longest first, each in the
first new row with room for its tokens and under every cap (first fit decreasing)::

    packer's row   a (2 images)  b (3)  c (0)  d (2)       --max-images 4
    kept           a  c  d       (2, 2, 4: b would have made 5)
    moved          b             -> the first new row with room for it

Rows only lose documents, so ``--seq-len`` still holds; a document that alone exceeds a cap
is refused by name (its images, the cap, the fix). On a corpus where the caps rarely bind,
the new rows are few: measured in ``scripts/bench_vision_balance.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._numba import njit
from ..errors import PacktoolError


@njit
def _cap(packs, n_packs, lengths, weights, limits, capacity):
    """Pack id per entry with every pack under ``limits`` (weights [m, n]); -1 stays -1."""
    n, m = packs.shape[0], weights.shape[0]
    load = np.zeros((m, n_packs), np.int64)
    out = packs.copy()
    moved = np.zeros(n, np.bool_)
    for i in range(n):  # keep, in the packer's order, what fits every cap
        p = packs[i]
        if p < 0:
            continue
        if _fits(load, p, weights, i, limits):
            load[:, p] += weights[:, i]
        else:
            moved[i] = True
    idx = np.flatnonzero(moved)
    idx = idx[np.argsort(-lengths[idx], kind="mergesort")]
    fill = np.zeros(idx.size, np.int64)
    cap = np.zeros((m, idx.size), np.int64)
    used = 0
    for i in idx:  # first fit decreasing over the new rows
        b = 0
        while b < used and not (fill[b] + lengths[i] <= capacity
                                and _fits(cap, b, weights, i, limits)):
            b += 1
        if b == used:
            used += 1
        fill[b] += lengths[i]
        cap[:, b] += weights[:, i]
        out[i] = n_packs + b
    return out, used


@njit
def _fits(load, p, weights, i, limits):
    """Whether entry i's weights fit pack p's ``load`` under every limit."""
    for k in range(limits.shape[0]):  # noqa: SIM110 (a loop numba compiles, no temporary)
        if load[k, p] + weights[k, i] > limits[k]:
            return False
    return True


def cap_packs(packs: np.ndarray, lengths: np.ndarray, capacity: int, caps: dict
              ) -> tuple[np.ndarray, int]:
    """(pack id per entry, packs added) with every pack under ``caps``: ``{name: (per-entry
    weights, limit)}`` (e.g. ``{"--max-images": (images, 8)}``); a cap of None is no cap.
    ``packs``/``lengths`` as the packer took and gave them (ids dense from 0, -1 empty)."""
    caps = {k: v for k, v in caps.items() if v[1] is not None}
    packs = np.asarray(packs)
    if not caps or not packs.size:
        return packs, 0
    weights = np.stack([np.asarray(w, np.int64) for w, _ in caps.values()])
    limits = np.array([int(lim) for _, lim in caps.values()], np.int64)
    over = (weights > limits[:, None]) & (packs >= 0)
    if over.any():
        k, i = (int(x[0]) for x in np.nonzero(over))
        name = list(caps)[k]
        raise PacktoolError(
            f"document {i} alone needs {int(weights[k, i]):,} against {name} "
            f"{int(limits[k]):,}: raise {name} to at least {int(weights[k, i]):,}"
            + (", or tokenize with a smaller --max-pixels (fewer tokens an image)"
               if "token" in name else ""))
    n_packs = int(packs.max()) + 1 if (packs >= 0).any() else 0
    out, added = _cap(packs.astype(np.int64), n_packs, np.asarray(lengths, np.int64),
                      weights, limits, int(capacity))
    return out.astype(packs.dtype), int(added)


@dataclass
class DocImages:
    """Every document's images over the sources (numbered one after another), from the token
    files' image tables (version 5): ``ends`` [docs] the end of each document's images,
    ``start`` and ``tokens`` [images] each image's first image token in its document and
    its image-token count and ``cost`` its vision encoder cost
    (:func:`packtool.formats.packed.images.image_cost`). A source without images has none."""

    ends: np.ndarray
    start: np.ndarray
    tokens: np.ndarray
    cost: np.ndarray  # the encoder's attention cost, t (h w)^2 patches (float64)

    @classmethod
    def of(cls, corpora) -> DocImages | None:
        """The images of ``corpora``, or None when none was tokenized with ``--vision``."""
        if not any(c.vision for c in corpora):
            return None
        from ..formats.packed.images import image_cost

        counts, spans, costs = [], [], []
        for q in (q for c in corpora for q in c.parts):
            ends = q.per_doc("images")
            if ends is None:  # a text part: no image a document
                counts.append(np.zeros(len(q), np.int64))
                continue
            ends = np.asarray(ends, np.int64)
            counts.append(np.diff(ends, prepend=0))
            spans.append(np.asarray(q.per_doc("img_span"), np.int64).reshape(-1, 2))
            costs.append(image_cost(q.per_doc("img_grid")))
        span = np.concatenate(spans) if spans else np.zeros((0, 2), np.int64)
        return cls(np.cumsum(np.concatenate(counts)), span[:, 0].copy(), span[:, 1].copy(),
                   np.concatenate(costs) if costs else np.zeros(0))

    def entry_weights(self, segs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(images, image tokens, vision cost) per table entry of ``segs`` (an overflow policy's
        :class:`packtool.pack.segments.Segments`): a split document's images go to the piece
        that holds them; a piece boundary inside an image is refused by name."""
        n_docs = self.ends.size
        doc = np.repeat(np.arange(n_docs, dtype=np.int64), np.diff(self.ends, prepend=0))
        extra = np.zeros(n_docs, np.int64)
        extra[segs.split_docs] = segs.split_pieces - 1
        first = np.arange(n_docs, dtype=np.int64) + np.cumsum(extra) - extra
        split = np.zeros(n_docs, bool)
        split[segs.split_docs] = True
        piece = np.where(split[doc], self.start // segs.seq_len, 0)
        end_piece = np.where(split[doc], (self.start + self.tokens - 1) // segs.seq_len, 0)
        if (cut := np.flatnonzero(piece != end_piece)).size:
            i = int(cut[0])
            raise PacktoolError(
                f"document {int(doc[i])} is longer than --seq-len {segs.seq_len:,} and "
                f"--overflow split would cut its image at tokens {int(self.start[i]):,}.."
                f"{int(self.start[i] + self.tokens[i]):,} ({cut.size:,} images cut in all): "
                "raise --seq-len, or --overflow drop (over-long documents dropped, counted)")
        entry = first[doc] + piece
        n = segs.table_length.size
        return (np.bincount(entry, minlength=n)[:n],
                np.bincount(entry, weights=self.tokens, minlength=n)[:n].astype(np.int64),
                np.bincount(entry, weights=self.cost, minlength=n)[:n])
