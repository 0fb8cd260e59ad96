"""Tokenizer engines: the `tokenizers` library as the reference, faster Rust engines verified
against it (:mod:`.select`), one module per engine (:mod:`.fastokens`, :mod:`.tokie`,
:mod:`.gigatoken`), and the measured order ``--engine auto`` tries them in per tokenizer
family (:mod:`.ranking`)."""

from .base import Engine, EngineMismatch, EngineRefused, flatten
from .select import (
    CHECKS,
    ENGINE_NAMES,
    FASTEST_FIRST,
    FIRST_DOCS,
    GROWTH,
    LOADERS,
    RANDOM_RATE,
    SEED,
    Selection,
    engine_manifest,
    engine_summary,
    first_difference,
    load_engine,
    mismatch_warning,
    sample_picks,
    select_engine,
)

__all__ = ["CHECKS", "ENGINE_NAMES", "FASTEST_FIRST", "FIRST_DOCS", "GROWTH", "LOADERS",
           "RANDOM_RATE", "SEED", "Engine", "EngineMismatch", "EngineRefused", "Selection",
           "engine_manifest", "engine_summary", "first_difference", "flatten", "load_engine",
           "mismatch_warning", "sample_picks", "select_engine"]
