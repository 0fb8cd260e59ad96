"""SentencePiece ``.model`` files: the sentencepiece library is the reference and packtool's
conversion a checked engine, on models trained in-process (byte-fallback BPE as
Llama-2/Mistral/Gemma, also with the library's default normalizer; Unigram as T5; a word model
packtool does not convert), and ``packtool tokenize --tokenizer x.model`` end to end."""

import hashlib
import json

import numpy as np
import pytest
from conftest import TOKENIZER, corpus_docs, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth import make_documents

import packtool
from packtool.engines import EngineRefused, load_engine, ranking, select_engine
from packtool.engines import spm as spm_engine
from packtool.engines.spm import convert, load_model
from packtool.errors import PacktoolError
from packtool.tokenize import TokenizeOptions, tokenize_files

spm = pytest.importorskip("sentencepiece")

LITERAL = "<s> </s> <unk> <pad> <0x41> [INST] ▁"
# accents, combining marks (tokenizers' Precompiled normalizer drops a second one that
# sentencepiece keeps), CJK, Cyrillic, emoji, code, NFKC compatibility characters
MARKS = "e\u0301 a\u0308\u0323 \u1ea1\u0308"
MULTI = ["café naïve Straße", "日本語の文章です。東京", "мир 🙂🚀", "  indented\n\tcode = x[1]  ",
         f"{MARKS} ﬁ ①"]
MODELS = {
    # Llama-2 / Mistral: byte fallback, identity normalization, spaces kept, digits split
    "bpe_llama2": dict(model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                       remove_extra_whitespaces=False, split_digits=True),
    "bpe_user_pieces": dict(model_type="bpe", byte_fallback=True,
                            normalization_rule_name="identity", remove_extra_whitespaces=False,
                            user_defined_symbols=["<tool>", "[INST]"]),
    "bpe_default": dict(model_type="bpe", byte_fallback=True, normalization_rule_name="identity"),
    # byte-fallback BPE with the library's defaults (normalizer nmt_nfkc)
    "bpe_nfkc": dict(model_type="bpe", byte_fallback=True),
    "unigram_identity": dict(model_type="unigram", byte_fallback=True,
                             normalization_rule_name="identity", remove_extra_whitespaces=False),
    "unigram_nfkc": dict(model_type="unigram"),  # the library's defaults (nmt_nfkc)
    "word": dict(model_type="word"),  # not converted: only the reference reads it
}
# the conversions whose load probe may find a difference (test_conversion_matches_sentencepiece
# says which); the others must pass it
MAY_DIFFER = {"bpe_user_pieces", "bpe_nfkc", "unigram_identity", "unigram_nfkc"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    text = d / "train.txt"
    # the characters of the control and byte pieces are in the vocabulary: a Unigram model
    # without them differs from its conversion (see test_literal_control_pieces)
    docs = make_documents(400, seed=21, median_words=40) + MULTI * 30 + [LITERAL] * 200
    text.write_text("\n".join(docs), encoding="utf-8")
    out = {}
    for name, kw in MODELS.items():
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(d / name),
                                       vocab_size=1200, character_coverage=1.0, minloglevel=2,
                                       num_threads=1, **kw)
        out[name] = d / f"{name}.model"
    return out


def converted_differs(path, texts) -> bool:
    """Whether packtool's conversion of the model at ``path`` encodes ``texts`` otherwise
    than sentencepiece: the tests assert what follows from it, not one tokenizers
    version's behaviour."""
    tok = convert(path.read_bytes())
    want = spm.SentencePieceProcessor(model_file=str(path)).encode(texts)
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)] != want


PIECES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.text(st.sampled_from(" \t\n\u00a0\u3000"), min_size=1, max_size=6),
    st.sampled_from(MULTI + ["<tool>", "[INST]", "<s>", "</s>", "<unk>", "<0x41>", "▁", "▁▁x"]),
    st.builds(lambda c, n: c * n, st.sampled_from("a日 1"), st.integers(2, 40)),
)
TEXTS = st.lists(st.lists(PIECES, max_size=6).map("".join), min_size=1, max_size=5)


