"""What --share-prompt saves and how pairs pack, through pack's planner (no disk): 20,000
preference pairs, seq_len 4096, bfd, --overflow drop (pairs over 4096 dropped, counted),
against the same sequences packed as single documents (which splits pairs across rows), in
two shapes (lognormal lengths, sigma 0.8 prompt, 0.7 completions):

    ultrafeedback    prompt median 160 tokens, completions 260: the prompt ~25% of P + C + R
    third            prompt median 240, completions 260: the prompt a third (33.0%) of
                     P + C + R, the issue's figure (plain 2P + C + R is 4 thirds, shared 3:
                     ~25% fewer)

The saving is conservative: plain drops the pairs over 4096 (their tokens not counted),
--share-prompt keeps them.

    PYTHONPATH=. python scripts/bench_preference.py
"""

import numpy as np

from packtool.formats.tokens.groups import GroupTable
from packtool.pack.pairs import plan_grouped
from packtool.pack.plan import PackOptions, plan_pack

SHAPES = {"ultrafeedback": (160, 260), "third": (240, 260)}  # prompt, completion medians


def pairs(n: int, prompt_median: int, completion_median: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    p = np.clip(rng.lognormal(np.log(prompt_median), 0.8, n), 8, 1500).astype(np.int64)
    c = np.clip(rng.lognormal(np.log(completion_median), 0.7, (n, 2)), 4, 1500).astype(np.int64)
    lengths = (p[:, None] + c).ravel()
    role = np.tile(np.array([1, 2], np.uint16), n)
    group = np.repeat(np.arange(n), 2)
    first = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
    return lengths, GroupTable(group, role, np.repeat(p, 2), first, "pairs")


def shape(name: str, n: int = 20_000, seq: int = 4096) -> None:
    lengths, table = pairs(n, *SHAPES[name])
    rows = {}
    for label, share in (("pairs, plain", False), ("pairs, --share-prompt", True)):
        opts = PackOptions(seq_len=seq, share_prompt=share, overflow="drop")
        lay = plan_grouped(lengths, opts, table)
        rows[label] = (lay.counts["n_tokens"], lay.n_packs, lay.groups["n_dropped_groups"])
    single = plan_pack(lengths, PackOptions(seq_len=seq, overflow="drop"))
    rows["single documents"] = (single.counts["n_tokens"], single.n_packs, None)
    prompts = table.prompt[::2].sum()
    print(f"{name}: {n:,} pairs, prompt {prompts / (lengths.sum() - prompts):.1%} of P + C + R, "
          f"seq_len {seq}, bfd")
    for label, (tok, packs, dropped) in rows.items():
        print(f"  {label:24s} {tok:>11,} tokens {packs:>7,} packs  efficiency "
              f"{tok / (packs * seq):.4f}" + ("" if dropped is None else
                                              f"  ({dropped} pairs over {seq} dropped)"))
    (t0, p0, _), (t1, p1, _) = rows["pairs, plain"], rows["pairs, --share-prompt"]
    print(f"  --share-prompt saves {t0 - t1:,} tokens ({(t0 - t1) / t0:.1%}) and {p0 - p1:,} "
          f"packs ({(p0 - p1) / p0:.1%})")


def main() -> None:
    for name in SHAPES:
        shape(name)


if __name__ == "__main__":
    main()
