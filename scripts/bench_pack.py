"""Benchmark packtool's packers and `packtool pack` against baselines on this machine.

    python scripts/bench_pack.py [--quick] [--skip-synthetic] [--skip-trl] [--skip-histograms]
                                 [--skip-e2e] [--algos bfd,ffd] [--workdir bench-out]

Prints measurements and ratios only (it never asserts on wall-clock time). Sections:
  1 synthetic   10M lognormal lengths (median 300, sigma 1, clipped to [1, 4096]), L=4096: every
                packer in PACKERS: seconds, packs, efficiency, gap to the L1 bound ceil(sum/L).
                Targets: ffd, bfd <= 3 s and within 0.01% of the bound; spfhp <= 1 s;
                bfd peak RSS (fresh process) < 1 GB.
  2 trl         Hugging Face TRL pack_dataset(strategy="bfd") on the same lengths, in its own venv
                (<workdir>/trl-venv, no torch), with its default 1,000-row map batches. Target:
                packtool bfd >= 50x faster with fewer packs. Also a multipack_sampler-style numba
                FFD (sort, then an O(n * bins) first-fit scan), on subsets if needed.
  3 histograms  wikipedia-512 and squad11-384 (packtool/data) beside the Graphcore paper's numbers.
  4 e2e         a synthetic uint32 token corpus (--corpus-mb of .bin, lognormal documents of
                median 500 tokens, cached in --workdir), packed at L=4096 with bfd in both
                layouts (and with --v1-root, by an older checkout writing version 1), each
                --repeat times interleaved with a plain copy of the .bin, best of each: wall
                and in-process seconds, bytes on disk per token, bytes written per second
                against the copy (tokens layout goal >= 0.5x), and the index layout's time
                against planning alone (goal: writing adds < 20%). Both sides as shipped: pack
                with its fsyncs and checksums (crc32 of what it writes, sha256 of the sources
                it copies), the copy a read and a write of the same bytes through an 8 MB
                buffer, then fsync (shutil.copyfile's copy_file_range never leaves the kernel
                and may share the extents: no baseline for a program that writes bytes).
                Each timed step starts after os.sync() and after touching and freeing 3x the
                corpus's bytes of memory (see warm_memory: this VM's balloon otherwise makes
                a step's first touch of memory cost up to 10x, by chance of what ran before).
--quick: 1M lengths, a 1M-doc TRL run, squad11-384 only, a ~10M-token corpus. Every section
title shows the load average: above 2 on a 2-core machine, timings include contention.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WARM_FACTOR = 3  # memory touched before a timed step: this many times the corpus's bytes
sys.path.insert(0, str(ROOT))  # benchmark this work tree, whatever else is installed

from packtool.lengths import load_histogram_csv, reference_histogram  # noqa: E402
from packtool.packers import PACKERS, assign_packs  # noqa: E402

TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"
TARGETS = {"bfd": (3.0, 0.01), "ffd": (3.0, 0.01), "spfhp": (1.0, None)}  # (max s, max gap %)
PAPER = {  # Krell et al. (Graphcore), "Efficient sequence packing without cross-contamination"
    "wikipedia-512": {"docs": 16_279_552, "l1": 8_134_368, "l2": 8_135_727, "rows": {
        "none": "49.97%", "spfhp": "99.604% depth 12, 0.03 s", "nnlshp": "99.75% depth 3, ~24 s",
        "lpfhp (not in packtool)": "99.813%, 0.05 s"}},
    "squad11-384": {"docs": 88_641, "l1": 39_713, "l2": 39_775, "rows": {
        "spfhp": "~97.55% (40,711 packs)", "bfd": "~97.55% (40,711 packs)"}},
}


def banner(title: str) -> None:
    print(f"\n== {title}  [load average {os.getloadavg()[0]:.1f}]", flush=True)


def stats(lengths, seq_len: int, n_packs: int, seconds: float, k: int, valid: bool = True) -> dict:
    total = int(lengths.sum())
    lb = -(-total // seq_len)
    return {"seconds": seconds, "k": k, "packs": n_packs, "valid": valid,
            "eff": total / (n_packs * seq_len), "gap": 100.0 * (n_packs - lb) / lb}


def run_packer(lengths, seq_len: int, algo: str) -> dict:
    """Best of up to 3 runs (while under ~10 s in total); checks every pack fits."""
    times = []
    while len(times) < 3 and sum(times) < 10.0:
        t0 = time.perf_counter()
        packs = assign_packs(lengths, seq_len, algo)
        times.append(time.perf_counter() - t0)
    n_packs = int(packs.max()) + 1
    fill = np.bincount(packs, weights=lengths, minlength=n_packs)
    valid = bool(packs.min() >= 0 and fill.max() <= seq_len and (fill > 0).all())
    return stats(lengths, seq_len, n_packs, min(times), len(times), valid)


def try_packer(lengths, seq_len: int, algo: str) -> dict | None:
    try:  # a packer may refuse an input: report it and go on with the others
        return run_packer(lengths, seq_len, algo)
    except Exception as e:
        print(f"  {algo:<11}error: {type(e).__name__}: {str(e)[:300]}")


def header(first: str = "packer") -> str:
    return f"  {first:<11}{'seconds':>11}{'':>11}{'packs':>13}{'efficiency':>11}{'gap L1':>10}"


def row(name: str, r: dict, note: str = "") -> str:
    secs = f"{r['seconds']:9.3f} s (best of {r['k']})" if r["k"] else f"{'-':>23}"
    return (f"  {name:<11}{secs} {r['packs']:>12,} {100 * r['eff']:9.3f}% {r['gap']:+9.4f}%   "
            f"{note}{'' if r['valid'] else '  INVALID PACKING'}")


def fresh(cmd: list) -> list[str]:
    """Run ``cmd`` as a child forked by a small shell: Linux carries ru_maxrss over fork/exec,
    so a child spawned straight from this (large) process would report our peak, not its own."""
    return ["/bin/sh", "-c", '"$@"; exit $?', "sh", *map(str, cmd)]


def peak_rss_bfd(lengths_file: Path, seq_len: int) -> tuple[int, int]:
    """ru_maxrss (bytes) of a fresh process before and after assign_packs(..., 'bfd')."""
    code = ("import resource, sys, json, numpy as np\nfrom packtool.packers import assign_packs\n"
            "l = np.load(sys.argv[1]); assign_packs(np.array([3, 2], np.int64), 8, 'bfd')\n"
            "r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "assign_packs(l, int(sys.argv[2]), 'bfd')\n"
            "print(json.dumps([r0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))")
    p = subprocess.run(fresh([sys.executable, "-c", code, lengths_file, seq_len]), cwd=ROOT,
                       capture_output=True, text=True, check=True)
    return tuple(kb * 1024 for kb in json.loads(p.stdout))


def section_synthetic(lengths, lengths_file: Path, algos, results: dict) -> None:
    total = int(lengths.sum())
    banner(f"1. synthetic: {len(lengths):,} lognormal lengths (median 300, sigma 1, "
           f"clip [1, 4096]), L=4096, {total:,} tokens, L1 bound {-(-total // 4096):,} packs")
    print(header())
    for algo in algos:
        r = results[algo] = try_packer(lengths, 4096, algo)
        if r is None:
            continue
        note = ""
        if algo in TARGETS:
            secs, gap = TARGETS[algo]
            ok = r["seconds"] <= secs and (gap is None or r["gap"] <= gap)
            note = (f"target <= {secs:g} s{f', gap <= {gap}%' if gap else ''}: "
                    f"{'met' if ok else 'NOT MET'}")
        print(row(algo, r, note))
    r0, r1 = peak_rss_bfd(lengths_file, 4096)
    print(f"  bfd peak RSS in a fresh process: {r1 / 2**20:,.0f} MiB (before the assignment "
          f"{r0 / 2**20:,.0f} MiB; target < 1024 MiB: {'met' if r1 < 2**30 else 'NOT MET'})")


TRL_CODE = r"""
import json, resource, sys, time, numpy as np, pyarrow as pa
lengths_file, n, seq_len, tmp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lengths = np.load(lengths_file, mmap_mode="r")[:n]
schema = pa.schema([("input_ids", pa.list_(pa.uint8()))])  # zeros: TRL only needs the lengths
with pa.OSFile(tmp + "/input.arrow", "wb") as f, pa.ipc.new_stream(f, schema) as w:
    for a in range(0, n, 200_000):
        off = np.concatenate([[0], np.cumsum(lengths[a:a + 200_000])]).astype(np.int32)
        col = pa.ListArray.from_arrays(pa.array(off), pa.array(np.zeros(off[-1], np.uint8)))
        w.write_batch(pa.record_batch([col], schema=schema))
