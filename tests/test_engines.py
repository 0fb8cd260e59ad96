"""Fast tokenizer engines against the `tokenizers` reference, token for token.

Tokenizer families are built in-process with `tokenizers` (no downloads). Every engine that
loads a family (that is, passes its own load probe) must give the reference's ids on every
generated text, with and without the post-processor; an engine may instead refuse at load.
"""

import json

import naive
import numpy as np
import pytest
from conftest import CORPUS, TOKENIZER, slow, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth import make_documents
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from packtool import engines, open_tokens
from packtool.engines import EngineRefused, load_engine, ranking
from packtool.tokenize import TokenizeOptions, tokenize_files

pytest.importorskip("fastokens")
pytest.importorskip("tokie")
pytest.importorskip("gigatoken")

FAST = engines.FASTEST_FIRST
FIRST = ranking.order("byte_level_bpe")[0]  # what auto runs on the fixture's byte-level BPE
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MULTILINGUAL = ["café naïve Straße", "日本語の文章です。東京", "مرحبا بالعالم", "שלום עולם",
                "привет мир", "🙂🚀 emoji", "e\u0301 a\u0308", "  spaces\t\ttabs\n\nlines"]


def _training_text():
    return make_documents(300, seed=11, median_words=30, max_words=200) + MULTILINGUAL * 20


