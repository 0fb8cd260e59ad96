"""Benchmark `packtool tokenize` end to end, per engine, against the raw `tokenizers` batch call.

    python scripts/bench_tokenize.py [--size-mb 300] [--workdir bench-out]
        [--engines hf,fastokens,tokie,auto] [--datatrove]

Generates a synthetic JSONL corpus of --size-mb (cached in --workdir), then measures on the
same machine in the same run:
  packtool   `packtool tokenize` in a subprocess: read, parse, tokenize, write, hash (peak RSS)
  raw        Tokenizer.encode_batch_fast on the same texts already in memory, same threads
and prints packtool's throughput as a ratio to raw (target >= 0.85 with --engine hf; >= 5 with
--engine auto on byte-level BPE) and its peak RSS (target < 1 GB). `auto/check-off` runs auto
with --engine-check off: the difference to `auto` is the measured cost of the sample check.
A second, 3x larger corpus shows memory stays flat (--flat).

--datatrove also times datatrove's DocumentTokenizer on the same corpus and tokenizer. It is
installed in a throwaway venv (WORKDIR/datatrove-venv, `pip install datatrove` from the
package index, with the `tokenizers` version of this environment) so it never touches this one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"


def make_corpus(path: Path, size_mb: int, seed: int = 0) -> Path:
    if path.exists():
        return path
    from packtool.synth import iter_documents

    tmp = path.with_suffix(".tmp")
    target = size_mb * 1_000_000
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target:
            for d in iter_documents(20_000, seed=seed):
                line = json.dumps({"text": d}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(line)
                if written >= target:
                    break
            seed += 1
    tmp.rename(path)
    return path


def run_packtool(corpus: Path, out: Path, workers: int, engine: str = "hf",
                 check: str = "sample") -> tuple[float, int, int]:
    """Seconds, tokens and peak RSS (bytes) of the CLI in a fresh process."""
    cmd = [sys.executable, "-c",
           "import resource, sys, json; from packtool.cli import main; sys.argv=sys.argv[1:];"
           "\ntry: main()\nexcept SystemExit: pass\n"
           "print(json.dumps({'rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}),"
           " file=sys.stderr)",
           "packtool", "tokenize", str(corpus), "-t", str(TOKENIZER), "-o", str(out), "--overwrite",
           "-q", "--json", "-j", str(workers),
           "--engine", engine, "--engine-check", check]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - t0
    summary = json.loads(p.stdout)
    rss_kb = json.loads(p.stderr.strip().splitlines()[-1])["rss"]
    return seconds, summary["n_tokens"], rss_kb * 1024


def run_raw(corpus: Path, workers: int, batch: int = 1024,
            python_threads: bool = False) -> tuple[float, int]:
    """encode_batch_fast on in-memory texts (fresh process): with `workers` Rust (rayon)
    threads, or with `python_threads` each batch split over `workers` Python threads with the
    Rust pool off (how packtool runs it)."""
    code = f"""
