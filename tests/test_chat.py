"""Chat templates: bounded rendering, located errors, {% generation %}, content parts, the
built-in template warning; BOS/EOS against a post-processor; the install extras."""

import json
import tomllib

import pytest
from click.testing import CliRunner
from conftest import ROOT, TOKENIZER, write_jsonl
from tokenizers import Tokenizer

import packtool
from packtool.cli import cli
from packtool.tokenize import TokenizeOptions, tokenize_files

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}")
CONV = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! café"},
        {"role": "user", "content": "More?"}, {"role": "assistant", "content": "Sure, 日本語 🚀."}]


@pytest.fixture()
def model(tmp_path):
    """The fixture tokenizer plus ChatML specials, saved with a ChatML template."""
    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    d = tmp_path / "model"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML,
                                                         "eos_token": "<|im_end|>"}))
    return d, tok


def run_cli(*args):
    return CliRunner().invoke(cli, ["tokenize", *map(str, args), "-q"])


def with_template(tmp_path, source, name="t.jinja"):
    p = tmp_path / name
    p.write_text(source)
    return p


# -- bounded rendering ------------------------------------------------------------------------

BOMBS = [
    ("{{ 'x' * 2000000000 }}", "--max-render-chars"),
    ("{% set s = 'x' %}{{ s * 2000000000 }}", "--max-render-chars"),
    ("{{ [1] * 2000000000 }}", "--max-render-chars"),
    ("{{ 'x'.ljust(2000000000) }}", "--max-render-chars"),
    ("{{ 'x' | center(2000000000) }}", "--max-render-chars"),
    ("{{ '%2000000000s' % 'x' }}", "--max-render-chars"),
    ("{{ '{:>2000000000}'.format('x') }}", "--max-render-chars"),
    ("{{ 2 ** 10000000000 }}", "--max-render-chars"),
    ("{% set ns = namespace(s='xx') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}{{ ns.s }}", "--max-render-chars"),
    # output that grows without any single large operation: caught while streaming
    ("{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
     "--max-render-chars"),
    # a loop that writes nothing: caught by the time limit inside the loop
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "--render-timeout"),
]


@pytest.mark.parametrize("source,match", BOMBS)
def test_template_bombs_are_clean_errors(tmp_path, source, match):
    tpl = with_template(tmp_path, source)
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    r = run_cli(p, "-t", TOKENIZER, "-o", tmp_path / "o", "--messages-field", "messages",
                "--chat-template", tpl, "--max-render-chars", 1_000_000, "--render-timeout", 1)
    assert r.exit_code == 1, r.output
    assert "c.jsonl line 1" in r.output and match in r.output, r.output
    assert "Traceback" not in r.output
    assert not list(tmp_path.glob("o*"))


def test_render_limits_allow_ordinary_templates(tmp_path, model):
    d, tok = model
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    res = tokenize_files([str(p)], d, tmp_path / "o",
                         TokenizeOptions(messages_field="messages", max_render_chars=200))
    assert res.n_docs == 1
    with pytest.raises(packtool.PacktoolError, match="--max-render-chars 50"):
        tokenize_files([str(p)], d, tmp_path / "o2",
                       TokenizeOptions(messages_field="messages", max_render_chars=50))


# -- runtime errors: located, skippable -------------------------------------------------------

ALTERNATE = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
             "{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
             "{% endfor %}")


