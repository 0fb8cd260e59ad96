"""Issue 41.4: TRL's trainers on packed, shared rows with no patch (packtool.train.trl): the
DPO loss, its gradients and metrics equal TRL's own unpacked ones within 1e-5 (float32, CPU,
a tiny Llama, eager / sdpa / FlexAttention), and GRPO's per-token log-probabilities equal
GRPOTrainer's. TRL's import alone takes ~6 s, so every test here is slow."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from conftest import TOKENIZER  # noqa: E402

from packtool.errors import PacktoolError  # noqa: E402
from packtool.train import trl as ptrl  # noqa: E402
from packtool.train.trees import row_tree  # noqa: E402

pytestmark = pytest.mark.slow

PAIRS = [  # the first two pairs' completions begin alike: a depth-2 tree each
    {"prompt": "The quick brown fox jumps over", "chosen": " the lazy dog today",
     "rejected": " the lazy cat"},
    {"prompt": "A tiny model learns", "chosen": " to stop at the end",
     "rejected": " to stop"},
    {"prompt": "Packing rows", "chosen": " saves tokens", "rejected": " wastes pads and time"},
]


@pytest.fixture(scope="module")
def tok():
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER), eos_token="<|eos|>", pad_token="<|eos|>",
        bos_token="<|bos|>")


def llama(tok, seed, attn="eager"):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)
    m = transformers.LlamaForCausalLM(cfg)
    m.set_attn_implementation(attn)
    return m


def dpo_args(tmp_path, **kw):
    return trl.DPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                         per_device_train_batch_size=3, save_strategy="no", logging_steps=1,
                         max_steps=1, **kw)


def dpo_loss_and_grad(cls, tok, tmp_path, attn, grad=True, **kw):
    tr = cls(model=llama(tok, 0, attn), ref_model=llama(tok, 1, attn),
             args=dpo_args(tmp_path, **kw), train_dataset=datasets.Dataset.from_list(PAIRS),
             processing_class=tok)
    batch = tr.data_collator([tr.train_dataset[i] for i in range(len(PAIRS))])
    with torch.set_grad_enabled(grad):
        loss = tr.compute_loss(tr.model, batch)
    g = None
    if grad:
        loss.backward()
        g = torch.cat([p.grad.ravel() for p in tr.model.parameters() if p.grad is not None])
    return loss.item(), g, {k: v[-1] for k, v in tr._metrics["train"].items()}, batch


@pytest.mark.parametrize("attn,kw", [("eager", {}), ("sdpa", {}),
                                     ("eager", {"loss_type": ["ipo", "sigmoid"],
                                                "loss_weights": [0.5, 1.0]}),
                                     ("sdpa", {"ld_alpha": 0.5, "use_weighting": True})])
def test_packed_dpo_equals_trl_unpacked(tok, tmp_path, attn, kw):
    want = dpo_loss_and_grad(trl.DPOTrainer, tok, tmp_path, attn, **kw)
    got = dpo_loss_and_grad(ptrl.PackedDPOTrainer, tok, tmp_path, attn, **kw)
    assert abs(got[0] - want[0]) < 1e-5
    assert (got[1] - want[1]).abs().max().item() < 1e-6
    assert want[1].abs().max().item() > 1e-4  # gradients that can differ
    for k, v in want[2].items():
        assert abs(got[2][k] - v) <= 1e-5 * max(1.0, abs(v)), k
    assert abs(want[2]["rewards/margins"]) > 1e-4  # two models: a loss that can differ


def test_packed_dpo_through_flex_attention(tok, tmp_path):
    """FlexAttention's block_mask (forward only: torch 2.13 has no FlexAttention backward
    on CPU)."""
    want = dpo_loss_and_grad(trl.DPOTrainer, tok, tmp_path, "eager", grad=False)
    got = dpo_loss_and_grad(ptrl.PackedDPOTrainer, tok, tmp_path, "flex_attention", grad=False)
    assert abs(got[0] - want[0]) < 1e-5


def test_the_packed_row_shares_each_pairs_beginning(tok, tmp_path):
    *_, batch = dpo_loss_and_grad(trl.DPOTrainer, tok, tmp_path, "eager", grad=False)
    row, src = ptrl.pack_rows(batch["input_ids"], batch["attention_mask"],
                              batch["completion_mask"])
    tree = row_tree(row)
    n_row, n_trl = row["input_ids"].shape[1], int(batch["attention_mask"].sum())
    prompts = sum(len(tok(p["prompt"])["input_ids"]) for p in PAIRS)
    assert n_row < n_trl - prompts  # prompts once, and the completions' common beginnings
    roots = np.flatnonzero(tree.parent == -1)
    assert roots.size == len(PAIRS)
    shared_completion = [int(row["completion_mask"][0][tree.seg == s].sum()) for s in roots]
    assert shared_completion[0] > 0 and shared_completion[1] > 0 and shared_completion[2] == 0
    assert src.shape == (batch["input_ids"].shape[0], batch["input_ids"].shape[1] - 1)
    with pytest.raises(PacktoolError, match="chosen rows then rejected rows"):
        ptrl.pack_rows(batch["input_ids"][:5], batch["attention_mask"][:5],
                       batch["completion_mask"][:5])


def test_packed_dpo_trains_a_step_as_trl_does(tok, tmp_path):
    """trainer.train(): one SGD step, the same loss logged and the same parameters after."""
    out = []
    for cls in (trl.DPOTrainer, ptrl.PackedDPOTrainer):
        tr = cls(model=llama(tok, 0), ref_model=llama(tok, 1),
                 args=dpo_args(tmp_path, optim="sgd", learning_rate=0.5),
                 train_dataset=datasets.Dataset.from_list(PAIRS), processing_class=tok)
        tr.train()
        out.append((tr.state.log_history[0]["loss"],
                    torch.cat([p.detach().ravel() for p in tr.model.parameters()])))
    assert abs(out[0][0] - out[1][0]) < 1e-5
    assert (out[0][1] - out[1][1]).abs().max().item() < 1e-6
    assert (out[0][1] - torch.cat([p.detach().ravel() for p in llama(tok, 0).parameters()])
            ).abs().max().item() > 1e-4  # the step moved the weights


def test_packed_grpo_logps_equal_trl(tok, tmp_path):
    """GRPOTrainer's scoring forward on its own layout (left-padded prompts, right-padded
    completions), packed one tree a prompt: log-probs and entropies as TRL's; a step trains."""
    left = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER), eos_token="<|eos|>", pad_token="<|eos|>",
        bos_token="<|bos|>", padding_side="left")
    ds = datasets.Dataset.from_list([{"prompt": p} for p in ["The quick brown fox",
                                                            "A tiny model learns to"] * 2])
    args = trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                          bf16=False, per_device_train_batch_size=4, num_generations=2,
                          max_completion_length=6, max_steps=1, save_strategy="no")

    def reward(completions, **kw):
        return [float(len(c)) for c in completions]

    base, packed = (cls(model=llama(left, 0), reward_funcs=reward, args=args,
                        train_dataset=ds, processing_class=left)
                    for cls in (trl.GRPOTrainer, ptrl.PackedGRPOTrainer))
    prompts = ["The quick brown fox"] * 2 + ["A tiny model learns to"] * 2
    p = left(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    c = left([" jumps over", " sleeps", " stop now please", " x"], return_tensors="pt",
             padding=True, padding_side="right", add_special_tokens=False)
    ids = torch.cat([p.input_ids, c.input_ids], 1)
    att = torch.cat([p.attention_mask, c.attention_mask], 1)
    k = c.input_ids.shape[1]
    want = base._get_per_token_logps_and_entropies(base.model, ids, att, k,
                                                   compute_entropy=True)
    got = packed._get_per_token_logps_and_entropies(packed.model, ids, att, k,
                                                    compute_entropy=True)
    m = c.attention_mask.bool()
    assert (got[0] - want[0])[m].abs().max().item() < 1e-5
    assert (got[1] - want[1])[m].abs().max().item() < 1e-5
    comp = torch.zeros_like(att)
    comp[:, p.input_ids.shape[1]:] = c.attention_mask
    row, _ = ptrl.pack_rows(ids, att, comp, groups="runs")
    assert row["input_ids"].shape[1] == int(att.sum()) - int(p.attention_mask[1::2].sum())
    packed.train()
    assert np.isfinite(packed.state.log_history[-1]["train_loss"])
