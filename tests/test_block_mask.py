"""Issue 31.4: packtool.torch.block_mask, FlexAttention's document-causal mask of a collated
batch, equals each document's causal attention alone (on CPU, flex_attention's eager path)."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

from packtool.errors import PacktoolError  # noqa: E402
from packtool.formats.packed.layout import derive  # noqa: E402
from packtool.torch import block_mask, collate_tensors  # noqa: E402


def pack(lengths, seed=0):
    ids = np.random.default_rng(seed).integers(0, 1000, int(sum(lengths))).astype(np.uint32)
    return derive(np.asarray(lengths, np.int64), ids)


def attend(batch, real_segments, heads=2, dim=16, seed=0):
    """max |flex_attention with block_mask(batch) - each document alone through SDPA with
    is_causal| over the real tokens; ``real_segments``: (start, length) of each document."""
    n = batch["input_ids"].shape[-1]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, dim, generator=g) for _ in range(3))
    with warnings.catch_warnings():  # eager flex_attention warns that it is unfused
        warnings.simplefilter("ignore", UserWarning)
        out = flex.flex_attention(q, k, v, block_mask=block_mask(batch))
    worst = 0.0
    for s, length in real_segments:
        sl = slice(s, s + length)
        alone = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], is_causal=True)
        worst = max(worst, (out[:, :, sl] - alone).abs().max().item())
    return worst


def test_block_mask_gives_each_document_its_own_causal_attention():
    lengths = [37, 5, 0, 130, 1, 60]
    batch = collate_tensors([pack(lengths[:3]), pack(lengths[3:], seed=1)])
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]
    assert attend(batch, [(int(s), n) for s, n in zip(starts, lengths, strict=True) if n]) \
        <= 1e-4


def test_block_mask_of_aligned_rows_keeps_pads_in_their_segment():
    """Aligned rows: every segment's pads after its tokens, inside its padded boundaries; the
    documents' real tokens still attend exactly as alone."""
    lengths = [13, 40, 7]
    batch = collate_tensors([pack(lengths)], pad_multiple=16, per_segment=True)
    padded = batch["cu_seq_lens_q"]
    assert padded.tolist() == [0, 16, 64, 80]
    assert attend(batch, [(int(s), n) for s, n in zip(padded[:-1], lengths, strict=True)]) <= 1e-4
    # the same row as pack --align writes it: real cu_seq_lens_q, and the padded boundaries
    aligned = dict(batch, cu_seq_lens_q=torch.tensor([0, 13, 53, 60], dtype=torch.int32),
                   cu_seq_lens_q_padded=padded)
    assert block_mask(aligned) is block_mask(batch)


def test_a_leaking_mask_would_be_seen():
    """The comparison can fail: one segment over two documents differs from them alone."""
    batch = collate_tensors([pack([20, 30])])
    merged = dict(batch, cu_seq_lens_q=torch.tensor([0, 50], dtype=torch.int32))
    assert attend(merged, [(0, 20), (20, 30)]) > 1e-2


def test_block_mask_is_cached_by_the_boundaries():
    a = collate_tensors([pack([10, 20])])
    same = collate_tensors([pack([10, 20], seed=5)])  # other tokens, the same boundaries
    assert block_mask(a) is block_mask(same)
    other = collate_tensors([pack([20, 10])])
    assert block_mask(other) is not block_mask(a)
    assert block_mask(a, block_size=64) is not block_mask(a)


@pytest.mark.parametrize("change, needle", [
    (lambda b: b.pop("cu_seq_lens_q"), "takes a collated batch"),
    (lambda b: b.update(cu_seq_lens_q=torch.tensor([0, 10], dtype=torch.int32)),
     "does not run from 0 up to the row's 30 tokens"),
    (lambda b: b.update(input_ids=torch.zeros(2, 15, dtype=torch.int64)), "one \\[1, N\\] row"),
])
def test_bad_batches_are_refused(change, needle):
    b = collate_tensors([pack([10, 20])])
    change(b)
    with pytest.raises(PacktoolError, match=needle):
        block_mask(b)


@pytest.mark.slow
def test_a_transformers_model_takes_the_mask_as_its_attention_mask():
    """transformers' flex_attention implementation takes a BlockMask for ``attention_mask``:
    a packed row then gives each document's logits (what docs/training/single-gpu.md shows)."""
    transformers = pytest.importorskip("transformers")
    # torch 2.13's CPU flex_attention, recompiled with dynamic shapes after other tests'
    # compiles (test_conformance's), emits C++ that does not build ('cur_qSplitSize8' not
    # declared): this test starts from a clean compile state, whatever ran before it
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)).eval()
    model.set_attn_implementation("flex_attention")
    lengths = [30, 50, 20]
    batch = collate_tensors([pack(lengths)])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       attention_mask=block_mask(batch), use_cache=False).logits
        s = 0
        for n in lengths:
            alone = model(input_ids=batch["input_ids"][:, s:s + n], use_cache=False).logits
            assert (packed[:, s:s + n] - alone).abs().max().item() <= 1e-4
            s += n