def test_raise_exception_names_record_and_is_skipped(tmp_path, model):
    d, tok = model
    tpl = with_template(tmp_path, ALTERNATE)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    records = [{"messages": CONV}] * 3 + [{"messages": bad}] + [{"messages": CONV[:2]}] * 4
    p = write_jsonl(tmp_path / "c.jsonl", records)
    r = run_cli(p, "-t", d, "-o", tmp_path / "o", "--messages-field", "messages",
                "--chat-template", tpl)
    assert r.exit_code == 1 and "c.jsonl line 4" in r.output, r.output
    assert "roles must alternate" in r.output and "--skip-bad-records" in r.output
    assert not list(tmp_path.glob("o*"))
    outs = []
    for k, (workers, batch) in enumerate([(1, 1), (3, 2), (2, 1024)]):
        res = tokenize_files([str(p)], d, tmp_path / f"s{k}", TokenizeOptions(
            messages_field="messages", chat_template=str(tpl), skip_bad_records=True,
            workers=workers, batch_size=batch))
        assert (res.n_docs, res.n_skipped) == (7, 1)
        meta = packtool.open_tokens(tmp_path / f"s{k}").meta
        assert meta["inputs"][0]["skipped"] == {"chat_template": 1}
        assert meta["inputs"][0]["skipped_records"] == [4]
        outs.append([(tmp_path / f"s{k}.{ext}").read_bytes() for ext in ("bin", "mask")])
    assert outs[0] == outs[1] == outs[2]


def test_runtime_error_names_record_and_template_line(tmp_path, model):
    d, tok = model
    tpl = with_template(tmp_path, "{% for m in messages %}\n{{ m['content'] }}\n{{ 1 // 0 }}\n"
                                  "{% endfor %}")
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    r = run_cli(p, "-t", d, "-o", tmp_path / "o", "--messages-field", "messages",
                "--chat-template", tpl)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "c.jsonl line 1" in r.output and "ZeroDivisionError" in r.output, r.output
    assert "t.jinja line 3" in r.output, r.output


def test_non_utf8_template_file(tmp_path, model):
    d, tok = model
    tpl = tmp_path / "t.jinja"
    tpl.write_bytes(b"{{ messages }}\xff\xfe")
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    r = run_cli(p, "-t", d, "-o", tmp_path / "o", "--messages-field", "messages",
                "--chat-template", tpl)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "t.jinja" in r.output and "UTF-8" in r.output, r.output


# -- {% generation %} ---------------------------------------------------------------------------

GENERATION = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
              "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}"
              "{% endgeneration %}{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}"
              "{{ '\\n' }}{% endfor %}")


def _hf(tok):
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok)


def test_generation_blocks_define_trained_spans(tmp_path, model):
    d, tok = model
    tpl = with_template(tmp_path, GENERATION)
    convs = [CONV, CONV[:1],
             [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]]
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": c} for c in convs])
    tokenize_files([str(p)], d, tmp_path / "o",
                   TokenizeOptions(messages_field="messages", chat_template=str(tpl)))
    c = packtool.open_tokens(tmp_path / "o")
    hf = _hf(tok)
    for i, conv in enumerate(convs):
        out = hf.apply_chat_template(conv, chat_template=GENERATION, tokenize=True,
                                     return_dict=True, return_assistant_tokens_mask=True)
        assert c[i].tolist() == list(out["input_ids"])
        assert c.doc_mask(i).tolist() == list(out["assistant_masks"])
    want = "Hello! café<|im_end|>Sure, 日本語 🚀.<|im_end|>"
    assert tok.decode([t for t, m in zip(c[0].tolist(), c.doc_mask(0).tolist(), strict=True) if m],
                      skip_special_tokens=False) == want
    assert not c.doc_mask(1).any()


# -- content as a list of parts -----------------------------------------------------------------

PARTS_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{% if part['type'] == 'text' %}[{{ part['text'] }}]"
    "{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}")


def parts(conv):
    return [dict(m, content=[{"type": "text", "text": m["content"][:3]},
                             {"type": "text", "text": m["content"][3:]}]) for m in conv]


@pytest.mark.parametrize("template", [CHATML, PARTS_TEMPLATE])
def test_text_parts_render_as_hf_does(tmp_path, model, template):
    d, tok = model
    tpl = with_template(tmp_path, template)
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": parts(CONV)}, {"messages": CONV}])
    tokenize_files([str(p)], d, tmp_path / "o",
                   TokenizeOptions(messages_field="messages", chat_template=str(tpl)))
    c = packtool.open_tokens(tmp_path / "o")
    text = tok.decode(c[0].tolist(), skip_special_tokens=False)
    if template is PARTS_TEMPLATE:  # the template reads the parts itself: passed unchanged
        assert text == _hf(tok).apply_chat_template(parts(CONV), chat_template=template,
                                                     tokenize=False)
        assert "[Hel][lo! café]" in text
    else:  # a template written for strings gets the text parts joined
        assert c[0].tolist() == c[1].tolist()
    ids, mask = c[0].tolist(), c.doc_mask(0).tolist()
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m],
                         skip_special_tokens=False)
    assert "Hel" in trained and "lo! café" in trained and "Hi" not in trained


