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

# family -> ((engine, prose M tok/s, code M tok/s), ...), fastest first (prose + code).
# Measured 2025-11 (issue 22) with --size-mb 4 while other jobs shared the 2 cores: the order
# is what counts. byte_level_bpe: the 70k BPE; sentencepiece_bpe: a 16k Llama-2-style model.
# metaspace_bpe: every fast engine refused the 8k Metaspace BPE (gigatoken: no byte
# vocabulary; fastokens: no Metaspace pre-tokenizer; tokie: probe mismatch on tabs).
MEASURED = {
    "byte_level_bpe": (("gigatoken", 43.5, 51.7), ("fastokens", 12.6, 59.5),
                       ("tokie", 4.0, 16.9), ("hf", 0.5, 0.5)),
    "sentencepiece_bpe": (("fastokens", 16.4, 27.2), ("gigatoken", 22.1, 9.9),
                          ("tokie", 5.2, 3.8), ("hf", 1.4, 1.5)),
    "metaspace_bpe": (("hf", 5.0, 2.2),),
}
FAST_ENGINES = ("gigatoken", "fastokens", "tokie")
# A SentencePiece .model: tokenizers running packtool's conversion (hf) against the reference,
# the sentencepiece library's batch encoder (its C++ threads), M tokens/s on 20 MB of prose /
# code, 32k models (scripts/bench_corpora.py's spm_models), 2 shared cores at load 5, best of 2
# (2025-11): byte-fallback BPE with the Llama-2 normalizer hf 1.5 / 1.1, sentencepiece 2.2 /
# 2.1 (fastokens 5.7 / 5.9); the same with the default nmt_nfkc hf 1.0, sentencepiece 1.7
# (prose); Unigram (nmt_nfkc) hf 0.7, sentencepiece 15.3. hf is never the faster, so auto
# does not try it on a .model (the fast engines read the conversion; --engine hf runs it).
HF_ON_A_MODEL = ("not tried: the sentencepiece library is as fast or faster on SentencePiece "
                 "models (measured 1.7-15 vs 0.7-1.5M tokens/s)")
DEFAULT_ORDER = FAST_ENGINES  # a family not measured: the byte-level order


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


def order(fam: str) -> tuple[str, ...]:
    """The fast engines ``auto`` tries for family ``fam``: the measured ones fastest first, then
    the others (one that refused the measured tokenizer may load another of the family)."""
    row = MEASURED.get(fam)
    if row is None:
        return DEFAULT_ORDER
    measured = tuple(name for name, *_ in row if name != "hf")
    return measured + tuple(n for n in FAST_ENGINES if n not in measured)

