"""Stage 1: raw corpora -> token files (``PREFIX.json`` and its parts' ``.bin``,
``.boundaries``, ``.mask``): a plan of parts (:mod:`.plan`), each a job (:mod:`.part`) run by
the pipeline (:mod:`.pipeline`, :mod:`.encode`), and the stage that runs them and writes the
manifest (:mod:`.stage`)."""

from ..options import TokenizeOptions
from .encode import make_encoder
from .plan import Part, TokenizePlan, group_files, plan_tokenize
from .result import TokenizeResult
from .stage import finalize_tokenize, tokenize_files

__all__ = ["Part", "TokenizeOptions", "TokenizePlan", "TokenizeResult", "finalize_tokenize",
           "group_files", "make_encoder", "plan_tokenize", "tokenize_files"]
