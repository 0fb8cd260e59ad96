"""``attn_implementation="packtool"`` (packtool.train.attention) and ``prepare_model``: tiny
random models of each kind (no download, CPU, float32) give packed logits equal to the
documents alone through the registered implementation, with the boundaries in every attention
call; a model that leaks is refused with its difference; the kernels agree with the reference
and are chosen by what a layer needs; their arguments are built as each library wants them
(checked with fakes: the GPU kernels themselves do not run here); and a compiled model sees
one shape."""

import sys
import types

import numpy as np
import pytest
from conftest import slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import packtool.torch as pt  # noqa: E402
from packtool.errors import PacktoolError  # noqa: E402
from packtool.train import attention as at  # noqa: E402
from packtool.train import conformance as cf  # noqa: E402

EXACT = 1e-5


def tiny(arch: str):
    return cf.build_model(cf.tiny_config({"model_type": arch, **cf.ARCHS.get(arch, {})}))


def row(vocab: int, lengths=(23, 9, 31, 5)):
    docs, batch = cf.documents(vocab, lengths)
    inputs = pt.model_inputs(batch)
    inputs.pop("labels")
    return docs, inputs


@pytest.mark.parametrize("arch", ["llama", *slow("mistral", "gemma2", "mixtral", "qwen2_moe")])
def test_prepare_model_is_exact_with_the_boundaries_in_every_call(arch):
    """Llama; Mistral (a 16-token window, shorter than two documents); Gemma 2 (soft-cap,
    alternating sliding and full layers); mixtures of experts."""
    model = pt.prepare_model(tiny(arch))
    assert model.config._attn_implementation == "packtool"
    docs, inputs = row(model.config.vocab_size, (37, 12, 53, 5, 29))
    want = cf.alone(model, docs)
    model.set_attn_implementation("packtool")
    at.CALLS.clear()
    with torch.no_grad():
        got = model(**inputs, use_cache=False).logits[0]
    assert len(at.CALLS) == model.config.num_hidden_layers  # every layer, with cu_seq_lens_q
    assert (got - want).abs().max().item() < EXACT


def test_a_model_that_leaks_is_refused_with_its_difference():
    """A leak outside attention: each token's embedding gets the running sum of those before
    it (a stand-in for a recurrent layer), so every attention call has its boundaries and the
    row still mixes its documents."""
    model = tiny("llama")
    model.model.embed_tokens.register_forward_hook(lambda m, i, out: out + 0.5 * out.cumsum(1))
    with pytest.raises(PacktoolError, match=r"max \|logit diff\| \d\.\d+e[+-]\d+ > 1\.0e-04.*"
                                            r"outside attention.*unpacked") as e:
        pt.prepare_model(model)
    diff = float(str(e.value).split("max |logit diff| ")[1].split()[0])
    assert diff > 1e-2


def test_a_layer_without_boundaries_is_refused_not_whole_row():
    q = torch.randn(1, 4, 10, 8)
    with pytest.raises(PacktoolError, match="without cu_seq_lens_q.*model_inputs"):
        at.packtool_attention(torch.nn.Linear(1, 1), q, q, q, None)
    with pytest.raises(PacktoolError, match="attention_mask.*mask='4d'"):
        at.packtool_attention(torch.nn.Linear(1, 1), q, q, q, torch.ones(1, 1, 10, 10),
                              cu_seq_lens_q=torch.tensor([0, 10], dtype=torch.int32))


def test_transformers_builds_no_mask_for_it():
    """Packed position ids would have transformers build a dense [N, N] mask (its sdpa path:
    +8 GB at 16k tokens); for "packtool" it builds none."""
    import inspect

    from transformers.masking_utils import create_causal_mask

    model = tiny("llama")
    at.register()
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    given = {"config": model.config, "inputs_embeds": torch.zeros(1, 7, 64),
             "input_embeds": torch.zeros(1, 7, 64), "attention_mask": None, "cache": None,
             "past_key_values": None, "cache_position": torch.arange(7), "position_ids": pos}
    kw = {k: v for k, v in given.items() if k in inspect.signature(create_causal_mask).parameters}
    model.set_attn_implementation("sdpa")
    assert create_causal_mask(**kw) is not None  # the packed rows' mask, for sdpa
    model.set_attn_implementation("packtool")
    assert create_causal_mask(**kw) is None


