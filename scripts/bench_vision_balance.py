"""Packing a mixed text + image corpus: by text tokens only, or with the vision encoder's cost.

    python scripts/bench_vision_balance.py [--docs 200000] [--seq-len 8192] [--world-size 8]
                                           [--batch-size 4] [--max-vision-tokens 6144]

A synthetic corpus of Qwen2-VL documents: half text only (lognormal lengths, median 300,
sigma 1, clipped to 8,192), half with 1-4 images (each side lognormal, median 700 px, sigma
0.6, clipped to [56, 4096]) sized by packtool's own rule (``packtool.vision.RULES["qwen2-vl"]``:
smart resize within min_pixels 56^2 and max_pixels 1280 x 28^2, the fine-tuning setting of
Qwen2-VL's model card, so 4 to 1,280 image tokens an image; 14-pixel patches, 2x2 merge)
plus 20-400 text tokens. A document's language tokens count its image tokens (``--seq-len``'s unit).

Costs, in FLOPs of Qwen2-VL-7B's shapes (decoder 28 layers of width 3,584; vision encoder 32
layers of width 1,280; a layer's projections and MLP ~24 d^2 a token, attention 2 d l^2 for a
causal segment of l tokens and 4 d P^2 for an image's P patches, bidirectional):

    language  28 x (24 d^2 L + 2 d sum l^2)            a L + L^2 per document, d = 3,584
    vision    32 x (24 d^2 P + 4 d sum P^2)            per image, d = 1,280

Three ways, bfd at ``--seq-len``, steps of ``world_size x batch_size`` rows balanced by
packtool's own sampler arithmetic (``like_cost_order`` then ``balance_steps``), the figure per
cost: the mean over steps of max-rank / min-rank cost (1.00 is even):

    text only        packs by text tokens, steps balanced on the language cost alone
    + vision term    the same packs, steps balanced on language + vision
    + vision cap     pack --max-vision-tokens N (``packtool.pack.caps``), balanced on both:
                     a cap bounds a row's encoder memory; it costs rows, it does not balance

Prints measurements only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this work tree

from packtool.formats.packed.balance import balance_steps, like_cost_order
from packtool.pack.caps import cap_packs
from packtool.packers import assign_packs
from packtool.vision import RULES

LM = (28, 3584)   # Qwen2-VL-7B decoder: layers, width
VIT = (32, 1280)  # its vision encoder
MAX_PIXELS = 1280 * 28 * 28  # at most 1,280 image tokens an image


def corpus(n: int, seq_len: int, seed: int = 0):
    """(language tokens, image tokens, vision FLOPs, images) per document, and per document
    the sum of its images' (patches, patches^2)."""
    rng = np.random.default_rng(seed)
    rule = RULES["qwen2-vl"]
    text = np.clip(rng.lognormal(np.log(300), 1.0, n), 1, seq_len).astype(np.int64)
    n_img = np.where(rng.random(n) < 0.5, rng.integers(1, 5, n), 0)
    sides = np.clip(rng.lognormal(np.log(700), 0.6, (int(n_img.sum()), 2)), 56, 4096)
    grids = np.array([rule.grid(int(w), int(h), max_pixels=MAX_PIXELS) for w, h in sides],
                     np.int64).reshape(-1, 3)
    patches = grids.prod(axis=1)
    doc = np.repeat(np.arange(n), n_img)
    img_tokens = np.bincount(doc, patches // rule.merge ** 2, n).astype(np.int64)
    p1 = np.bincount(doc, patches.astype(np.float64), n)
    p2 = np.bincount(doc, patches.astype(np.float64) ** 2, n)
    text = np.where(n_img > 0, rng.integers(20, 400, n), text)
    lengths = text + img_tokens
    keep = lengths <= seq_len  # an over-long document would be dropped (--overflow drop)
    return lengths[keep], img_tokens[keep], n_img[keep], p1[keep], p2[keep]


def costs(packs, lengths, p1, p2) -> tuple[np.ndarray, np.ndarray]:
    (ll, dl), (lv, dv) = LM, VIT
    n = int(packs.max()) + 1
    lm = ll * (24.0 * dl * dl * np.bincount(packs, lengths, n)
               + 2.0 * dl * np.bincount(packs, lengths.astype(np.float64) ** 2, n))
    vit = lv * (24.0 * dv * dv * np.bincount(packs, p1, n) + 4.0 * dv * np.bincount(packs, p2, n))
    return lm, vit


def imbalance(balance_on, parts, world: int, batch: int, seed: int = 0) -> list[float]:
    """Mean over steps of max/min rank cost of each of ``parts``, steps of like
    ``balance_on`` cost dealt by it (the sampler's arithmetic)."""
    g = world * batch
    order = like_cost_order(np.random.default_rng(seed).permutation(len(balance_on)),
                            balance_on, g)
    order = order[: len(order) // g * g].reshape(-1, g)
    slots = balance_steps(balance_on[order], world, batch).reshape(len(order), g)
    ids = np.take_along_axis(order, slots, axis=1).reshape(len(order), world, batch)
    out = []
    for c in parts:
        rank = c[ids].sum(axis=2)
        ok = rank.min(axis=1) > 0
        out.append(float((rank.max(axis=1)[ok] / rank.min(axis=1)[ok]).mean()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-vision-tokens", type=int, default=6144)
    a = ap.parse_args()
    t0 = time.perf_counter()
    lengths, img_tokens, n_img, p1, p2 = corpus(a.docs, a.seq_len)
    (ll, dl), (lv, dv) = LM, VIT
    doc_vit = lv * (24.0 * dv * dv * p1 + 4.0 * dv * p2)
    doc_lm = ll * (24.0 * dl * dl * lengths + 2.0 * dl * lengths.astype(np.float64) ** 2)
    print(f"{len(lengths):,} documents, {int(lengths.sum()):,} language tokens "
          f"({100 * img_tokens.sum() / lengths.sum():.1f}% image tokens), {int(n_img.sum()):,} "
          f"images; the vision encoder {100 * doc_vit.sum() / (doc_vit.sum() + doc_lm.sum()):.1f}"
          f"% of the FLOPs; seq_len {a.seq_len:,}, {a.world_size} ranks x {a.batch_size} rows")
    plain = assign_packs(lengths, a.seq_len)
    capped, _ = cap_packs(plain, lengths, a.seq_len,
                          {"--max-vision-tokens": (img_tokens, a.max_vision_tokens)})
    print(f"{'':<34}{'rows':>9}{'efficiency':>12}   max/min rank cost: language  vision  total")
    for name, packs, on_both in (("text tokens only", plain, False),
                                 ("+ vision term (balance)", plain, True),
                                 (f"+ --max-vision-tokens {a.max_vision_tokens}", capped, True)):
        lm, vit = costs(packs, lengths, p1, p2)
        parts = imbalance(lm + vit if on_both else lm, (lm, vit, lm + vit), a.world_size,
                          a.batch_size)
        n = int(packs.max()) + 1
        print(f"{name:<34}{n:>9,}{100 * lengths.sum() / (n * a.seq_len):>11.2f}%   "
              f"{'':>19}{parts[0]:>8.3f}{parts[1]:>8.3f}{parts[2]:>7.3f}")
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
