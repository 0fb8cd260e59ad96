"""Training throughput: packed rows through each attention kernel against padded batches.

    python scripts/bench_gpu_train.py --docs short -L 4096            # on a GPU, the 0.62B Llama
    python scripts/bench_gpu_train.py --corpus out/corpus --config config.json -L 8192
    python scripts/bench_gpu_train.py --device cpu --tiny             # smoke test (slow tier)

The same documents in every configuration, every step the same token slots
(``--packs-per-step`` x ``-L``): packs from ``bfd``, or padded batches of whole documents
(longer ones cut at ``-L``) under the same slot budget. Each configuration trains a fresh copy
of one randomly initialised model (seed 0) over those documents once, after ``--warmup`` steps
that are not timed (bf16 autocast and fused AdamW on a GPU; float32 on CPU):

    padded-random   documents in random order, sdpa + a padding mask
    padded-sorted   sorted by length and cut into batches (group_by_length), batches shuffled
    packed-<kernel> prepare_model(model) + model_inputs(batch), for each kernel of
                    packtool.train.attention installed here (flash_attn, torch_varlen, flex;
                    reference on CPU)
    packed-sdpa     attn_implementation="sdpa" + position ids only (transformers infers the
                    documents from the position restarts and builds a dense [N, N] mask)

It prints real (non-pad) tokens per second, the pad fraction, peak GPU memory and, for each
packed configuration, the exactness check: every document's mean loss in the first step's
packs against the document alone (max |difference|), and how many attention calls got
cu_seq_lens_q. docs/BENCHMARKS.md holds the figures of an H200.
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch
import transformers

from packtool.packers import run_packer
from packtool.torch import collate_tensors, model_inputs, prepare_model
from packtool.train import attention as at
from packtool.train import conformance as cf

# the issue-39 model: 0.62B parameters, GQA 12/4, vocabulary 70,000
LLAMA_06B = {"model_type": "llama", "hidden_size": 1536, "intermediate_size": 4096,
             "num_hidden_layers": 16, "num_attention_heads": 12, "num_key_value_heads": 4,
             "vocab_size": 70_000, "max_position_embeddings": 8192}
SYNTH = {"short": (30_000, 84, 0.6), "long": (400, 3000, 1.0)}  # docs, median tokens, sigma


def documents(args, vocab: int) -> list[np.ndarray]:
    """The corpus's documents (or synthetic ones), each cut into pieces of at most -L."""
    if args.corpus:
        import packtool

        c = packtool.open_tokens(args.corpus)
        docs = [np.asarray(c[i], np.int64) % vocab for i in range(min(len(c), args.limit_docs))]
    else:
        n, median, sigma = SYNTH[args.docs]
        if args.tiny:
            n, median = 300, 24
        rng = np.random.default_rng(0)
        lens = np.maximum(2, rng.lognormal(np.log(median), sigma, n).astype(np.int64))
        docs = [rng.integers(1, vocab, k) for k in lens]
    return [d[a:a + args.L] for d in docs for a in range(0, len(d), args.L) if len(d[a:]) > 1]


def packed_steps(docs, args) -> list[dict]:
    ids = run_packer([len(d) for d in docs], args.L, "bfd").packs
    packs = []
    for p in range(int(ids.max()) + 1):
        members = [docs[i] for i in np.flatnonzero(ids == p)]
        cu = np.concatenate([[0], np.cumsum([len(d) for d in members])])
        ids_ = np.concatenate(members)
        labels = ids_.copy()
        labels[cu[:-1]] = -100  # no token learns across a boundary
        packs.append({"input_ids": ids_, "labels": labels, "cu_seqlens": cu.astype(np.int32),
                      "position_ids": np.concatenate([np.arange(len(d)) for d in members])})
    order = np.random.default_rng(1).permutation(len(packs))
    k = args.packs_per_step
    return [collate_tensors([packs[i] for i in order[s:s + k]])
            for s in range(0, len(order) - k + 1, k)]


def padded_steps(docs, args, sort: bool) -> list[dict]:
    """Batches of whole documents, B x the longest <= the step's slots."""
    rng = np.random.default_rng(1)
    order = (sorted(range(len(docs)), key=lambda i: len(docs[i])) if sort
             else list(rng.permutation(len(docs))))
    budget, batches, cur = args.packs_per_step * args.L, [], []
    for i in order:
        if cur and (len(cur) + 1) * max(len(docs[j]) for j in cur + [i]) > budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    batches.append(cur)
    if sort:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    out = []
    for b in batches:
        n = max(len(docs[i]) for i in b)
        ids = torch.zeros(len(b), n, dtype=torch.long)
        mask = torch.zeros(len(b), n, dtype=torch.long)
        for r, i in enumerate(b):
            ids[r, :len(docs[i])] = torch.from_numpy(docs[i])
            mask[r, :len(docs[i])] = 1
        out.append({"input_ids": ids, "attention_mask": mask,
                    "labels": ids.masked_fill(mask == 0, -100)})
    return out


def set_attn(model, attn: str) -> None:
    """``attn``, or eager where the model has no sdpa path (Gemma 2)."""
    try:
        model.set_attn_implementation(attn)
    except ValueError:
        model.set_attn_implementation("eager")


