"""Packed pairs on a tiny random Llama (CPU, float32, no downloads): each sequence's summed
completion log-probability from packed rows, plain and --share-prompt, equals the sequence
alone within 1e-4, and the DPO loss of packed rows equals the unpacked one. Pairs are built
from the synthetic corpus text (tests/synth.py), prompts about a third of a pair's tokens."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import TOKENIZER, write_jsonl  # noqa: E402
from synth import make_documents  # noqa: E402

import packtool  # noqa: E402
import packtool.torch  # noqa: E402
from packtool.errors import PacktoolError  # noqa: E402
from packtool.formats.packed import open_packed  # noqa: E402
from packtool.pack import pack_corpus  # noqa: E402
from packtool.tokenize import TokenizeOptions, tokenize_files  # noqa: E402
from packtool.torch import block_mask, collate_tensors, model_inputs  # noqa: E402
from packtool.train import dpo_loss, sequence_logps  # noqa: E402
from packtool.verify import verify_packed  # noqa: E402

TOL = 1e-4


def pair_records(n: int, seed: int = 0) -> list[dict]:
    """Prompt, chosen and rejected of like lengths (the prompt ~ a third of the pair)."""
    words = " ".join(make_documents(3 * n, seed=seed, median_words=30, max_words=60)).split()
    rng = np.random.default_rng(seed)
    out, at = [], 0
    for _ in range(n):
        parts = []
        for _ in range(3):
            k = int(rng.integers(4, 14))
            parts.append(" ".join(words[at:at + k]) or "x")
            at += k
        out.append({"prompt": parts[0], "chosen": parts[1], "rejected": parts[2]})
    return out


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pairs")
    p = write_jsonl(d / "pairs.jsonl", pair_records(24))
    tokenize_files([str(p)], TOKENIZER, d / "pairs", TokenizeOptions(
        prompt_field="prompt", chosen_field="chosen", rejected_field="rejected",
        bos="<|bos|>", eos="<|eos|>"))
    out = {}
    for share in (False, True):
        for layout in ("index", "tokens"):
            dst = d / f"packed-{share}-{layout}"
            pack_corpus([d / "pairs"], dst, 512, share_prompt=share, layout=layout)
            out[share, layout] = dst
    return packtool.open_tokens(d / "pairs"), out


def tiny_llama(vocab: int, seed: int = 0, attn: str = "eager"):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(cfg)
    model.set_attn_implementation(attn)
    return model.eval()


def alone(model, corpus) -> dict:
    """Each sequence alone: the summed log-probability of its completion tokens."""
    roles = corpus.per_doc("roles")
    group = np.cumsum((roles == 1) | (roles == 3)) - 1
    out = {}
    for d in range(len(corpus)):
        ids = torch.from_numpy(np.asarray(corpus[d], np.int64))[None]
        mask = torch.from_numpy(np.asarray(corpus.doc_mask(d), bool))
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0], -1)
        tok = logp[:-1].gather(1, ids[0, 1:, None]).squeeze(1)
        out[int(group[d]), "chosen" if roles[d] == 1 else "rejected"] = tok[mask[1:]].sum()
    return out


def packed_logps(model, directory, **kw) -> dict:
    ds = open_packed(directory)
    out = {}
    for i in range(len(ds)):
        batch = collate_tensors([{k: torch.from_numpy(v) if hasattr(v, "dtype") else v
                                  for k, v in ds[i].items()}])
        with torch.no_grad():
            logits = model(**model_inputs(batch, **kw), use_cache=False).logits
        got = sequence_logps(logits, batch)
        assert not set(got) & set(out), "a sequence in two rows"
        out.update(got)
    return out


def test_every_group_whole_in_one_row_and_every_record_there(pairs):
    corpus, dirs = pairs
    for (share, _layout), d in dirs.items():
        ds = open_packed(d)
        assert ds.index["groups"] == {"kind": "pairs", "share_prompt": share, "n_groups": 24,
                                      "n_dropped_groups": 0}
        rows = {}
        for i in range(len(ds)):
            ex = ds[i]
            for g, r in zip(ex["seq_group"].tolist(), ex["seq_role"].tolist(), strict=True):
                rows.setdefault(g, []).append((i, r))
            assert set(np.unique(ex["group_ids"]).tolist()) == set(ex["seq_group"].tolist())
        assert sorted(rows) == list(range(24))
        assert all(len({i for i, _ in v}) == 1 and [r for _, r in v] == [1, 2]
                   for v in rows.values())
        verify_packed(d, sources=[corpus.prefix])


def test_share_prompt_stores_each_prompt_once(pairs):
    corpus, dirs = pairs
    plain = open_packed(dirs[False, "index"]).index
    shared = open_packed(dirs[True, "index"]).index
    prompts = corpus.per_doc("prompt")[corpus.per_doc("roles") == 1].astype(np.int64).sum()
    assert plain["n_tokens"] == corpus.n_tokens
    assert shared["n_tokens"] == corpus.n_tokens - prompts
    assert 0.25 <= prompts / (corpus.n_tokens - prompts) <= 0.42  # ~ a third of P + C + R
    assert shared["n_tokens"] <= 0.8 * plain["n_tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_logps_equal_each_sequence_alone(pairs, attn):
    corpus, dirs = pairs
    model = tiny_llama(int(corpus.meta["vocab_size"]), attn=attn)
    want = alone(model, corpus)
    kw = {"mask": "4d", "dtype": torch.float32 if attn == "eager" else None}
    for (share, layout), d in dirs.items():
        got = packed_logps(model, d, **kw)
        assert set(got) == set(want)
        for k, v in want.items():
            assert abs(float(got[k]) - float(v)) < TOL, (share, layout, k)
    plain = packed_logps(model, dirs[False, "tokens"], varlen=False)  # position ids only
    assert max(abs(float(plain[k]) - float(v)) for k, v in want.items()) < TOL


@pytest.mark.slow
def test_a_boolean_mask_is_wrong_for_eager_attention(pairs):
    """Why eager gets the additive mask: transformers adds a 4-D mask to the scores as it is."""
    corpus, dirs = pairs
    model = tiny_llama(int(corpus.meta["vocab_size"]), attn="eager")
    want = alone(model, corpus)
    got = packed_logps(model, dirs[True, "tokens"], mask="4d")
    assert max(abs(float(got[k]) - float(v)) for k, v in want.items()) > 1e-2


@pytest.mark.slow
def test_dpo_loss_packed_equals_unpacked(pairs):
    corpus, dirs = pairs
    vocab = int(corpus.meta["vocab_size"])
    policy, ref = tiny_llama(vocab, 0), tiny_llama(vocab, 1)
    want = dpo_loss(alone(policy, corpus), alone(ref, corpus))
    for d in dirs.values():
        got = dpo_loss(packed_logps(policy, d, mask="4d", dtype=torch.float32),
                       packed_logps(ref, d, mask="4d", dtype=torch.float32))
        assert abs(float(got) - float(want)) < TOL
    assert abs(float(want) - np.log(2)) > 1e-3  # two different models: a loss that can fail


def test_shared_rows_refuse_varlen_and_block_mask_keeps_siblings_apart(pairs):
    _, dirs = pairs
    ds = open_packed(dirs[True, "tokens"])
    batch = collate_tensors([{k: torch.from_numpy(v) if hasattr(v, "dtype") else v
                              for k, v in ds[0].items()}])
    with pytest.raises(PacktoolError, match="cu_seqlens.*mask='4d'"):
        model_inputs(batch)
    from torch.nn.attention.flex_attention import flex_attention

    n = batch["input_ids"].shape[1]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8) for _ in range(3))
    dense = model_inputs(batch, mask="4d")["attention_mask"]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    got = flex_attention(q, k, v, block_mask=block_mask(batch, block_size=16))
    assert torch.allclose(got, want, atol=1e-5)
    seg = np.repeat(np.arange(len(batch["cu_seq_lens_q"]) - 1),
                    np.diff(batch["cu_seq_lens_q"].numpy()))
    sp = batch["seg_prompt"].numpy()
    siblings = [(a, b) for a in range(sp.size) for b in range(sp.size)
                if a != b and sp[a] >= 0 and sp[a] == sp[b]]
    assert siblings
    m = dense[0, 0].numpy()
    for a, b in siblings:
        assert not m[np.ix_(seg == a, seg == b)].any()
    assert m[np.ix_(seg == siblings[0][0], seg == sp[siblings[0][0]])].all()


@pytest.mark.slow
def test_shared_rows_through_packtool_attention_with_their_block_mask(pairs):
    """attn_implementation="packtool" (packtool.torch.prepare_model): shared-prompt rows take
    block_mask(batch) (FlexAttention), plain rows model_inputs(batch) (varlen), and both give
    each sequence's log-probability as it is alone."""
    corpus, dirs = pairs
    model = tiny_llama(int(corpus.meta["vocab_size"]))
    want = alone(model, corpus)
    packtool.torch.prepare_model(model)
    got = packed_logps(model, dirs[False, "tokens"])
    ds = open_packed(dirs[True, "tokens"])
    for i in range(len(ds)):
        batch = collate_tensors([{k: torch.from_numpy(v) if hasattr(v, "dtype") else v
                                  for k, v in ds[i].items()}])
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                           attention_mask=block_mask(batch), use_cache=False).logits
        shared = sequence_logps(logits, batch)
        assert all(abs(float(shared[k]) - float(want[k])) < TOL for k in shared)
        got.update({k: v for k, v in shared.items() if k not in got})
    assert set(got) == set(want)
    assert max(abs(float(got[k]) - float(v)) for k, v in want.items()) < TOL


