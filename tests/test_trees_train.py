"""Issue 41.3: rows of prefix trees (depth 3-5, several trees a row, built by hand as the
reader lays them out) give each sequence's completion log-probability as the sequence alone,
within 1e-5 per completion token (float32, CPU), on tiny Llama, Qwen2 and Gemma through
FlexAttention's block_mask and the 4-D mask; DPO, the GRPO-style loss and the SFT loss over
tree rows equal their flat forms; collation and padding keep the tree; cp_shard carries the
ancestors a shard needs."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packtool.errors import PacktoolError  # noqa: E402
from packtool.formats.packed.batching import collate_numpy, pad_example  # noqa: E402
from packtool.sources.groups import role_name  # noqa: E402
from packtool.torch import block_mask, collate_tensors, model_inputs  # noqa: E402
from packtool.train import conformance as cf  # noqa: E402
from packtool.train import cp_shard, dpo_loss, sequence_logps  # noqa: E402
from packtool.train.preference import grpo_loss, sft_loss, token_logps  # noqa: E402
from packtool.train.trees import ROLE_RECORD, allowed, row_tree  # noqa: E402

PER_TOKEN = 1e-5
VOCAB = 128


def node(n, mask=1, kids=(), role=None):
    return {"n": n, "mask": mask, "kids": list(kids), "role": role}


# (group, tree): a GRPO group whose completions share a first part (depth 3), a pair behind
# a 4-deep chain of shared turns (depth 5), records sharing a system prompt and a history
# (--share-prefix across records, depth 3), and a plain --share-prompt pair (depth 1)
TREES = [
    (0, node(12, 0, [node(6, 1, [node(5, role=3), node(7, role=4)]), node(4, role=5)])),
    (1, node(8, 0, [node(3, 1, [node(4, 0, [node(2, 1, [node(3, role=1), node(5, role=2)])])])])),
    (2, node(10, 0, [node(3, role=ROLE_RECORD),
                     node(6, 1, [node(2, role=ROLE_RECORD), node(4, role=ROLE_RECORD)])])),
    (3, node(5, 0, [node(3, role=1), node(4, role=2)])),
]


def build_pack(trees, seed=0):
    """One pack as the reader gives it (docs: CONTRACTS A), and each sequence alone:
    {key: (tokens, completion mask)}."""
    rng = np.random.default_rng(seed)
    segs, alone = [], {}

    def walk(nd, parent, group, path_tok, path_mask, pos, path):
        s = len(segs)
        ids = rng.integers(1, VOCAB, nd["n"])
        segs.append((ids, parent, nd["mask"], group, nd["role"], pos))
        tok, msk = path_tok + list(ids), path_mask + [nd["mask"]] * nd["n"]
        if not nd["kids"]:
            key = (group, tuple(path) if nd["role"] == ROLE_RECORD else role_name(nd["role"]))
            alone[key] = (np.array(tok), np.array(msk, bool))
        for i, kid in enumerate(nd["kids"]):
            walk(kid, s, group, tok, msk, pos + nd["n"], path + [i])

    for group, root in trees:
        walk(root, -1, group, [], [], 0, [])
    lens = np.array([len(s[0]) for s in segs])
    leaf = [i for i, s in enumerate(segs) if s[4] is not None]
    seq_of = np.full(len(segs), -1)
    seq_of[leaf] = np.arange(len(leaf))
    ids = np.concatenate([s[0] for s in segs])
    labels = ids.copy()
    labels[np.cumsum(lens) - lens] = -100
    ex = {"input_ids": ids, "labels": labels,
          "position_ids": np.concatenate([np.arange(s[5], s[5] + len(s[0])) for s in segs]),
          "cu_seqlens": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
          "seg_parent": np.array([s[1] for s in segs], np.int32),
          "group_ids": np.repeat([s[3] for s in segs], lens),
          "seq_ids": np.repeat(seq_of, lens),
          "completion_mask": np.repeat([s[2] for s in segs], lens).astype(np.uint8),
          "seq_group": np.array([segs[i][3] for i in leaf], np.int64),
          "seq_role": np.array([segs[i][4] for i in leaf], np.int32),
          "seq_leaf": np.array(leaf, np.int32)}
    return ex, alone


@pytest.fixture(scope="module")
def row():
    """Two packs of two trees each, collated into one row (indices moved on by collation)."""
    a, want_a = build_pack(TREES[:2], seed=1)
    b, want_b = build_pack(TREES[2:], seed=2)
    return [a, b], {**want_a, **want_b}


def tensors(batch):
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def model_of(arch, seed=0):
    cfg = cf.tiny_config({"model_type": arch})
    torch.manual_seed(seed)
    import transformers

    m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return m.eval()


def alone_logps(model, want) -> dict:
    model.set_attn_implementation("eager")
    out = {}
    for key, (tok, mask) in want.items():
        with torch.no_grad():
            lg = model(input_ids=torch.from_numpy(tok)[None], use_cache=False).logits[0]
        lp = torch.log_softmax(lg.float(), -1)[:-1].gather(1, torch.from_numpy(tok[1:, None]))
        out[key] = lp[:, 0][torch.from_numpy(mask[1:])].sum()
    return out


def forward(model, batch, path):
    if path == "block_mask":
        model.set_attn_implementation("flex_attention")
        kw = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
              "attention_mask": block_mask(batch, block_size=16)}
    else:
        model.set_attn_implementation(path.split("-")[1])
        kw = model_inputs(batch, mask="4d",
                          dtype=torch.float32 if path == "4d-eager" else None)
        kw.pop("labels")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # flex_attention's unfused eager path
        return model(**kw, use_cache=False).logits


def worst_per_token(got, want, tokens) -> float:
    assert set(got) == set(want)
    return max(abs(float(got[k]) - float(want[k])) / max(1, int(tokens[k][1][1:].sum()))
               for k in want)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma"])
def test_tree_rows_give_each_sequence_as_alone(row, arch):
    packs, want = row
    model = model_of(arch)
    ref = alone_logps(model, want)
    batch = tensors(collate_numpy(packs))
    for path in ("block_mask", "4d-eager", "4d-sdpa"):
        got = sequence_logps(forward(model, batch, path), batch)
        assert worst_per_token(got, ref, want) <= PER_TOKEN, (arch, path)
    # a control that can fail: the plain document mask (siblings apart, ancestors lost)
    plain = dict(batch, seg_parent=torch.full_like(batch["seg_parent"], -1))
    plain.pop("seg_end")
    model.set_attn_implementation("sdpa")
    kw = model_inputs(plain, mask="4d")
    kw.pop("labels")
    with torch.no_grad():
        lost = sequence_logps(model(**kw, use_cache=False).logits, batch)
    assert worst_per_token(lost, ref, want) > 1e-3


def test_keys_and_depths(row):
    packs, want = row
    batch = collate_numpy(packs)
    tree = row_tree(batch)
    depth = max(len(tree.ancestors(s)) for s in range(tree.parent.size))
    assert depth == 5
    assert (2, (1, 1)) in want and (0, 2) in want and (1, "chosen") in want
    got = sequence_logps(torch.zeros(1, batch["input_ids"].shape[1], VOCAB), tensors(batch))
    assert list(got) == [k for k in want]  # the row's order: pack by pack, pre-order


def naive_allowed(tree) -> np.ndarray:
    """Key k visible to q iff k <= q and k's segment is q's or one of its ancestors."""
    n = tree.seg.size
    out = np.zeros((n, n), bool)
    for q in range(n):
        anc = set(tree.ancestors(int(tree.seg[q])))
        for k in range(q + 1):
            out[q, k] = int(tree.seg[k]) in anc
    return out


@pytest.mark.parametrize("pad", [None, 32, 7])
def test_collation_and_padding_keep_the_tree(row, pad):
    """collate_numpy moves seg_parent, seg_end, tree_in, tree_out, seq_leaf on by the packs
    before and gives a row pad a root segment of its own (issue 38.1's bug class: an array
    left behind by padding)."""
    packs, _ = row
    batch = collate_numpy(packs, pad_multiple=pad)
    tree = row_tree(batch)
    assert np.array_equal(batch["tree_in"][0], tree.tree_in)
    assert np.array_equal(batch["tree_out"][0], tree.tree_out)
    assert np.array_equal(batch["seg_end"], tree.end)
    n_a = len(packs[0]["cu_seqlens"]) - 1
    assert np.array_equal(batch["seq_leaf"][len(packs[0]["seq_leaf"]):],
                          packs[1]["seq_leaf"] + n_a)
    assert np.array_equal(allowed(batch), naive_allowed(tree))
    if pad:
        assert batch["input_ids"].shape[1] % pad == 0
    one = pad_example(packs[0], pad_to=128)
    t1 = row_tree(one)
    assert t1.parent[-1] == -1 and np.array_equal(one["tree_out"], t1.tree_out)


def test_an_old_batch_with_seg_prompt_alone_reads_as_the_depth_1_tree():
    """Batches from before trees name a completion's prompt in seg_prompt only."""
    packs = [build_pack([(g, TREES[3][1])], seed=g)[0] for g in (3, 4)]
    olds = [{**{k: v for k, v in p.items() if k != "seg_parent"}, "seg_prompt": p["seg_parent"]}
            for p in packs]
    old = olds[0]
    a, b = collate_numpy(packs), collate_numpy(olds)
    assert np.array_equal(b["seg_parent"], a["seg_parent"])
    assert np.array_equal(b["seg_prompt"], b["seg_parent"])
    assert np.array_equal(allowed(b), allowed(a))
    logits = torch.randn(1, a["input_ids"].shape[1], VOCAB)
    got, want = (sequence_logps(logits, tensors(x)) for x in (b, a))
    assert got.keys() == want.keys() and all(float(got[k]) == float(want[k]) for k in got)
    plain = dict(old, seg_prompt=np.full_like(old["seg_prompt"], -1))
    assert not np.array_equal(allowed(collate_numpy([plain])), allowed(collate_numpy([old])))


