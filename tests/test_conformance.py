"""``packtool conformance``: tiny random models, packed rows vs each document alone.

The verdicts come from real forwards of real transformers models, so each test checks a
finding that can fail: an exact path for the plain architectures, a leak found where the
model really leaks (the no-boundary control; a Mamba2 hybrid whose CPU fallback ignores
cu_seqlens), and the refusals named, never a traceback."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import ROOT

pytest.importorskip("torch")
pytest.importorskip("transformers")

from packtool.cli import cli
from packtool.errors import PacktoolError
from packtool.train import conformance as cf
from packtool.train.attention import varlen_attention

KEYS = {"arch", "path", "max_abs_diff", "verdict"}


def run_cli(*args):
    """``packtool ARGS`` in a fresh process (stdout as a user's pipe sees it)."""
    return subprocess.run([sys.executable, "-m", "packtool", "conformance", *map(str, args)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def by_path(rows, arch):
    return {r["path"]: r for r in rows if r["arch"] == arch}


@pytest.mark.slow
def test_llama_gpt2_mistral_have_an_exact_path():
    """The issue's bar: each of the three has an exact path, the control leaks, exit 0, and
    stdout is the JSON alone."""
    r = run_cli("--arch", "llama,gpt2,mistral", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)
    assert isinstance(rows, list) and {row["arch"] for row in rows} == {"llama", "gpt2", "mistral"}
    for row in rows:
        assert KEYS <= set(row) <= KEYS | {"note"}, row
        assert row["verdict"] in ("exact", "leaks", "unsupported")
    for arch in ("llama", "gpt2", "mistral"):
        paths = by_path(rows, arch)
        # varlen threads cu_seq_lens to every layer; position ids alone are exact in
        # transformers >= 5 for eager/sdpa too (it derives the mask from the restarts)
        assert paths["varlen"]["verdict"] == "exact", paths["varlen"]
        assert paths["varlen"]["max_abs_diff"] <= cf.TOL
        assert paths["none"]["verdict"] == "leaks" and paths["none"]["max_abs_diff"] > 0.1
        assert paths["seq_idx"]["verdict"] == "unsupported" and paths["seq_idx"]["note"]
    # mistral's window (16) is shorter than three documents: the varlen reference honours it
    assert by_path(rows, "mistral")["flex_attention"]["verdict"] == "exact"


def test_varlen_reference_honours_the_window_and_the_boundaries():
    """The reference varlen attention is what it says: per segment, causal, windowed, and
    without cu_seq_lens_q one causal sequence (the leak the path exists to catch)."""
    import torch

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 20, 8) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA: 2 key/value heads
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)

    def naive(a, z, window=None):
        kk, vv = k.repeat_interleave(2, 1)[:, :, a:z], v.repeat_interleave(2, 1)[:, :, a:z]
        s = q[:, :, a:z] @ kk.transpose(-1, -2) / 8 ** 0.5
        i = torch.arange(z - a)
        bad = (i[None, :] > i[:, None]) | ((i[:, None] - i[None, :] >= window) if window
                                          else torch.zeros(1, dtype=torch.bool))
        return (torch.softmax(s.masked_fill(bad, -torch.inf), -1) @ vv).transpose(1, 2)

    out, _ = varlen_attention(None, q, k, v, None, cu_seq_lens_q=cu, sliding_window=4)
    ref = torch.cat([naive(0, 7, 4), naive(7, 20, 4)], dim=1)
    assert (out - ref).abs().max() < 1e-6
    whole, _ = varlen_attention(None, q, k, v, None)
    assert (whole - naive(0, 20)).abs().max() < 1e-6
    assert (whole[:, 7:] - torch.cat([naive(0, 7), naive(7, 20)], 1)[:, 7:]).abs().max() > 1e-2


@pytest.mark.slow
def test_a_leaking_path_is_found():
    """A Mamba2 hybrid on CPU: transformers' torch fallback of the SSM scan ignores the packed
    boundaries, so every path that runs leaks, the row says which, and the architecture fails."""
    result = cf.conformance(["granitemoehybrid"])
    paths = by_path(result.rows, "granitemoehybrid")
    assert paths["position_ids"]["verdict"] == "leaks"
    assert paths["position_ids"]["max_abs_diff"] > 0.1
    # every attention layer got cu_seq_lens, yet it leaks: the note points outside attention
    assert paths["varlen"]["verdict"] == "leaks" and "outside attention" in paths["varlen"]["note"]
    assert not result.ok and result.failing() == ["granitemoehybrid"]
    assert "no exact path for granitemoehybrid" in result.verdict_line()


def test_unknown_arch_is_named_and_fails():
    r = CliRunner().invoke(cli, ["conformance", "--arch", "no_such_model", "--json"])
    assert r.exit_code == 1
    rows = json.loads(r.stdout)
    assert rows == [{"arch": "no_such_model", "path": "-", "max_abs_diff": None,
                     "verdict": "unsupported", "note": rows[0]["note"]}]
    assert "'no_such_model' is unknown to transformers" in rows[0]["note"]
    assert "could not check no_such_model" in r.stderr
    assert "Traceback" not in r.output


@pytest.mark.slow
def test_user_config_is_shrunk_keeping_its_architecture(tmp_path):
    """A user's Mistral config.json (32 layers, hidden 4096, window 4096) becomes a 2-layer
    model of hidden 64 with the window (16) kept, and checks exact."""
    cfg = {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
           "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096,
           "vocab_size": 32000, "torch_dtype": "bfloat16", "attention_dropout": 0.1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tiny = cf.tiny_config(cf.read_config(tmp_path / "config.json"))
    assert (tiny.num_hidden_layers, tiny.hidden_size, tiny.sliding_window) == (2, 64, cf.WINDOW)
    assert tiny.attention_dropout == 0.0
    r = CliRunner().invoke(cli, ["conformance", "--config", str(tmp_path / "config.json"),
                                 "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert {row["arch"] for row in rows} == {"mistral (config.json)"}
    assert by_path(rows, "mistral (config.json)")["varlen"]["verdict"] == "exact"


def test_layer_kinds_survive_the_shrink():
    """Qwen3-Next's 48 layers (3 linear-attention : 1 full) shrink to one of each kind."""
    tiny = cf.tiny_config({"model_type": "qwen3_next"})
    assert tiny.layer_types == ["linear_attention", "full_attention"]
    assert tiny.num_hidden_layers == 2 and tiny.num_experts == 4


@pytest.mark.parametrize("text,error", [
    ("{not json", "is not JSON"),
    ('{"hidden_size": 64}', 'has no "model_type"'),
])
def test_bad_config_is_named(tmp_path, text, error):
    (tmp_path / "config.json").write_text(text)
    r = CliRunner().invoke(cli, ["conformance", "--config", str(tmp_path / "config.json")])
    assert r.exit_code == 1 and error in r.output and "config.json" in r.output
    with pytest.raises(PacktoolError, match=error):
        cf.read_config(tmp_path / "config.json")


def test_empty_arch_list_is_refused():
    r = CliRunner().invoke(cli, ["conformance", "--arch", " , "])
    assert r.exit_code == 1 and "names no architecture" in r.output