@pytest.mark.parametrize("content,match", [
    ([{"type": "image", "url": "x.png"}], "part 0 has type 'image'"),
    ([{"type": "text", "text": 3}], "part 0 'text' is number"),
    ([{"text": "a"}], "part 0 has no 'type'"),
    (["a"], "part 0 is a string"),
])
def test_other_parts_refused(tmp_path, content, match):
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONV},
                                           {"messages": [{"role": "user", "content": content}]}])
    r = run_cli(p, "-t", TOKENIZER, "-o", tmp_path / "o", "--messages-field", "messages")
    assert r.exit_code == 1 and "c.jsonl line 2" in r.output and match in r.output, r.output
    res = tokenize_files([str(p)], TOKENIZER, tmp_path / "o",
                         TokenizeOptions(messages_field="messages", skip_bad_records=True))
    assert (res.n_docs, res.n_skipped) == (1, 1)


# -- the built-in template is announced --------------------------------------------------------

def test_builtin_template_warns_once(tmp_path, model):
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONV}] * 50)
    r = run_cli(p, "-t", TOKENIZER, "-o", tmp_path / "o", "--messages-field", "messages",
                "--batch-size", 7)
    assert r.exit_code == 0, r.output
    assert r.output.count("built-in chat template") == 1, r.output
    res = tokenize_files([str(p)], TOKENIZER, tmp_path / "o2",
                         TokenizeOptions(messages_field="messages"))
    assert len(res.warnings) == 1 and "built-in chat template" in res.summary()
    assert packtool.open_tokens(tmp_path / "o2").meta["options"]["chat_template"] == \
        "packtool default"
    d, tok = model  # a folder with its own template: no warning
    res = tokenize_files([str(p)], d, tmp_path / "o3", TokenizeOptions(messages_field="messages"))
    assert res.warnings == [] and "built-in" not in res.summary()


def test_bare_tokenizer_json_needs_eos_and_trains_on_it(tmp_path):
    """A folder with only tokenizer.json (no tokenizer_config.json, so no template and no
    eos_token) and --messages-field: without --eos it is refused by name (the built-in
    template would write no end-of-turn token: a model that never learns to stop); with
    --eos TOKEN the decoded output has TOKEN after each assistant turn, trained (mask 1)."""
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONV}] * 3)
    r = run_cli(p, "-t", bare, "-o", tmp_path / "o", "--messages-field", "messages")
    assert r.exit_code == 1 and "--eos" in r.output and str(bare) in r.output, r.output
    assert not list(tmp_path.glob("o*"))
    r = run_cli(p, "-t", bare, "-o", tmp_path / "o", "--messages-field", "messages",
                "--eos", "<|eos|>")
    assert r.exit_code == 0, r.output
    tok = Tokenizer.from_file(str(TOKENIZER))
    eos = tok.token_to_id("<|eos|>")
    c = packtool.open_tokens(tmp_path / "o")
    ids, mask = c[0].tolist(), c.doc_mask(0).tolist()
    text = tok.decode(ids, skip_special_tokens=False)
    replies = [m["content"] for m in CONV if m["role"] == "assistant"]
    assert [text.index(r) < text.index("<|eos|>", text.index(r)) for r in replies] == \
        [True, True]
    at = [i for i, t in enumerate(ids) if t == eos]
    assert len(at) == len(replies), text  # once per assistant turn, nowhere else
    for i, reply in zip(at, replies, strict=True):
        assert mask[i] == 1, "the end-of-turn token is trained"
        assert tok.decode(ids[:i], skip_special_tokens=False).rstrip().endswith(reply)
    assert mask[:3] == [0, 0, 0], "the user's turn is not trained"


