"""Does *this* model see a packed row as its documents alone? A check to run before training.

Packing is exact only if every layer keeps each document to itself. Users have lost 10-20
benchmark points to layers that ignored ``cu_seqlens`` (Megatron-Bridge #2952) and hybrid
models leak recurrent state across packed samples (Qwen3.5's GatedDeltaNet: 0.40 layer-output
difference, NVIDIA-NeMo/Automodel #2147). This builds a tiny random model of each architecture
from its config class (no download: 2 layers, hidden 64, 4 heads, vocabulary 128, float32,
eval mode, dropout 0, seed 0), packs five documents of 37, 12, 53, 5 and 29 tokens into one
``[1, 136]`` row, and compares the row's logits with each document run alone (eager attention,
no position ids), through every input path the model may take:

    path            what the packed row carries                       attention
    position_ids    position ids restarting per document, no mask    sdpa
    varlen          ``model_inputs(batch)``: position ids + cu_seq_lens_q/k, max_length_q/k
                                                                      packtool's varlen reference
    flex_attention  position ids + a document-causal BlockMask       flex_attention
    seq_idx         ``model_inputs(batch)`` + seq_idx (models with   eager
                    state-space / linear-attention layers)
    none            nothing: the control, must leak                   eager

``varlen`` runs :func:`packtool.train.attention.varlen_attention`, which sees the whole row as
one sequence in a layer whose call carries no ``cu_seq_lens_q``: the path is exact only if the
*model* threads the kwargs down to every attention layer, as flash-attn needs (the note counts
the calls that got them). Mistral's and Gemma 2's sliding window is 16 tokens here, shorter
than three of the documents, so it matters.

A path is ``exact`` at max |logit difference| <= 1e-4 (float32 noise is ~1e-6, the ``none``
control's leak 3-5), ``leaks`` above, ``unsupported`` (with a ``note``) when the model or path
cannot run here. An architecture passes when one path is exact and the control leaks.

Vision-language models (:data:`VISION_ARCHS`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL) get a tiny
vision encoder too (2 blocks, the real patch size, Qwen2.5-VL's window attention, Qwen3-VL's
deepstack) and four documents of 1, 3, 2 and 1 generated images (24-112 pixels a side, 2-16
image tokens each, seed 0) between text. Each document alone is the model's own forward
(``get_rope_index`` computes its mRoPE ids); the packed row is :class:`packtool.train.
vision.ImageCollator`'s batch of the four (pixels through the model's own image processor
class, built here), its position ids restarting per document: packtool's own
(:func:`packtool.vision.mrope_positions`, what tokenize stores), checked equal to the
model's ``get_rope_index`` of each document alone (the row ``mrope_ids``, which must be exact
for the architecture to pass). The paths:

    position_ids     [4, 1, N]: text positions, then mRoPE t, h, w; no mask   sdpa
    varlen           the mRoPE rows + cu_seq_lens_q/k (model_inputs)           packtool varlen
    mask_4d          [4, 1, N] ids + a document-causal [1, 1, N, N] mask       eager
    position_ids_3d  the three mRoPE rows alone, no mask: leaks (transformers splits the
                     row on the text row; NeMo Automodel #2172's fallback)     sdpa
    flex_attention, none   as above (none: the model's get_rope_index over the whole row)

Exact there is max |logit difference| <= 1e-5 (:data:`VISION_TOL`), the issue's bar.

On CPU, state-space and linear-attention layers run transformers' torch fallbacks: some refuse
packed input (``unsupported``, transformers' reason in the note), others leak silently (the
Mamba2 scan of GraniteMoeHybrid). With the mamba_ssm / causal_conv1d / fla kernels on a GPU
these models may be exact; this check says nothing about those kernels. The table for the
default architectures is in docs/TRAINING.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PacktoolError
from .attention import CALLS, VARLEN, document_block_mask, register

TOL = 1e-4
WINDOW = 16  # sliding window in tokens: shorter than three of the documents, so it matters
DOC_LENGTHS = (37, 12, 53, 5, 29)
PATHS = ("position_ids", "varlen", "flex_attention", "seq_idx", "none")
CONTROL = "none"
IDS = "mrope_ids"  # not a path: packtool's stored 3-D ids checked against the model's own
INSTALL = "pip install 'packtool[torch]' transformers"

VISION_TOL = 1e-5
VISION_PATHS = ("position_ids", "varlen", "mask_4d", "position_ids_3d", "flex_attention",
                "none")
IMAGES_PER_DOC = (1, 3, 2, 1)
# token ids inside the tiny vocabulary for <|image_pad|>, <|video_pad|>, vision start and end
VISION_IDS = {"image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122,
              "vision_end_token_id": 123}
# vision-language models: the patch size, the mRoPE sections (t, h, w: 8 frequencies of the
# tiny head dim 16) and what the tiny vision encoder needs beyond VISION_TINY
VISION_ARCHS = {
    "qwen2_vl": (14, [2, 3, 3], {"embed_dim": 32, "hidden_size": 64}),
    "qwen2_5_vl": (14, [2, 3, 3], {"fullatt_block_indexes": [1], "window_size": 56}),
    "qwen3_vl": (16, [4, 2, 2], {"deepstack_visual_indexes": [0],
                                 "num_position_embeddings": 64}),
}
VISION_TINY = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
               "out_hidden_size": 64, "initializer_range": 0.1}

# The architectures checked by default, each with what its tiny config needs beyond TINY.
ARCHS = {
    "llama": {}, "gpt2": {}, "mistral": {},  # mistral: a sliding window on every layer
    "qwen2": {"use_sliding_window": True, "max_window_layers": 1},  # one sliding, one full
    "gemma2": {},  # alternating sliding / full layers, attention soft-capping
    "mixtral": {}, "qwen2_moe": {},  # mixtures of experts
    "qwen3_next": {},  # GatedDeltaNet (linear attention) + full attention + MoE
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},  # Mamba2 + attn
}

# Tiny sizes, applied to each key the config has set: small enough to run on a laptop core,
# big enough for GQA (4 heads, 2 KV heads), top-2 of 4 experts, state-space chunks < a document.
TINY = {
    "vocab_size": 128, "hidden_size": 64, "n_embd": 64, "d_model": 64,
    "intermediate_size": 128, "ffn_dim": 128,
    "num_attention_heads": 4, "n_head": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 256, "n_positions": 256,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "shared_intermediate_size": 32, "n_shared_experts": 1,
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_n_groups": 1,
    "mamba_expand": 2, "mamba_chunk_size": 16, "chunk_size": 16, "state_size": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    # random weights at std 0.02 give logits of ~1e-2, where a leak hides under 1e-4: at 0.1
    # the control's leak is 1e-1 or more on every default architecture
    "initializer_range": 0.1,
}
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
DROP = ("quantization_config", "auto_map", "architectures", "dtype", "torch_dtype",
        "_name_or_path", "transformers_version", "use_cache")
# module class names of layers that keep state along the sequence (not attention)
RECURRENT = ("mamba", "mixer", "deltanet", "linearattention", "shortconv", "ssm", "rwkv")


@dataclass
class ConformanceResult:
    """One row per architecture and path: arch, path, max_abs_diff (None when it did not run),
    verdict (exact / leaks / unsupported) and, where there is more to say, note."""

    rows: list[dict] = field(default_factory=list)

    def archs(self) -> list[str]:
        return list(dict.fromkeys(r["arch"] for r in self.rows))

    def failing(self) -> list[str]:
        """Architectures with no exact path (or whose control did not leak: proof of nothing)."""
        def passes(arch):
            rows = [r for r in self.rows if r["arch"] == arch]
            return (any(r["verdict"] == "exact" for r in rows if r["path"] not in (CONTROL, IDS))
                    and any(r["verdict"] == "leaks" for r in rows if r["path"] == CONTROL)
                    and all(r["verdict"] == "exact" for r in rows if r["path"] == IDS))

        return [a for a in self.archs() if not passes(a)]

    @property
    def ok(self) -> bool:
        return not self.failing()

    def to_json(self) -> list[dict]:  # --json: the rows
        return [dict(r) for r in self.rows]

    def summary(self, verdict: bool = True) -> str:
        width = max([len(r["arch"]) for r in self.rows] + [4])
        lines = [f"{'arch':<{width}}  {'path':<14}  {'max |diff|':>10}  verdict"]
        for r in self.rows:
            d = r["max_abs_diff"]
            diff = "-" if d is None else f"{d:.1e}"
            note = f"  ({r['note']})" if r.get("note") else ""
            lines.append(f"{r['arch']:<{width}}  {r['path']:<14}  {diff:>10}  "
                         f"{r['verdict']}{note}")
        if verdict:
            lines.append(self.verdict_line())
        return "\n".join(lines)

    def verdict_line(self) -> str:
        bad = self.failing()
        if not bad:
            vision = " (1e-5 for vision-language models)" if set(self.archs()) & set(
                VISION_ARCHS) else ""
            return (f"OK: every architecture ({', '.join(self.archs())}) has an exact path "
                    f"(max |logit diff| <= {TOL:g}{vision})")
        ran = {r["arch"] for r in self.rows if r["verdict"] != "unsupported"}
        leak, unknown = [a for a in bad if a in ran], [a for a in bad if a not in ran]
        parts = []
        if leak:
            parts.append(f"no exact path for {', '.join(leak)}: packed rows leak across "
                         "documents on every path that ran here; train unpacked, or check the "
                         "kernels that keep documents apart on a GPU")
        if unknown:
            parts.append(f"could not check {', '.join(unknown)} (see the note: unknown model "
                         "type, or no path runs here)")
        return "; ".join(parts)


def conformance(archs=None, config_path=None) -> ConformanceResult:
    """Check each of ``archs`` (model types; default :data:`ARCHS`, or none when
    ``config_path`` is given) and the model of ``config_path`` (a ``config.json``, shrunk to
    tiny sizes keeping its layer types, window, experts and state-space settings)."""
    _need_torch()
    if archs is None:
        archs = [] if config_path is not None else [*ARCHS, *VISION_ARCHS]
    result = ConformanceResult()
    for arch in archs:
        result.rows += (check_vision_arch(arch) if arch in VISION_ARCHS else
                        check_arch(arch, {"model_type": arch, **ARCHS.get(arch, {})}))
    if config_path is not None:
        user = read_config(config_path)
        result.rows += check_arch(f"{user['model_type']} ({Path(config_path).name})", user)
    return result


def parse_archs(text: str) -> list[str]:
    """``"llama, gpt2"`` -> ``["llama", "gpt2"]``; ``"all"`` -> the default architectures."""
    if text.strip() == "all":
        return [*ARCHS, *VISION_ARCHS]
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names:
        raise PacktoolError(f"--arch {text!r} names no architecture; give model types "
                            f"separated by commas, e.g. --arch {','.join(list(ARCHS)[:3])}")
    return list(dict.fromkeys(names))


def read_config(path) -> dict:
    """A model's ``config.json`` as a dict with a ``model_type``; errors name the file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise PacktoolError(f"cannot read --config {p}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PacktoolError(f"--config {p} is not JSON ({e}); pass a model's config.json") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise PacktoolError(f"--config {p} has no \"model_type\": pass a transformers model's "
                            "config.json (it names the architecture there, e.g. \"llama\")")
    return data