def _byte_level(split_regex: str | None):
    tok = Tokenizer(models.BPE())
    if split_regex:  # Llama-3 / Qwen: a split regex, then bytes without GPT-2's regex
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|bos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_training_text(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", tok.token_to_id("<|bos|>"))])
    return tok


def _metaspace_bpe(nfkc: bool = True):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if nfkc:
        tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator(_training_text(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    return tok


def _unigram(nfkc: bool = True):
    tok = Tokenizer(models.Unigram())
    if nfkc:
        tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=500, special_tokens=["<unk>", "<s>"],
                                      unk_token="<unk>", show_progress=False)
    tok.train_from_iterator(_training_text(), trainer)
    return tok


def _llama2_style():
    """SentencePiece converted as Llama-2's: ▁ written by the normalizer, no pre-tokenizer."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator(_training_text(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def _wordpiece():
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[UNK]", "[CLS]", "[SEP]"],
                                        show_progress=False)
    tok.train_from_iterator(_training_text(), trainer)
    tok.post_processor = processors.BertProcessing(("[SEP]", 2), ("[CLS]", 1))
    return tok


def _llama2_byte_fallback():
    """Llama-2 / Mistral: a SentencePiece byte-fallback BPE, converted by packtool.engines.spm (the
    form gigatoken reads: identity normalizer, spaces kept)."""
    import tempfile
    from pathlib import Path

    spm = pytest.importorskip("sentencepiece")
    from packtool.engines.spm import convert

    with tempfile.TemporaryDirectory() as d:
        text = Path(d) / "t.txt"
        text.write_text("\n".join(_training_text()), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(Path(d) / "m"), vocab_size=900,
            model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
            remove_extra_whitespaces=False, character_coverage=0.9995, minloglevel=2,
            num_threads=1)
        tok = convert((Path(d) / "m.model").read_bytes())
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


FAMILIES = {
    "llama2_byte_fallback": _llama2_byte_fallback,
    "gpt2_byte_bpe": lambda: _byte_level(None),
    "llama3_split_regex": lambda: _byte_level(LLAMA3_SPLIT),
    "metaspace_bpe_nfkc": _metaspace_bpe,
    "metaspace_bpe": lambda: _metaspace_bpe(nfkc=False),
    "llama2_sentencepiece_bpe": _llama2_style,
    "unigram_nfkc": _unigram,
    "unigram": lambda: _unigram(nfkc=False),
    "wordpiece_bert": _wordpiece,
}
ADDED = ["<tool_call>", "hello world", "<|im_start|>"]


def _with_added(tok: Tokenizer) -> Tokenizer:
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True)])
    tok.add_tokens([AddedToken("<tool_call>", lstrip=True, rstrip=True), "hello world"])
    return tok


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """name -> (path, reference Tokenizer) for every family, added tokens included (~6 s on
    2 cores: the tests that use it are slow)."""
    out = {}
    d = tmp_path_factory.mktemp("families")
    for name, build in FAMILIES.items():
        path = d / f"{name}.json"
        _with_added(build()).save(str(path))
        ref = Tokenizer.from_file(str(path))
        out[name] = (path, ref)
    return out


@pytest.mark.slow
def test_id_space_is_what_get_vocab_says(families, tmp_path):
    """packtool.engines.tokenizer.id_space reads the JSON; the reference is the library's
    vocabulary."""
    from packtool.engines.tokenizer import id_space, load_tokenizer

    def reference(tok):
        vocab = tok.get_vocab(with_added_tokens=True)
        return max(max(vocab.values()) + 1, tok.get_vocab_size(with_added_tokens=True))

    sparse = json.loads(families["gpt2_byte_bpe"][0].read_text())
    sparse["added_tokens"].append({**sparse["added_tokens"][-1], "id": 100_000,
                                   "content": "<|far|>"})  # the library renumbers it
    (tmp_path / "sparse.json").write_text(json.dumps(sparse))
    paths = [path for path, _ in families.values()] + [tmp_path / "sparse.json"]
    for path in paths:
        tok, _ = load_tokenizer(path)
        assert id_space(tok) == reference(tok), path
        fresh = Tokenizer.from_file(str(path))  # not loaded by packtool: serialized afresh
        assert id_space(fresh) == reference(fresh), path


def _loaded(path, ref, add_special):
    """Engines that accept the family (a refusal is allowed; it must come at load)."""
    got = {}
    for name in FAST:
        try:
            got[name] = load_engine(name, path, ref, add_special)
        except EngineRefused:
            continue
    return got


def _plane_char():
    # every plane, surrogates excluded (sources.py rejects them before any engine)
    return st.characters(blacklist_categories=("Cs",))


PIECES = st.one_of(
    st.text(_plane_char(), max_size=20),
    st.text(st.sampled_from(" \t\n\r\u00a0\u3000\u2028\u200b"), min_size=1, max_size=12),
    st.text(st.characters(whitelist_categories=("Mn", "Me", "Mc")), min_size=1, max_size=4),
    st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), min_size=1, max_size=4),
    st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=8),
    st.text(st.characters(min_codepoint=0x0590, max_codepoint=0x06FF), min_size=1, max_size=8),
    st.text(st.characters(whitelist_categories=("Cc", "Cf")), min_size=1, max_size=4),
    st.builds(lambda c, n: c * n, st.sampled_from("aé日x0_-"), st.integers(100, 3000)),
    st.sampled_from(ADDED + ["<|bos|>", "<s>", "[CLS]", "<|endoftext|>", "don't", "  I'll"]),
    st.sampled_from(MULTILINGUAL),
)
TEXTS = st.lists(st.lists(PIECES, max_size=8).map("".join), min_size=1, max_size=6)


def _assert_same(engine, ref, texts, add_special):
    expect = [e.ids for e in ref.encode_batch_fast(texts, add_special_tokens=add_special)]
    lengths, ids = engine.encode(texts, add_special, np.uint32)
    got = np.split(ids, np.cumsum(lengths)[:-1]) if len(texts) else []
    assert len(got) == len(expect)
    for text, g, want in zip(texts, got, expect, strict=True):
        assert g.tolist() == want, (engine.name, text)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("add_special", [False, True])
def test_engines_match_reference(families, family, add_special):
    path, ref = families[family]
    loaded = _loaded(path, ref, add_special)

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(TEXTS)
    def check(texts):
        for engine in loaded.values():
            _assert_same(engine, ref, texts, add_special)

    check()


@pytest.mark.slow
def test_which_engines_claim_which_family(families):
    """Pins the measured support: a change in an engine's claims shows here first."""
    claims = {f: sorted(_loaded(p, r, False)) for f, (p, r) in families.items()}
    assert claims["gpt2_byte_bpe"] == claims["llama3_split_regex"] == [
        "fastokens", "gigatoken", "tokie"]
    assert "fastokens" in claims["llama2_sentencepiece_bpe"]
    assert "gigatoken" in claims["llama2_byte_fallback"]
    assert "fastokens" not in claims["wordpiece_bert"]
    with pytest.raises(EngineRefused, match="BertNormalizer"):
        load_engine("fastokens", *families["wordpiece_bert"], False)
    for family in ("wordpiece_bert", "unigram"):  # declared, so the reason names the model
        with pytest.raises(EngineRefused, match="does not support the model"):
            load_engine("gigatoken", *families[family], False)


@pytest.mark.slow
def test_auto_tries_engines_in_the_measured_order_and_says_why(families):
    path, ref = families["gpt2_byte_bpe"]
    sel = engines.select_engine("auto", "sample", path, ref, False)
    assert sel.engine.name == ranking.order("byte_level_bpe")[0] == "gigatoken"
    path, ref = families["wordpiece_bert"]
    sel = engines.select_engine("auto", "sample", path, ref, False)
    assert sel.family == "wordpiece" and sel.engine.name not in sel.reasons
    line = engines.engine_summary(engines.engine_manifest(sel), 2.5e6)
    assert line.startswith(f"engine {sel.engine.name}") and "2.5M tokens/s" in line
    for name, why in sel.reasons.items():  # each faster engine, with its reason
        assert f"{name}: " in line and why
    assert all(ranking.order(f) for f in ranking.MEASURED)


@pytest.mark.slow
def test_lone_surrogates_never_encode_silently(families):
    """Readers reject lone surrogates before tokenizing; no engine may encode one either."""
    for path, ref in families.values():
        with pytest.raises(Exception):  # noqa: B017 - the reference's own exception type
            ref.encode_batch_fast(["a\ud800b"])
        for engine in _loaded(path, ref, False).values():
            with pytest.raises(Exception):  # noqa: B017
                engine.encode(["a\ud800b"], False, np.uint32)


@pytest.mark.slow
def test_truncation_and_padding_in_the_file_are_ignored(tmp_path, families):
    path, ref = families["gpt2_byte_bpe"]
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(8)
    tok.enable_padding(length=64)
    tok.save(str(tmp_path / "t.json"))
    ref2 = Tokenizer.from_file(str(tmp_path / "t.json"))
    ref2.no_truncation()
    ref2.no_padding()
    long = ["word " * 200, "short"]
    for engine in _loaded(tmp_path / "t.json", ref2, False).values():
        _assert_same(engine, ref2, long, False)


# -- the pipeline: --engine auto is byte-identical to --engine hf ------------------------------

def _outputs(prefix):
    files = [prefix.parent / f"{prefix.name}{s}" for s in (".bin", ".boundaries", ".mask")]
    return {f.suffix: f.read_bytes() for f in files if f.exists()}


def _run(tmp_path, name, inputs, engine, tokenizer=TOKENIZER, **kw):
    out = tmp_path / name
    res = tokenize_files([str(i) for i in inputs], tokenizer, out,
                         TokenizeOptions(engine=engine, **kw))
    meta = json.loads(out.with_suffix(".json").read_text())
    meta["_warnings"] = res.warnings
    return out, meta


CASES = {
    "fixture corpus": dict(),
    "eos": dict(eos="<|eos|>"),
    "bos and eos, small batches": dict(bos="<|bos|>", eos="<|eos|>", batch_size=7, workers=2),
    "post-processor": dict(special_tokens=True),
    "full check": dict(engine_check="full"),
}


@pytest.mark.parametrize("case", [*(c for c in CASES if c != "full check"), *slow("full check")])
def test_auto_is_byte_identical_to_hf_on_fixtures(tmp_path, case):
    kw = CASES[case]
    hf, _ = _run(tmp_path, "hf", [CORPUS], "hf", **kw)
    auto, meta = _run(tmp_path, "auto", [CORPUS], "auto", **kw)
    assert _outputs(auto) == _outputs(hf)
    assert meta["engine"]["name"] == FIRST and meta["engine"]["result"] == "identical"
    n_docs = meta["n_docs"]
    checked = meta["engine"]["checked_docs"]
    assert checked == n_docs if kw.get("engine_check") == "full" else 0 < checked <= n_docs


@pytest.mark.slow
def test_every_engine_on_every_family_corpus(tmp_path, families):
    docs = make_documents(200, seed=5, median_words=50) + MULTILINGUAL + ["", "<tool_call>x"]
    write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    for family, (path, _) in families.items():
        hf, _ = _run(tmp_path, f"{family}-hf", [tmp_path / "in.jsonl"], "hf", tokenizer=path)
        for name in ("auto", *FAST):
            try:
                out, meta = _run(tmp_path, f"{family}-{name}", [tmp_path / "in.jsonl"], name,
                                 tokenizer=path, engine_check="full")
            except packtool_error() as e:  # an engine may refuse a family at load, by name
                why = ("load probe", "does not support", "cannot load")
                assert any(w in str(e) for w in why), e
                continue
            assert _outputs(out) == _outputs(hf), (family, name)
            assert meta["engine"]["name"] in ("hf", *FAST)


def packtool_error():
    from packtool.errors import PacktoolError

    return PacktoolError


def test_prompt_completion_through_a_fast_engine(tmp_path):
    recs = [{"q": d, "a": d[::-1]} for d in make_documents(80, seed=2)]
    write_jsonl(tmp_path / "pc.jsonl", recs)
    kw = dict(prompt_field="q", completion_field="a", bos="<|bos|>", eos="<|eos|>")
    hf, _ = _run(tmp_path, "hf", [tmp_path / "pc.jsonl"], "hf", **kw)
    auto, meta = _run(tmp_path, "auto", [tmp_path / "pc.jsonl"], "auto", **kw)
    assert _outputs(auto) == _outputs(hf) and meta["engine"]["name"] == FIRST


def test_chat_needs_offsets_so_auto_uses_the_reference(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", [{"m": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"}]}])
    _, meta = _run(tmp_path, "c", [tmp_path / "c.jsonl"], "auto", messages_field="m")
    assert meta["engine"]["name"] == "hf"
    assert "offsets" in meta["engine"]["not_used"]["fastokens"]
    with pytest.raises(packtool_error(), match="offsets"):
        _run(tmp_path, "c2", [tmp_path / "c.jsonl"], "fastokens", messages_field="m")


