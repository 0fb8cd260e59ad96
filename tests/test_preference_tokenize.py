"""tokenize of preference pairs and groups of completions: one sequence per completion, the
prompt's tokens copied before each, the loss mask on the completions, roles and prompt
lengths per sequence (token format version 4), bad records named by file and line."""

import json

import numpy as np
import pytest
from conftest import TOKENIZER, run, write_jsonl

import packtool
from packtool.errors import FormatError, PacktoolError
from packtool.formats.tokens import validate_tokens
from packtool.tokenize import TokenizeOptions, tokenize_files

PAIRS = [{"prompt": "What is two plus two?", "chosen": "Four.", "rejected": "Five, surely."},
         {"prompt": "Name a colour", "chosen": "Blue", "rejected": "Seven 日本語"}]


def pairs_corpus(tmp_path, records=PAIRS, **kw):
    p = write_jsonl(tmp_path / "p.jsonl", records)
    opts = TokenizeOptions(prompt_field="prompt", chosen_field="chosen",
                           rejected_field="rejected", **kw)
    tokenize_files([str(p)], TOKENIZER, tmp_path / "p", opts)
    return packtool.open_tokens(tmp_path / "p")


def test_pairs_are_prompt_then_completion_masked_on_the_completion(tmp_path, tokenizer):
    c = pairs_corpus(tmp_path, bos="<|bos|>", eos="<|eos|>")
    bos, eos = tokenizer.token_to_id("<|bos|>"), tokenizer.token_to_id("<|eos|>")
    assert c.meta["version"] == 4
    assert c.groups == {"kind": "pairs", "n_groups": 2, "rewards": False}
    assert c.per_doc("roles").tolist() == [1, 2, 1, 2]
    for i, rec in enumerate(PAIRS):
        prompt = tokenizer.encode(rec["prompt"], add_special_tokens=False).ids
        for j, key in enumerate(("chosen", "rejected")):
            d = 2 * i + j
            comp = tokenizer.encode(rec[key], add_special_tokens=False).ids
            assert c[d].tolist() == [bos, *prompt, *comp, eos]
            assert c.doc_mask(d).tolist() == [0] * (1 + len(prompt)) + [1] * (len(comp) + 1)
            assert int(c.per_doc("prompt")[d]) == 1 + len(prompt)
    validate_tokens(tmp_path / "p")


def test_groups_with_rewards(tmp_path, tokenizer):
    recs = [{"q": "Say hi", "outs": ["hi", "hello there", "hey"], "r": [1, 0.5, 0]},
            {"q": "Count", "outs": ["one two"], "r": [-2]}]
    p = write_jsonl(tmp_path / "g.jsonl", recs)
    tokenize_files([str(p)], TOKENIZER, tmp_path / "g", TokenizeOptions(
        prompt_field="q", completions_field="outs", rewards_field="r"))
    c = packtool.open_tokens(tmp_path / "g")
    assert c.groups == {"kind": "completions", "n_groups": 2, "rewards": True}
    assert c.per_doc("roles").tolist() == [3, 4, 5, 3]
    assert c.per_doc("rewards").tolist() == [1.0, 0.5, 0.0, -2.0]
    want = tokenizer.encode("hello there", add_special_tokens=False).ids
    assert c[1].tolist()[int(c.per_doc("prompt")[1]):] == want
    assert c.meta["inputs"][0]["n_docs"] == 2  # records, so groups


def test_chat_prompt_is_rendered_with_the_generation_prompt(tmp_path, tokenizer):
    recs = [{"messages": [{"role": "user", "content": "Hi?"}], "chosen": "Hello",
             "rejected": "Go away"}]
    p = write_jsonl(tmp_path / "m.jsonl", recs)
    tokenize_files([str(p)], TOKENIZER, tmp_path / "m", TokenizeOptions(
        messages_field="messages", chosen_field="chosen", rejected_field="rejected",
        eos="<|eos|>"))
    c = packtool.open_tokens(tmp_path / "m")
    k = int(c.per_doc("prompt")[0])
    prompt = tokenizer.decode(c[0].tolist()[:k], skip_special_tokens=False)
    # the built-in template (the fixture config names <|bos|>) with its generation prompt
    assert prompt == "<|bos|><|user|>\nHi?\n<|assistant|>\n"
    assert tokenizer.decode(c[1].tolist()[k:], skip_special_tokens=False) == "Go away<|eos|>"