def _need_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise PacktoolError(f"conformance builds transformers models ({e.name} is missing): "
                            f"{INSTALL}") from None


def path_row(arch, path, diff=None, verdict=None, note=None, tol=TOL) -> dict:
    if verdict is None:
        verdict = "exact" if diff is not None and diff <= tol else "leaks"
    row = {"arch": arch, "path": path,
           "max_abs_diff": None if diff is None or math.isnan(diff) else float(f"{diff:.3g}"),
           "verdict": verdict}
    if diff is not None and math.isnan(diff):
        note = "NaN in the logits" + (f"; {note}" if note else "")
    if note:
        row["note"] = note
    return row


def _reason(e: BaseException) -> str:
    if e.__cause__ is not None:  # a validation wrapper: the cause says what was wrong
        return _reason(e.__cause__)
    text = str(e).strip().splitlines()
    first = text[0].split(". ")[0].rstrip(".")[:200] if text else ""  # not the "please file"
    return f"{type(e).__name__}: {first}".rstrip(": ")


# -- tiny models ----------------------------------------------------------------------------------

def tiny_config(spec: dict):
    """The config class of ``spec["model_type"]`` built from ``spec`` with tiny sizes: every
    per-layer list (layer types, ...) cut to one layer of each kind (at least two layers),
    every size in :data:`TINY` shrunk, a sliding window of :data:`WINDOW`, dropout 0."""
    from transformers import CONFIG_MAPPING

    spec = {k: v for k, v in spec.items() if k not in DROP}
    if isinstance(spec.get("layer_types"), list) and not any(k in spec for k in LAYER_KEYS):
        spec["num_hidden_layers"] = len(spec["layer_types"])
    cls = CONFIG_MAPPING[spec["model_type"]]  # KeyError: unknown to this transformers
    full = {k: v for k, v in cls(**spec).to_dict().items() if k not in DROP}
    full.update({k: v for k, v in spec.items() if k == "layer_types"})
    return cls(**_shrink(full))


