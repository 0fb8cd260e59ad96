"""Deterministic synthetic text: the bundled demo corpus, test inputs and benchmark corpora.

No text is copied from anywhere: words are random syllable strings drawn with a Zipf law
(like real word frequencies), with some accented, CJK and emoji words so tokenizers see
multi-byte UTF-8. Document lengths are lognormal (median ``median_words``), like web text.
"""

from __future__ import annotations

import numpy as np

_SYLLABLES = [
    "ka", "ri", "to", "na", "mi", "so", "lu", "ve", "de", "ran", "tor", "pel", "gis", "fa",
    "mo", "ne", "sul", "tri", "bak", "chen", "war", "pi", "qua", "zel", "ost", "und", "ber",
    "lin", "ha", "gen", "dro", "mas", "tik", "por", "ev", "al", "um", "ex", "ion", "ism", "ly",
    "ing", "ed", "er", "ca", "se", "ro", "te", "la", "vi", "na", "co", "mu", "sa", "fe", "ge",
    "ta",
]
_EXOTIC = [
    "café", "naïve", "Straße", "señor", "日本語", "数据", "東京", "λόγος", "привет", "🙂", "🚀",
    "Ωmega",
]


def make_vocabulary(n_words: int = 20_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = set()
    while len(words) < n_words:
        k = int(rng.integers(1, 5))
        words.add("".join(rng.choice(_SYLLABLES, size=k)))
    words = sorted(words)
    rng.shuffle(words)
    words[50:50 + len(_EXOTIC)] = _EXOTIC  # exotic words are moderately frequent
    return np.array(words, dtype=object)


def iter_documents(n_docs: int, *, seed: int = 0, median_words: int = 120, sigma: float = 1.0,
                   max_words: int = 6000, vocab: np.ndarray | None = None):
    """Yield ``n_docs`` synthetic documents (str), deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    vocab = make_vocabulary(seed=seed) if vocab is None else vocab
    n_words = np.clip(rng.lognormal(np.log(median_words), sigma, n_docs), 1, max_words).astype(int)
    chunk = 4096
    for start in range(0, n_docs, chunk):
        counts = n_words[start:start + chunk]
        idx = np.minimum(rng.zipf(1.15, int(counts.sum())) - 1, len(vocab) - 1)
        words = vocab[idx]
        # sentence ends and numbers sprinkled in
        ends = rng.random(len(words)) < 0.07
        nums = rng.random(len(words)) < 0.01
        numbers = rng.integers(0, 10_000, len(words)).astype(str).astype(object)
        words = np.where(nums, numbers, words)
        words = np.where(ends, words + ".", words)
        pos = 0
        for c in counts:
            doc = " ".join(words[pos:pos + c])
            pos += c
            yield doc[:1].upper() + doc[1:]


def make_documents(n_docs: int, **kw) -> list[str]:
    return list(iter_documents(n_docs, **kw))


def write_token_corpus(prefix, lengths, *, vocab_size: int = 32_000, seed: int = 0,
                       chunk_docs: int = 1 << 20, mask: bool = False, parts: int = 1,
                       docs: tuple | None = None) -> dict:
    """A valid token corpus at ``prefix`` (``PREFIX.json``, ``.bin``, ``.boundaries``, with
    ``mask`` a ``.mask``; with ``parts`` > 1 that many parts of consecutive documents,
    ``PREFIX.part-KKKKK.*``) of documents of ``lengths`` with seeded random ids, written a
    chunk of documents at a time (memory flat), without a tokenizer: for benchmarks and scale
    tests of pack, verify and the readers. ~0.5 GB/s here. Returns the manifest."""
    import hashlib
    from pathlib import Path

    from packtool._io import write_new
    from packtool.formats._manifest import manifest_text
    from packtool.formats.tokens import (
        PART_FORMAT,
        PART_VERSION,
        TokenWriter,
        corpus_manifest,
        part_manifest_path,
        part_name,
        plan_digest,
        token_dtype,
    )

    prefix = Path(prefix)
    lengths = np.asarray(lengths, np.int64)
    dtype = token_dtype(vocab_size)
    rng = np.random.default_rng(seed)
    cuts = np.linspace(0, lengths.size, parts + 1).astype(np.int64)
    entries = []
    for k in range(parts):
        name = part_name(prefix.name, k, parts)
        paths = {x: prefix.with_name(f"{name}.{x}") for x in ("bin", "boundaries", "mask")}
        writer = TokenWriter(paths, mask)
        for a in range(int(cuts[k]), int(cuts[k + 1]), chunk_docs):
            n = lengths[a:min(a + chunk_docs, int(cuts[k + 1]))]
            ids = rng.integers(0, vocab_size, size=int(n.sum()), dtype=np.uint32).astype(dtype)
            m = rng.integers(0, 2, size=ids.size, dtype=np.uint8) if mask else None
            if docs is not None:  # write_docs: these very tokens
                b = a + n.size
                ids = np.concatenate([np.zeros(0, dtype)] + [np.asarray(x, dtype)
                                                             for x in docs[0][a:b]])
                m = None if not mask else np.concatenate(
                    [np.zeros(0, np.uint8)] + [np.asarray(x, np.uint8) for x in docs[1][a:b]])
            writer.write(n, ids, m)
        digest = hashlib.sha256(f"synthetic {seed} part {k}".encode()).hexdigest()
        entries.append(writer.finish(name, k, digest, [
            {"path": "synthetic", "kind": None, "n_docs": int(cuts[k + 1] - cuts[k])}]))
    meta = {"dtype": dtype.name, "vocab_size": vocab_size,
            "tokenizer": {"path": "synthetic", "sha256": "0" * 64}, "bos_id": None,
            "eos_id": None, "options": {"synthetic": True, "seed": seed},
            "engine": {"name": "synthetic"}}
    plan = {"policy": "synthetic", "n_parts": parts,
            "digest": plan_digest([q["digest"] for q in entries]), "prefix": prefix.name}
    own = [{"format": PART_FORMAT, "version": PART_VERSION, "index": k, "digest": q["digest"],
            "plan_digest": plan["digest"], "part": q, "meta": meta}
           for k, q in enumerate(entries)]  # each part's own manifest, as tokenize writes it
    for body in own:
        write_new(part_manifest_path(prefix.parent, body["part"]["name"]),
                  manifest_text(body))
    manifest = corpus_manifest(meta, entries, plan, own)
    write_new(Path(f"{prefix}.json"), manifest_text(manifest))
    return manifest


def lognormal_lengths(n_docs: int, median: float = 300, sigma: float = 1.0, cap: int = 4096,
                      seed: int = 0) -> np.ndarray:
    """Document lengths like web text: lognormal (``median``, ``sigma``), at least 1, at most
    ``cap`` (int64)."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n_docs)), 1, cap
                   ).astype(np.int64)


