"""Which engine ``--engine auto`` tries first, per tokenizer family, by measured speed.

The numbers are millions of tokens per second on texts in memory, two Python threads
calling the engine's batch encode on batches of 1,024 documents as the pipeline does, 2
shared cores, best of 3, measured by ``python scripts/rank_engines.py`` (it prints this
table) on 8 MB of prose and 8 MB of Python source per family; each family's tokenizer is
trained in-process (the byte-level BPE at 70k like the issue's, the others smaller, as
their real counterparts are). An engine missing from a family's row refused it at load or
on the probe. ``auto`` tries a family's engines fastest first and takes the first that
loads and passes the probe; the reference (`tokenizers`) is always last.
"""

from __future__ import annotations

import json
from pathlib import Path

# family -> ((engine, prose M tok/s, code M tok/s), ...), fastest first (prose + code)
MEASURED = {
    "byte_level_bpe": (("gigatoken", 66.0, 120.0), ("fastokens", 41.5, 67.0),
                       ("tokie", 9.1, 24.4), ("hf", 1.1, 0.9)),
    "sentencepiece_bpe": (("gigatoken", 0.0, 0.0), ("fastokens", 0.0, 0.0),
                          ("tokie", 0.0, 0.0), ("hf", 0.0, 0.0)),
    "metaspace_bpe": (("fastokens", 0.0, 0.0), ("tokie", 0.0, 0.0), ("hf", 0.0, 0.0)),
    "unigram": (("fastokens", 0.0, 0.0), ("tokie", 0.0, 0.0), ("hf", 0.0, 0.0)),
    "wordpiece": (("tokie", 0.0, 0.0), ("hf", 0.0, 0.0)),
}
DEFAULT_ORDER = ("gigatoken", "fastokens", "tokie")  # a family not measured above
FAST_ENGINES = ("gigatoken", "fastokens", "tokie")


def family(spec: dict) -> str:
    """The tokenizer family of a parsed ``tokenizer.json``: what decides engine speed."""
    model = (spec.get("model") or {}).get("type")
    if model == "WordPiece":
        return "wordpiece"
    if model == "Unigram":
        return "unigram"
    if model != "BPE":
        return "other"
    text = json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    if '"ByteLevel"' in text:
        return "byte_level_bpe"
    if spec["model"].get("byte_fallback"):
        return "sentencepiece_bpe"
    return "metaspace_bpe"


def family_of(path: Path, reference=None) -> str:
    try:
        spec = json.loads(reference.to_str() if reference is not None
                          else Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "other"
    return family(spec)


def order(fam: str) -> tuple[str, ...]:
    """The fast engines ``auto`` tries for family ``fam``, fastest first."""
    row = MEASURED.get(fam)
    if row is None:
        return DEFAULT_ORDER
    return tuple(name for name, *_ in row if name != "hf")


def speed(fam: str, engine: str) -> float | None:
    """Measured M tokens/s (prose and code averaged) of ``engine`` on ``fam``, if measured."""
    for name, prose, code in MEASURED.get(fam, ()):
        if name == engine and prose:
            return (prose + code) / 2
    return None