def _shrink(d: dict) -> dict:
    d = dict(d)
    key = next((k for k in LAYER_KEYS if isinstance(d.get(k), int)), None)
    n = d[key] if key else 0
    lists = [k for k, v in d.items() if isinstance(v, list) and len(v) == n and n > 2]
    if key and n > 2:
        # one layer of each kind (the tuple of every per-layer list at that layer), in order
        kinds = [tuple(str(d[k][i]) for k in lists) for i in range(n)]
        keep = sorted({kinds.index(kind) for kind in kinds})
        keep = keep if len(keep) >= 2 else [0, 1]
        for k in lists:
            d[k] = [d[k][i] for i in keep]
        d[key] = len(keep)
    elif key:
        d[key] = max(2, len(d["layer_types"])) if isinstance(d.get("layer_types"), list) else 2
    for k, v in TINY.items():
        if d.get(k) is not None:
            d[k] = v
    if d.get("sliding_window"):
        d["sliding_window"] = WINDOW
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):  # inside the tiny vocabulary
        if isinstance(d.get(k), int) and d[k] >= TINY["vocab_size"]:
            d[k] = TINY["vocab_size"] - 1
    for k, v in d.items():
        if isinstance(v, float) and ("dropout" in k or "pdrop" in k):
            d[k] = 0.0
    return d


