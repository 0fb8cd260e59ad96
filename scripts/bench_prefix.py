"""Prefix trees against flat packing and --share-prompt (depth 1): tokens stored (= tokens a
forward pass computes) and packs, through pack's own planners (no disk), on synthetic
corpora whose records share what real ones do; then the CPU time of a tiny Llama's forward
over the same sequences flat vs tree-packed (4-D ancestor mask from tree_in/tree_out), and
that every record's log-probs agree.

    (a) GRPO groups      G = 8 and 16 completions of a prompt; prompt/response length 4 and 1
    (b) pairs            preference pairs, prompt median 160, completions 260 (UltraFeedback)
    (c) multi-turn trees depth 3-5: a prompt (300), then levels of branches (depth 3: 2
                         shared first parts of 400 tokens, 4 branches of 100 of each;
                         LEVELS), each record a root-to-leaf path (a completions group)
    (d) chat             plain records repeating a 300-token system prompt; and records that
                         are successive turns of the same conversations (turn k: turns 1..k)

Lengths are lognormal (sigma 0.5, at most 3x) around the medians given; ids random over 32,000, so
nothing is shared by chance beyond what the shape shares. seq_len 32768 for (a) and (c) (a
flat group of 16 sequences is up to ~25,000 tokens), 8192 for (b), 4096 for (d); bfd.

    PYTHONPATH=. python scripts/bench_prefix.py [--quick] [--min-shared N]
"""

import argparse
import time

import numpy as np

from packtool.formats.packed.groups import tree_shape
from packtool.formats.tokens.groups import GroupTable
from packtool.pack.pairs import plan_grouped
from packtool.pack.plan import PackOptions, plan_pack
from packtool.pack.trees import keys_of, plan_trees

VOCAB = 32_000
rng = np.random.default_rng(0)


def ln(median: float, n=None) -> np.ndarray:
    """Lognormal lengths (sigma 0.5) in [2, 3 x median]."""
    x = np.round(rng.lognormal(np.log(median), 0.5, n))
    return np.clip(x, 2, 3 * median).astype(np.int64)


def toks(n: int) -> np.ndarray:
    return rng.integers(0, VOCAB, int(n))


def grouped(groups: list, kind: str):
    """(documents, GroupTable) of groups given as (prompt, [completions])."""
    docs, role, group, prompt, first = [], [], [], [], [0]
    for g, (p, outs) in enumerate(groups):
        for k, c in enumerate(outs):
            docs.append(np.concatenate([p, c]))
            role.append((1 + k) if kind == "pairs" else 3 + k)
            group.append(g)
            prompt.append(p.size)
        first.append(len(docs))
    return docs, GroupTable(np.array(group, np.int64), np.array(role, np.uint16),
                            np.array(prompt, np.int64), np.array(first, np.int64), kind)


def grpo(n: int, g: int, ratio: int, response: int = 128):
    return grouped([(toks(ln(ratio * response)), [toks(x) for x in ln(response, g)])
                    for _ in range(n)], "completions")


def pairs(n: int):
    return grouped([(toks(ln(160)), [toks(x) for x in ln(260, 2)]) for _ in range(n)],
                   "pairs")


LEVELS = {  # depth -> (branches, median tokens) of each level below the prompt
    3: [(2, 400), (4, 100)],                       # a shared first part, then branches
    4: [(2, 400), (2, 200), (3, 100)],
    5: [(2, 300), (2, 150), (2, 100), (2, 100)]}


def multi_turn(n: int, depth: int, scale: float = 1.0):
    """A prompt (median 300), then ``LEVELS[depth]`` (lengths x ``scale``): the records are
    the root-to-leaf paths, each a completion of the prompt (their first parts shared)."""
    out = []
    for _ in range(n):
        paths = [np.zeros(0, np.int64)]
        for branches, median in LEVELS[depth]:
            paths = [np.concatenate([q, toks(ln(scale * median))]) for q in paths
                     for _ in range(branches)]
        out.append((toks(ln(scale * 300)), paths))
    return grouped(out, "completions")


def system_prompt(n: int, sys_len: int = 300):
    system = toks(sys_len)
    return [np.concatenate([system, toks(ln(200))]) for _ in range(n)], None


def successive_turns(n_conv: int, turns: int = 6, sys_len: int = 300):
    system, docs = toks(sys_len), []
    for _ in range(n_conv):
        conv = system
        for _ in range(rng.integers(2, turns + 1)):
            conv = np.concatenate([conv, toks(ln(60)), toks(ln(150))])  # user, assistant
            docs.append(conv)
    return docs, None