@pytest.mark.parametrize("name", [n for n in MODELS if n != "word"])
def test_conversion_matches_sentencepiece(models, name):
    """Where the conversion passes the load probe against sentencepiece, it matches on
    hypothesis texts. Where it is refused, the refusal names the first difference:
    tokenizers' BPE (ignore_merges) emits a control piece that a text isolates between user
    pieces ("<tool><s>"); its Unigram lattice takes a control piece (a literal ``</s>``)
    that sentencepiece never emits; its Precompiled normalizer (NFKC models) drops a second
    combining mark."""
    path = models[name]
    tok, _ = load_model(path)
    try:
        engine = load_engine("hf", path, tok, False)
    except EngineRefused as e:
        assert name in MAY_DIFFER, e
        assert "differs from sentencepiece on the load probe" in str(e)
        return
    assert engine.name == "hf"
    sp = spm.SentencePieceProcessor(model_file=str(path))

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(TEXTS)
    def check(texts):
        got = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        assert got == sp.encode(texts), texts

    check()


@pytest.mark.parametrize("name", ["bpe_nfkc", "unigram_nfkc", "word"])
def test_the_reference_is_the_sentencepiece_library(models, name):
    """The reference's flat (lengths, ids) are ``sp.encode`` of each text, in order, in the
    corpus dtype; ``add_special`` adds nothing (packtool adds BOS/EOS itself)."""
    path = models[name]
    ref = spm_engine.reference(path)
    sp = spm.SentencePieceProcessor(model_file=str(path))

    @settings(max_examples=30, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(TEXTS)
    def check(texts):
        lengths, ids = ref.encode(texts, True, np.uint16)
        want = sp.encode(texts)
        assert lengths.tolist() == [len(w) for w in want] and ids.dtype == np.uint16
        assert ids.tolist() == [i for w in want for i in w]

    check()
    assert ref.encode([], False, np.uint16)[0].size == 0


def test_the_default_normalizer_runs_the_reference(models):
    """A byte-fallback BPE trained with the library's defaults (nmt_nfkc: the shape of
    Llama-2/Mistral's) loads (it was refused at load); where its conversion differs from
    sentencepiece (a second combining mark), ``auto`` runs sentencepiece and says why each
    engine reading the conversion was not used; ``--engine hf`` is refused by the probe."""
    path = models["bpe_nfkc"]
    tok, _ = load_model(path)
    sel = select_engine("auto", "sample", path, tok, False)
    assert sel.reference_name.startswith("sentencepiece ")
    if not converted_differs(path, [MARKS]):
        assert sel.engine.name != "sentencepiece", sel.reasons
        return
    assert sel.engine.name == "sentencepiece" and sel.check == "none (the reference)"
    assert set(sel.reasons) == {*ranking.order(sel.family), "hf"}
    assert sel.reasons["hf"] == ranking.HF_ON_A_MODEL  # slower than sentencepiece anyway
    with pytest.raises(PacktoolError, match=r"--engine hf: hf \S+ differs from sentencepiece"
                                            r".*--engine sentencepiece"):
        select_engine("hf", "sample", path, tok, False)


def test_a_model_packtool_does_not_convert_is_served_by_the_reference(models):
    """A word model (no conversion: a vocabulary of its pieces stands in for lookups) loads;
    every other engine is refused, saying why."""
    path = models["word"]
    tok, _ = load_model(path)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert tok.token_to_id("</s>") == sp.eos_id()
    assert tok.get_vocab_size() == sp.get_piece_size()
    sel = select_engine("auto", "sample", path, tok, False)
    assert sel.engine.name == "sentencepiece" and "hf" in sel.reasons
    assert all("does not convert this model" in why for why in sel.reasons.values())
    with pytest.raises(PacktoolError, match="--engine fastokens: .*does not convert"):
        select_engine("fastokens", "sample", path, tok, False)


def test_sentencepiece_runs_a_model_file_only():
    from packtool.engines.tokenizer import load_tokenizer

    tok, path = load_tokenizer(TOKENIZER)
    with pytest.raises(PacktoolError, match="--engine sentencepiece .* not one"):
        select_engine("sentencepiece", "sample", path, tok, False)


@pytest.mark.slow
def test_literal_control_pieces(tmp_path):
    """sentencepiece never matches a control piece in the text; `tokenizers`' Unigram would
    when the piece's characters are unknown (the unknown-character path costs more). Such a
    model is served; its conversion is not used where the probe finds that."""
    text = tmp_path / "t.txt"
    text.write_text("\n".join(make_documents(200, seed=3, median_words=30)), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "u"),
                                   vocab_size=600, model_type="unigram", minloglevel=2,
                                   normalization_rule_name="identity", num_threads=1)
    path = tmp_path / "u.model"
    tok, _ = load_model(path)
    sel = select_engine("auto", "full", path, tok, False)
    _, ids = sel.encode([LITERAL], False, np.uint32)
    assert ids.tolist() == spm.SentencePieceProcessor(model_file=str(path)).encode(LITERAL)
    if converted_differs(path, [LITERAL]):
        assert sel.engine.name == "sentencepiece" and "hf" in sel.reasons


