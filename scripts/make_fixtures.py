"""Build fixtures/: a small BPE tokenizer trained with `tokenizers`, the demo corpus and
64 preference pairs made from it (pairs.jsonl, for docs/training/preference.md).

    python scripts/make_fixtures.py           # rewrites fixtures/ deterministically

The corpus is synthetic (synth (tests/synth.py)), in every input kind packtool reads, so the demo
exercises all readers. The tokenizer is byte-level BPE (any UTF-8 text round-trips), with
special tokens <|bos|>, <|eos|>, <|pad|> and a post-processor that adds <|bos|> (used only
with --special-tokens), and a tokenizer_config.json like a Hugging Face model folder.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
from synth import make_documents

ROOT = Path(__file__).resolve().parent.parent / "fixtures"
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]


def train_tokenizer(texts: list[str], vocab_size: int = 2048) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)]
    )
    return tok


def write_jsonl(path: Path, docs: list[str], opener=open) -> None:
    with opener(path, "wb") as f:
        for i, d in enumerate(docs):
            f.write((json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n").encode())


def write_pairs(path: Path, docs: list[str], n: int = 64) -> None:
    """Preference pairs for the docs' preference page: a prompt (a document's first words),
    the chosen completion (the words after them), the rejected one (another document's)."""
    with open(path, "wb") as f:
        for i in range(n):
            words, other = docs[i].split(), docs[(i + 7) % len(docs)].split()
            rec = {"prompt": " ".join(words[:16]), "chosen": " " + " ".join(words[16:48]),
                   "rejected": " " + " ".join(other[:24])}
            f.write((json.dumps(rec, ensure_ascii=False) + "\n").encode())


def main() -> None:
    docs = make_documents(1220, seed=7, median_words=90, sigma=1.1, max_words=3000)
    (ROOT / "tokenizer").mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(docs[:600])
    tok.save(str(ROOT / "tokenizer" / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "model_max_length": 4096,
    }
    (ROOT / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    corpus = ROOT / "corpus"
    (corpus / "notes").mkdir(parents=True, exist_ok=True)
    write_jsonl(corpus / "part-0.jsonl", docs[0:300])
    write_jsonl(corpus / "part-1.jsonl.gz", docs[300:600],
                lambda p, m: gzip.GzipFile(p, m, mtime=0))
    with (open(corpus / "part-2.jsonl.zst", "wb") as raw,
          zstandard.ZstdCompressor(level=10).stream_writer(raw) as f):
        for i, d in enumerate(docs[600:900]):
            f.write((json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n").encode())
    table = pa.table({"id": list(range(300)), "text": docs[900:1200]})
    pq.write_table(table, corpus / "part-3.parquet", row_group_size=100)
    for i, d in enumerate(docs[1200:1220]):
        (corpus / "notes" / f"note-{i:02d}.txt").write_text(d + "\n", encoding="utf-8")
    write_pairs(ROOT / "pairs.jsonl", docs[:64])
    print(f"wrote {ROOT}: tokenizer ({tok.get_vocab_size()} tokens), {len(docs)} documents")


if __name__ == "__main__":
    main()
