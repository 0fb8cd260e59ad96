"""SentencePiece ``.model`` files: packtool's conversion against the sentencepiece library, on
models trained in-process (byte-fallback BPE as Llama-2/Mistral/Gemma, Unigram as T5), and
``packtool tokenize --tokenizer x.model`` end to end."""

import hashlib
import json

import numpy as np
import pytest
from conftest import corpus_docs, slow, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth import make_documents

from packtool.engines import ranking
from packtool.engines.spm import convert, load_model
from packtool.errors import PacktoolError
from packtool.tokenize import TokenizeOptions, tokenize_files

spm = pytest.importorskip("sentencepiece")

LITERAL = "<s> </s> <unk> <pad> <0x41> [INST] ▁"
MULTI = ["café naïve Straße", "日本語の文章です。東京", "мир 🙂🚀", "  indented\n\tcode = x[1]  "]
MODELS = {
    # Llama-2 / Mistral: byte fallback, identity normalization, spaces kept, digits split
    "bpe_llama2": dict(model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                       remove_extra_whitespaces=False, split_digits=True),
    "bpe_user_pieces": dict(model_type="bpe", byte_fallback=True,
                            normalization_rule_name="identity", remove_extra_whitespaces=False,
                            user_defined_symbols=["<tool>", "[INST]"]),
    "bpe_default": dict(model_type="bpe", byte_fallback=True, normalization_rule_name="identity"),
    "unigram_identity": dict(model_type="unigram", byte_fallback=True,
                             normalization_rule_name="identity", remove_extra_whitespaces=False),
    "unigram_nfkc": dict(model_type="unigram"),  # the library's defaults (nmt_nfkc)
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    text = d / "train.txt"
    # the characters of the control and byte pieces are in the vocabulary: a Unigram model
    # without them is refused at load (see test_literal_control_pieces)
    docs = make_documents(400, seed=21, median_words=40) + MULTI * 30 + [LITERAL] * 200
    text.write_text("\n".join(docs), encoding="utf-8")
    out = {}
    for name, kw in MODELS.items():
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(d / name),
                                       vocab_size=1200, character_coverage=1.0, minloglevel=2,
                                       num_threads=1, **kw)
        out[name] = d / f"{name}.model"
    return out


PIECES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.text(st.sampled_from(" \t\n\u00a0\u3000"), min_size=1, max_size=6),
    st.sampled_from(MULTI + ["<tool>", "[INST]", "<s>", "</s>", "<unk>", "<0x41>", "▁", "▁▁x"]),
    st.builds(lambda c, n: c * n, st.sampled_from("a日 1"), st.integers(2, 40)),
)
TEXTS = st.lists(st.lists(PIECES, max_size=6).map("".join), min_size=1, max_size=5)


@pytest.mark.parametrize("name", [*slow("bpe_llama2"), *(m for m in MODELS if m != "bpe_llama2")])
def test_conversion_matches_sentencepiece(models, name):
    """The BPE models without user pieces load and match everywhere; with user pieces,
    tokenizers' BPE (ignore_merges) emits a control piece that a text isolates between user
    pieces ("<tool><s>"), so the probe refuses them. A Unigram model loads only when the probe
    passes: `tokenizers`' Unigram lattice takes a control piece (a literal ``</s>``) that
    sentencepiece never emits, and NFKC models meet tokenizers' Precompiled normalizer
    dropping a second combining mark; either way the refusal names the first difference."""
    path = models[name]
    try:
        tok, _ = load_model(path)
    except PacktoolError as e:  # see the docstring, and bpe_user_pieces: "<tool><s>"
        assert name.startswith("unigram") or name == "bpe_user_pieces", e
        assert "differs from the sentencepiece library" in str(e)
        return
    sp = spm.SentencePieceProcessor(model_file=str(path))

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(TEXTS)
    def check(texts):
        got = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        assert got == sp.encode(texts), texts

    check()


def test_a_conversion_that_differs_is_refused_at_load(models):
    """tokenizers' Precompiled normalizer (NFKC models) drops a second combining mark that
    sentencepiece keeps; the load probe holds such a text, so the model is either refused by
    name or, if a later tokenizers fixes it, matches on it."""
    path = models["unigram_nfkc"]
    text = ["a\u0308\u0323 e\u0301"]
    want = spm.SentencePieceProcessor(model_file=str(path)).encode(text)
    try:
        tok, _ = load_model(path)
    except PacktoolError as e:
        assert str(path) in str(e) and "differs from the sentencepiece library" in str(e)
        return
    assert [e.ids for e in tok.encode_batch(text)] == want


@pytest.mark.slow
def test_literal_control_pieces(tmp_path):
    """sentencepiece never matches a control piece in the text; `tokenizers`' Unigram would
    when the piece's characters are unknown (the unknown-character path costs more). Such a
    model is refused at load by the probe, by name, instead of differing on the corpus."""
    text = tmp_path / "t.txt"
    text.write_text("\n".join(make_documents(200, seed=3, median_words=30)), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "u"),
                                   vocab_size=600, model_type="unigram", minloglevel=2,
                                   normalization_rule_name="identity", num_threads=1)
    path = tmp_path / "u.model"
    try:
        tok, _ = load_model(path)
    except PacktoolError as e:
        assert "differs from the sentencepiece library" in str(e)
        return
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert tok.encode(LITERAL).ids == sp.encode(LITERAL)


def test_not_installed_names_the_extra(models, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_spm(name, *a, **kw):
        if name == "sentencepiece":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_spm)
    with pytest.raises(PacktoolError, match=r"packtool\[sentencepiece\]"):
        load_model(models["bpe_llama2"])


def test_unsupported_model_types_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no pieces"):
        convert(b"")


# gigatoken reads byte-fallback BPE with the Llama-2 normalizer (identity, spaces kept) and
# refuses, at load, the others' Split pre-tokenizer (user pieces) and strip regexes
GIGATOKEN_READS = {"bpe_llama2"}


@pytest.mark.parametrize("model", [*slow("bpe_llama2"), "bpe_default"])
@pytest.mark.parametrize("engine", [*slow("auto"), "hf", *slow("gigatoken", "fastokens")])
def test_tokenize_a_model_file_end_to_end(tmp_path, models, engine, model):
    path = models[model]
    docs = make_documents(300, seed=4, median_words=30) + MULTI + ["", "<tool> x [INST]"]
    write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    out = tmp_path / "out"
    opts = TokenizeOptions(engine=engine, bos="<s>", eos="</s>", engine_check="full")
    if engine == "gigatoken" and model not in GIGATOKEN_READS:
        with pytest.raises(PacktoolError, match="--engine gigatoken: gigatoken"):
            tokenize_files([str(tmp_path / "in.jsonl")], path, out, opts)
        return
    tokenize_files([str(tmp_path / "in.jsonl")], path, out, opts)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    want = [[sp.bos_id(), *ids, sp.eos_id()] for ids in sp.encode(docs)]
    assert corpus_docs(out) == want
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["tokenizer"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert meta["tokenizer"]["path"] == str(path)
    if engine == "auto":  # byte-fallback BPE: the measured ranking's first that reads it
        e = meta["engine"]
        first = ranking.order("sentencepiece_bpe")[0]
        assert e["family"] == "sentencepiece_bpe"
        if first == "gigatoken" and model not in GIGATOKEN_READS:
            assert e["name"] != "gigatoken" and "gigatoken" in e["not_used"]
        else:
            assert e["name"] == first
    assert np.dtype(meta["dtype"]) == np.uint16
