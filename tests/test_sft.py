"""SFT and chat: loss masks from JSONL to the reader's labels; export to Parquet."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import TOKENIZER, write_jsonl
from tokenizers import Tokenizer

import packtool
from packtool.cli import cli
from packtool.formats.packed import open_packed
from packtool.pack import pack_corpus
from packtool.tokenize import TokenizeOptions, tokenize_files
from packtool.verify import verify_packed

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}")
CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello! café"}, {"role": "user", "content": "More?"},
     {"role": "assistant", "content": "Sure, 日本語 🚀."}],
    [{"role": "user", "content": "Only a question"}, {"role": "assistant", "content": "An answer"}],
]


@pytest.fixture()
def chatml_model(tmp_path):
    """The fixture tokenizer plus <|im_start|>/<|im_end|> specials and a ChatML template."""
    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    d = tmp_path / "model"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>"}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d, tok


def trained_text(tok, ids, mask):
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)


def test_chat_mask_covers_exactly_assistant_turns(tmp_path, chatml_model):
    model, tok = chatml_model
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": m} for m in CONVERSATIONS])
    res = tokenize_files([str(p)], model, tmp_path / "c",
                         TokenizeOptions(messages_field="messages"))
    c = packtool.open_tokens(tmp_path / "c")
    assert c.meta["mask"] and c.meta["options"]["chat_template"].endswith("tokenizer_config.json")
    im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    for i, conv in enumerate(CONVERSATIONS):
        ids, mask = c[i].tolist(), c.doc_mask(i).tolist()
        rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conv)
        assert ids == tok.encode(rendered, add_special_tokens=False).ids
        assert ids.count(im_start) == len(conv)  # special tokens recognised around turns
        want = "".join(m["content"] + "<|im_end|>\n" for m in conv if m["role"] == "assistant")
        assert trained_text(tok, ids, mask) == want
        # untrained: every <|im_start|> and role header, system and user content
        assert all(m == 0 for t, m in zip(ids, mask, strict=True) if t == im_start)
        n_assistant = sum(r["role"] == "assistant" for r in conv)
        assert sum(m for t, m in zip(ids, mask, strict=True) if t == im_end) == n_assistant
    assert res.n_docs == 2


def test_train_on_all_and_default_template(tmp_path, chatml_model):
    model, tok = chatml_model
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": m} for m in CONVERSATIONS])
    tokenize_files([str(p)], model, tmp_path / "all",
                   TokenizeOptions(messages_field="messages", train_on="all"))
    c = packtool.open_tokens(tmp_path / "all")
    assert all(c.doc_mask(i).all() for i in range(len(c)))
    # the fixture folder has no chat_template: the built-in one (with its bos/eos) is used
    tokenize_files([str(p)], TOKENIZER.parent, tmp_path / "d",
                   TokenizeOptions(messages_field="messages"))
    d = packtool.open_tokens(tmp_path / "d")
    ftok = Tokenizer.from_file(str(TOKENIZER))
    assert d.meta["options"]["chat_template"] == "packtool default"
    assert trained_text(ftok, d[1].tolist(), d.doc_mask(1).tolist()) == "An answer<|eos|>\n"


def test_chat_template_file_option(tmp_path, chatml_model):
    model, tok = chatml_model
    (tmp_path / "t.jinja").write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATIONS[1]}])
    tokenize_files([str(p)], model, tmp_path / "c",
                   TokenizeOptions(messages_field="messages",
                                   chat_template=str(tmp_path / "t.jinja")))
    c = packtool.open_tokens(tmp_path / "c")
    assert tok.decode(c[0].tolist()) == "[user] Only a question\n[assistant] An answer\n"
    assert trained_text(tok, c[0].tolist(), c.doc_mask(0).tolist()) == "An answer\n"


@pytest.mark.parametrize("layout", ["index", "tokens"])
def test_prompt_completion_round_trip_to_labels(tmp_path, tokenizer, layout):
    rows = [{"q": f"Question {i}: what is {i} plus {i}?", "a": f" It is {2 * i}."}
            for i in range(40)]
    p = write_jsonl(tmp_path / "pc.jsonl", rows)
    tokenize_files([str(p)], TOKENIZER, tmp_path / "pc",
                   TokenizeOptions(prompt_field="q", completion_field="a",
                                   bos="<|bos|>", eos="<|eos|>"))
    c = packtool.open_tokens(tmp_path / "pc")
    bos, eos = tokenizer.token_to_id("<|bos|>"), tokenizer.token_to_id("<|eos|>")
    for i, r in enumerate(rows):
        pi = tokenizer.encode(r["q"], add_special_tokens=False).ids
        ci = tokenizer.encode(r["a"], add_special_tokens=False).ids
        assert c[i].tolist() == [bos, *pi, *ci, eos]
        assert c.doc_mask(i).tolist() == [0] * (1 + len(pi)) + [1] * (len(ci) + 1)
    pack_corpus([tmp_path / "pc"], tmp_path / "p", 64, "bfd", layout=layout)
    assert verify_packed(tmp_path / "p", [tmp_path / "pc"]).summary().startswith("OK")
    ds = open_packed(tmp_path / "p")
    assert ds.index["mask_storage"] == {"index": "source", "tokens": "folded"}[layout]
    seen = 0
    for j in range(len(ds)):
        ex = ds[j]
        cu = ex["cu_seqlens"]
        for k, d in enumerate(ex["source_docs"]):
            labels = ex["labels"][cu[k]:cu[k + 1]]
            mask = c.doc_mask(int(d))
            want = np.where(mask == 1, c[int(d)].astype(np.int64), -100)
            want[0] = -100
            assert labels.tolist() == want.tolist()
            seen += 1
    assert seen == 40


@pytest.mark.parametrize("record,match", [
    ({"messages": [{"content": "x"}]}, "message 0 has no 'role'"),
    ({"messages": []}, "empty conversation"),
    ({"messages": [{"role": "user", "content": 3}]}, "message 0 'content' is number"),
    ({"messages": "hi"}, "is string, expected an array of messages"),
    ({"messages": [{"role": "user", "content": "a\ud800"}]}, "lone surrogate"),
])
def test_bad_chat_records(tmp_path, record, match):
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATIONS[1]}, record])
    r = CliRunner().invoke(cli, ["tokenize", str(p), "-t", str(TOKENIZER),
                                 "-o", str(tmp_path / "o"), "--messages-field", "messages", "-q"])
    assert r.exit_code == 1 and "c.jsonl line 2" in r.output and match in r.output, r.output
    assert not list(tmp_path.glob("o*"))
    res = tokenize_files([str(p)], TOKENIZER, tmp_path / "o",
                         TokenizeOptions(messages_field="messages", skip_bad_records=True))
    assert res.n_docs == 1 and res.n_skipped == 1


def test_prompt_needs_completion(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"q": "x"}])
    with pytest.raises(packtool.PacktoolError, match="go together"):
        tokenize_files([str(p)], TOKENIZER, tmp_path / "o", TokenizeOptions(prompt_field="q"))


@pytest.mark.parametrize("layout", ["index", "tokens"])
def test_export_parquet_reads_back(tmp_path, tokenizer, layout):
    rows = [{"q": "Tell me a story " * (i % 7 + 1), "a": " Once upon a time" * (i % 5 + 1)}
            for i in range(60)]
    p = write_jsonl(tmp_path / "pc.jsonl", rows)
    tokenize_files([str(p)], TOKENIZER, tmp_path / "pc",
                   TokenizeOptions(prompt_field="q", completion_field="a"))
    pack_corpus([tmp_path / "pc"], tmp_path / "p", 96, "bfd", shard_size=1500, layout=layout)
    ds = open_packed(tmp_path / "p")
    runner = CliRunner()
    for out in ("x.parquet", "xdir"):
        r = runner.invoke(cli, ["export", str(tmp_path / "p"), "--format", "parquet",
                                "--out", str(tmp_path / out)])
        assert r.exit_code == 0, r.output
        table = pq.read_table(tmp_path / out)
        assert table.num_rows == len(ds)
        assert table.column_names == ["input_ids", "labels", "position_ids", "seq_lengths"]
        for i, row in enumerate(table.to_pylist()):
            ex = ds[i]
            assert row["input_ids"] == ex["input_ids"].tolist()
            assert row["labels"] == ex["labels"].tolist()
            assert row["position_ids"] == ex["position_ids"].tolist()
            assert row["seq_lengths"] == np.diff(ex["cu_seqlens"]).tolist()
    datasets = pytest.importorskip("datasets")
    hf = datasets.load_dataset("parquet", data_files=str(tmp_path / "x.parquet"), split="train")
    assert hf[0]["input_ids"] == ds[0]["input_ids"].tolist()


LLAMA3 = ("{{ '<|bos|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
          "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}")


@pytest.mark.parametrize("template,conv,want", [
    # a trimming template; contents that also occur inside headers and special tokens
    (LLAMA3, [{"role": "user", "content": "x"}, {"role": "assistant", "content": " d "}],
     ["d<|eot_id|>"]),
    # an assistant answer that reappears in a later user turn
    (LLAMA3, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Yes"},
              {"role": "user", "content": "Yes really?"}, {"role": "assistant", "content": "ok"}],
     ["Yes<|eot_id|>", "ok<|eot_id|>"]),
    # ChatML: the answer "a" occurs in the word "assistant" before it
    (CHATML, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}],
     ["a<|im_end|>\n"]),
    # an empty answer still learns to end the turn
    (CHATML, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
     ["<|im_end|>\n"]),
])
def test_chat_spans_are_located_exactly(tmp_path, chatml_model, template, conv, want):
    model, tok = chatml_model
    tok.add_special_tokens(["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    tok.save(str(model / "tokenizer.json"))
    (tmp_path / "t.jinja").write_text(template)
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": conv}])
    tokenize_files([str(p)], model, tmp_path / "c",
                   TokenizeOptions(messages_field="messages",
                                   chat_template=str(tmp_path / "t.jinja")))
    c = packtool.open_tokens(tmp_path / "c")
    ids, mask = c[0].tolist(), c.doc_mask(0).tolist()
    # the trained tokens, grouped into runs, decode to exactly the assistant turns
    runs, cur = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    assert [tok.decode(r, skip_special_tokens=False) for r in runs] == want


def test_chat_options_refused(tmp_path):
    p = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATIONS[1]}])
    for opts, match in [(dict(bos="<|eos|>"), "drop --bos"),
                        (dict(special_tokens=True), "--special-tokens")]:
        with pytest.raises(packtool.PacktoolError, match=match):
            tokenize_files([str(p)], TOKENIZER, tmp_path / "o",
                           TokenizeOptions(messages_field="messages", **opts))