def test_not_installed_names_the_extra(models, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_spm(name, *a, **kw):
        if name == "sentencepiece":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_spm)
    spm_engine._processor.cache_clear()
    with pytest.raises(PacktoolError, match=r"packtool\[sentencepiece\]"):
        load_model(models["bpe_llama2"])


def test_unsupported_model_types_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no pieces"):
        convert(b"")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\x0a\x05hello")
    with pytest.raises(PacktoolError, match="cannot read SentencePiece model"):
        load_model(bad)


# gigatoken reads byte-fallback BPE with the Llama-2 normalizer (identity, spaces kept) and
# refuses, at load, the others' Split pre-tokenizer (user pieces) and strip regexes
GIGATOKEN_READS = {"bpe_llama2"}
END_TO_END = [(m, e) for m in ("bpe_llama2", "bpe_default")
              for e in ("auto", "hf", "gigatoken", "fastokens")] + [
    ("bpe_llama2", "sentencepiece"), ("bpe_nfkc", "auto"), ("bpe_nfkc", "sentencepiece"),
    ("unigram_nfkc", "auto"), ("word", "auto")]


def _tokenize(tmp_path, path, engine, name="out", **kw):
    docs = make_documents(300, seed=4, median_words=30) + MULTI + ["", "<tool> x [INST]"]
    write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    out = tmp_path / name
    opts = TokenizeOptions(engine=engine, bos="<s>", eos="</s>", **kw)
    res = tokenize_files([str(tmp_path / "in.jsonl")], path, out, opts)
    return docs, out, res