def to(batch: dict, device) -> dict:
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for k, v in batch.items()}


def run(name, model, steps, args, inputs) -> dict:
    """Train ``model`` over ``steps`` (``--warmup`` of them first, untimed): real tokens/s."""
    dev = torch.device(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    auto = torch.autocast(dev.type, torch.bfloat16, enabled=dev.type == "cuda")

    def step(batch):
        with auto:
            loss = model(**inputs(to(batch, dev)), use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.train()
    for b in steps[:args.warmup]:
        step(b)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    real = slots = 0
    t = time.perf_counter()
    for b in steps:
        step(b)
        real += (int(b["attention_mask"].sum()) if "attention_mask" in b
                 else b["input_ids"].numel())
        slots += b["input_ids"].numel()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None
    return {"config": name, "tokens_s": real / dt, "pad": 1 - real / slots, "peak_gib": peak}


def exactness(model, batch, args, inputs) -> tuple[float, int, int]:
    """Max |mean loss of a document in its packs - alone| over the first step's documents."""
    dev = torch.device(args.device)
    auto = torch.autocast(dev.type, torch.bfloat16, enabled=dev.type == "cuda")
    model.eval()
    at.CALLS.clear()
    with torch.no_grad(), auto:
        logits = model(**inputs(to(batch, dev)), use_cache=False).logits[0].float()
        calls = len(at.CALLS)
        ids = batch["input_ids"][0].to(dev)
        tok = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")
        cu = batch["cu_seq_lens_q"].tolist()
        impl = model.config._attn_implementation
        set_attn(model, "sdpa")
        worst = 0.0
        for a, z in zip(cu[:-1], cu[1:], strict=True):
            alone = model(input_ids=ids[a:z][None], use_cache=False).logits[0].float()
            want = torch.nn.functional.cross_entropy(alone[:-1], ids[a + 1:z])
            worst = max(worst, abs(float(tok[a:z - 1].mean()) - float(want)))
        model.set_attn_implementation(impl)
    return worst, calls, model.config.num_hidden_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 model (smoke)")
    ap.add_argument("--config", help="a model's config.json (default: the 0.62B Llama)")
    ap.add_argument("--corpus", help="a packtool token corpus (default: synthetic --docs)")
    ap.add_argument("--docs", choices=sorted(SYNTH), default="short")
    ap.add_argument("--limit-docs", type=int, default=30_000)
    ap.add_argument("-L", type=int, default=4096)
    ap.add_argument("--packs-per-step", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40, help="timed packed steps (the documents)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--configs", help="comma-separated subset of the configurations")
    args = ap.parse_args()
    if args.tiny:
        args.L, args.steps, args.warmup = min(args.L, 128), min(args.steps, 4), 1
        spec = {"model_type": "llama"}
    else:
        spec = cf.read_config(args.config) if args.config else LLAMA_06B
    config = cf.tiny_config(spec) if args.tiny else transformers.CONFIG_MAPPING[
        spec["model_type"]](**{k: v for k, v in spec.items() if k not in cf.DROP})
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(config)
    docs = documents(args, config.vocab_size)
    budget = args.steps * args.packs_per_step * args.L
    keep = int(np.searchsorted(np.cumsum([len(d) for d in docs]), budget * 0.97))
    docs = docs[:max(keep, 8)]
    print(f"{len(docs):,} documents, {sum(map(len, docs)):,} tokens; -L {args.L}, "
          f"{args.packs_per_step} x {args.L} slots a step; {args.device}")
    packed = packed_steps(docs, args)
    kernels = [k for k in at.ORDER if torch.device(args.device).type in at.KERNELS[k].devices
               and at.KERNELS[k].installed()]
    plans = [("padded-random", padded_steps(docs, args, False), "sdpa", dict),
             ("padded-sorted", padded_steps(docs, args, True), "sdpa", dict)]
    plans += [(f"packed-{k}", packed, k, model_inputs) for k in kernels]
    plans += [("packed-sdpa", packed, "sdpa", lambda b: model_inputs(b, varlen=False))]
    wanted = args.configs.split(",") if args.configs else None
    rows = []
    for name, steps, attn, inputs in plans:
        if wanted and name not in wanted:
            continue
        model = copy.deepcopy(base).to(args.device)
        if attn in at.KERNELS:
            at.attention_kernel(args.device, only=(attn,))
            prepare_model(model)
        else:
            set_attn(model, attn)
        r = run(name, model, steps, args, inputs)
        if name.startswith("packed"):
            r["loss_diff"], calls, layers = exactness(model, steps[0], args, inputs)
            r["calls"] = f"{calls} of {layers}" if attn in at.KERNELS else "-"
        rows.append(r)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    at.attention_kernel(args.device, only=at.ORDER)
    print("| configuration | real tokens/s | pad | peak GiB | max loss diff | calls with "
          "cu_seq_lens |\n| --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        diff = f"{r['loss_diff']:.1e}" if "loss_diff" in r else "-"
        print(f"| {r['config']} | {r['tokens_s']:,.0f} | {r['pad']:.0%} | {peak} | {diff} | "
              f"{r.get('calls', '-')} |")


if __name__ == "__main__":
    main()