def test_bad_arguments_are_refused_by_name(pairs):
    """Logits of another shape or vocabulary, a reference of another batch, a beta that is
    not a finite positive number, a FlexAttention tile of 0: each refused by name (they were
    an IndexError, a KeyError, a ZeroDivisionError, or a NaN loss)."""
    ds = open_packed(pairs[1][False, "tokens"])
    batch = collate_tensors([{k: torch.from_numpy(v) if hasattr(v, "dtype") else v
                              for k, v in ds[i].items()} for i in (0, 1)])
    n, vocab = batch["input_ids"].shape[1], int(batch["input_ids"].max()) + 1
    for bad in (torch.zeros(n), torch.zeros(1, n - 1, vocab), torch.zeros(2, n, vocab),
                torch.zeros(n - 3, vocab), np.zeros((n, vocab))):
        with pytest.raises(PacktoolError, match=f"logits must be a tensor \\[1, {n}, V\\]"):
            sequence_logps(bad, batch)
    with pytest.raises(PacktoolError, match="logits' vocabulary"):
        sequence_logps(torch.zeros(1, n, vocab - 1), batch)
    logps = sequence_logps(torch.zeros(1, n, vocab), batch)
    assert float(dpo_loss(logps, logps)) == pytest.approx(np.log(2))
    other = {(g + 1000, r): v for (g, r), v in logps.items()}
    with pytest.raises(PacktoolError, match="reference's sequences are not the policy's"):
        dpo_loss(logps, other)
    for beta in (float("nan"), float("inf"), 0.0, -0.1, True, "0.1"):
        with pytest.raises(PacktoolError, match="beta must be a finite number > 0"):
            dpo_loss(logps, logps, beta=beta)
    for size in (0, -128, 1.5):
        with pytest.raises(PacktoolError, match="block_size must be an integer >= 1"):
            block_mask(batch, block_size=size)


