"""Benchmark of ``pack --vsl MIN:MAX`` (issue 32.1): rows per length, remnant share and the
plan's time against a plain ``pack -L MAX`` (bfd) of the same lengths, in the same run.

Lengths: the repository's lognormal mix (median 300, sigma 1, as scripts/bench_scale.py) with
a longer tail (``--cap``, default 32,768) so that documents over MAX exist. The time is
plan_pack's (cut + rows + order + shards: everything ``pack`` decides before it writes),
the kernels compiled before the clock starts.

    PYTHONPATH=$PWD python scripts/bench_vsl.py                         # 1e7 documents
    PYTHONPATH=$PWD python scripts/bench_vsl.py --docs 1000000 --vsl 256:2048
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from packtool.options import PackOptions
from packtool.pack.meta import vsl_entry
from packtool.pack.plan import plan_pack


def lengths_of(n: int, cap: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).lognormal(np.log(300), 1.0, n)
    return np.clip(x, 1, cap).astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--vsl", default="256:8192")
    ap.add_argument("--cap", type=int, default=32_768)
    a = ap.parse_args()
    lengths = lengths_of(a.docs, a.cap)
    vsl = PackOptions(vsl=a.vsl)
    plain = PackOptions(seq_len=vsl.seq_len)
    plan_pack(lengths[:1000], vsl), plan_pack(lengths[:1000], plain)  # compile
    t0 = time.perf_counter()
    lay = plan_pack(lengths, vsl)
    t_vsl = time.perf_counter() - t0
    t0 = time.perf_counter()
    base = plan_pack(lengths, plain)
    t_plain = time.perf_counter() - t0
    v = vsl_entry(lay)["vsl"]
    n_tok = int(lengths.sum())
    print(f"{a.docs:,} documents, {n_tok:,} tokens (lognormal median 300, sigma 1, cap "
          f"{a.cap:,}); --vsl {a.vsl}")
    print(f"rows: {lay.n_packs:,} ({sum(v['rows'].values()):,} chunk rows, "
          f"{v['n_remnant_rows']:,} remnant rows of {v['min']:,})")
    for k, c in sorted(v["rows"].items(), key=lambda kv: int(kv[0])):
        print(f"  {int(k):>6,}: {c:>12,} rows  {100 * c * int(k) / n_tok:6.2f}% of the tokens")
    print(f"remnant rows hold {v['n_remnant_tokens']:,} tokens = "
          f"{100 * v['n_remnant_tokens'] / n_tok:.2f}% of the tokens; slots "
          f"{100 * n_tok / v['n_slot_tokens']:.2f}% full")
    print(f"plan: --vsl {t_vsl:.2f}s, plain -L {plain.seq_len} bfd {t_plain:.2f}s "
          f"({base.n_packs:,} packs); ratio {t_vsl / t_plain:.2f}x")


if __name__ == "__main__":
    main()