def group_records(n: int, seed: int = 3) -> list[dict]:
    """Records of a prompt (``q``, 3-40 words) and 1-4 completions (``outs``, 1-30 words
    each), from a small vocabulary: a corpus of groups for ``--completions-field outs``."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]

    def text(k):
        return " ".join(rng.choice(words, int(k)))

    return [{"q": text(rng.integers(3, 40)), "outs": [text(rng.integers(1, 30))
                                                      for _ in range(int(rng.integers(1, 5)))]}
            for _ in range(n)]



def write_docs(prefix, docs: list, masks: list | None = None, vocab_size: int = 32_000) -> dict:
    """A valid one-part token corpus at ``prefix`` holding exactly ``docs`` (arrays of ids;
    ``masks`` their loss masks): records whose tokens a test chooses (shared prefixes)."""
    return write_token_corpus(prefix, [len(d) for d in docs], vocab_size=vocab_size,
                              mask=masks is not None, docs=(docs, masks))


# ------------------------------------------------------------------------ images (issue 42)
VISION_SPECIALS = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<image>", "</s>"]
MAX_PIXELS = 28 * 28 * 64  # 4-64 image tokens an image under --vision qwen2-vl


def png(w: int, h: int, seed: int = 0) -> bytes:
    """A ``w`` x ``h`` PNG of seeded random pixels (Pillow)."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def image_records(d, n: int, seed: int = 1, max_words: int = 60) -> list[dict]:
    """``n`` prompt/completion records with 0-3 ``<image>`` each, of 30-300 px a side: files
    under ``d / "img"`` and every third image inline base64 (a data URI)."""
    import base64

    rng = np.random.default_rng(seed)
    (d / "img").mkdir(exist_ok=True)
    records = []
    for r in range(n):
        images = []
        for k in range(int(rng.integers(0, 4))):
            data = png(int(rng.integers(30, 300)), int(rng.integers(30, 300)), seed=r * 4 + k)
            if k == 2:
                images.append("data:image/png;base64," + base64.b64encode(data).decode())
            else:
                (d / f"img/{r}-{k}.png").write_bytes(data)
                images.append(f"img/{r}-{k}.png")
        words = " ".join(["word"] * int(rng.integers(3, max_words)))
        records.append({"prompt": " ".join(["<image>"] * len(images)) + f" {words}?",
                        "completion": words, "images": images})
    return records


def tokenize_vision(d, records, out: str = "corpus"):
    """``records`` (prompt, completion, images) tokenized into ``d / out`` with --vision
    qwen2-vl at :data:`MAX_PIXELS`, by the test tokenizer with the image tokens added
    (``d / "tokenizer.json"``). Returns ``d``."""
    from conftest import TOKENIZER, write_jsonl
    from tokenizers import Tokenizer

    from packtool.tokenize import TokenizeOptions, tokenize_files

    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.add_special_tokens(VISION_SPECIALS)
    tok.save(str(d / "tokenizer.json"))
    src = write_jsonl(d / f"{out}.jsonl", records)
    tokenize_files([str(src)], d / "tokenizer.json", d / out, TokenizeOptions(
        prompt_field="prompt", completion_field="completion", vision="qwen2-vl",
        images_field="images", eos="</s>", max_pixels=MAX_PIXELS))
    return d