import datasets
from trl.data_utils import pack_dataset
datasets.disable_progress_bars()
ds = datasets.Dataset.from_file(tmp + "/input.arrow")  # memory-mapped; map() caches beside it
t0 = time.perf_counter()
packed = pack_dataset(ds, seq_length=seq_len, strategy="bfd")
secs = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": secs, "packs": len(packed), "rss": rss}))
"""


def ensure_trl_venv(workdir: Path) -> Path:
    """A venv of its own for TRL (no torch: trl.data_utils needs none), made on first use."""
    venv = workdir / "trl-venv"
    import_check = [venv / "bin" / "python", "-c", "import trl.data_utils"]
    if subprocess.run(import_check, capture_output=True).returncode:
        print(f"  creating {venv}: datasets transformers numpy pyarrow, then trl --no-deps")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = [venv / "bin" / "pip", "install", "-q"]
        subprocess.run(pip + ["datasets", "transformers", "numpy", "pyarrow"], check=True)
        subprocess.run(pip + ["--no-deps", "trl"], check=True)
    return venv / "bin" / "python"


def run_trl(py: Path, lengths_file: Path, n: int, workdir: Path) -> dict:
    tmp = tempfile.mkdtemp(prefix="trl-run-", dir=workdir)  # fresh dir: no datasets cache hit
    try:
        p = subprocess.run(fresh([py, "-c", TRL_CODE, lengths_file, n, 4096, tmp]),
                           capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"TRL run failed:\n{p.stderr[-3000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"  TRL on {n:,} docs: {r['seconds']:.1f} s, {r['packs']:,} packs, "
          f"peak RSS {r['rss'] / 2**20:,.0f} MiB (input memory-mapped)")
    return r


@numba.njit(cache=False)
def multipack_style_ffd(lengths, capacity):
    """First-fit decreasing as in multipack_sampler: sort, then scan the bins from the first
    for one with room, O(n * bins). Written for this benchmark; returns the bin per item."""
    order = np.argsort(lengths)[::-1]
    room = np.empty(lengths.shape[0], np.int64)
    bins = np.empty(lengths.shape[0], np.int64)
    n_bins = 0
    for k in range(order.shape[0]):
        i = order[k]
        b = 0
        while b < n_bins and room[b] < lengths[i]:
            b += 1
        if b == n_bins:
            room[b] = capacity
            n_bins += 1
        room[b] -= lengths[i]
        bins[i] = b
    return bins


def section_trl(lengths, lengths_file: Path, workdir: Path, results: dict, budget_s: float,
                ffd_cap: int) -> None:
    n = len(lengths)
    banner("2. TRL pack_dataset(strategy='bfd', default 1,000-row map batches), L=4096")
    py = ensure_trl_venv(workdir)
    probe = min(n, 1_000_000)
    trl, how = run_trl(py, lengths_file, probe, workdir), "measured"
    if n > probe and trl["seconds"] * n / probe <= budget_s:
        trl = run_trl(py, lengths_file, n, workdir)
    elif n > probe:
        how = (f"EXTRAPOLATED linearly from {probe:,} docs: the full run would exceed "
               f"{budget_s:.0f} s")
        trl = {"seconds": trl["seconds"] * n / probe, "packs": round(trl["packs"] * n / probe)}
    bfd = results.get("bfd") or run_packer(lengths, 4096, "bfd")  # section 1 skipped or failed
    speed, packs = trl["seconds"] / bfd["seconds"], bfd["packs"] / trl["packs"]
    print(f"  {n:,} docs  TRL: {trl['seconds']:.1f} s, {trl['packs']:,} packs ({how})")
    print(f"  {n:,} docs  packtool bfd: {bfd['seconds']:.3f} s, {bfd['packs']:,} packs")
    print(f"  packtool bfd is {speed:,.0f}x faster "
          f"(target >= 50x: {'met' if speed >= 50 else 'NOT MET'})"
          f", packs ratio packtool/TRL {packs:.4f} ({bfd['packs'] - trl['packs']:+,} packs; "
          f"target < 1: {'met' if packs < 1 else 'NOT MET'})")
    print("  note: TRL also materialises the packed lists (uint8 zeros here); packtool's time is"
          " the assignment only (section 4 times packtool's whole write)")

    multipack_style_ffd(np.array([5, 3, 8], np.int64), 8)  # compile
    print(f"  multipack_sampler-style numba FFD, O(n * bins) scan, on prefixes "
          f"(cap {ffd_cap:,} docs):")
    print(header("docs"))
    m = min(n, 100_000)
    while True:
        sub = lengths[:m]
        t0 = time.perf_counter()
        bins = multipack_style_ffd(sub, 4096)
        secs = time.perf_counter() - t0
        print(row(f"{m:,}", stats(sub, 4096, int(bins.max()) + 1, secs, 1), "multipack-style FFD"))
        for algo in ("ffd", "bfd"):
            r = run_packer(sub, 4096, algo)
            print(row("", r, f"packtool {algo}: {secs / r['seconds']:,.0f}x faster"))
        if m >= min(n, ffd_cap) or secs * 100 > budget_s:  # quadratic: 10x items ~ 100x time
            break
        m = min(10 * m, n, ffd_cap)
    if m < n:
        est = secs * (n / m) ** 2
        print(f"  not run on all {n:,} docs: O(n * bins) extrapolation ~{est:,.0f} s "
              f"(~{est / (results.get('ffd') or bfd)['seconds']:,.0f}x packtool ffd)")


def section_histograms(algos, quick: bool) -> None:
    banner("3. reference histograms beside Krell et al. (Graphcore) published numbers")
    for name, paper in PAPER.items():
        if quick and paper["docs"] > 1_000_000:
            print(f"  {name}: skipped in --quick mode ({paper['docs']:,} docs)")
            continue
        seq_len = int(name.rsplit("-", 1)[1])
        hist_lengths = load_histogram_csv(reference_histogram(name))
        lengths = np.random.default_rng(0).permutation(hist_lengths)
        lb = -(-int(lengths.sum()) // seq_len)
        print(f"  {name}: {len(lengths):,} docs (paper {paper['docs']:,}), L={seq_len}, L1 bound "
              f"{lb:,} (paper {paper['l1']:,}), paper L2 bound {paper['l2']:,}; input shuffled")
        print(header() + f"{'vs L2':>10}   paper")
        none = paper["rows"].get("none")
        print(row("none", stats(lengths, seq_len, len(lengths), 0.0, 0),
                  f"{'':>9}   paper: {none}" if none else ""))
        for algo in algos:
            if (r := try_packer(lengths, seq_len, algo)) is not None:
                pub = paper["rows"].get(algo)
                note = f"{r['packs'] - paper['l2']:+9,}" + (f"   paper: {pub}" if pub else "")
                print(row(algo, r, note))
        for k, v in paper["rows"].items():
            if k != "none" and k.split()[0] not in algos:
                print(f"  {k:<84}paper: {v}")


def make_corpus(path: Path, target_mb: float) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import iter_documents, make_vocabulary

    vocab, tmp, seed, t0 = make_vocabulary(seed=0), path.with_suffix(".tmp"), 0, time.perf_counter()
    with open(tmp, "w", encoding="utf-8") as f:
        while f.tell() < target_mb * 1e6:
            f.write("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n"
                            for d in iter_documents(10_000, seed=seed, vocab=vocab)))
            seed += 1
            if seed == 1:
                est = (time.perf_counter() - t0) * target_mb * 1e6 / f.tell()
                print(f"  generating {path.name}: estimated {est:.0f} s", flush=True)
                if est > 600:
                    target_mb /= 2
                    print(f"  > 10 min: generating half of it (~{target_mb:,.0f} MB) instead")
    print(f"  generated {tmp.stat().st_size / 1e6:,.0f} MB in {time.perf_counter() - t0:.0f} s")
    tmp.rename(path)


def warm_memory(nbytes: int) -> None:
    """Touch ``nbytes`` of memory and free it, right before a timed step. On a VM with free
    page reporting (virtio-balloon here) memory freed a few seconds earlier has been handed
    back to the host, and the first touch of each page costs a host fault, inside whatever
    system call touched it: writing 1.6 GB into the page cache measured 0.4 s right after
    such a touch and 3.2-4.2 s five seconds later, the same script. Every timed step (the
    copy and each pack) starts from the same state, so the ratio compares programs."""
    a = np.ones(max(nbytes, 1) // 8 + 1, np.int64)
    del a


def timed_copy(src: Path, dst: Path) -> float:
    """A read and a write of every byte of ``src`` through an 8 MB user buffer, then fsync:
    what writing the same bytes costs any program (the page cache warm, as for pack)."""
    os.sync()  # every timed step starts with no dirty pages queued for writeback
    warm_memory(WARM_FACTOR * src.stat().st_size)
    t0 = time.perf_counter()
    with open(src, "rb") as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 23)
        g.flush()
        os.fsync(g.fileno())
    secs = time.perf_counter() - t0
    dst.unlink()
    return secs


def _pack_cmd(prefix: Path, out: Path, layout: str | None, root: Path = ROOT) -> list:
    cmd = [sys.executable, "-m", "packtool", "pack", str(prefix), "--seq-len", "4096",
           "--algo", "bfd", "--out", str(out), "-q", "--json"]
    return cmd + (["--layout", layout] if layout else [])


def _plan_alone(prefix: Path) -> float:
    """Seconds to plan the same pack in a fresh process (open, lengths, plan), no writing."""
    warm_memory(WARM_FACTOR * Path(f"{prefix}.bin").stat().st_size)
    code = ("import sys, time; from packtool.pack import open_sources; "
            "from packtool.formats.tokens import read_lengths; "
            "from packtool.pack.plan import plan_pack; from packtool.options import PackOptions; "
            "t = time.perf_counter(); c = open_sources([sys.argv[1]]); "
            "plan_pack(read_lengths(c), PackOptions(4096)); print(time.perf_counter() - t)")
    return float(subprocess.run([sys.executable, "-c", code, str(prefix)], capture_output=True,
                                text=True, check=True, cwd=ROOT).stdout.split()[-1])


def _v1_readable(prefix: Path) -> Path:
    """The corpus as a version-1 token manifest (hard links to its files) for the older
    checkout of --v1-root, which reads token format 1 and 2 only."""
    v1 = prefix.with_name(prefix.name + "-v1")
    meta = json.loads(Path(f"{prefix}.json").read_text())
    body = {k: v for k, v in meta.items() if k not in ("parts", "plan", "manifest_sha256")}
    body.update(version=1, checksums=meta["parts"][0]["checksums"])
    for suffix in (".bin", ".boundaries"):
        if not Path(f"{v1}{suffix}").exists():
            os.link(f"{prefix}{suffix}", f"{v1}{suffix}")
    Path(f"{v1}.json").write_text(json.dumps(body))
    return v1


def _timed_pack(prefix: Path, out: Path, layout: str | None, root: Path) -> tuple:
    """(wall s, in-process s, bytes on disk) of one pack in a fresh process."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(root)}
    os.sync()
    warm_memory(WARM_FACTOR * sum(Path(f"{prefix}{s}").stat().st_size
                                  for s in (".bin", ".boundaries")))
    t0 = time.perf_counter()
    proc = subprocess.run(_pack_cmd(prefix, out, layout), capture_output=True, text=True,
                          check=True, cwd=root, env=env)
    wall = time.perf_counter() - t0
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out, ignore_errors=True)
    return wall, json.loads(proc.stdout)["seconds"], written


