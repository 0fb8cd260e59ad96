"""Images in token files, counted without decoding a pixel: :mod:`.headers` an image's size
from its header, :mod:`.rules` how many tokens a model's processor makes of that size (one
rule a model family, in a dict), :mod:`.rope` the 3-D (mRoPE) positions of one document,
:mod:`.images` a record's images found, loaded, hashed and sized in the reader.
"""

from .headers import COUNTER, BadImage, image_size
from .rope import mrope_positions
from .rules import PLACEHOLDER, RULES, Rule, smart_resize

__all__ = ["COUNTER", "PLACEHOLDER", "RULES", "BadImage", "Rule", "image_size",
           "mrope_positions", "smart_resize"]