@pytest.mark.parametrize(("model", "engine"), END_TO_END)
def test_tokenize_a_model_file_end_to_end(tmp_path, models, engine, model):
    """Every engine that runs gives the tokens of ``sp.encode`` with BOS/EOS; the manifest
    says which engine ran and that sentencepiece was the reference."""
    path = models[model]
    if engine == "gigatoken" and model not in GIGATOKEN_READS:
        with pytest.raises(PacktoolError, match="--engine gigatoken: gigatoken"):
            _tokenize(tmp_path, path, engine, engine_check="full")
        return
    docs, out, res = _tokenize(tmp_path, path, engine, engine_check="full")
    sp = spm.SentencePieceProcessor(model_file=str(path))
    want = [[sp.bos_id(), *ids, sp.eos_id()] for ids in sp.encode(docs)]
    assert corpus_docs(out) == want
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["tokenizer"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert meta["tokenizer"]["path"] == str(path)
    e = meta["engine"]
    assert e["reference"] == f"sentencepiece {spm.__version__}"
    assert np.dtype(meta["dtype"]) == np.uint16
    if engine == "sentencepiece" or model == "word":
        assert e["name"] == "sentencepiece" and e["check"] == "none (the reference)"
    elif engine == "auto" and model in ("bpe_llama2", "bpe_default"):
        # byte-fallback BPE: the measured ranking's first that reads it
        first = ranking.order("sentencepiece_bpe")[0]
        assert e["family"] == "sentencepiece_bpe"
        if first == "gigatoken" and model not in GIGATOKEN_READS:
            assert e["name"] != "gigatoken" and "gigatoken" in e["not_used"]
        else:
            assert e["name"] == first
    elif engine == "auto" and converted_differs(path, [MARKS]):
        assert e["name"] == "sentencepiece" and "hf" in e["not_used"]
        assert f"hf: {ranking.HF_ON_A_MODEL}" in res.summary()
    if e["name"] != "sentencepiece":
        assert e["checked_docs"] == len(docs) and e["result"] == "identical"
        assert f"checked against sentencepiece {spm.__version__}" in res.summary()


def test_outputs_are_the_same_whichever_engine_ran(tmp_path, models):
    """The token files are byte-identical, and so is what the manifest says of them; only
    its engine entry (and the digests of the options, which name the engine) differ."""
    path = models["bpe_llama2"]
    _, a, _ = _tokenize(tmp_path, path, "auto", "a")
    _, b, _ = _tokenize(tmp_path, path, "sentencepiece", "b")
    for suffix in (".bin", ".boundaries"):
        assert a.with_suffix(suffix).read_bytes() == b.with_suffix(suffix).read_bytes()
    ma, mb = (json.loads(p.with_suffix(".json").read_text()) for p in (a, b))
    assert ma["engine"]["name"] != mb["engine"]["name"] == "sentencepiece"
    assert ma["engine"]["reference"] == mb["engine"]["reference"]
    same = ("dtype", "vocab_size", "tokenizer", "bos_id", "eos_id", "n_docs", "n_tokens",
            "n_empty", "mask")
    assert [ma[k] for k in same] == [mb[k] for k in same]
    assert [q["checksums"] for q in ma["parts"]] == [q["checksums"] for q in mb["parts"]]


def test_a_difference_mid_run_falls_back_to_sentencepiece(tmp_path, models, monkeypatch):
    """A fast engine passes the probe but differs on a document of the corpus: the sample
    check finds it, the part is made again by sentencepiece, and the manifest says why."""
    from packtool.engines import select

    path = models["bpe_llama2"]
    name = select_engine("auto", "sample", path, load_model(path)[0], False).engine.name
    if name == "sentencepiece":
        pytest.skip("no fast engine installed reads this model")
    real = select.LOADERS[name]

    def corrupting(json_path, reference):
        eng = real(json_path, reference)
        inner = eng.encode

        def encode(texts, add_special, dtype):
            lengths, ids = inner(texts, add_special, dtype)
            if any("MARKER" in t for t in texts):
                ids = ids.copy()
                ids[-1] = (int(ids[-1]) + 1) % 100
            return lengths, ids

        eng.encode = encode
        return eng

    monkeypatch.setitem(select.LOADERS, name, corrupting)
    docs = make_documents(50, seed=5) + ["a MARKER document"]
    write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    res = tokenize_files([str(tmp_path / "in.jsonl")], path, tmp_path / "out",
                         TokenizeOptions(engine="auto"))
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert corpus_docs(tmp_path / "out") == sp.encode(docs)
    e = json.loads((tmp_path / "out.json").read_text())["engine"]
    assert e["name"] == "sentencepiece" and "MARKER" in e["fallback"]
    assert any(w.startswith(name) and "differs from sentencepiece on the corpus" in w
               for w in res.warnings)


def test_chat_on_a_model_file_takes_the_reference_offsets(tmp_path, models):
    """Chat masks need character offsets: the reference (sentencepiece) encodes the rendered
    conversation, and the mask keeps the tokens overlapping the assistant's turn."""
    from packtool.chat import chat_renderer

    path = models["bpe_nfkc"]
    msgs = [{"role": "user", "content": f"hi {MARKS}"},
            {"role": "assistant", "content": "café 日本語 🙂"}]
    write_jsonl(tmp_path / "c.jsonl", [{"m": msgs}])
    opts = TokenizeOptions(messages_field="m", eos="</s>")
    res = tokenize_files([str(tmp_path / "c.jsonl")], path, tmp_path / "c", opts)
    e = json.loads((tmp_path / "c.json").read_text())["engine"]
    assert e["name"] == "sentencepiece" and "offsets" in e["not_used"]["hf"]
    text, spans = chat_renderer(path, opts)[0](msgs)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    got = sp.encode([text], return_type="offset_mapping")[0]
    assert corpus_docs(tmp_path / "c") == [got["ids"]]
    want = [int(any(s < b and a < t for a, b in spans)) for s, t in got["offsets"]]
    assert packtool.open_tokens(tmp_path / "c").doc_mask(0).tolist() == want and any(want)
    assert res.n_docs == 1