def _corrupting(monkeypatch, marker, name=FIRST):
    """Fault injection over a real engine (the one auto runs): the ids of documents holding
    ``marker`` come back with one id changed, as an engine bug would."""
    real = engines.LOADERS[name]

    def load(path, reference):
        eng = real(path, reference)
        inner = eng.encode

        def encode(texts, add_special, dtype):
            lengths, ids = inner(texts, add_special, dtype)
            ids = ids.copy()
            ends = np.cumsum(lengths)
            for i, t in enumerate(texts):
                if marker in t and lengths[i]:
                    ids[ends[i] - 1] = (int(ids[ends[i] - 1]) + 1) % 100
            return lengths, ids

        eng.encode = encode
        return eng

    monkeypatch.setitem(engines.LOADERS, name, load)


def test_a_difference_mid_run_falls_back_to_the_reference(tmp_path, monkeypatch):
    docs = make_documents(3000, seed=4, median_words=10, max_words=40)
    docs[2500] = "MARKER " + "the longest document " * 200  # past the first 1,000, longest
    write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    hf, _ = _run(tmp_path, "hf", [tmp_path / "in.jsonl"], "hf")
    _corrupting(monkeypatch, "MARKER")
    auto, meta = _run(tmp_path, "auto", [tmp_path / "in.jsonl"], "auto")
    assert _outputs(auto) == _outputs(hf)
    assert meta["engine"]["name"] == "hf" and "MARKER" in meta["engine"]["fallback"]
    assert any("tokenizing again with the reference" in w for w in meta["_warnings"])
    with pytest.raises(packtool_error(), match="differs from tokenizers on the corpus"):
        _run(tmp_path, "explicit", [tmp_path / "in.jsonl"], FIRST)
    assert not list(tmp_path.glob("explicit*"))


