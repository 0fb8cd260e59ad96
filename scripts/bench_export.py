"""Benchmark `packtool export` for every format against a plain copy of the same bytes.

    python scripts/bench_export.py [--size-mb 1000] [--seq-len 4096] [--workdir DIR] [--keep]

Builds a synthetic token corpus of --size-mb MB of uint16 tokens (lognormal document lengths,
median 300 tokens, written straight in the token-file format, no tokenizer) and packs it with
bfd. Then, in the same run, times a plain copy (shutil.copyfile) of the corpus .bin and of the
packed tokens, and each export. MB/s counts the *source token bytes* moved per second for all
rows, so ratios compare like with like; `written MB` is what the export put on disk.

through MDSWriter's per-sample Python path and is reported, not targeted. Prints only; never
asserts on time. Neither side calls fsync, so both mostly measure writes into the page cache.
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
sys.path.insert(0, str(ROOT))  # benchmark this work tree, whatever else is installed

from packtool._io import sha256_file  # noqa: E402
from packtool.export import export  # noqa: E402
from packtool.pack import pack_corpus  # noqa: E402


def make_corpus(prefix: Path, size_mb: float, seed: int = 0) -> int:
    """uint16 tokens + boundaries + manifest (docs/FORMAT.md), written in 64 MB chunks."""
    rng = np.random.default_rng(seed)
    n_tokens_goal = int(size_mb * 1e6 / 2)
    lengths = []
    total = 0
    while total < n_tokens_goal:
        chunk = np.clip(rng.lognormal(np.log(300), 1.0, 100_000), 1, 32_768).astype(np.int64)
        lengths.append(chunk)
        total += int(chunk.sum())
    lengths = np.concatenate(lengths)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), n_tokens_goal)) + 1]
    ends = np.cumsum(lengths)
    n_tokens = int(ends[-1])
    with open(f"{prefix}.bin", "wb") as f:
        for lo in range(0, n_tokens, 1 << 25):
            f.write(rng.integers(3, 50_000, min(1 << 25, n_tokens - lo), dtype=np.uint16).data)
    ends.astype("<i8").tofile(f"{prefix}.boundaries")
    meta = {"format": "packtool.tokens", "version": 1, "dtype": "uint16", "vocab_size": 50_257,
            "n_docs": len(lengths), "n_tokens": n_tokens, "n_empty": 0,
            "tokenizer": {"path": "synthetic", "sha256": "0" * 64}, "bos_id": None,
            "eos_id": None, "inputs": [], "mask": False, "n_trained_tokens": n_tokens,
            "options": {}, "checksums": {k: {"sha256": sha256_file(f"{prefix}.{k}")}
                                         for k in ("bin", "boundaries")}}
    Path(f"{prefix}.json").write_text(json.dumps(meta))
    return n_tokens


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def remove(path: Path) -> None:
    for p in (path, Path(f"{path}.bin"), Path(f"{path}.idx")):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=1000.0, help="corpus token bytes (MB)")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--workdir", default=None, help="default: a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the best counts")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-export-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"workdir {work}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    corpus = work / "corpus"
    t = timed(lambda: make_corpus(corpus, args.size_mb))
    corpus_bytes = os.path.getsize(f"{corpus}.bin")
    print(f"corpus: {corpus_bytes / 1e6:,.0f} MB of uint16 tokens in {t:.1f}s")
    packed = work / "packed"
    if not (packed / "index.json").exists():
        t = timed(lambda: pack_corpus([corpus], packed, args.seq_len, "bfd"))
        print(f"packed: seq_len {args.seq_len}, bfd, in {t:.1f}s")
    index = json.loads((packed / "index.json").read_text())
    packed_bytes = sum(os.path.getsize(packed / sh["files"]["tokens"]["name"])
                       for sh in index["shards"])
    print(f"packed tokens: {packed_bytes / 1e6:,.0f} MB in {len(index['shards'])} shard(s)")

    tok_files = [packed / sh["files"]["tokens"]["name"] for sh in index["shards"]]
    sources = {"corpus": ([Path(f"{corpus}.bin")], corpus_bytes),
               "packed": (tok_files, packed_bytes)}

    def copy_seconds(kind: str) -> float:
        dst = work / "copy"
        dst.mkdir(exist_ok=True)
        os.sync()  # both sides start with no dirty pages: write-back throttling hits neither
        t = timed(lambda: [shutil.copyfile(f, dst / f"{i}")
                           for i, f in enumerate(sources[kind][0])])
        shutil.rmtree(dst)
        return t

    from packtool.export.llmc import _with_eos

    _with_eos(np.arange(4, dtype=np.uint16), np.array([0, 2]), 1)  # compile numba outside timing
    runs = [  # name, source, format, options, relayout (targeted >= 0.5x)
        ("megatron (corpus, hard link)", "corpus", "megatron", {}, True),
        ("megatron (corpus, --copy)", "corpus", "megatron", {"link": False}, True),
        ("llmc (corpus, --eos-id 50256)", "corpus", "llmc", {"eos_id": 50256}, True),
        ("megatron (packed)", "packed", "megatron", {}, True),
        ("parquet (packed)", "packed", "parquet", {}, False),
        ("parquet-packed (packed)", "packed", "parquet-packed", {}, False),
        ("mds (packed)", "packed", "mds", {}, False),
    ]
    print(f"each row: {args.repeat} x (copy of the same source bytes, export), alternating, "
          "os.sync() before each; the best of each side")
    print(f"\n{'format':32s} {'seconds':>8s} {'src MB/s':>9s} {'copy MB/s':>9s} {'ratio':>6s} "
          f"{'written MB':>10s}  target")
    for name, kind, fmt, opts, relayout in runs:
        nbytes = sources[kind][1]
        out = work / "out"
        best, copies = None, []
        for _ in range(args.repeat):  # copy and export alternate: both see the same disk state
            copies.append(copy_seconds(kind))
            remove(out)
            os.sync()
            try:
                res = export(corpus if kind == "corpus" else packed, fmt, out, **opts)
            except Exception as e:  # report and go on: one missing optional library is not fatal
                print(f"{name:32s} failed: {e}")
                break
            best = res if best is None or res.seconds < best.seconds else best
        remove(out)
        if best is None:
            continue
        copy = nbytes / 1e6 / min(copies)
        rate = nbytes / 1e6 / best.seconds
        ratio = rate / copy
        target = ("ok" if ratio >= 0.5 else "BELOW 0.5") if relayout else "- (re-encoding)"
        print(f"{name:32s} {best.seconds:8.2f} {rate:9,.0f} {copy:9,.0f} {ratio:6.2f} "
              f"{best.bytes_written / 1e6:10,.0f}  {target}", flush=True)
    if not args.keep and not args.workdir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