def test_a_broken_tree_is_refused_by_name(row):
    packs, _ = row
    batch = collate_numpy(packs)
    bad = dict(batch, seg_end=batch["seg_end"] + 1)
    with pytest.raises(PacktoolError, match="seg_end does not match seg_parent"):
        row_tree(bad)
    p = batch["seg_parent"].copy()
    p[1] = 3  # a parent after its child
    with pytest.raises(PacktoolError, match="pre-order"):
        row_tree({k: v for k, v in dict(batch, seg_parent=p).items() if k != "seg_end"})
    p = batch["seg_parent"].copy()
    at = int(np.flatnonzero(p == -1)[1])  # the second root adopted by the first: not contiguous
    p[at + 1] = 0
    with pytest.raises(PacktoolError, match="not segment .* nor one of its ancestors"):
        row_tree({k: v for k, v in dict(batch, seg_parent=p).items() if k != "seg_end"})
    with pytest.raises(PacktoolError, match="cu_seqlens.*mask='4d'"):
        model_inputs(tensors(batch))


def flat_terms(model, want, old_model, adv):
    """Per sequence alone: completion token log-probs (policy, old)."""
    model.set_attn_implementation("eager")
    out = {}
    for key, (tok, mask) in want.items():
        ids = torch.from_numpy(tok)[None]
        lp = [torch.log_softmax(m(input_ids=ids, use_cache=False).logits[0].float(), -1)[:-1]
              .gather(1, ids[0, 1:, None])[:, 0][torch.from_numpy(mask[1:])]
              for m in (model, old_model)]
        out[key] = (lp[0], lp[1].detach(), adv[key])
    return out


