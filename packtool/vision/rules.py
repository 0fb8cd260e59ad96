"""How many tokens an image becomes, per model family: a rule is a value (:class:`Rule`), the
registry a dict (:data:`RULES`), as transformers' image processors compute it from the image's
size alone (tests/test_vision.py compares every rule with the processor on generated images)::

    qwen2-vl, qwen2.5-vl   patch 14, merge 2: smart_resize to multiples of 28 within
                           [min_pixels, max_pixels] (aspect kept, rounded), grid
                           (t=1, h/14, w/14), tokens t*h*w/4; a 640x480 image: 644x476 ->
                           grid (1, 34, 46) -> 391 tokens
    qwen3-vl               the same with patch 16, merge 2 (multiples of 32)
    llava                  a fixed 576 tokens an image (LLaVA-1.5: 336 px, 14 px patches)

Defaults of min/max pixels are those of the models' ``preprocessor_config.json`` on the Hub
(Qwen2-VL and Qwen2.5-VL 3,136 and 12,845,056; Qwen3-VL 65,536 and 16,777,216); a
processor made with others (``min_pixels=``, ``max_pixels=``, or ``size=`` with
``shortest_edge``/``longest_edge``) needs the same numbers here (``--min-pixels``,
``--max-pixels``), else its grids differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .headers import BadImage

MAX_ASPECT = 200  # smart_resize refuses a longer side over 200x the shorter


@dataclass(frozen=True)
class Rule:
    name: str
    patch: int              # pixels per patch side
    merge: int              # patches merged per token side (2: 2x2 patches a token)
    min_pixels: int | None  # default pixel bounds of the resize (None: a fixed size)
    max_pixels: int | None
    image_token: str        # the token repeated once per vision token
    start_token: str | None  # around the image's tokens, where the model's template has them
    end_token: str | None
    mrope: bool             # 3-D positions (packtool.vision.rope)
    fixed: int = 0          # a fixed grid side in patches (LLaVA)

    def grid(self, width: int, height: int, min_pixels: int | None = None,
             max_pixels: int | None = None) -> tuple[int, int, int]:
        """(t, h, w) in patches of an image of ``width`` x ``height`` pixels."""
        if self.fixed:
            return 1, self.fixed, self.fixed
        lo = self.min_pixels if min_pixels is None else min_pixels
        hi = self.max_pixels if max_pixels is None else max_pixels
        h, w = smart_resize(height, width, self.patch * self.merge, lo, hi)
        return 1, h // self.patch, w // self.patch

    def tokens(self, grid) -> int:
        """Vision tokens of a grid: t*h*w / merge**2."""
        t, h, w = (int(x) for x in grid)
        return t * h * w // (self.merge * self.merge)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int
                 ) -> tuple[int, int]:
    """Qwen-VL's resize target: both sides multiples of ``factor``, the area within
    [min_pixels, max_pixels], the aspect ratio kept as closely as rounding allows (Python's
    ``round``, half to even, as transformers' own)."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise BadImage(f"a {width}x{height} image: its aspect ratio is over {MAX_ASPECT}, "
                       "which the Qwen-VL processors refuse")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


_QWEN = {"image_token": "<|image_pad|>", "start_token": "<|vision_start|>",
         "end_token": "<|vision_end|>", "mrope": True, "merge": 2}
RULES = {
    "qwen2-vl": Rule("qwen2-vl", patch=14, min_pixels=56 * 56, max_pixels=12_845_056, **_QWEN),
    "qwen2.5-vl": Rule("qwen2.5-vl", patch=14, min_pixels=56 * 56, max_pixels=12_845_056,
                       **_QWEN),
    "qwen3-vl": Rule("qwen3-vl", patch=16, min_pixels=65_536, max_pixels=16_777_216, **_QWEN),
    "llava": Rule("llava", patch=14, merge=1, min_pixels=None, max_pixels=None,
                  image_token="<image>", start_token=None, end_token=None, mrope=False,
                  fixed=24),
}
PLACEHOLDER = "<image>"  # where an --images-field image goes in a record's text