import json, time, os
os.environ["RAYON_NUM_THREADS"] = "{workers}"
if {python_threads}:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
from concurrent.futures import ThreadPoolExecutor
from tokenizers import Tokenizer
tok = Tokenizer.from_file({str(TOKENIZER)!r})
texts = [json.loads(l)["text"] for l in open({str(corpus)!r}, encoding="utf-8")]
pool = ThreadPoolExecutor({workers})
enc = lambda part: sum(len(e) for e in tok.encode_batch_fast(part, add_special_tokens=False))
t0 = time.perf_counter(); n = 0
for i in range(0, len(texts), {batch}):
    b = texts[i:i + {batch}]
    if {python_threads}:
        k = -(-len(b) // {workers})
        n += sum(pool.map(enc, [b[j:j + k] for j in range(0, len(b), k)]))
    else:
        n += enc(b)
print(json.dumps({{"seconds": time.perf_counter() - t0, "tokens": n}}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    r = json.loads(p.stdout)
    return r["seconds"], r["tokens"]


DATATROVE_CODE = """
import json, sys, time, tempfile
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
from datatrove.executor import LocalPipelineExecutor
corpus, tok, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = tempfile.mkdtemp()
t0 = time.perf_counter()
LocalPipelineExecutor(pipeline=[JsonlReader(str(__import__("pathlib").Path(corpus).parent),
    glob_pattern=__import__("pathlib").Path(corpus).name),
    DocumentTokenizer(out, tokenizer_name_or_path=tok, eos_token=None, shuffle_documents=False)],
    tasks=1, workers=1, logging_dir=tempfile.mkdtemp()).run()
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def run_datatrove(corpus: Path, workdir: Path, workers: int) -> float:
    """Seconds for datatrove's DocumentTokenizer, from a throwaway venv made on first use."""
    import tokenizers

    venv = workdir / "datatrove-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "datatrove",
                        f"tokenizers=={tokenizers.__version__}"], check=True)
    p = subprocess.run([str(py), "-c", DATATROVE_CODE, str(corpus), str(TOKENIZER), str(workers)],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=300)
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--flat", action="store_true", help="also run a 3x corpus to show flat memory")
    ap.add_argument("--engines", default="hf,fastokens,tokie,auto,auto/check-off",
                    help="comma list of --engine values (/check-off: --engine-check off)")
    ap.add_argument("--datatrove", action="store_true",
                    help="also time datatrove's DocumentTokenizer (throwaway venv, see above)")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(args.workdir / f"corpus-{args.size_mb}mb.jsonl", args.size_mb)
    size = corpus.stat().st_size

    rayon_s, raw_tokens = run_raw(corpus, args.workers)
    threads_s, _ = run_raw(corpus, args.workers, python_threads=True)
    raw_s = min(rayon_s, threads_s)  # the fastest raw call is the reference
    runs = {}
    for name in args.engines.split(","):
        engine, _, check = name.partition("/")
        check = "off" if check == "check-off" else "sample"
        out = args.workdir / f"tok-{name.replace('/', '-')}"
        runs[name] = run_packtool(corpus, out, args.workers, engine, check)
        if runs[name][1] != raw_tokens:
            sys.exit(f"token counts differ: packtool {name} {runs[name][1]:,} "
                     f"vs raw {raw_tokens:,}")
    raw_tps = raw_tokens / raw_s
    print(f"corpus            {size / 1e6:,.0f} MB JSONL, {raw_tokens:,} tokens, "
          f"{args.workers} threads")
    print(f"raw encode_batch_fast, rayon threads      {rayon_s:7.1f} s  "
          f"{raw_tokens / rayon_s / 1e6:6.2f} M tok/s")
    print(f"raw encode_batch_fast, Python threads     {threads_s:7.1f} s  "
          f"{raw_tokens / threads_s / 1e6:6.2f} M tok/s")
    print("  (texts already in memory; the faster of the two is the reference)")
    print("packtool tokenize, end to end from JSONL on disk:")
    print("  engine              seconds   M tok/s   x raw   peak RSS MiB")
    for name, (s, n, peak) in runs.items():
        print(f"  {name:18s} {s:8.2f} {n / s / 1e6:9.2f} {n / s / raw_tps:7.2f} "
              f"{peak / 2**20:10.0f}")
    if args.datatrove:
        dt_s = run_datatrove(corpus, args.workdir, args.workers)
        print(f"datatrove DocumentTokenizer {dt_s:7.1f} s  {raw_tokens / dt_s / 1e6:6.2f} M tok/s;"
              + "".join(f" {k} is {dt_s / s:.2f}x faster;" for k, (s, _, _) in runs.items()))
    if args.flat:
        big = make_corpus(args.workdir / f"corpus-{3 * args.size_mb}mb.jsonl", 3 * args.size_mb,
                          seed=1000)
        s, n, rss3 = run_packtool(big, args.workdir / "tok3", args.workers)
        print(f"3x corpus ({big.stat().st_size / 1e6:,.0f} MB): {s:.1f} s, "
              f"peak RSS {rss3 / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