@pytest.mark.slow
def test_grpo_and_sft_losses_of_tree_rows_equal_flat(row):
    """The per-sequence policy loss (clipped, token and sequence means) and the SFT loss,
    values and gradients, as the sequences trained flat: a shared token counts once per
    sequence through it."""
    packs, want = row
    model, old = model_of("llama", 0), model_of("llama", 1)
    batch = tensors(collate_numpy(packs))
    rng = np.random.default_rng(0)
    adv = {k: float(v) for k, v in zip(want, rng.normal(0, 1, len(want)), strict=True)}
    model.set_attn_implementation("eager")
    kw = model_inputs(batch, mask="4d", dtype=torch.float32)
    kw.pop("labels")
    with torch.no_grad():
        old_tok = token_logps(old(**kw, use_cache=False).logits, batch)[0]
    flat = flat_terms(model, want, old, adv)
    ratios = {k: torch.exp(lp - o) for k, (lp, o, _) in flat.items()}
    clipped = sum(int(((r < 0.8) | (r > 1.2)).sum()) for r in ratios.values())
    assert clipped > 0  # the clip takes part
    terms = {k: -torch.minimum(ratios[k] * a, torch.clamp(ratios[k], 0.8, 1.2) * a)
             for k, (_, _, a) in flat.items()}
    want_tok = torch.cat(list(terms.values())).mean()
    want_seq = torch.stack([t.mean() for t in terms.values()]).mean()
    sft_flat = -torch.cat([lp for lp, _, _ in flat.values()]).mean()
    for mean, ref in (("token", want_tok), ("sequence", want_seq)):
        got = grpo_loss(model(**kw, use_cache=False).logits, batch, adv, old_tok, mean=mean)
        assert abs(got.item() - ref.item()) < 1e-5, mean
        w = model.model.layers[0].self_attn.q_proj.weight
        g_tree = torch.autograd.grad(got, w)[0]
        g_flat = torch.autograd.grad(ref, w, retain_graph=True)[0]
        assert torch.allclose(g_tree, g_flat, atol=1e-6), mean
    got = sft_loss(model(**kw, use_cache=False).logits, batch)
    assert abs(float(got) - float(sft_flat)) < 1e-5
    tok, _, _ = token_logps(model(**kw, use_cache=False).logits, batch)
    assert abs(float(-tok.mean()) - float(sft_flat)) > 1e-4  # each shared token once: not flat


