"""Measure each engine's speed per tokenizer family: the numbers behind
packtool/engines/ranking.py's MEASURED table (printed in its format).

    python scripts/rank_engines.py [--size-mb 8] [--workdir bench-out]

Per family, a tokenizer is trained in-process on prose and code (bench_corpora), then every
engine that loads it and passes its probe encodes --size-mb of prose and of code held in
memory, in batches of 1,024 documents on two Python threads (as the pipeline calls it); best
of 3 wall times, in M tokens/s. Families: byte_level_bpe (70k, Llama-3 split regex),
sentencepiece_bpe (a SentencePiece byte-fallback BPE, Llama-2 style, converted by
packtool.engines.spm), metaspace_bpe, unigram, wordpiece (8k each).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from bench_corpora import _sample, bpe_tokenizer, iter_code, iter_prose  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _train(kind: str, workdir: Path) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    path = workdir / f"family-{kind}.json"
    if path.exists():
        return path
    texts = _sample(iter_prose(seed=3000), 3_000_000) + _sample(iter_code(seed=3000), 3_000_000)
    if kind == "sentencepiece_bpe":
        import sentencepiece as spm

        from packtool.engines.spm import convert

        txt = workdir / "family-spm.txt"
        txt.write_text("\n".join(line for t in texts for line in t.splitlines() if line.strip()),
                       encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(txt), model_prefix=str(workdir / "family-spm"), vocab_size=16000,
            model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
            remove_extra_whitespaces=False, character_coverage=0.98, minloglevel=2)
        convert((workdir / "family-spm.model").read_bytes()).save(str(path))
        return path
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=8000, special_tokens=["[UNK]"],
                                            show_progress=False)
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=32000, special_tokens=["<unk>"],
                                          unk_token="<unk>", show_progress=False)
    else:  # metaspace_bpe
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>"],
                                      show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


def measure(path: Path, texts: list[str]) -> dict[str, float]:
    from tokenizers import Tokenizer

    from packtool.engines import EngineRefused, load_engine

    ref = Tokenizer.from_file(str(path))
    ref.no_truncation()
    ref.no_padding()
    pool = ThreadPoolExecutor(2)
    batches = [texts[i:i + 1024] for i in range(0, len(texts), 1024)]
    out = {}
    for name in ("gigatoken", "fastokens", "tokie", "hf"):
        try:
            engine = load_engine(name, path, ref, False)
        except EngineRefused as e:
            print(f"    {name}: refused ({str(e)[:100]})")
            continue
        best = None
        for _ in range(1 if name == "hf" else 3):
            t0 = time.perf_counter()
            n = sum(int(r[0].sum()) for r in pool.map(
                lambda b, e=engine: e.encode(b, False, "uint32"), batches))
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        out[name] = n / best / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=8)
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out")
    ap.add_argument("--families", default="byte_level_bpe,sentencepiece_bpe,metaspace_bpe,"
                                          "unigram,wordpiece")
    args = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpora = {"prose": _sample(iter_prose(seed=7), int(args.size_mb * 1e6)),
               "code": _sample(iter_code(seed=7), int(args.size_mb * 1e6))}
    table = {}
    for fam in args.families.split(","):
        path = bpe_tokenizer(args.workdir) if fam == "byte_level_bpe" else _train(fam, args.workdir)
        print(f"{fam}: {path.name}")
        speeds = {k: measure(path, v) for k, v in corpora.items()}
        rows = sorted(speeds["prose"], key=lambda n: -(speeds["prose"][n] + speeds["code"][n]))
        table[fam] = [(n, round(speeds["prose"][n], 1), round(speeds["code"][n], 1)) for n in rows]
        for row in table[fam]:
            print(f"    {row[0]:10s} prose {row[1]:7.1f}  code {row[2]:7.1f} M tok/s")
    print(json.dumps(table))


if __name__ == "__main__":
    main()
