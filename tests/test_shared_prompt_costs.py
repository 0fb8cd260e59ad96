"""The attention cost packtool states of a packed row (stats DIR, index.json's imbalance and
per-shard cost classes, a balanced sampler's costs and fingerprint, verify) is what the row's
attention mask computes: 2 x attended pairs - tokens, i.e. x^2 for a causal document of x
tokens. With --share-prompt a completion after its group's prompt attends to the prompt too
(2 p c more), which every cost left out when it took each stored segment for a document;
datasets without shared prompts keep the costs they had (sum of x^2 per row)."""

import json

import numpy as np
import pytest
from conftest import TOKENIZER, run, write_jsonl
from synth import group_records, make_documents

from packtool.formats.packed import index_digest, open_packed
from packtool.formats.packed.balance import step_imbalance
from packtool.formats.packed.batching import collate_numpy
from packtool.formats.packed.costs import dataset_digest, digest, shard_entry
from packtool.pack import pack_corpus
from packtool.stats.corpus import ATTN_RANKS
from packtool.tokenize import TokenizeOptions, tokenize_files
from packtool.train.sampler import PackSampler
from packtool.train.trees import allowed
from packtool.verify import VerifyError, verify_packed

SEQ_LEN = 1024


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """{name: packed dir}: groups with and without --share-prompt, plain documents; each a
    few shards, the grouped ones balanced (--balance attention orders packs by cost)."""
    d = tmp_path_factory.mktemp("share-cost")
    tokenize_files([str(write_jsonl(d / "g.jsonl", group_records(60, seed=5)))], TOKENIZER, d / "g",
                   TokenizeOptions(prompt_field="q", completions_field="outs"))
    docs = [{"text": t} for t in make_documents(40, seed=2)]
    tokenize_files([str(write_jsonl(d / "d.jsonl", docs))], TOKENIZER, d / "d",
                   TokenizeOptions())
    out = {}
    for name, src, opts in (("shared", "g", {"share_prompt": True, "balance": "attention"}),
                            ("grouped", "g", {"balance": "attention"}),
                            ("plain", "d", {})):
        out[name] = d / name
        pack_corpus([d / src], out[name], SEQ_LEN, shard_size=6, **opts)
    return out


def mask_costs(ds) -> np.ndarray:
    """Per row, from the boolean [T, T] mask model_inputs(mask="4d") hands the trainer
    (packtool.train.preference.allowed): 2 x its True entries - T."""
    out = np.empty(len(ds))
    for i in range(len(ds)):
        m = allowed(collate_numpy([ds[i]]))
        out[i] = 2 * int(m.sum()) - m.shape[0]
    return out


def segment_costs(ds) -> np.ndarray:
    """Per row, each stored segment taken as a causal document of its own: sum of x^2."""
    out = []
    for k in range(ds.n_shards):
        sh = ds.shard(k)
        x, ps = np.asarray(sh.seg_length, np.float64), np.asarray(sh.pack_seg, np.int64)
        out += [float((x[a:b] ** 2).sum()) for a, b in zip(ps[:-1], ps[1:], strict=True)]
    return np.array(out)


def block_imbalance(costs: np.ndarray, ranks: int = 8) -> float:
    """index.json's attention_imbalance: mean over blocks of ``ranks`` packs of max/mean."""
    blocks = costs[:costs.size // ranks * ranks].reshape(-1, ranks)
    return float((blocks.max(axis=1) / blocks.mean(axis=1)).mean())


def check_costs(directory, costs: np.ndarray) -> None:
    """Every cost packtool states of the dataset is the one of ``costs``."""
    ds = open_packed(directory)
    assert np.array_equal(ds.attention_costs(), costs)
    at = np.cumsum([0] + [sh["n_packs"] for sh in ds.index["shards"]])
    assert len(at) > 3  # several shards: each entry's costs are its own packs'
    for k, sh in enumerate(ds.index["shards"]):
        want = shard_entry(costs[at[k]:at[k + 1]], ds.index["cost_ratio"])
        assert (sh["cost_classes"], sh["costs_sha256"]) == (want["cost_classes"],
                                                            want["costs_sha256"])
    sampler = PackSampler(ds, rank=0, world_size=2, balance="attention")
    assert sampler.fingerprint == dataset_digest([digest(costs[at[k]:at[k + 1]])
                                                  for k in range(len(at) - 1)])
    assert ds.index["attention_imbalance"] == pytest.approx(block_imbalance(costs), rel=1e-12)
    r = run("stats", directory, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["attention_imbalance"] == step_imbalance(costs, ATTN_RANKS)
    assert rep["attention_imbalance_balanced"] == step_imbalance(costs, ATTN_RANKS,
                                                                 balanced=True)
    assert verify_packed(directory)


def test_a_shared_prompt_rows_cost_is_what_its_mask_attends(packed):
    """Each completion of c tokens after a prompt of p attends to p c + c (c + 1) / 2 pairs:
    stats, the stored classes, the imbalance pack writes, the balanced sampler's costs and
    verify all count the p c (left out, the costs were about half the mask's here)."""
    ds = open_packed(packed["shared"])
    costs = mask_costs(ds)
    alone = segment_costs(ds)
    assert (costs > alone).all() and alone.sum() < 0.8 * costs.sum()
    check_costs(packed["shared"], costs)


@pytest.mark.parametrize("name", ["plain", "grouped"])
def test_datasets_without_shared_prompts_keep_their_costs(packed, name):
    """A plain pack and a grouped pack without --share-prompt: every stated cost is still
    the sum of x^2 of each row's segments (what the costs were before shared prompts were
    counted: the same stored bytes and fingerprints), and that is what the mask computes."""
    ds = open_packed(packed[name])
    costs = segment_costs(ds)
    assert np.array_equal(mask_costs(ds), costs)
    check_costs(packed[name], costs)


def test_verify_refuses_shared_costs_counted_as_segments(packed, tmp_path):
    """Stored costs of a --share-prompt dataset that take each segment for a document alone
    (what pack wrote before the prompt was counted) are not its packs': verify says so."""
    import shutil

    d = tmp_path / "p"
    shutil.copytree(packed["shared"], d)
    index = json.loads((d / "index.json").read_text())
    costs, at = segment_costs(open_packed(d)), 0
    for sh in index["shards"]:
        sh.update(shard_entry(costs[at:at + sh["n_packs"]], index["cost_ratio"]))
        at += sh["n_packs"]
    index["index_sha256"] = index_digest(index)
    (d / "index.json").write_text(json.dumps(index))
    with pytest.raises(VerifyError, match="cost_classes is not its packs'"):
        verify_packed(d)