def test_dpo_over_tree_rows_equals_flat(row):
    packs, want = row
    policy, ref = model_of("qwen2", 0), model_of("qwen2", 1)
    batch = tensors(collate_numpy(packs))
    pairs = {k: v for k, v in want.items() if k[1] in ("chosen", "rejected")}
    got = [sequence_logps(forward(m, batch, "4d-sdpa"), batch) for m in (policy, ref)]
    got = [{k: v[k] for k in pairs} for v in got]
    flat = [alone_logps(m, pairs) for m in (policy, ref)]
    assert abs(float(dpo_loss(*got)) - float(dpo_loss(*flat))) < 1e-5
    assert abs(float(dpo_loss(*flat)) - np.log(2)) > 1e-4


@pytest.mark.parametrize("cp", [2, 3])
def test_cp_shard_carries_every_ancestor_a_shard_needs(row, cp):
    """Balanced shards of a tree row: each piece's keys are its ancestors' tokens and its own
    segment's up to the piece, so the union over ranks is the ancestor-causal mask exactly;
    zigzag (TE's THD: attention within one segment) is refused by name."""
    packs, _ = row
    batch = collate_numpy(packs)
    n = batch["input_ids"].shape[1]
    m = np.zeros((n, n), bool)
    for rank in range(cp):
        s = cp_shard(batch, cp, rank, "balanced")
        for j in range(len(s["cu_seqlens_q"]) - 1):
            qs = s["positions"][s["cu_seqlens_q"][j]:s["cu_seqlens_q"][j + 1]]
            ks = s["key_positions"][s["cu_seqlens_k"][j]:s["cu_seqlens_k"][j + 1]]
            # flash-attention's bottom-right causal alignment: query i of a piece of q sees
            # the first len(ks) - len(qs) + i + 1 keys
            for i, q in enumerate(qs):
                m[q, ks[:len(ks) - len(qs) + i + 1]] = True
        assert np.array_equal(s["tree_out"], row_tree(batch).tree_out[s["positions"]])
    assert np.array_equal(m, allowed(batch))
    with pytest.raises(PacktoolError, match="zigzag"):
        cp_shard(batch, cp, 0, "zigzag")


