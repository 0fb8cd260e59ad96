"""Tokenizer engines: the `tokenizers` library as the reference, faster Rust engines verified
against it (:mod:`.select`), one module per engine (:mod:`.fastokens`, :mod:`.tokie`,
:mod:`.gigatoken`), and the measured order ``--engine auto`` tries them in per tokenizer
family (:mod:`.ranking`); the run-time check's sample in :mod:`.sample`.

The rest: :mod:`.base` what an engine is (``encode`` and the two refusals),
:mod:`.tokenizer` the tokenizer loader (a ``tokenizer.json``, a folder, a SentencePiece
``.model``, or a URL), :mod:`.spm` SentencePiece models, :mod:`.report` what a run's
engine was, for the manifest and the summary.
"""

from .base import Engine, EngineMismatch, EngineRefused, flatten
from .report import engine_manifest, engine_summary, mismatch_warning
from .sample import (
    BUDGET_BYTES,
    BUDGET_SHARE,
    FIRST_DOCS,
    GROWTH,
    RANDOM_RATE,
    SEED,
    Sampled,
    sample_picks,
)
from .select import (
    CHECKS,
    ENGINE_NAMES,
    FASTEST_FIRST,
    LOADERS,
    Selection,
    first_difference,
    load_engine,
    select_engine,
)

__all__ = ["BUDGET_BYTES", "BUDGET_SHARE", "CHECKS", "ENGINE_NAMES", "FASTEST_FIRST",
           "FIRST_DOCS", "GROWTH", "LOADERS", "RANDOM_RATE", "SEED", "Engine", "EngineMismatch",
           "EngineRefused", "Sampled", "Selection", "engine_manifest", "engine_summary",
           "first_difference", "flatten", "load_engine", "mismatch_warning", "sample_picks",
           "select_engine"]