@pytest.mark.parametrize("options,says", [
    ({"vsl": "256:512", "seq_len": 512}, "--vsl"), ({"group_docs": 10}, "--group-docs"),
    ({"max_docs": 2}, "--max-docs"), ({"align": 8}, "alignment"),
    ({"valid_docs": 3}, "--valid-docs")])
def test_what_would_break_a_group_apart_is_refused_by_name(pairs, tmp_path, options, says):
    d = next(iter(pairs[1].values())).parent  # the corpus beside its packed datasets
    seq_len = options.pop("seq_len", 512)
    with pytest.raises(PacktoolError, match=f"pairs and groups are packed whole.*{says}"):
        pack_corpus([d / "pairs"], tmp_path / "p", seq_len, **options)
    assert not (tmp_path / "p").exists()


def test_a_rows_attention_cost_is_what_its_mask_computes(pairs):
    """A completion after a shared prompt attends to the prompt's p tokens too, which the
    costs (stats DIR, the stored cost classes, the balanced sampler) left out: a row's cost
    (sum of x^2 over causal segments, i.e. 2 x attended pairs - tokens) now equals what the
    4-D mask the trainer gets computes, with and without --share-prompt, and the stored
    costs verify."""
    _, dirs = pairs
    for share in (False, True):
        ds = open_packed(dirs[share, "tokens"])
        costs = ds.attention_costs()
        for i in range(len(ds)):
            row = ds[i]
            batch = collate_tensors([{k: torch.from_numpy(v) if hasattr(v, "dtype") else v
                                      for k, v in row.items()}])
            m = model_inputs(batch, mask="4d", dtype=None)["attention_mask"][0, 0]
            n = int(batch["input_ids"].shape[1])
            assert costs[i] == 2 * int(m.sum()) - n, (share, i)
        verify_packed(dirs[share, "tokens"])