def section_e2e(workdir: Path, corpus_mb: float, v1_root: Path | None = None,
                repeat: int = 3) -> None:
    banner("4. end to end: packed layouts on a uint32 corpus: time, bytes per token, copy ratio")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import lognormal_lengths, write_token_corpus

    prefix = workdir / f"e2e-u32-{corpus_mb:g}mb"
    n_docs = int(corpus_mb * 1e6 / 4 / 500)  # uint32 tokens, documents of median 500 tokens
    if not Path(f"{prefix}.json").exists():
        write_token_corpus(prefix, lognormal_lengths(n_docs, median=500, seed=3),
                           vocab_size=100_000)
    meta = json.loads(Path(f"{prefix}.json").read_text())
    src = Path(f"{prefix}.bin")
    token_bytes = src.stat().st_size
    print(f"  corpus: {meta['n_docs']:,} documents, {meta['n_tokens']:,} tokens "
          f"({meta['dtype']}), .bin {token_bytes / 1e6:,.0f} MB; best of {repeat}, "
          "interleaved")
    plan = min(_plan_alone(prefix) for _ in range(repeat))
    print(f"  plan alone (open, lengths, bfd plan; fresh process): {plan:.2f} s")
    runs = [(layout, root) for layout, root in (("index", ROOT), ("tokens", ROOT),
                                                (None, v1_root)) if root is not None]
    best: dict = {}
    copies = []
    for _ in range(repeat):
        copies.append(timed_copy(src, workdir / "e2e-copy.bin"))
        for layout, root in runs:
            got = _timed_pack(prefix if layout else _v1_readable(prefix),
                              workdir / f"e2e-packed-{layout or 'v1'}", layout, root)
            name = layout or "v1 (before)"
            best[name] = min(best.get(name, got), got, key=lambda r: r[1])
    copy = min(copies)
    print(f"  copy of the .bin (read + write + fsync): best {copy:.2f} s "
          f"({token_bytes / copy / 1e6:,.0f} MB/s; runs {', '.join(f'{c:.2f}' for c in copies)})")
    print("  | layout | pack wall s | inside s | writing s (inside - plan) | on disk | "
          "bytes per token | x token bytes | MB/s written | vs copy | vs copy, writing |")
    print("  | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rate = token_bytes / copy
    for name, (wall, inside, written) in best.items():
        writing = inside - plan
        vs_writing = (f"{written / writing / rate:.2f}x" if writing > 0.05 * inside
                      else "- (within the plan's noise)")
        print(f"  | {name} | {wall:.2f} | {inside:.2f} | {writing:.2f} | {written / 1e6:,.1f} MB "
              f"| {written / meta['n_tokens']:.3f} | {written / token_bytes:.3f} | "
              f"{written / inside / 1e6:,.0f} | {written / inside / rate:.2f}x | {vs_writing} |")
    print(f"  index layout inside / plan alone: {best['index'][1] / plan:.2f} (goal: writing "
          f"adds < 20%, i.e. <= 1.20)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes everywhere (see above)")
    for s in ("synthetic", "trl", "histograms", "e2e"):
        ap.add_argument(f"--skip-{s}", action="store_true")
    ap.add_argument("--algos", default=None,
                    help="comma-separated packers (default: all in PACKERS)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out")
    ap.add_argument("--n", type=int, default=None, help="synthetic lengths (default 10M, quick 1M)")
    ap.add_argument("--v1-root", type=Path, default=None,
                    help="an older checkout (packed format 1) to measure beside (section 4)")
    ap.add_argument("--corpus-mb", type=float, default=None,
                    help="e2e JSONL size (default 1600 MB ~ 510M tokens; quick 30)")
    ap.add_argument("--trl-budget", type=float, default=900,
                    help="max seconds for the full TRL run")
    ap.add_argument("--repeat", type=int, default=3,
                    help="section 4: runs of each pack and of the copy (best of)")
    ap.add_argument("--ffd-cap", type=int, default=1_000_000,
                    help="max items for the O(n*bins) FFD")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    algos = args.algos.split(",") if args.algos else list(PACKERS)
    n = args.n or (1_000_000 if args.quick else 10_000_000)
    print(f"packtool packers: {', '.join(algos)}; numba {numba.__version__}, "
          f"numpy {np.__version__}, {os.cpu_count()} cores")
    for algo in algos:  # compile (or load from numba's disk cache) every kernel before timing
        assign_packs(np.array([5, 3, 8, 1, 7, 2], np.int64), 8, algo)
    results: dict = {}
    if not (args.skip_synthetic and args.skip_trl):
        lognormal = np.random.default_rng(0).lognormal(np.log(300), 1.0, n)
        lengths = np.clip(lognormal, 1, 4096).astype(np.int64)
        lengths_file = args.workdir / f"lengths-{n}.npy"
        np.save(lengths_file, lengths)
        if not args.skip_synthetic:
            section_synthetic(lengths, lengths_file, algos, results)
        if not args.skip_trl:
            section_trl(lengths, lengths_file, args.workdir, results, args.trl_budget, args.ffd_cap)
    if not args.skip_histograms:
        section_histograms(algos, args.quick)
    if not args.skip_e2e:
        section_e2e(args.workdir, args.corpus_mb or (30 if args.quick else 1000), args.v1_root,
                    args.repeat)


if __name__ == "__main__":
    main()