def build_model(config, auto: str = "AutoModelForCausalLM"):
    """The random model of ``config`` (seed 0, float32, eager, eval mode), built by
    transformers' ``auto`` class."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(config, dtype=torch.float32,
                                                    attn_implementation="eager")
    return model.eval()


def documents(vocab: int, lengths=DOC_LENGTHS):
    """Random token ids of ``lengths`` (seed 0) and the batch packtool would collate from
    them: one ``[1, N]`` row (collate_tensors')."""
    import numpy as np

    from .torch import collate_tensors

    rng = np.random.default_rng(0)
    docs = [rng.integers(1, vocab, n) for n in lengths]
    packs = [{"input_ids": d, "labels": d, "position_ids": np.arange(len(d)),
              "cu_seqlens": np.array([0, len(d)])} for d in docs]
    return docs, collate_tensors(packs)


# -- the paths ------------------------------------------------------------------------------------

def check_arch(arch: str, spec: dict) -> list[dict]:
    """Every path of one architecture: a row each, never an exception."""
    import transformers

    try:
        config = tiny_config(spec)
    except KeyError:
        return [path_row(arch, "-", verdict="unsupported",
                     note=f"model type {spec['model_type']!r} is unknown to transformers "
                          f"{transformers.__version__} (remote code is not run)")]
    except Exception as e:  # a config class refusing our sizes: say which, go on
        return [path_row(arch, "-", verdict="unsupported", note=f"config: {_reason(e)}")]
    try:
        model = build_model(config)
        docs, batch = documents(config.vocab_size)
        ref = alone(model, docs)
    except Exception as e:
        return [path_row(arch, "-", verdict="unsupported", note=f"model: {_reason(e)}")]
    return _run_paths(arch, PATHS, model, batch, ref, TOL)


def _run_paths(arch, paths, model, batch, ref, tol) -> list[dict]:
    rows = []
    for path in paths:
        try:
            rows.append(RUNNERS[path](arch, model, batch, ref, tol))
        except Exception as e:  # the path is not one this model (or this machine) accepts
            rows.append(path_row(arch, path, verdict="unsupported", note=_reason(e)))
    return rows


def alone(model, docs):
    """Each document alone, eager attention, no position ids: the ground truth."""
    import torch

    model.set_attn_implementation("eager")
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.from_numpy(d)[None].to(model.device),
                                use_cache=False).logits[0] for d in docs])