def plans(docs, table, seq_len: int, min_shared):
    """{method: layout}: flat (every sequence whole), depth-1 (--share-prompt, groups
    only) and trees (--share-prefix)."""
    lengths = np.array([d.size for d in docs], np.int64)
    keys = [keys_of(d, None) for d in docs]
    out = {}
    if table is None:
        out["flat"] = plan_pack(lengths, PackOptions(seq_len=seq_len))
    else:
        out["flat"] = plan_grouped(lengths, PackOptions(seq_len=seq_len), table)
        out["depth-1"] = plan_grouped(lengths, PackOptions(seq_len=seq_len, share_prompt=True),
                                      table)
    out["trees"] = plan_trees(lengths, PackOptions(seq_len=seq_len, share_prefix=True,
                                                   min_shared=min_shared), table,
                              lambda d: keys[d])
    return out


def table_rows(name: str, docs, table, seq_len: int, min_shared) -> dict:
    lays = plans(docs, table, seq_len, min_shared)
    flat = lays["flat"].counts["n_tokens"]
    for method, lay in lays.items():
        t = lay.counts["n_tokens"]
        print(f"| {name} | {method} | {t:,} | {lay.n_packs:,} | {flat / t:.2f}x | "
              f"{t / (lay.n_packs * seq_len):.4f} |")
    return {m: lay.counts["n_tokens"] for m, lay in lays.items()}


# ---------------------------------------------------------------- choosing --min-shared
def templated_chat(n: int):
    """Chat records as a template renders them: a 3-token header per turn
    (``<|im_start|>role\\n``), 40% under one of 5 system prompts of 300 tokens, the rest
    starting at the user's header; the user's first two tokens drawn from 40 common openings
    (Zipf: "How do", "What is", ...), so records share short beginnings by chance."""
    sys_prompts = [toks(300) for _ in range(5)]
    openings = [toks(2) for _ in range(40)]
    weights = 1 / np.arange(1, 41)
    weights /= weights.sum()
    docs = []
    for _ in range(n):
        head = ([np.array([1, 2, 3]), sys_prompts[rng.integers(5)], np.array([6])]
                if rng.random() < 0.4 else [])
        user = [np.array([1, 4, 3]), openings[rng.choice(40, p=weights)], toks(ln(40)),
                np.array([6])]
        docs.append(np.concatenate(head + user + [np.array([1, 5, 3]), toks(ln(200))]))
    return docs, None


def min_shared_sweep(n: int) -> None:
    docs, _ = templated_chat(n)
    keys = [keys_of(d, None) for d in docs]
    lengths = np.array([d.size for d in docs], np.int64)
    print("\n| --min-shared | tokens stored | packs | segments | shared segments | of them < 16 "
          "tokens |")
    print("|---|---|---|---|---|---|")
    for m in (1, 2, 4, 8, 16, 32, 64):
        lay = plan_trees(lengths, PackOptions(seq_len=4096, share_prefix=True, min_shared=m),
                         None, lambda d: keys[d])
        r = lay.rounds[0]
        shared = (r.role == 0) & (r.table_length > 0)
        short = shared & (r.table_length < 16)
        print(f"| {m} | {lay.counts['n_tokens']:,} | {lay.n_packs:,} | "
              f"{lay.counts['n_segments']:,} | {int(shared.sum()):,} | {int(short.sum()):,} |")


# -------------------------------------------------------------------- the forward pass
def rows_of(lay, docs, tree: bool):
    """Per pack: (ids, positions, tree_in, tree_out, [(doc, token indices of its path)])."""
    r = lay.rounds[0]
    doc, off, length = lay.segments()
    up = r.up[lay.order] if tree and getattr(r, "up", None) is not None else \
        np.zeros(doc.size, np.int64)
    role = r.role[lay.order] if hasattr(r, "role") else np.ones(doc.size)
    out, a = [], 0
    for n in lay.pack_nseg.tolist():
        d, o, x, u = doc[a:a + n], off[a:a + n], length[a:a + n], up[a:a + n]
        parent, end, before = tree_shape(u, x)
        ids = np.concatenate([docs[di][oi:oi + xi] for di, oi, xi in zip(d, o, x, strict=True)])
        starts = np.concatenate([[0], np.cumsum(x)[:-1]])
        pos = np.concatenate([np.arange(xi) + bi for xi, bi in zip(x, before, strict=True)])
        tin = np.repeat(np.arange(n), x)
        seqs = []
        for s in range(n):
            if role[a + s] == 0 or (s + 1 < n and parent[s + 1] == s):
                continue  # a shared segment
            path, p = [], s
            while p >= 0:
                path.append(np.arange(starts[p], starts[p] + x[p]))
                p = parent[p]
            seqs.append((int(d[s]), np.concatenate(path[::-1])))
        out.append((ids, pos, tin, np.repeat(end, x), seqs))
        a += n
    return out