@pytest.mark.slow
def test_probe_refuses_an_engine_that_differs(monkeypatch, families):
    _corrupting(monkeypatch, "a")
    path, ref = families["gpt2_byte_bpe"]
    with pytest.raises(EngineRefused, match="load probe"):
        load_engine(FIRST, path, ref, False)
    sel = engines.select_engine("auto", "sample", path, ref, False)
    assert sel.engine.name == ranking.order("byte_level_bpe")[1]
    assert "load probe" in sel.reasons[FIRST]
    assert "load probe" in engines.engine_summary(engines.engine_manifest(sel))


def test_cli_engine_choices_match_the_layer():
    from packtool.cli import tokenize

    opts = {o.name: o for o in tokenize.params}
    assert tuple(opts["engine"].type.choices) == engines.ENGINE_NAMES
    assert tuple(opts["engine_check"].type.choices) == engines.CHECKS


@pytest.mark.slow
def test_the_check_sample_is_what_the_manifest_says(tmp_path):
    docs = make_documents(5000, seed=8, median_words=8, max_words=30)
    write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    out, meta = _run(tmp_path, "s", [tmp_path / "in.jsonl"], "auto", workers=2, batch_size=300)
    c = open_tokens(out)
    sizes = np.array([len(d.encode()) for d in docs])
    picks, state = engines.sample_picks(0, sizes)  # the whole corpus as one batch
    e = meta["engine"]
    assert e["checked_docs"] == len(picks)
    assert e["checked_tokens"] == int(c.lengths[picks].sum())
    # small documents: the first FIRST_DOCS, about 1 in 1,000 of all, and the longest within
    # GROWTH all fit in the budget
    assert set(range(engines.FIRST_DOCS)) <= set(picks.tolist())
    assert state.longest in sizes[picks] and sizes.max() <= state.longest * engines.GROWTH
    assert engines.FIRST_DOCS + 1 <= len(picks) <= engines.FIRST_DOCS + 40
    assert state.checked == sizes[picks].sum() <= engines.BUDGET_BYTES