def logit_diff(model, ref, **inputs) -> float:
    import torch

    with torch.no_grad():
        out = model(**inputs, use_cache=False).logits[0]
    return (out.float() - ref.float()).abs().max().item()


def recurrent_layers(model) -> list[str]:
    """The class names of ``model``'s layers that keep state along the sequence."""
    return sorted({type(m).__name__ for m in model.modules()
                   if any(s in type(m).__name__.lower() for s in RECURRENT)})


def _inputs(batch, **kw) -> dict:
    from .torch import model_inputs

    inputs = model_inputs(batch, **kw)
    inputs.pop("labels")
    return inputs


def _diff(arch, path, model, ref, impl, inputs, tol, note=None):
    model.set_attn_implementation(impl)
    return path_row(arch, path, logit_diff(model, ref, **inputs), note=note, tol=tol)


def _position_ids(arch, model, batch, ref, tol):
    return _diff(arch, "position_ids", model, ref, "sdpa", _inputs(batch, varlen=False), tol)


def _varlen(arch, model, batch, ref, tol):
    register()
    inputs = _inputs(batch)
    if "position_ids_3d" in batch:  # the mRoPE rows: the kwargs alone keep docs apart
        inputs["position_ids"] = inputs["position_ids"][1:]
    model.set_attn_implementation(VARLEN)
    CALLS.clear()
    diff = logit_diff(model, ref, **inputs)
    got, n = sum(CALLS), len(CALLS)
    note = ("no layer called the attention interface" if n == 0 else
            f"{n - got} of {n} attention calls got no cu_seq_lens_q" if got < n else
            "every attention call got cu_seq_lens: the leak is outside attention" if diff > tol
            else None)
    return path_row(arch, "varlen", diff, note=note, tol=tol)


def _flex(arch, model, batch, ref, tol):
    cu, n = batch["cu_seq_lens_q"], batch["input_ids"].shape[1]
    window = getattr(model.config, "sliding_window", None)
    types = getattr(model.config, "layer_types", None)
    if isinstance(types, list):  # a mask per layer kind, as the model's own mapping holds
        mask = {t: (document_block_mask(cu, n, window if "sliding" in t else None)
                    if "attention" in t and "linear" not in t else None) for t in set(types)}
    else:
        mask = document_block_mask(cu, n, window)
    return _diff(arch, "flex_attention", model, ref, "flex_attention",
                 {**_inputs(batch, varlen=False), "attention_mask": mask}, tol)


def _seq_idx(arch, model, batch, ref, tol):
    layers = recurrent_layers(model)
    if not layers:
        return path_row(arch, "seq_idx", verdict="unsupported",
                        note="attention only: no layer reads seq_idx")
    return _diff(arch, "seq_idx", model, ref, "eager",
                 {**_inputs(batch), "seq_idx": batch["seq_idx"]}, tol,
                 note=f"recurrent layers: {', '.join(layers)}")


