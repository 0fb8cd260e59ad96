"""Benchmark inputs made on this machine, no downloads: corpora and tokenizers.

    from bench_corpora import prose_corpus, code_corpus, split_files, bpe_tokenizer, spm_models

- prose: tests/synth.py documents (Zipf words of a 20k vocabulary) with one word in
  five replaced by random characters of Latin, Cyrillic, CJK, Arabic, emoji or digits (the
  ``mixed`` corpus of bench_tokenize.py): far fewer repeated words than plain synth text, so
  an engine's word cache helps less, as on real web text.
- code: the Python source files of this interpreter's standard library, one document per
  file, cycled in a seeded order up to the size asked (real code: indentation, operators,
  identifiers; the same bytes for the same Python version).
- ``split_files``: one JSONL into N files of whole records (4 files, 2,000 small files).
- ``bpe_tokenizer``: a byte-level BPE (Llama-3 split regex) trained with `tokenizers` on a
  separate sample of both corpora, ``vocab_size`` 70k by default; ``spm_models``:
  SentencePiece byte-fallback BPE and Unigram models trained with `sentencepiece`.
Everything is cached in the work directory under a name that holds its parameters.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

_SCRIPTS = [(0x61, 0x7A), (0x430, 0x44F), (0x4E00, 0x9FFF), (0x627, 0x64A), (0x1F300, 0x1FAFF),
            (0x30, 0x39)]
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def mixed_scripts(doc: str, rng) -> str:
    words = doc.split(" ")
    swap = rng.random(len(words)) < 0.2
    for i in swap.nonzero()[0]:
        lo, hi = _SCRIPTS[rng.integers(len(_SCRIPTS))]
        words[i] = "".join(map(chr, rng.integers(lo, hi + 1, int(rng.integers(2, 12)))))
    lines = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    return "\n    ".join(lines)


def iter_prose(seed: int = 0):
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import iter_documents

    rng = np.random.default_rng(seed)
    while True:
        for d in iter_documents(20_000, seed=seed):
            yield mixed_scripts(d, rng)
        seed += 1


def iter_code(seed: int = 0):
    import numpy as np

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    rng = np.random.default_rng(seed)
    while True:
        for i in rng.permutation(len(files)):
            try:
                text = files[i].read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if text.strip():
                yield text


def _write(path: Path, docs, size_mb: float) -> Path:
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    target, written = size_mb * 1_000_000, 0
    with open(tmp, "w", encoding="utf-8") as f:
        for d in docs:
            line = json.dumps({"text": d}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            if written >= target:
                break
    tmp.rename(path)
    return path


def prose_corpus(workdir: Path, size_mb: float, seed: int = 0) -> Path:
    return _write(workdir / f"prose-{size_mb:g}mb-s{seed}.jsonl", iter_prose(seed), size_mb)


def code_corpus(workdir: Path, size_mb: float, seed: int = 0) -> Path:
    return _write(workdir / f"code-{size_mb:g}mb-s{seed}.jsonl", iter_code(seed), size_mb)


def split_files(corpus: Path, n: int) -> Path:
    """``corpus`` as ``n`` JSONL files of consecutive records, the same records and bytes (1
    or 2 a file when there are fewer than 2n), in a folder whose sorted file order is the
    record order. (Before, with ceil(records / n) a file, the files past the last record got
    a copy of it: 2,000 files of the 2,711-record code corpus held 3,355 records.)"""
    folder = corpus.with_name(f"{corpus.stem}-x{n}")
    if folder.exists():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    lines = corpus.read_bytes().splitlines(keepends=True)
    if n > len(lines):
        raise ValueError(f"{n} files from {len(lines)} records: some would be empty")
    width = len(str(n))
    for k in range(n):
        part = lines[k * len(lines) // n:(k + 1) * len(lines) // n]
        (tmp / f"part-{k:0{width}d}.jsonl").write_bytes(b"".join(part))
    tmp.rename(folder)
    return folder


def _sample(it, chars: int) -> list[str]:
    out, n = [], 0
    for d in it:
        out.append(d)
        n += len(d)
        if n >= chars:
            return out
    return out


def bpe_tokenizer(workdir: Path, vocab_size: int = 70_000) -> Path:
    """A byte-level BPE like Llama-3's (split regex, then bytes), trained on 40M characters
    of prose and code drawn apart from the benchmark corpora (other seeds)."""
    path = workdir / f"bpe-{vocab_size}.json"
    if path.exists():
        return path
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=["<|endoftext|>", "<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    texts = _sample(iter_prose(seed=1000), 20_000_000) + _sample(iter_code(seed=1000), 20_000_000)
    tok.train_from_iterator(texts, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def spm_models(workdir: Path, vocab_size: int = 8000) -> dict[str, Path]:
    """SentencePiece models trained on 4M characters of prose and code: ``bpe`` (byte
    fallback, Llama-2 style: identity normalization, no extra-whitespace removal) and
    ``unigram`` (the library's defaults: nmt_nfkc)."""
    import sentencepiece as spm

    out = {}
    text = workdir / "spm-train.txt"
    if not text.exists():
        docs = _sample(iter_prose(seed=2000), 2_000_000) + _sample(iter_code(seed=2000), 2_000_000)
        text.write_text("\n".join(line for d in docs for line in d.splitlines() if line.strip()),
                        encoding="utf-8")
    for kind, extra in (("bpe", dict(model_type="bpe", byte_fallback=True,
                                     normalization_rule_name="identity",
                                     remove_extra_whitespaces=False, split_digits=True)),
                        ("unigram", dict(model_type="unigram"))):
        prefix = workdir / f"spm-{kind}-{vocab_size}"
        if not prefix.with_suffix(".model").exists():
            spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(prefix),
                                           vocab_size=vocab_size, character_coverage=0.9995,
                                           minloglevel=2, num_threads=2, **extra)
        out[kind] = prefix.with_suffix(".model")
    return out
