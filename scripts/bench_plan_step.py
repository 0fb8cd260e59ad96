"""plan_step against verl's step planner and a plain FFD, in one run (issue 40).

    python scripts/bench_plan_step.py [--sizes 8192x64,65536x512] [--repeats 5] [--no-verl]

For each length distribution and each size (sequences x data-parallel ranks), one step
planned three ways, each giving every rank M micro-batches of at most max_tokens tokens:

    plan_step   packtool.plan_step(lengths, max_tokens, world_size, groups=...)
    verl        verl 0.9.1: get_seqlen_balanced_partitions(24576 L + L^2, W, equal_size=True)
                (get_group_balanced_partitions for groups) to ranks, then each rank's
                rearrange_micro_batches(max_token_len), M all-reduced to the max over ranks
                (here: the max taken, then every rank planned again at that M, as verl's
                all-reduce makes it)
    ffd         packtool's ffd packer over the sequences (groups: over the groups' totals)
                at max_tokens, packs dealt round robin to ranks, M = the most any rank got

and prints: CPU ms per call (``time.process_time``: one core's work, what a busy shared
machine leaves honest where wall time is not; plan_step: the least of --repeats calls after
the first, which compiles or loads the cached kernels; verl and ffd: one call), M, max /
mean over ranks of the attention cost (sum of L^2 per rank), the same for tokens, and the
step's cost (sum over the M slots of the costliest rank's micro-batch, / the mean rank cost:
the time of a step whose micro-batches wait for the slowest rank, against perfect balance).

Distributions: lognormal (median 1,000, sigma 1, clipped to 16,384; max_tokens 16,384);
squad11-384 (packtool/data/squad11-384.histogram.csv, the Graphcore paper's SQuAD v1.1
lengths, drawn with replacement; max_tokens 4,096); GRPO (groups of 16 completions of one
prompt: prompt lognormal median 200, completions lognormal median 500, sigma 0.8, sequences
clipped to 2,048; max_tokens 32,768, a group whole in one micro-batch).

verl is read from an install made with ``pip install --no-deps verl==0.9.1`` (its
dependencies pin transformers < 5.11, ray, tensordict, hydra...): tests/verl_ref.py runs its
seqlen_balancing.py file against three stubs (DataProto, get_device_name,
index_select_tensor_dict); torch and numpy are needed. Prints measurements only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this work tree
sys.path.insert(0, str(ROOT / "tests"))  # verl_ref

from packtool import plan_step  # noqa: E402
from packtool.lengths import load_histogram_csv, reference_histogram  # noqa: E402
from packtool.packers import assign_packs  # noqa: E402


def distributions(n: int, rng):
    """(name, lengths, groups or None, max_tokens) for a step of ``n`` sequences."""
    lognormal = np.clip(rng.lognormal(np.log(1000), 1.0, n).astype(np.int64), 1, 16384)
    squad = rng.choice(load_histogram_csv(reference_histogram("squad11-384")), n)
    g = 16
    prompts = np.repeat(rng.lognormal(np.log(200), 0.8, n // g).astype(np.int64) + 1, g)
    completions = rng.lognormal(np.log(500), 0.8, n).astype(np.int64) + 1
    grpo = np.clip(prompts + completions, 1, 2048)
    return [("lognormal", lognormal, None, 16384), ("squad11-384", squad, None, 4096),
            ("grpo x16", grpo, np.arange(n) // g, 32768)]


def figures(lengths, micro_batches):
    """(M, rank cost max/mean, rank tokens max/mean, step cost / mean) of [r][m] indices."""
    w, m = len(micro_batches), max(len(r) for r in micro_batches)
    cost, tok = np.zeros((w, m)), np.zeros((w, m))
    sq = lengths.astype(np.float64) ** 2
    for r, rank in enumerate(micro_batches):
        for k, idx in enumerate(rank):
            idx = np.asarray(idx, np.int64)
            cost[r, k], tok[r, k] = sq[idx].sum(), lengths[idx].sum()
    rc, rt = cost.sum(1), tok.sum(1)
    return m, rc.max() / rc.mean(), rt.max() / rt.mean(), cost.max(0).sum() / rc.mean()


def ours(lengths, groups, w, max_tokens, repeats):
    plan_step(lengths, max_tokens=max_tokens, world_size=w, groups=groups)  # compile or load
    times = []
    for _ in range(repeats):
        t = time.process_time()
        plan = plan_step(lengths, max_tokens=max_tokens, world_size=w, groups=groups)
        times.append(time.process_time() - t)
    return float(np.min(times)), plan.micro_batches


def ffd(lengths, groups, w, max_tokens):
    t = time.process_time()
    unit = np.arange(len(lengths)) if groups is None else groups
    packs = assign_packs(np.bincount(unit, lengths).astype(np.int64), max_tokens,
                         algo="ffd")[unit]
    n_packs = int(packs.max()) + 1
    m = -(-n_packs // w)
    order = np.argsort(packs, kind="stable")
    bounds = np.searchsorted(packs[order], np.arange(n_packs + 1))
    mbs = [[np.zeros(0, np.int64)] * m for _ in range(w)]
    for p in range(n_packs):
        mbs[p % w][p // w] = order[bounds[p]:bounds[p + 1]]
    return time.process_time() - t, mbs


def verl_plan(sb, lengths, groups, w, max_tokens):
    import torch

    t = time.process_time()
    work = (24576 * lengths + lengths ** 2).tolist()
    if groups is None:
        ranks = sb.get_seqlen_balanced_partitions(work, w, equal_size=True)
    else:
        ranks = sb.get_group_balanced_partitions(lengths.tolist(), groups.tolist(), w)
    g = 1 if groups is None else int(np.bincount(groups).max())

    def per_rank(idx, least=None):
        sub = lengths[idx]
        mask = torch.zeros(len(sub), int(sub.max()), dtype=torch.long)
        for i, n in enumerate(sub):
            mask[i, :n] = 1
        batch = {"input_ids": torch.zeros(len(sub), 1), "attention_mask": mask}
        _, index = sb.rearrange_micro_batches(batch, max_tokens, min_num_micro_batch=least,
                                              force_group_size=g)
        return [np.asarray(idx)[i] for i in index]

    first = [per_rank(idx) for idx in ranks]
    m = max(len(r) for r in first)  # verl's all-reduce of the count (MAX over dp ranks)
    mbs = [r if len(r) == m else per_rank(idx, m) for r, idx in zip(first, ranks, strict=True)]
    return time.process_time() - t, mbs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="8192x64,65536x512")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-verl", action="store_true")
    args = ap.parse_args()
    sb = None
    if not args.no_verl:
        import verl_ref

        sb, how = verl_ref.load()
        print(f"verl: {how}")
    print(f"{'distribution':<12} {'size':>10} {'planner':<9} {'cpu ms':>9} {'M':>4} "
          f"{'cost max/mean':>13} {'tokens':>7} {'step':>6}")
    for size in args.sizes.split(","):
        n, w = map(int, size.split("x"))
        for name, lengths, groups, max_tokens in distributions(n, np.random.default_rng(0)):
            runs = [("plan_step", *ours(lengths, groups, w, max_tokens, args.repeats)),
                    ("ffd", *ffd(lengths, groups, w, max_tokens))]
            if sb is not None:
                runs.append(("verl", *verl_plan(sb, lengths, groups, w, max_tokens)))
            for who, seconds, mbs in runs:
                m, cost, tok, step = figures(lengths, mbs)
                print(f"{name:<12} {size:>10} {who:<9} {seconds * 1e3:9.2f} {m:4d} "
                      f"{cost:13.4f} {tok:7.4f} {step:6.3f}", flush=True)


if __name__ == "__main__":
    main()
