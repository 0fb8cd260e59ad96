"""Rewards of groups (tokenize --rewards-field) reached from packed rows: sequence_rewards
gives each sequence of a row its record's reward for that completion, in both layouts and
both storages; a corpus without rewards, or a dataset that holds no groups, is refused."""

import numpy as np
import pytest
from conftest import TOKENIZER, write_jsonl

from packtool.errors import PacktoolError
from packtool.formats.packed import open_packed
from packtool.pack import pack_corpus
from packtool.tokenize import TokenizeOptions, tokenize_files
from packtool.train import sequence_rewards

RECORDS = [{"q": f"Question number {g}" + " again" * (g % 3),
            "outs": [f"answer {g}.{k}" + " more" * k for k in range(1 + g % 4)],
            "r": [round(g + k / 8, 3) for k in range(1 + g % 4)]} for g in range(40)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("rewards")
    tokenize_files([str(write_jsonl(d / "g.jsonl", RECORDS))], TOKENIZER, d / "g",
                   TokenizeOptions(prompt_field="q", completions_field="outs",
                                   rewards_field="r"))
    return d


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("layout", ["index", "tokens"])
def test_each_sequence_gets_its_records_reward(folder, share, layout):
    out = folder / f"p-{share}-{layout}"
    pack_corpus([folder / "g"], out, 256, share_prompt=share, layout=layout, overwrite=True)
    ds = open_packed(out)
    n = 0
    for i in range(len(ds)):
        ex = ds[i]
        got = sequence_rewards(ds, i)
        want = [RECORDS[g]["r"][role - 3] for g, role in zip(ex["seq_group"], ex["seq_role"],
                                                              strict=True)]
        assert got.dtype == np.float32
        assert got.tolist() == pytest.approx(want)
        assert sequence_rewards(ds, i, ex).tolist() == got.tolist()
        n += got.size
    assert n == sum(len(r["outs"]) for r in RECORDS)


def test_pairs_without_rewards_and_documents_are_refused(tmp_path):
    p = write_jsonl(tmp_path / "p.jsonl", [{"q": "a b", "c": "c d", "r": "e f"}])
    tokenize_files([str(p)], TOKENIZER, tmp_path / "p", TokenizeOptions(
        prompt_field="q", chosen_field="c", rejected_field="r"))
    pack_corpus([tmp_path / "p"], tmp_path / "pp", 64)
    with pytest.raises(PacktoolError, match="tokenized without --rewards-field"):
        sequence_rewards(open_packed(tmp_path / "pp"), 0)
    d = write_jsonl(tmp_path / "d.jsonl", [{"text": "one two"}])
    tokenize_files([str(d)], TOKENIZER, tmp_path / "d", TokenizeOptions())
    pack_corpus([tmp_path / "d"], tmp_path / "dp", 64)
    with pytest.raises(PacktoolError, match="needs a packed dataset of groups"):
        sequence_rewards(open_packed(tmp_path / "dp"), 0)
