"""Benchmark of packtool.scale (issue 12): prints ratios measured in this run.

1. tokens/s of ``--executor ray`` vs ``local`` on the same inputs and cores (goal >= 0.8x):
   ray runs one task per part (--ray-cpus 1 each), local runs the parts in turn, all cores.
2. parts/s of planning (plan_tokenize over many small files: stat + digest per file).
3. the grouped-packing table: packs and efficiency of --group-docs G vs global packing on
   lognormal lengths (default 10M documents), bfd, seq_len 4096.
4. the driver's assignment time (bfd over all lengths, plan_pack) at 1e8 lengths.

    PYTHONPATH=$PWD python scripts/bench_scale.py                  # all, defaults
    PYTHONPATH=$PWD python scripts/bench_scale.py --only group --docs 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"


def lognormal(n: int, seed: int = 0) -> np.ndarray:
    """The repository's standard mix (scripts/bench_pack.py): median 300, sigma 1, <= 4096."""
    lengths = np.random.default_rng(seed).lognormal(np.log(300), 1.0, n)
    return np.clip(lengths, 1, 4096).astype(np.int64)


def bench_executors(files: int, mb: float, work: Path) -> dict:
    from packtool.executors import RunOptions
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import make_documents

    from packtool.tokenize import TokenizeOptions, tokenize_files

    inputs = work / "in"
    inputs.mkdir()
    docs = make_documents(2000, seed=1)
    per_file = int(mb * 1e6)
    for k in range(files):
        with open(inputs / f"f{k:03d}.jsonl", "w") as f:
            size, i = 0, k
            while size < per_file:
                line = json.dumps({"text": docs[i % len(docs)]}) + "\n"
                f.write(line)
                size += len(line)
                i += 7
    out = {}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    import ray

    cores = os.cpu_count() or 1
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    try:
        for executor in ("local", "ray", "local", "ray"):  # twice each, best of two
            d = work / f"o-{executor}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            t0 = time.perf_counter()
            res = tokenize_files([str(inputs)], TOKENIZER, d / "c", TokenizeOptions(),
                                 run=RunOptions(executor=executor))
            dt = time.perf_counter() - t0
            out[executor] = max(out.get(executor, 0.0), res.n_tokens / dt)
            out["n_tokens"] = res.n_tokens
    finally:
        ray.shutdown()
    same = all((work / "o-local" / p.name).read_bytes() == p.read_bytes()
               for p in (work / "o-ray").glob("c.part-*.bin"))
    out["identical"] = same
    out["ratio"] = out["ray"] / out["local"]
    print(f"tokenize {files} files x {mb} MB ({out['n_tokens']:,} tokens), {cores} cores: "
          f"local {out['local'] / 1e6:.2f}M tok/s, ray {out['ray'] / 1e6:.2f}M tok/s, "
          f"ray/local = {out['ratio']:.2f}x (goal >= 0.8); data files identical: {same}")
    return out


def bench_planning(n_files: int, work: Path) -> float:
    from packtool.tokenize import TokenizeOptions, plan_tokenize

    d = work / "many"
    d.mkdir()
    for k in range(n_files):
        (d / f"f{k:06d}.jsonl").write_text('{"text": "a"}\n')
    t0 = time.perf_counter()
    plan = plan_tokenize([str(d)], TOKENIZER, work / "p", TokenizeOptions())
    dt = time.perf_counter() - t0
    print(f"planning: {len(plan.parts):,} parts in {dt:.2f}s = {len(plan.parts) / dt:,.0f} "
          "parts/s")
    return len(plan.parts) / dt


def bench_group(n_docs: int, seq_len: int, groups: list[int]) -> list[dict]:
    from packtool.pack.plan import PackOptions, plan_pack

    lengths = lognormal(n_docs)
    rows = []
    for g in [None, *groups]:
        t0 = time.perf_counter()
        layout = plan_pack(lengths, PackOptions(seq_len, group_docs=g, shuffle=False))
        dt = time.perf_counter() - t0
        eff = layout.counts["n_tokens"] / (layout.n_packs * seq_len)
        rows.append({"group_docs": g, "n_packs": layout.n_packs, "efficiency": eff,
                     "seconds": dt})
    base = rows[0]["n_packs"]
    print(f"\n{n_docs:,} lognormal lengths, bfd, seq_len {seq_len}:")
    print("| --group-docs | packs | extra packs vs global | efficiency | plan_pack s |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        extra = 100 * (r["n_packs"] - base) / base
        g = "global" if r["group_docs"] is None else f"{r['group_docs']:.0e}"
        print(f"| {g} | {r['n_packs']:,} | {extra:+.4f}% | {100 * r['efficiency']:.4f}% | "
              f"{r['seconds']:.1f} |")
    return rows


def bench_assignment(n_docs: int, seq_len: int) -> float:
    from packtool.pack.plan import PackOptions, make_segments
    from packtool.packers import run_packer

    lengths = lognormal(n_docs, seed=1)
    run_packer(lengths[:10_000], seq_len, "bfd", PackOptions(seq_len).packer_options())  # jit
    t0 = time.perf_counter()
    segs = make_segments(lengths, seq_len)
    packing = run_packer(segs.length, seq_len, "bfd", PackOptions(seq_len).packer_options())
    dt = time.perf_counter() - t0
    print(f"\nassignment (make_segments + bfd) at {n_docs:,} lengths: {dt:.1f}s "
          f"({packing.report.n_packs:,} packs); x10 for 1e9 documents: ~{10 * dt:.0f}s")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["executors", "planning", "group", "assign"])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--mb", type=float, default=2.0, help="MB of JSONL per file")
    ap.add_argument("--plan-files", type=int, default=2000)
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--assign-docs", type=int, default=100_000_000)
    ap.add_argument("--seq-len", type=int, default=4096)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.only in (None, "executors"):
            bench_executors(args.files, args.mb, work)
        if args.only in (None, "planning"):
            bench_planning(args.plan_files, work)
    if args.only in (None, "group"):
        bench_group(args.docs, args.seq_len, [10_000, 100_000, 1_000_000])
    if args.only in (None, "assign"):
        bench_assignment(args.assign_docs, args.seq_len)


if __name__ == "__main__":
    main()