@pytest.mark.parametrize("record, match", [
    ({"prompt": "p", "chosen": "c"}, "no field 'rejected'"),
    ({"prompt": "p", "chosen": "", "rejected": "r"}, "field 'chosen' is empty"),
    ({"prompt": "p", "chosen": ["c"], "rejected": "r"}, "field 'chosen' is array, expected a "
                                                        "string"),
    ({"prompt": "", "chosen": "c", "rejected": "r"}, "field 'prompt' is empty"),
])
def test_bad_pair_records_name_file_and_line(tmp_path, record, match):
    p = write_jsonl(tmp_path / "b.jsonl", [PAIRS[0], record])
    r = run("tokenize", p, "-t", TOKENIZER, "-o", tmp_path / "b", "--prompt-field", "prompt",
            "--chosen-field", "chosen", "--rejected-field", "rejected", "-q")
    assert r.exit_code == 1 and "b.jsonl line 2" in r.output and match in r.output, r.output
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("record, match", [
    ({"q": "p", "outs": "one", "r": [1]}, "field 'outs' is string, expected a non-empty list"),
    ({"q": "p", "outs": [], "r": []}, "field 'outs' is an empty list"),
    ({"q": "p", "outs": ["a", 3], "r": [1, 2]}, "field 'outs[1]' is number"),
    ({"q": "p", "outs": ["a", "b"], "r": [1]}, "holds 1 rewards for 2 completions"),
    ({"q": "p", "outs": ["a"], "r": ["x"]}, "r[0] is 'x', expected a finite number"),
    ({"q": "p", "outs": ["a"], "r": [10 ** 400]},
     "r[0] is 100000000000... (401 chars), expected a finite number"),
])
def test_bad_group_records(tmp_path, record, match):
    p = write_jsonl(tmp_path / "b.jsonl", [{"q": "p", "outs": ["a"], "r": [0]}, record])
    r = run("tokenize", p, "-t", TOKENIZER, "-o", tmp_path / "b", "--prompt-field", "q",
            "--completions-field", "outs", "--rewards-field", "r", "-q")
    assert r.exit_code == 1 and "b.jsonl line 2" in r.output and match in r.output, r.output
    r = run("tokenize", p, "-t", TOKENIZER, "-o", tmp_path / "s", "--prompt-field", "q",
            "--completions-field", "outs", "--rewards-field", "r", "--skip-bad-records", "-q")
    assert r.exit_code == 0, r.output
    corpus = packtool.open_tokens(tmp_path / "s")
    assert corpus.groups["n_groups"] == 1
    assert sum(corpus.meta["inputs"][0]["skipped"].values()) == 1


@pytest.mark.parametrize("kw, match", [
    ({"chosen_field": "c"}, "--chosen-field and --rejected-field go together"),
    ({"chosen_field": "c", "rejected_field": "r"}, "need the prompt"),
    ({"chosen_field": "c", "rejected_field": "r", "prompt_field": "p",
      "completions_field": "f"}, "two kinds of record"),
    ({"completions_field": "f", "prompt_field": "p", "completion_field": "x"},
     "--completion-field is for SFT"),
    ({"rewards_field": "r", "chosen_field": "c", "rejected_field": "r2", "prompt_field": "p"},
     "--rewards-field goes with --completions-field"),
    ({"chosen_field": "c", "rejected_field": "c", "prompt_field": "p"},
     "--chosen-field and --rejected-field both name the field 'c'"),
    ({"chosen_field": "c", "rejected_field": "r", "prompt_field": "c"},
     "--prompt-field and --chosen-field both name the field 'c'"),
    ({"completions_field": "f", "rewards_field": "f", "prompt_field": "p"},
     "--completions-field and --rewards-field both name"),
    ({"chosen_field": "c", "rejected_field": "r", "prompt_field": "p", "train_on": "all"},
     "--train-on all chooses the trained tokens of a chat"),
    ({"chosen_field": "c", "rejected_field": "r", "messages_field": "m", "train_on": "all"},
     "pairs records train on their completions only"),
    ({"prompt_field": "p", "completion_field": "p"}, "both name the field 'p'"),
])
def test_option_combinations_refused(kw, match):
    with pytest.raises(PacktoolError, match=match):
        TokenizeOptions(**kw).check()


def test_a_tampered_role_file_is_refused_by_verify(tmp_path):
    c = pairs_corpus(tmp_path)
    roles = np.asarray(c.per_doc("roles")).copy()
    roles[1] = 1  # chosen, chosen: no pair
    from packtool.formats.tokens.groups import check_roles

    with pytest.raises(FormatError, match="document 0 has role 1"):
        check_roles(roles, "x")


@pytest.mark.parametrize("kind", ["pairs", "completions"])
def test_summary_counts_groups_and_sequences(tmp_path, kind):
    """The summary line and --json say groups and sequences, true to the corpus written."""
    if kind == "pairs":
        p = write_jsonl(tmp_path / "in.jsonl", PAIRS)
        flags = ["--prompt-field", "prompt", "--chosen-field", "chosen", "--rejected-field",
                 "rejected"]
        want = "2 pairs, 4 sequences"
    else:
        p = write_jsonl(tmp_path / "in.jsonl", [{"q": "Say hi", "outs": ["hi", "yo", "hey"]},
                                               {"q": "Count", "outs": ["one two"]}])
        flags = ["--prompt-field", "q", "--completions-field", "outs"]
        want = "2 groups of completions, 4 sequences"
    base = ["tokenize", p, "--tokenizer", TOKENIZER, *flags]
    r = run(*base, "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert f"{tmp_path / 'a'}: {want}, " in r.stdout
    assert "documents" not in r.stdout.splitlines()[0]
    assert "no --eos: completions" in r.output and "export --format" not in r.output
    r = run(*base, "--out", tmp_path / "b", "--json", "-q")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    c = packtool.open_tokens(tmp_path / "b")
    assert got["groups"] == {"kind": kind, "n_groups": c.groups["n_groups"],
                             "n_sequences": len(c)}
    assert got["n_docs"] == len(c) and got["n_tokens"] == c.n_tokens


def test_summary_of_documents_is_unchanged(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "one two"}, {"text": "three"}])
    r = run("tokenize", p, "--tokenizer", TOKENIZER, "--out", tmp_path / "d", "--json", "-q")
    assert json.loads(r.stdout)["groups"] is None
    r = run("tokenize", p, "--tokenizer", TOKENIZER, "--out", tmp_path / "e")
    assert f"{tmp_path / 'e'}: 2 documents, " in r.stdout
