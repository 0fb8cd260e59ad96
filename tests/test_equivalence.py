"""A real model sees exactly what it would see unpacked (Llama: rotary; GPT-2: absolute).

Tiny randomly initialised models from configs (no downloads), float32 on CPU. For packs that
packtool produced from a fixture corpus: per-token logits of each pack run as one [1, T] row
(packtool's position_ids, attention_mask=None, use_cache=False) equal those of each document
alone, and packtool's labels give the same summed loss. Negative control: positions 0..T-1
without restarts must differ. The same through packtool.collate_numpy with several packs per row.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import TOKENIZER, slow, write_jsonl  # noqa: E402

from packtool.formats.packed import open_packed  # noqa: E402
from packtool.pack import pack_corpus  # noqa: E402
from packtool.tokenize import TokenizeOptions, tokenize_files  # noqa: E402

TOL = 1e-4


def tiny_model(kind: str, attn: str, vocab: int):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=1024)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4,
                                      n_positions=1024, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg)
    model.set_attn_implementation(attn)
    return model.eval()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    from synth import make_documents

    d = tmp_path_factory.mktemp("eq")
    docs = make_documents(40, seed=21, median_words=25, max_words=200)
    write_jsonl(d / "a.jsonl", [{"text": t} for t in docs])
    tokenize_files([str(d / "a.jsonl")], TOKENIZER, d / "c", TokenizeOptions(eos="<|eos|>"))
    return d


@pytest.fixture(scope="module", params=["index"])
def packed(request, corpus_dir):
    """The corpus packed in a layout (index by default; tests name "tokens" too): the reader
    derives every per-token array from the segments either way."""
    import packtool

    d, layout = corpus_dir, request.param
    if not (d / f"p-{layout}").exists():
        pack_corpus([d / "c"], d / f"p-{layout}", 256, "bfd", layout=layout)
    ds = open_packed(d / f"p-{layout}")
    assert ds.layout == layout
    return ds, packtool.open_tokens(d / "c")


def per_token_loss(logits, labels):
    """Summed next-token cross-entropy over labels != -100 (the HF shift convention)."""
    logits, labels = logits[:-1], labels[1:]
    keep = labels != -100
    loss = torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum")
    return loss, int(keep.sum())


def alone(model, corpus, ex):
    """Logits and summed loss of each segment of a pack run on its own."""
    outs, loss, n = [], 0.0, 0
    cu = ex["cu_seqlens"]
    for k, (d, o) in enumerate(zip(ex["source_docs"], ex["source_offsets"], strict=True)):
        segment = np.asarray(corpus[d][o:o + cu[k + 1] - cu[k]], dtype=np.int64)
        ids = torch.from_numpy(segment)[None]
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0]
        outs.append(logits)
        seg_loss, c = per_token_loss(logits, ids[0])
        loss, n = loss + seg_loss, n + c
    return torch.cat(outs), loss, n


@pytest.mark.parametrize("packed,attn", [("index", "eager"), ("index", "sdpa"),
                                         ("tokens", "sdpa")], indirect=["packed"])
@pytest.mark.parametrize("kind", ["llama", *slow("gpt2")])
def test_packed_rows_equal_documents_alone(packed, kind, attn):
    ds, corpus = packed
    model = tiny_model(kind, attn, vocab=2048)
    multi = [i for i in range(len(ds)) if len(ds[i]["source_docs"]) >= 3][:4]
    assert multi, "need packs with several documents"
    worst = 0.0
    for i in multi:
        ex = ds[i]
        ids = torch.from_numpy(ex["input_ids"])[None]
        pos = torch.from_numpy(ex["position_ids"])[None]
        with torch.no_grad():
            out = model(input_ids=ids, position_ids=pos, use_cache=False,
                        labels=torch.from_numpy(ex["labels"])[None])
            naive = model(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None],
                          use_cache=False).logits[0]
        ref, ref_loss, ref_n = alone(model, corpus, ex)
        diff = (out.logits[0] - ref).abs().max().item()
        worst = max(worst, diff)
        assert diff <= TOL, f"pack {i}: max |logit diff| {diff:.2e}"
        # labels: HF's mean loss times the number of trained tokens = the documents' summed loss
        n_trained = int((torch.from_numpy(ex["labels"])[1:] != -100).sum())
        assert n_trained == ref_n
        assert out.loss.item() * n_trained == pytest.approx(ref_loss.item(), rel=1e-5)
        # negative control: without restarts the model sees across documents
        assert (naive - ref).abs().max().item() > 1e-2
    print(f"\n{kind}/{attn}: max |logit diff| packed vs alone = {worst:.2e}")


@pytest.mark.parametrize("packed", ["index", "tokens"], indirect=True)
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_collate_flattened_row(packed, kind):
    from packtool.torch import TorchPackedDataset, collate_tensors, model_inputs

    ds, corpus = packed
    tds = TorchPackedDataset(ds.directory)
    model = tiny_model(kind, "sdpa", vocab=2048)
    batch = collate_tensors([tds[0], tds[1], tds[2]])
    assert batch["input_ids"].shape[0] == 1 and batch["cu_seq_lens_q"].dtype == torch.int32
    with torch.no_grad():
        out = model(**model_inputs(batch), use_cache=False)
    refs, ref_loss, ref_n = [], 0.0, 0
    for i in range(3):
        r, doc_loss, n = alone(model, corpus, ds[i])
        refs.append(r)
        ref_loss, ref_n = ref_loss + doc_loss, ref_n + n
    assert (out.logits[0] - torch.cat(refs)).abs().max().item() <= TOL
    n_trained = int((batch["labels"][0, 1:] != -100).sum())
    assert n_trained == ref_n
    assert out.loss.item() * n_trained == pytest.approx(ref_loss.item(), rel=1e-5)


def test_padded_items_and_dataloader(packed):
    from packtool.torch import TorchPackedDataset, collate_tensors

    ds, _ = packed
    tds = TorchPackedDataset(ds.directory, pad_to=256, pad_id=0)
    item = tds[0]
    assert item["input_ids"].shape == (256,) and item["labels"].dtype == torch.int64
    loader = torch.utils.data.DataLoader(TorchPackedDataset(ds.directory), batch_size=3,
                                         collate_fn=collate_tensors)
    batch = next(iter(loader))
    assert batch["input_ids"].shape[1] == int(batch["cu_seq_lens_q"][-1])


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_aligned_rows_equal_documents_alone(corpus_dir, kind):
    """pack --align 16: each segment's pads after its tokens (positions running on, labels
    -100) leave the real tokens' logits and the loss those of the documents alone, through
    collate_tensors and model_inputs (which gives the model the padded boundaries)."""
    import packtool
    from packtool.torch import collate_tensors, model_inputs

    d = corpus_dir
    if not (d / "p-aligned").exists():
        pack_corpus([d / "c"], d / "p-aligned", 256, "bfd", align=16)
    ds, corpus = open_packed(d / "p-aligned"), packtool.open_tokens(d / "c")
    model = tiny_model(kind, "sdpa", vocab=2048)
    exs = [ds[i] for i in range(3)]
    batch = collate_tensors(exs)
    with torch.no_grad():
        out = model(**model_inputs(batch), use_cache=False)
    cu, cup = batch["cu_seq_lens_q"].tolist(), batch["cu_seqlens_padded"].tolist()
    real = torch.cat([torch.arange(a, a + cu[j + 1] - cu[j]) for j, a in enumerate(cup[:-1])])
    assert cup[-1] > cu[-1], "the rows hold pads"
    refs, ref_loss, ref_n = [], 0.0, 0
    for ex in exs:
        r, doc_loss, n = alone(model, corpus, ex)
        refs.append(r)
        ref_loss, ref_n = ref_loss + doc_loss, ref_n + n
    assert (out.logits[0][real] - torch.cat(refs)).abs().max().item() <= TOL
    n_trained = int((batch["labels"][0, 1:] != -100).sum())
    assert n_trained == ref_n
    assert out.loss.item() * n_trained == pytest.approx(ref_loss.item(), rel=1e-5)