def forward(model, rows, torch):
    """(seconds, {doc: summed log-prob of its tokens 1..}) over the rows, one a forward."""
    logps, t0 = {}, time.perf_counter()
    for ids, pos, tin, tout, seqs in rows:
        n = ids.size
        q, k = np.arange(n)[:, None], np.arange(n)[None, :]
        vis = (k <= q) & (tin[k] <= tin[q]) & (tin[q] < tout[k])
        mask = torch.zeros(1, 1, n, n)
        mask[0, 0][~torch.from_numpy(vis)] = torch.finfo(torch.float32).min
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(ids)[None],
                           position_ids=torch.from_numpy(pos)[None], attention_mask=mask,
                           use_cache=False).logits[0]
        lp = torch.log_softmax(logits, -1)
        for d, path in seqs:
            t = torch.from_numpy(path)
            logps[d] = float(lp[t[:-1], torch.from_numpy(ids[path[1:]])].sum())
    return time.perf_counter() - t0, logps


def forward_bench(cases, min_shared) -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=4096)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("eager")
    print("\n| corpus | tokens flat | tokens tree | forward flat (s) | forward tree (s) | "
          "speedup | max abs diff of a record's log-prob |")
    print("|---|---|---|---|---|---|---|")
    for name, (docs, table), seq_len in cases:
        lays = plans(docs, table, seq_len, min_shared)
        flat, tree = rows_of(lays["flat"], docs, False), rows_of(lays["trees"], docs, True)
        tf, lf = forward(model, flat, torch)
        tt, lt = forward(model, tree, torch)
        diff = max(abs(lf[d] - lt[d]) for d in lf)
        assert set(lf) == set(lt)
        print(f"| {name} | {lays['flat'].counts['n_tokens']:,} | "
              f"{lays['trees'].counts['n_tokens']:,} | {tf:.2f} | {tt:.2f} | {tf / tt:.2f}x | "
              f"{diff:.1e} |")


def FORWARD_CASES():  # small: an eager forward with a 4-D mask costs rows x seq_len^2
    return [("(a) GRPO G=8, P/R=4, response 32", grpo(24, 8, 4, 32), 4096),
            ("(c) multi-turn depth 4, lengths / 10", multi_turn(24, 4, 0.1), 4096),
            ("(d) 300-token system prompt", system_prompt(150), 4096),
            ("(d) successive turns", successive_turns(20), 4096)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--min-shared", type=int, default=None)
    ap.add_argument("--skip-forward", action="store_true")
    a = ap.parse_args()
    k = 4 if a.quick else 1
    m = a.min_shared
    print("| corpus | method | tokens stored | packs | flat / stored | slot efficiency |")
    print("|---|---|---|---|---|---|")
    got = {}
    for g in (8, 16):
        for ratio in (4, 1):
            got[f"grpo G={g} P/R={ratio}"] = table_rows(f"(a) GRPO G={g}, P/R={ratio}",
                                                        *grpo(400 // k, g, ratio), 32768, m)
    got["pairs"] = table_rows("(b) pairs", *pairs(4000 // k), 8192, m)
    for depth in (3, 4, 5):
        got[f"depth {depth}"] = table_rows(f"(c) multi-turn depth {depth}",
                                           *multi_turn(300 // k, depth), 32768, m)
    got["system"] = table_rows("(d) 300-token system prompt", *system_prompt(20_000 // k),
                               4096, m)
    got["turns"] = table_rows("(d) successive turns", *successive_turns(3000 // k), 4096, m)
    d3 = got["depth 3"]
    g8 = got["grpo G=8 P/R=4"]
    print(f"\ndepth-3 trees store {d3['trees'] / d3['depth-1']:.3f} of --share-prompt's tokens"
          f"; GRPO G=8 P/R=4 keeps {g8['flat'] / g8['trees']:.2f}x")
    min_shared_sweep(20_000 // k)
    if not a.skip_forward:
        forward_bench(FORWARD_CASES(), m)


if __name__ == "__main__":
    main()