def _naive_picks(sizes):
    return naive.sample_picks(sizes.tolist(), engines.FIRST_DOCS, engines.RANDOM_RATE,
                              engines.GROWTH, engines.BUDGET_BYTES, engines.BUDGET_SHARE,
                              engines.SEED)


@pytest.mark.parametrize("order", [*slow("random", "ascending"), "small"])
def test_sample_picks_do_not_depend_on_batching(order):
    rng = np.random.default_rng(3)
    sizes = rng.integers(0, 100_000, 20_000)
    if order == "ascending":  # a corpus sorted by length: every document is a new maximum
        sizes = np.sort(sizes)
    if order == "small":
        sizes //= 200
    whole, state = engines.sample_picks(0, sizes)
    assert whole.tolist() == _naive_picks(sizes)  # one document at a time
    for cut in (1, 7, 1000, 4096):
        parts, got_state = [], None
        for start in range(0, len(sizes), cut):
            got, got_state = engines.sample_picks(start, sizes[start:start + cut], got_state)
            parts.append(got + start)
        assert np.array_equal(np.concatenate(parts), whole), cut
        assert got_state == state
    # never over budget: a few tenths of a percent of the bytes, never a full check in disguise
    assert state.checked == sizes[whole].sum()
    assert state.checked <= engines.BUDGET_BYTES + sizes.sum() // engines.BUDGET_SHARE
    assert len(whole) < 300
    if order == "small":  # 250 bytes a document on average: the budget holds every rule
        assert set(range(engines.FIRST_DOCS)) <= set(whole.tolist())
        assert sizes.max() <= state.longest * engines.GROWTH
        assert len(whole) > engines.FIRST_DOCS + 5


def test_the_check_budget_waits_for_a_long_document():
    """A document over the budget is checked once enough of the corpus has been read, and
    the budget, not the document count, bounds the checked bytes."""
    big = engines.BUDGET_BYTES * 4
    sizes = np.array([big] + [1000] * 400_000 + [big])
    picks, state = engines.sample_picks(0, sizes)
    assert 0 not in picks.tolist()  # over the budget at the start
    assert len(sizes) - 1 in picks.tolist()  # 400 MB read: the budget has grown past it
    assert picks.tolist() == _naive_picks(sizes)


@pytest.mark.slow
def test_the_manifest_is_the_same_whatever_workers_and_batch_size(tmp_path):
    """The check's sample is a function of the corpus, so the whole manifest (engine entry
    with checked_docs and checked_tokens included) is byte-identical between runs."""
    docs = make_documents(3000, seed=9, median_words=10, max_words=80)
    write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    runs = [(1, 1024), (2, 1), (2, 333), (3, 50)]
    manifests = set()
    for workers, batch in runs:  # each in a folder of its own: a run over a finished part
        folder = tmp_path / f"w{workers}-b{batch}"  # of the same plan would skip it (resume)
        folder.mkdir()
        out, meta = _run(folder, "out", [tmp_path / "in.jsonl"], "auto", workers=workers,
                         batch_size=batch)
        assert meta["engine"]["name"] == FIRST and meta["engine"]["checked_docs"] > 200
        manifests.add(out.with_suffix(".json").read_bytes())
    assert len(manifests) == 1



def test_a_part_made_again_counts_its_input_once_in_the_progress(tmp_path, monkeypatch):
    import packtool.executors as ex

    bars = []
    real = ex.progress_bar

    def kept(total, desc, unit="tok", enabled=True):
        bars.append(real(total, desc, unit, enabled))
        return bars[-1]

    monkeypatch.setattr(ex, "progress_bar", kept)
    docs = make_documents(3000, seed=4, median_words=10, max_words=40)
    docs[2500] = "MARKER " + "the longest document " * 200  # met after earlier batches ticked
    write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    _corrupting(monkeypatch, "MARKER")  # the part fails its check and is made again with hf
    out = tmp_path / "p"
    res = tokenize_files([str(tmp_path / "in.jsonl")], TOKENIZER, out,
                         TokenizeOptions(engine="auto", batch_size=100), progress=True)
    assert any("MARKER" in w for w in res.warnings)
    assert len(bars) == 1 and bars[0].n == bars[0].total > 0