# -- --special-tokens with --bos/--eos ----------------------------------------------------------

@pytest.fixture()
def bert(tmp_path):
    """A BERT-style WordPiece tokenizer whose post-processor writes [CLS] ... [SEP]."""
    from tokenizers import models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello",
                                         "world", "the", "cat", "##s", ".", "!"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.add_special_tokens(["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"])
    path = tmp_path / "bert.json"
    tok.save(str(path))
    return path


def test_special_tokens_with_eos_already_added(tmp_path, bert):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "hello cats!"}, {"text": "the world."}])
    for flags in (["--eos", "[SEP]"], ["--bos", "[CLS]"]):
        r = run_cli(p, "-t", bert, "-o", tmp_path / "o", "--special-tokens", *flags)
        assert r.exit_code == 1 and "post-processor already" in r.output, r.output
        assert flags[1] in r.output and not list(tmp_path.glob("o*"))
    r = run_cli(p, "-t", bert, "-o", tmp_path / "a", "--special-tokens")
    assert r.exit_code == 0, r.output
    assert packtool.open_tokens(tmp_path / "a")[0].tolist() == [2, 5, 8, 9, 11, 3]
    r = run_cli(p, "-t", bert, "-o", tmp_path / "b", "--eos", "[SEP]")
    assert r.exit_code == 0, r.output
    assert packtool.open_tokens(tmp_path / "b")[0].tolist() == [5, 8, 9, 11, 3]
    r = run_cli(p, "-t", bert, "-o", tmp_path / "c", "--special-tokens", "--eos", "[MASK]")
    assert r.exit_code == 0, r.output  # a token the post-processor does not write is added
    assert packtool.open_tokens(tmp_path / "c")[0].tolist() == [2, 5, 8, 9, 11, 3, 4]


# -- install extras -----------------------------------------------------------------------------

def test_the_mds_extra_installs_beside_test():
    """`pip install ".[mds,test]"` could not resolve: mds required mosaicml-streaming, whose
    every release pins transformers<5 beside test's transformers>=5. The extra now lists what
    its MDS code imports (checked with pip install --dry-run against the index), and the
    package goes in with --no-deps, as the docs, .ci/run and the missing-package error say."""
    import re

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]

    def names(reqs):
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}
    assert "mosaicml-streaming" not in names(extras["mds"])
    assert {"xxhash", "zstd", "brotli", "python-snappy", "catalogue", "pillow", "torch"} <= \
        names(extras["mds"])
    line = "pip install --no-deps mosaicml-streaming==0.13.0"
    assert line in (ROOT / "docs" / "EXPORT.md").read_text()
    assert '--no-deps "mosaicml-streaming==0.13.0"' in (ROOT / ".ci" / "run").read_text()
    from packtool.export import mds

    with open(mds.__file__) as f:
        assert "install --no-deps mosaicml-streaming==0.13.0" in f.read()


def test_extras_and_ci_install_line():
    """No torch pin on a user's install line (issue 38/39: ``"torch==2.13.0"`` on the README's
    line replaced a GPU user's CUDA build): CI pins it in .ci/constraints.txt, passed to pip
    with -c by .ci/run; the README's full-suite line is exactly the test command .ci/run runs,
    and .ci/run runs that and ``ruff check .``."""
    import re

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(r.startswith("accelerate") for r in extras["torch"])
    assert not any(r.replace(" ", "").startswith("torch==") for r in extras["test"])
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"torch\s*[=<>~]=", readme), "a torch pin in the README"
    assert re.search(r"^torch==\d", (ROOT / ".ci" / "constraints.txt").read_text(), re.M)
    assert 'pip install -c .ci/constraints.txt ".[test]"' in ci
    assert 'pip install ".[test]"' in readme and "packtool demo" in readme
    runs = re.findall(r"^(python -m pytest .*?) && ruff check \.$", ci, re.M)
    assert len(runs) == 1, runs
    lines = [ln.split("#")[0].strip() for ln in readme.split("```bash", 1)[1].split("```")[0]
             .splitlines()]
    assert runs[0] in lines, (runs[0], lines)