def _mask_4d(arch, model, batch, ref, tol):
    import torch

    return _diff(arch, "mask_4d", model, ref, "eager",
                 _inputs(batch, mask="4d", dtype=torch.float32), tol)


def _position_ids_3d(arch, model, batch, ref, tol):
    inputs = _inputs(batch, varlen=False)
    inputs["position_ids"] = inputs["position_ids"][1:]
    return _diff(arch, "position_ids_3d", model, ref, "sdpa", inputs, tol,
                 note="the mRoPE rows alone: no text row to split the row on")


def _control(arch, model, batch, ref, tol):
    import torch

    ids = batch["input_ids"]
    if "pixel_values" not in batch:
        return _diff(arch, CONTROL, model, ref, "eager", {"input_ids": ids}, tol,
                     note="control: no boundaries given, must leak")
    inputs = {"input_ids": ids, "pixel_values": batch["pixel_values"],
              "image_grid_thw": batch["image_grid_thw"],
              "mm_token_type_ids": (ids == VISION_IDS["image_token_id"]).to(torch.int32)}
    return _diff(arch, CONTROL, model, ref, "eager", inputs, tol,
                 note="control: the model's positions over the whole row, must leak")


# every path of PATHS and VISION_PATHS: (arch, model, batch, ref, tol) -> its row
RUNNERS = {"position_ids": _position_ids, "varlen": _varlen, "flex_attention": _flex,
           "seq_idx": _seq_idx, "mask_4d": _mask_4d, "position_ids_3d": _position_ids_3d,
           "none": _control}


# -- vision-language models -----------------------------------------------------------------------