def test_one_version_one_layout_and_old_pairs_still_read(pairs, tmp_path):
    """Pairs are version 5 (they were version 4, the number --vsl has, issue 38); a dataset of
    pairs written as version 4 reads as it did, and a version 4 with both keys is refused."""
    import json
    import shutil

    from packtool.formats.packed import index_digest

    src = pairs[1][False, "tokens"]  # a shared prompt is version 6 (a tree) since issue 41
    assert open_packed(src).index["version"] == 5
    assert open_packed(pairs[1][True, "tokens"]).index["version"] == 6
    old = tmp_path / "v4"
    shutil.copytree(src, old)
    idx = json.loads((old / "index.json").read_text())
    idx["version"] = 4
    idx["index_sha256"] = index_digest(idx)
    (old / "index.json").write_text(json.dumps(idx))
    a, b = open_packed(src), open_packed(old)
    for k, v in a[0].items():
        assert np.array_equal(np.asarray(v), np.asarray(b[0][k])), k
    verify_packed(old)
    idx["vsl"] = {"min": 256, "max": 512, "rows": {}, "n_remnant_rows": 0,
                  "n_remnant_tokens": 0, "n_slot_tokens": 0}
    idx["index_sha256"] = index_digest(idx)
    (old / "index.json").write_text(json.dumps(idx))
    with pytest.raises(PacktoolError, match="one version, one layout"):
        open_packed(old)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma"])
def test_share_prompt_rows_within_1e5_per_token_on_three_architectures(pairs, arch):
    """Issue 41.3 through pack --share-prompt (the depth-1 tree): each sequence's
    log-probability within 1e-5 per completion token of the sequence alone, through
    block_mask (FlexAttention) and the 4-D mask (eager, sdpa)."""
    import warnings

    from packtool.train import conformance as cf

    corpus, dirs = pairs
    cfg = cf.tiny_config({"model_type": arch})
    cfg.vocab_size = int(corpus.meta["vocab_size"])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.set_attn_implementation("eager")
    want = alone(model, corpus)
    roles = corpus.per_doc("roles")
    group = np.cumsum((roles == 1) | (roles == 3)) - 1
    n_tok = {(int(group[d]), "chosen" if roles[d] == 1 else "rejected"):
             max(1, int(np.asarray(corpus.doc_mask(d), bool)[1:].sum()))
             for d in range(len(corpus))}
    ds = open_packed(dirs[True, "tokens"])
    for path in ("block_mask", "eager", "sdpa"):
        model.set_attn_implementation("flex_attention" if path == "block_mask" else path)
        got = {}
        for i in range(len(ds)):
            batch = collate_tensors([{k: torch.from_numpy(v) if hasattr(v, "dtype") else v
                                      for k, v in ds[i].items()}])
            if path == "block_mask":
                kw = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                      "attention_mask": block_mask(batch)}
            else:
                kw = model_inputs(batch, mask="4d",
                                  dtype=torch.float32 if path == "eager" else None)
                kw.pop("labels")
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                got.update(sequence_logps(model(**kw, use_cache=False).logits, batch))
        assert set(got) == set(want)
        worst = max(abs(float(got[k]) - float(v)) / n_tok[k] for k, v in want.items())
        assert worst <= 1e-5, (arch, path, worst)