def naive(q, k, v, cu, window=None, softcap=None, sinks=None):
    """Segment by segment, the obvious loop (q [T, H, D], k/v [T, Hkv, D])."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = torch.zeros_like(q)
    for a, z in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        for i in range(a, z):
            lo = a if window is None else max(a, i - window + 1)
            s = torch.einsum("hd,khd->hk", q[i], k[lo:i + 1]) / q.shape[-1] ** 0.5
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            e = torch.exp(s - s.max(-1, keepdim=True).values)
            z_ = e.sum(-1, keepdim=True)
            if sinks is not None:
                z_ = z_ + torch.exp(sinks[:, None] - s.max(-1, keepdim=True).values)
            out[i] = torch.einsum("hk,khd->hd", e / z_, v[lo:i + 1])
    return out


FEATURES = [{}, {"window": 4}, {"softcap": 2.0}, {"sinks": True}]


@pytest.mark.parametrize("kernel", ["reference", *slow("flex")])
@pytest.mark.parametrize("feature", FEATURES, ids=lambda f: next(iter(f), "plain"))
def test_kernels_equal_the_obvious_loop(kernel, feature):
    """GQA (4 query heads on 2 key heads), empty segments (--max-docs), and each feature."""
    if kernel == "flex" and not at._flex_installed():
        pytest.skip("FlexAttention needs torch >= 2.5")
    torch.manual_seed(0)
    q = torch.randn(20, 4, 8)
    k, v = torch.randn(20, 2, 8), torch.randn(20, 2, 8)
    cu = torch.tensor([0, 7, 7, 16, 20, 20], dtype=torch.int32)
    sinks = torch.randn(4) if feature.get("sinks") else None
    opts = {"window": feature.get("window"), "softcap": feature.get("softcap"), "sinks": sinks}
    got = at.KERNELS[kernel].run(q, k, v, cu, cu, 9, 9, scale=8 ** -0.5, **opts)
    assert (got - naive(q, k, v, cu, **opts)).abs().max() < 1e-5


@pytest.fixture
def kernels(monkeypatch):
    """Every kernel installed on cuda; torch's varlen_attn with the signature asked for."""
    def install(flash=True, varlen_params=("window_size", "enable_gqa", "scale")):
        monkeypatch.setattr(at, "_chosen", {})  # the choice is once per process
        ks = dict(at.KERNELS)
        ks["flash_attn"] = ks["flash_attn"]._replace(installed=lambda: flash)
        ks["flex"] = ks["flex"]._replace(installed=lambda: True)
        monkeypatch.setattr(at, "KERNELS", ks)
        monkeypatch.setattr(at, "_varlen_params", lambda: varlen_params)
    return install


def test_the_kernel_is_chosen_by_what_a_layer_needs(kernels):
    kernels(flash=True)
    assert at.kernel_for("cuda") == "flash_attn"
    assert at.kernel_for("cuda", ("window", "softcap", "dropout")) == "flash_attn"
    assert at.kernel_for("cuda", ("sinks",)) == "flex"
    assert at.kernel_for("cpu", ("window", "sinks")) == "reference"
    kernels(flash=False)
    assert at.kernel_for("cuda", ("window",)) == "torch_varlen"
    assert at.kernel_for("cuda", ("softcap",)) == "flex"
    with pytest.raises(PacktoolError, match="needs dropout, which torch_varlen.*lacks.*"
                                            "attention_dropout to 0"):
        at.kernel_for("cuda", ("dropout",))
    kernels(flash=False, varlen_params=("is_causal",))  # torch 2.9-2.10
    assert at.kernel_for("cuda", ("window",)) == "flex"
    assert at.kernel_for("cuda") == "torch_varlen"
    with pytest.raises(PacktoolError, match="no kernel for 'mps'"):
        at.kernel_for("mps")


def test_flash_attn_gets_its_arguments(monkeypatch):
    """``flash_attn_varlen_func``: keys with their own (fewer) heads, causal, the window as
    (w - 1, 0), soft-cap and dropout by its names, the boundaries and ints as given."""
    seen = {}

    def fake(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        seen.update(kw, heads=(q.shape[1], k.shape[1]), cu=cu_q, maxes=(max_q, max_k))
        return at.reference(q, k, v, cu_q, cu_k, scale=kw["softmax_scale"])

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(
        flash_attn_varlen_func=fake))
    q, k = torch.randn(12, 4, 8), torch.randn(12, 2, 8)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    at._flash_attn(q, k, k, cu, cu, 7, 7, scale=0.3, window=4, softcap=30.0, dropout=0.1)
    assert seen["heads"] == (4, 2) and seen["cu"] is cu and seen["maxes"] == (7, 7)
    assert (seen["causal"], seen["window_size"], seen["softcap"], seen["dropout_p"],
            seen["softmax_scale"]) == (True, (3, 0), 30.0, 0.1, 0.3)
    at._flash_attn(q, k, k, cu, cu, 7, 7, scale=0.3)
    assert (seen["window_size"], seen["softcap"], seen["dropout_p"]) == ((-1, -1), 0.0, 0.0)


