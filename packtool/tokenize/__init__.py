"""Stage 1: raw corpora -> token files (``PREFIX.json`` and its parts' ``.bin``,
``.boundaries``, ``.mask``): a plan of parts (:mod:`.plan`), each a job (:mod:`.part`) run by
the pipeline (:mod:`.pipeline`, :mod:`.encode`), and the stage that runs them and writes the
manifest, ``PREFIX.json`` from the parts' own manifests (:mod:`.stage`).

Besides: :mod:`.prepare` what every part needs once per process (tokenizer, ids,
encoder, engine), :mod:`.groups` pairs and groups to sequences (the prompt encoded once),
:mod:`.result` what a run reports, :mod:`.images` records with images (``--vision``):
image tokens expanded, their spans and 3-D positions.
"""

from ..options import TokenizeOptions
from .encode import make_encoder
from .plan import Part, TokenizePlan, group_files, plan_tokenize
from .result import TokenizeResult
from .stage import finalize_tokenize, tokenize_files

__all__ = ["Part", "TokenizeOptions", "TokenizePlan", "TokenizeResult", "finalize_tokenize",
           "group_files", "make_encoder", "plan_tokenize", "tokenize_files"]