def test_a_tree_row_through_collate_tensors_and_block_mask_cache(row):
    packs, _ = row
    batch = collate_tensors([tensors(p) for p in packs])
    assert block_mask(batch, block_size=16) is block_mask(batch, block_size=16)
    flat = dict(batch, seg_parent=torch.full_like(batch["seg_parent"], -1))
    flat.pop("seg_end")
    assert block_mask(flat, block_size=16) is not block_mask(batch, block_size=16)


@pytest.fixture(scope="module")
def packed_trees(tmp_path_factory):
    """Through the reader: chat records repeating a system prompt (--share-prefix across
    records) and groups whose completions begin alike (a prompt, a shared first part, then
    branches: depth 3), packed with pack --share-prefix."""
    from conftest import TOKENIZER, write_jsonl

    import packtool
    from packtool.pack import pack_corpus
    from packtool.tokenize import TokenizeOptions, tokenize_files

    d = tmp_path_factory.mktemp("trees")
    system = "You are a careful assistant. Answer briefly and cite the rule you used."
    chat = [{"text": f"{system} Question {i}: what is {i} plus {i + 1}? Answer: {2 * i + 1}."}
            for i in range(12)]
    groups = [{"q": f"Problem {i}: add {i} and 7.",
               "outs": [f" Let us think step by step. {i} plus 7 is {i + 7}.",
                        f" Let us think step by step. Adding gives {i + 7}!",
                        f" The sum is {i + 7}."]} for i in range(8)]
    tokenize_files([str(write_jsonl(d / "chat.jsonl", chat))], TOKENIZER, d / "chat",
                   TokenizeOptions())
    tokenize_files([str(write_jsonl(d / "groups.jsonl", groups))], TOKENIZER, d / "groups",
                   TokenizeOptions(prompt_field="q", completions_field="outs"))
    out = {}
    for name in ("chat", "groups"):
        pack_corpus([d / name], d / f"{name}-p", 512, share_prefix=True, min_shared=2)
        out[name] = (packtool.open_tokens(d / name), d / f"{name}-p")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["chat", "groups"])
def test_pack_share_prefix_rows_give_each_record_as_alone(packed_trees, name):
    """End to end: pack --share-prefix, the reader's tree, collate two rows, Llama through
    block_mask and the 4-D mask: every record's log-probability (its loss-masked tokens)
    within 1e-5 per token of the record alone."""
    from packtool.formats.packed import open_packed
    from packtool.train.preference import sequence_keys

    corpus, directory = packed_trees[name]
    ds = open_packed(directory)
    rows = [ds[i] for i in range(min(2, len(ds)))]
    batch = tensors(collate_numpy(rows))
    tree = row_tree(batch)
    depth = max(len(tree.ancestors(s)) for s in range(tree.parent.size))
    assert depth >= 2 if name == "chat" else depth >= 3
    assert batch["input_ids"].shape[1] < sum(len(corpus[int(d)]) for d in batch["seq_doc"])
    cfg = cf.tiny_config({"model_type": "llama"})
    cfg.vocab_size = int(corpus.meta["vocab_size"])
    torch.manual_seed(0)
    import transformers

    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    want = {}
    for key, doc in zip(sequence_keys(batch), batch["seq_doc"].tolist(), strict=True):
        tok = np.asarray(corpus[doc], np.int64)
        m = corpus.doc_mask(doc)
        want[key] = (tok, np.ones(tok.size, bool) if m is None else np.asarray(m, bool))
    ref = alone_logps(model, want)
    for path in ("block_mask", "4d-eager", "4d-sdpa"):
        logits = forward(model, batch, path)
        got = sequence_logps(logits, batch)
        assert worst_per_token(got, ref, want) <= PER_TOKEN, path
    flat = -sum(float(v) for v in ref.values()) / sum(int(m[1:].sum()) for _, m in want.values())
    assert abs(float(sft_loss(logits, batch)) - flat) < 1e-5  # the records' flat SFT loss
