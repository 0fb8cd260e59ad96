"""What --share-prompt saves and how pairs pack, through pack's planner (no disk): 20,000
preference pairs of UltraFeedback-like lengths (lognormal: prompt median 160 tokens,
completions median 260), seq_len 4096, bfd, --overflow drop (8 pairs over 4096
dropped plain); against the same sequences packed as single
documents (which splits pairs across rows).

    PYTHONPATH=. python scripts/bench_preference.py
"""

import numpy as np

from packtool.formats.tokens.groups import GroupTable
from packtool.pack.grouped import plan_grouped
from packtool.pack.plan import PackOptions, plan_pack


def pairs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    p = np.clip(rng.lognormal(np.log(160), 0.8, n), 8, 1500).astype(np.int64)
    c = np.clip(rng.lognormal(np.log(260), 0.7, (n, 2)), 4, 1500).astype(np.int64)
    lengths = (p[:, None] + c).ravel()
    role = np.tile(np.array([1, 2], np.uint16), n)
    group = np.repeat(np.arange(n), 2)
    first = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
    return lengths, GroupTable(group, role, np.repeat(p, 2), first, "pairs")


def main() -> None:
    lengths, table = pairs(20_000)
    seq = 4096
    rows = {}
    for name, share in (("pairs, plain", False), ("pairs, --share-prompt", True)):
        opts = PackOptions(seq_len=seq, share_prompt=share, overflow="drop")
        lay = plan_grouped(lengths, opts, table)
        rows[name] = (lay.counts["n_tokens"], lay.n_packs)
    single = plan_pack(lengths, PackOptions(seq_len=seq, overflow="drop"))
    rows["single documents"] = (single.counts["n_tokens"], single.n_packs)
    prompt_share = table.prompt[::2].sum() / (lengths.sum() - table.prompt[::2].sum())
    print(f"20,000 pairs, prompt {prompt_share:.1%} of P + C + R, seq_len {seq}, bfd")
    for name, (tok, packs) in rows.items():
        print(f"  {name:24s} {tok:>11,} tokens {packs:>7,} packs  efficiency "
              f"{tok / (packs * seq):.4f}")
    (t0, p0), (t1, p1) = rows["pairs, plain"], rows["pairs, --share-prompt"]
    print(f"  --share-prompt saves {t0 - t1:,} tokens ({(t0 - t1) / t0:.1%}) and {p0 - p1:,} "
          f"packs ({(p0 - p1) / p0:.1%})")


if __name__ == "__main__":
    main()