@pytest.mark.parametrize("version", ["2.11", "2.9"])
def test_torch_varlen_gets_the_arguments_of_its_signature(monkeypatch, version):
    """torch >= 2.11: window_size=(w - 1, 0) or (-1, 0), enable_gqa; 2.9-2.10: is_causal and
    keys repeated to the query heads (no enable_gqa there)."""
    seen = {}
    if version == "2.11":
        def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None,
                 window_size=(-1, -1), enable_gqa=False):
            seen.update(window_size=window_size, enable_gqa=enable_gqa, heads=k.shape[1],
                        scale=scale)
            return q
    else:
        def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal=False, return_aux=None):
            seen.update(is_causal=is_causal, heads=k.shape[1])
            return q
    mod = types.ModuleType("torch.nn.attention.varlen")
    mod.varlen_attn = fake
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", mod)
    q, k = torch.randn(12, 4, 8), torch.randn(12, 2, 8)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    if version == "2.11":
        assert set(at._varlen_features()) == {"window", "scale"}
        at._torch_varlen(q, k, k, cu, cu, 7, 7, scale=0.3, window=4)
        assert seen == {"window_size": (3, 0), "enable_gqa": True, "heads": 2, "scale": 0.3}
        at._torch_varlen(q, q, q, cu, cu, 7, 7, scale=0.3)
        assert seen["window_size"] == (-1, 0) and seen["enable_gqa"] is False
    else:
        assert at._varlen_features() == ()
        at._torch_varlen(q, k, k, cu, cu, 7, 7, scale=None)
        assert seen == {"is_causal": True, "heads": 4}


@pytest.mark.slow
def test_no_host_sync_in_the_attention_function():
    """The whole function traces into one graph (an ``.item()``, a ``.tolist()`` or a shape
    read from data would break it), with the boundaries as int32 tensors."""
    fn = torch.compile(at.packtool_attention, backend="eager", fullgraph=True)
    q, k = torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8)
    cu = torch.tensor([0, 5, 16, 16], dtype=torch.int32)
    got, _ = fn(torch.nn.Linear(1, 1), q, k, k, None, sliding_window=4, cu_seq_lens_q=cu,
                cu_seq_lens_k=cu, max_length_q=16, max_length_k=16)
    want = naive(q[0].transpose(0, 1), k[0].transpose(0, 1), k[0].transpose(0, 1), cu, window=4)
    assert (got[0] - want).abs().max() < 1e-5


@pytest.mark.slow
def test_a_compiled_model_compiles_once(tmp_path):
    """``TorchPackedDataset(pad_to=L)``, ``pack --max-docs K``, ``collate_tensors(max_docs=K +
    1)`` (the pad is a segment): every batch has one shape and one max_length, so a compiled
    model (training steps, forward and backward) is compiled for the first and never again."""
    import functools

    import torch._dynamo
    from synth import write_token_corpus

    from packtool.pack import pack_corpus

    rng = np.random.default_rng(0)
    write_token_corpus(tmp_path / "c", rng.integers(3, 40, 60), vocab_size=128)
    pack_corpus([tmp_path / "c"], tmp_path / "p", 64, max_docs=4)
    ds = pt.TorchPackedDataset(tmp_path / "p", pad_to=64)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=2, collate_fn=functools.partial(pt.collate_tensors, max_docs=5))
    model = pt.prepare_model(cf.build_model(cf.tiny_config({"model_type": "llama"})))
    model.train()
    compiled = torch.compile(model, backend="eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    shapes = set()
    for step, batch in zip(range(4), loader, strict=False):
        inputs = pt.model_inputs(batch)
        shapes.add((tuple(inputs["input_ids"].shape), tuple(inputs["cu_seq_lens_q"].shape),
                    inputs["max_length_q"]))
        compiled(**inputs, use_cache=False).loss.backward()
        if step == 0:
            first = dict(torch._dynamo.utils.counters["stats"])
    assert len(shapes) == 1 and first["unique_graphs"] >= 1
    # a recompile is a new graph (a batch of another length makes one: checked by hand)
    assert dict(torch._dynamo.utils.counters["stats"])["unique_graphs"] == first["unique_graphs"]


@pytest.mark.slow
def test_the_benchmark_runs_on_cpu(capsys, monkeypatch):
    """``scripts/bench_gpu_train.py --device cpu --tiny`` prints the comparison, the packed
    rows exact through packtool's attention with the boundaries in every call."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_gpu_train.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--device", "cpu", "--tiny"])
    runpy.run_path(str(script), run_name="__main__")
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
            for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and "---" not in r}
    assert {"padded-random", "padded-sorted", "packed-reference", "packed-sdpa"} <= set(rows)
    assert rows["packed-reference"][4] == "2 of 2" and float(rows["packed-reference"][3]) < 1e-4
    assert rows["packed-reference"][1] == "0%" and rows["padded-random"][1] != "0%"
    assert all(float(r[0].replace(",", "")) > 0 for k, r in rows.items() if k != "configuration")