def tiny_vision_config(arch: str):
    """The config of ``arch`` (of :data:`VISION_ARCHS`): the text model of :data:`TINY`'s sizes
    (2 layers, hidden 64, mRoPE sections of its head dim) and a 2-block vision encoder."""
    from transformers import CONFIG_MAPPING

    patch, sections, extra = VISION_ARCHS[arch]
    text = {k: TINY[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                 "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "max_position_embeddings", "initializer_range")}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
    if arch == "qwen3_vl":
        rope["mrope_interleaved"] = True
    text.update(num_hidden_layers=2, rope_parameters=rope, bos_token_id=1, eos_token_id=2)
    vision = {**VISION_TINY, "patch_size": patch, **extra}
    return CONFIG_MAPPING[arch](text_config=text, vision_config=vision, **VISION_IDS)


def image_processor(config):
    """The model's image processor class (its PIL backend: no torchvision needed, the same
    resize on every machine) for ``config``'s vision encoder, built here, no download: images
    of 1 to 16 merged patches (min/max pixels), so each holds 1-16 image tokens."""
    from transformers.models.auto.image_processing_auto import (
        IMAGE_PROCESSOR_MAPPING_NAMES,
        get_image_processor_class_from_name,
    )

    names = IMAGE_PROCESSOR_MAPPING_NAMES[config.model_type]
    cls = get_image_processor_class_from_name(names["pil"] if isinstance(names, dict)
                                              else names)
    v = config.vision_config
    side = v.patch_size * v.spatial_merge_size
    return cls(patch_size=v.patch_size, merge_size=v.spatial_merge_size,
               temporal_patch_size=v.temporal_patch_size, min_pixels=side * side,
               max_pixels=side * side * 16)


def vision_documents(config, processor):
    """Documents of 1-3 generated images each (:data:`IMAGES_PER_DOC`, seed 0): per document
    the row the packed reader would give (input_ids, labels, position_ids, cu_seqlens,
    image_grid_thw, image_refs; position_ids_3d is added by :func:`_stored_ids`), the
    inputs of its forward alone, and the PNG bytes of every image by reference."""
    import numpy as np
    import torch
    from PIL import Image

    rng = np.random.default_rng(0)
    ids, v = VISION_IDS, config.vision_config
    docs, blobs = [], {}
    for n_images in IMAGES_PER_DOC:
        tokens, refs, images = [], [], []
        for _ in range(n_images):
            w, h = (int(x) for x in rng.integers(24, 113, 2))
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
            uri = f"mem://image-{len(blobs)}.png"
            blobs[uri] = buf.getvalue()
            refs.append({"uri": uri, "bytes": len(blobs[uri]),
                         "sha256": hashlib.sha256(blobs[uri]).hexdigest()})
            images.append(Image.open(io.BytesIO(blobs[uri])).convert("RGB"))
        out = processor(images=images, return_tensors="pt")
        merge = v.spatial_merge_size ** 2
        for grid in out["image_grid_thw"].tolist():
            tokens += rng.integers(3, 110, int(rng.integers(3, 13))).tolist()
            tokens += [ids["vision_start_token_id"]] + [ids["image_token_id"]] * (
                grid[0] * grid[1] * grid[2] // merge) + [ids["vision_end_token_id"]]
        tokens += rng.integers(3, 110, int(rng.integers(3, 13))).tolist()
        t = np.asarray(tokens, np.int64)
        row = {"input_ids": t, "labels": t, "position_ids": np.arange(len(t)),
               "cu_seqlens": np.array([0, len(t)]),
               "image_grid_thw": out["image_grid_thw"].numpy(), "image_refs": refs}
        alone_inputs = {"input_ids": torch.from_numpy(t)[None],
                        "pixel_values": out["pixel_values"],
                        "image_grid_thw": out["image_grid_thw"],
                        "mm_token_type_ids": torch.from_numpy(
                            (t == ids["image_token_id"]).astype(np.int32))[None]}
        docs.append((row, alone_inputs))
    return docs, blobs


def check_vision_arch(arch: str) -> list[dict]:
    """Every path of one vision-language architecture: a row each, never an exception."""
    import torch

    from .vision import ImageCollator

    try:
        config = tiny_vision_config(arch)
        model = build_model(config, "AutoModelForImageTextToText")
        processor = image_processor(config)
        docs, blobs = vision_documents(config, processor)
        with torch.no_grad():
            ref = torch.cat([model(**inputs, use_cache=False).logits[0] for _, inputs in docs])
            ids_row = _stored_ids(arch, model, docs)
        batch = ImageCollator(processor, read=lambda r: blobs[r["uri"]])(
            [row for row, _ in docs])
    except Exception as e:  # a config or model this transformers cannot build
        return [path_row(arch, "-", verdict="unsupported", note=f"model: {_reason(e)}")]
    return [ids_row, *_run_paths(arch, VISION_PATHS, model, batch, ref, VISION_TOL)]


def _stored_ids(arch: str, model, docs) -> dict:
    """Each document's mRoPE ids as tokenize stores them (:func:`packtool.vision.
    mrope_positions`, into its row) against the model's own ``get_rope_index`` of the
    document alone: the row :data:`IDS`, exact only when equal."""
    import numpy as np

    from ..vision import mrope_positions

    diff = 0
    for row, inputs in docs:
        ids = row["input_ids"]
        pad = np.flatnonzero(ids == VISION_IDS["image_token_id"])
        starts = pad[np.concatenate([[True], np.diff(pad) > 1])] if pad.size else pad
        grids = row["image_grid_thw"]
        spans = np.stack([starts, grids.prod(axis=1) // 4], axis=1)
        row["position_ids_3d"] = mrope_positions(len(ids), spans, grids, merge=2)
        want = model.model.get_rope_index(**{k: inputs[k] for k in (
            "input_ids", "mm_token_type_ids", "image_grid_thw")})[0][:, 0].numpy()
        diff = max(diff, int(np.abs(row["position_ids_3d"] - want).max()))
    return path_row(arch, IDS, diff, tol=0, note="packtool's stored ids against the model's "
                    "get_rope_index, each document alone")
