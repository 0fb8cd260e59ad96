"""Benchmark `packtool tokenize` end to end, per engine, against a minimal gigatoken script,
the raw `tokenizers` batch call and datatrove's DocumentTokenizer.

    python scripts/bench_tokenize.py --issue22 [--datatrove] [--size-mb 50] [--repeat 3]
        [--slow-repeat N] [--shapes 1,4,2000] [--check-cost]   # prose + code, 1/4/2,000
        # files, the 70k byte-level BPE of bench_corpora.py, every engine, the gigatoken
        # script, datatrove
    python scripts/bench_tokenize.py [--size-mb 100] [--corpora prose,mixed] [--repeat 3]
        [--workdir bench-out] [--engines hf,fastokens,tokie,auto,auto/check-off,auto/check-full]
        [--datatrove] [--flat]

--issue22: corpora from bench_corpora.py (prose: synth text with mixed scripts; code: this
Python's standard library), each as 1 file, 4 files and 2,000 files of the same records;
per shape, interleaved, whole processes: packtool with each --engine, and
`gigatoken-script` (GIGATOKEN_CODE below: encode_files on the JSONL files, write .bin and
boundaries, as the issue's 10-line script). The token streams of every run are compared
(byte-identical to --engine hf, and the script's to packtool's); ratios are wall time (and
CPU time) over the gigatoken script's and datatrove's; auto with --engine-check off gives the
sample check's cost (--check-cost: its own CPU, measured directly); a last table checks the
issue's targets. --slow-repeat: fewer repeats
of --engine hf and datatrove, which take 20-60 s a run here (the ratios rest on the fast runs).

Generates synthetic JSONL corpora of --size-mb (cached in --workdir): `prose` (tests/synth.py:
Zipf words from a 20k vocabulary, some accented/CJK/emoji words) and `mixed` (the same with one
word in five replaced by random characters of Latin, Cyrillic, CJK, Arabic, emoji or digits,
and indented lines: far fewer repeated words, so BPE caches help less). Then, on the same
machine in the same run, with the same threads:
  packtool   `packtool tokenize` in a fresh process: start, read, parse, tokenize, check, write,
             hash, exit (wall seconds, CPU seconds, peak RSS)
  raw        Tokenizer.encode_batch_fast on the same texts already in memory
  datatrove  (--datatrove) JsonlReader + DocumentTokenizer (shuffle off, eos off) in a fresh
             process of a throwaway venv, WORKDIR/datatrove-venv (`pip install datatrove orjson
             tokenizers==<this environment's>` from the package index, never touching this one),
             RAYON_NUM_THREADS = --workers
Each run is repeated --repeat times; the fastest wall time is kept (CPU is that run's). Ratios
are tokens/s over the raw call's tokens/s (target: >= 5 with --engine auto on byte-level BPE).
On a shared machine, wall times move with other load; the CPU column (user + sys of the whole
process) does not, and `x raw (CPU)` compares tokens per CPU second.
`auto/check-off` runs auto with --engine-check off, `auto/check-full` with full: the differences
to `auto` are the measured costs of the sample and full checks. --flat runs a 3x corpus to
show that memory stays flat.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"
from bench_corpora import mixed_scripts  # noqa: E402  (the prose of both benchmarks)


def make_corpus(path: Path, size_mb: int, seed: int = 0, kind: str = "prose") -> Path:
    if path.exists():
        return path
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import iter_documents

    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    target = size_mb * 1_000_000
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target:
            for d in iter_documents(20_000, seed=seed):
                if kind == "mixed":
                    d = mixed_scripts(d, rng)
                line = json.dumps({"text": d}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(line.encode("utf-8"))
                if written >= target:
                    break
            seed += 1
    tmp.rename(path)
    return path


TIME = "/usr/bin/time"  # GNU time: the peak RSS of the process it starts


def timed(cmd: list, env: dict | None = None, cwd=None) -> dict:
    """Run ``cmd`` to its end: wall seconds, the CPU seconds (user + sys) of that process
    alone (``os.wait4``) and its peak RSS (GNU time's %M: a child forked from this process
    carries this process's peak over exec, and RUSAGE_CHILDREN's is the largest of every
    child so far), its output and exit code."""
    wrap = [TIME, "-f", "peak-rss-kib %M"] if os.path.exists(TIME) else []
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(wrap + cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, ru = os.wait4(p.pid, 0)
        seconds = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stderr = err.read().decode()
        rss = float("nan")
        if wrap and stderr.rstrip().rsplit("\n", 1)[-1].startswith("peak-rss-kib "):
            stderr, _, last = stderr.rstrip().rpartition("\n")
            rss = int(last.split()[1]) * 1024
        return {"seconds": seconds, "cpu": ru.ru_utime + ru.ru_stime, "rss": rss,
                "stdout": out.read().decode(), "stderr": stderr, "returncode": p.returncode}


def run_packtool(corpus: Path, out: Path, workers: int, engine: str = "hf",
                 check: str = "sample", tokenizer: Path = TOKENIZER) -> dict:
    """Wall seconds, CPU seconds, tokens and peak RSS of the CLI in a fresh process, writing
    prefix ``out/tok`` in the emptied folder ``out``: a finished part left by the previous
    repeat would be skipped as a resume (--overwrite keeps verified parts of the same plan)
    and timed as a run."""
    shutil.rmtree(out, ignore_errors=True)
    out = out / "tok"
    cmd = [sys.executable, "-m", "packtool", "tokenize", str(corpus), "-t", str(tokenizer),
           "-o", str(out), "--overwrite", "-q", "--json", "-j", str(workers), "--engine", engine,
           "--engine-check", check]
    p = timed(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p["returncode"] or not p["stdout"].strip():
        sys.exit(f"packtool --engine {engine} failed:\n{p['stderr'][-3000:]}")
    summary = json.loads(p["stdout"])
    if summary["n_parts_skipped"]:
        sys.exit(f"packtool --engine {engine} skipped parts of {out}: not a timed run")
    meta = json.loads(out.with_suffix(".json").read_text())
    return {"seconds": p["seconds"], "cpu": p["cpu"], "tokens": summary["n_tokens"],
            "rss": p["rss"], "engine": meta["engine"], "prefix": out}


def run_raw(corpus: Path, workers: int, batch: int = 1024, python_threads: bool = False) -> dict:
    """encode_batch_fast on in-memory texts (fresh process): with `workers` Rust (rayon)
    threads, or with `python_threads` each batch split over `workers` Python threads with the
    Rust pool off (how packtool runs it). Timed from the first batch (no parsing)."""
    code = f"""
import json, time, os, resource
os.environ["RAYON_NUM_THREADS"] = "{workers}"
if {python_threads}:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
from concurrent.futures import ThreadPoolExecutor
from tokenizers import Tokenizer
tok = Tokenizer.from_file({str(TOKENIZER)!r})
texts = [json.loads(line)["text"] for line in open({str(corpus)!r}, encoding="utf-8")]
pool = ThreadPoolExecutor({workers})
enc = lambda part: sum(len(e) for e in tok.encode_batch_fast(part, add_special_tokens=False))
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
t0, c0 = time.perf_counter(), cpu()
n = 0
for i in range(0, len(texts), {batch}):
    b = texts[i:i + {batch}]
    if {python_threads}:
        k = -(-len(b) // {workers})
        n += sum(pool.map(enc, [b[j:j + k] for j in range(0, len(b), k)]))
    else:
        n += enc(b)
print(json.dumps({{"seconds": time.perf_counter() - t0, "cpu": cpu() - c0, "tokens": n}}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


DATATROVE_CODE = """
import json, sys, time, tempfile
from pathlib import Path
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
corpus, tok = Path(sys.argv[1]), sys.argv[2]
out = tempfile.mkdtemp(prefix="dt-out-")
t0 = time.perf_counter()
dt = DocumentTokenizer(out, tokenizer_name_or_path=tok, eos_token=None, shuffle_documents=False)
LocalPipelineExecutor(
    pipeline=[JsonlReader(str(corpus), glob_pattern="*.jsonl", text_key="text") if corpus.is_dir()
              else JsonlReader(str(corpus.parent), glob_pattern=corpus.name, text_key="text"),
              dt],
    tasks=1, workers=1, logging_dir=tempfile.mkdtemp(prefix="dt-logs-"),
    skip_completed=False).run()
seconds = time.perf_counter() - t0
tokens = sum(p.stat().st_size for p in Path(out).rglob("*.ds")) // dt.token_size
import resource
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": seconds, "tokens": tokens, "rss": ru.ru_maxrss * 1024,
                  "cpu": ru.ru_utime + ru.ru_stime}))
"""


def run_datatrove(corpus: Path, workdir: Path, workers: int, tokenizer: Path = TOKENIZER) -> dict:
    """datatrove's DocumentTokenizer from a throwaway venv made on first use. It calls
    ``encode_batch`` (offsets included) with the tokenizer's post-processor on, so it writes
    one more token per document here (the fixture's ``<|bos|>``)."""
    import tokenizers

    venv = workdir / "datatrove-venv"
    py = venv / "bin" / "python"
    if not (venv / "ok").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        # orjson: datatrove's JsonlReader refuses to run without it
        p = subprocess.run([str(py), "-m", "pip", "install", "-q", "datatrove", "orjson",
                            f"tokenizers=={tokenizers.__version__}"], capture_output=True,
                           text=True)
        if p.returncode:
            sys.exit(f"cannot install datatrove in {venv}:\n{p.stderr[-3000:]}")
        (venv / "ok").touch()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["RAYON_NUM_THREADS"] = str(workers)
    p = timed([str(py), "-c", DATATROVE_CODE, str(corpus), str(tokenizer)], env=env, cwd=workdir)
    if p["returncode"]:
        sys.exit(f"datatrove failed:\n{p['stderr'][-3000:]}")
    r = json.loads(p["stdout"].strip().splitlines()[-1])
    return {**r, "seconds": p["seconds"], "cpu": p["cpu"], "rss": p["rss"]}  # whole process


def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["seconds"])


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the lower middle of an even count)."""
    return sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]


def bench_corpus(kind: str, args) -> None:
    corpus = make_corpus(args.workdir / f"corpus-{kind}-{args.size_mb}mb.jsonl", args.size_mb,
                         kind=kind)
    size = corpus.stat().st_size
    raws = {"rayon threads": best([run_raw(corpus, args.workers) for _ in range(args.repeat)]),
            "Python threads": best([run_raw(corpus, args.workers, python_threads=True)
                                    for _ in range(args.repeat)])}
    raw = min(raws.values(), key=lambda r: r["seconds"])  # the fastest raw call is the reference
    raw_tps, raw_cps = raw["tokens"] / raw["seconds"], raw["tokens"] / raw["cpu"]
    names = args.engines.split(",")
    tries: dict[str, list] = {n: [] for n in names}
    for _ in range(args.repeat):  # interleaved, so slow spells of a shared machine spread out
        for name in names:
            engine, _, check = name.partition("/")
            check = check.removeprefix("check-") or "sample"
            out = args.workdir / f"tok-{kind}-{name.replace('/', '-')}"
            tries[name].append(run_packtool(corpus, out, args.workers, engine, check))
    runs = {n: best(r) for n, r in tries.items()}
    for name, r in runs.items():
        if r["tokens"] != raw["tokens"]:
            sys.exit(f"token counts differ: packtool {name} {r['tokens']:,} "
                     f"vs raw {raw['tokens']:,}")
    if args.datatrove:
        runs["datatrove"] = best([run_datatrove(corpus, args.workdir, args.workers)
                                  for _ in range(args.repeat)])
        runs["datatrove"]["engine"] = {"name": "tokenizers encode_batch (datatrove)"}

    print(f"\n== corpus {kind}: {size / 1e6:,.0f} MB JSONL, {raw['tokens']:,} tokens, "
          f"{args.workers} threads, best of {args.repeat}")
    for label, r in raws.items():
        print(f"raw encode_batch_fast, {label:15s} {r['seconds']:7.2f} s  "
              f"{r['tokens'] / r['seconds'] / 1e6:6.2f} M tok/s  CPU {r['cpu']:6.2f} s")
    print("  (texts already in memory; the faster of the two is the reference)")
    print("end to end from JSONL on disk (process start to exit):")
    dt = runs.get("datatrove")
    print(f"  {'run':16s} {'engine':10s} {'wall s':>7s} {'M tok/s':>8s} {'x raw':>6s} "
          f"{'x dtrove':>8s} {'CPU s':>6s} {'x raw CPU':>9s} {'RSS MiB':>8s}  checked")
    for name, r in runs.items():
        tps = r["tokens"] / r["seconds"]
        vs_dt = f"{tps / (dt['tokens'] / dt['seconds']):8.2f}" if dt else f"{'':8s}"
        e = r["engine"]
        checked = (f"{e['checked_docs']:,} docs / {e['checked_tokens']:,} tokens"
                   if "checked_docs" in e else "-")
        print(f"  {name:16s} {e['name'][:10]:10s} {r['seconds']:7.2f} {tps / 1e6:8.2f} "
              f"{tps / raw_tps:6.2f} {vs_dt} {r['cpu']:6.2f} "
              f"{r['tokens'] / r['cpu'] / raw_cps:9.2f} {r['rss'] / 2**20:8.0f}  {checked}")
    for name in ("auto/check-off", "auto/check-full"):
        if "auto" in runs and name in runs:
            a, b = runs["auto"], runs[name]
            print(f"  auto (sample check) - {name}: wall {a['seconds'] - b['seconds']:+.2f} s, "
                  f"CPU {a['cpu'] - b['cpu']:+.2f} s")
    if args.flat:
        big = make_corpus(args.workdir / f"corpus-{kind}-{3 * args.size_mb}mb.jsonl",
                          3 * args.size_mb, seed=1000, kind=kind)
        r = run_packtool(big, args.workdir / "tok3", args.workers, "auto")
        print(f"  3x corpus ({big.stat().st_size / 1e6:,.0f} MB), auto: {r['seconds']:.1f} s, "
              f"peak RSS {r['rss'] / 2**20:.0f} MiB")



GIGATOKEN_CODE = """
import sys, glob, os, numpy as np, gigatoken as gt
src, tok, out = sys.argv[1], sys.argv[2], sys.argv[3]
files = sorted(glob.glob(os.path.join(src, "*.jsonl"))) if os.path.isdir(src) else [src]
a = gt.Tokenizer(tok).encode_files(gt.JsonlFileSource(files, field="text"))
ids, offsets = a.layout.content.data, a.layout.offsets.data
ids[offsets[0]:offsets[-1]].astype(np.uint32).tofile(out + ".bin")
offsets.astype(np.int64).tofile(out + ".boundaries")
"""


def run_gigatoken_script(src: Path, tokenizer: Path, out: Path) -> dict:
    p = timed([sys.executable, "-c", GIGATOKEN_CODE, str(src), str(tokenizer), str(out)])
    if p["returncode"]:
        sys.exit(f"gigatoken script failed:\n{p['stderr'][-3000:]}")
    ids = np.fromfile(f"{out}.bin", np.uint32)
    return {"seconds": p["seconds"], "cpu": p["cpu"], "rss": p["rss"], "tokens": len(ids),
            "digest": hashlib.sha256(ids.tobytes()).hexdigest(), "engine": {"name": "gigatoken"}}


def _digest(prefix: Path) -> str:
    """sha256 of a token corpus's ids as one uint32 stream (whatever dtype and parts)."""
    import packtool

    c = packtool.open_tokens(prefix)
    h = hashlib.sha256()
    for i in range(len(c)):
        h.update(np.asarray(c[i], np.uint32).tobytes())
    return h.hexdigest()


def _issue22_shape(src: Path, kind: str, n: int, tok: Path, names: list, args) -> dict:
    """Every run of one corpus shape, interleaved (whole processes): the fastest of
    ``--repeat`` each (``--median``: the median run), hf and datatrove the fastest of
    ``--slow-repeat``."""
    slow, label = {"hf"}, f"{kind}-{n}"
    tries: dict[str, list] = {k: [] for k in ["gigatoken-script", *names]}
    for rep in range(args.repeat):
        out = args.workdir / f"gt-{label}"
        tries["gigatoken-script"].append(run_gigatoken_script(src, tok, out))
        for name in names:
            if name in slow and rep >= args.slow_repeat:
                continue
            engine, _, check = name.partition("/")
            check = check.removeprefix("check-") or "sample"
            out = args.workdir / f"tok-{label}-{name.replace('/', '-')}"
            r = run_packtool(src, out, args.workers, engine, check, tok)
            r["digest"] = _digest(r["prefix"])
            tries[name].append(r)
    pick = median_run if args.median else best
    runs = {k: pick(v) for k, v in tries.items()}
    if args.datatrove and n <= 4:
        runs["datatrove"] = best([run_datatrove(src, args.workdir, args.workers, tok)
                                  for _ in range(args.slow_repeat)])
        runs["datatrove"]["engine"] = {"name": "tokenizers (datatrove)"}
    return runs


def _print_shape(title: str, runs: dict) -> None:
    from packtool.engines import engine_summary

    ref = runs.get("hf", runs["gigatoken-script"])
    g, dt = runs["gigatoken-script"], runs.get("datatrove")
    print(f"\n== {title}, {g['tokens']:,} tokens")
    print(f"  {'run':18s} {'wall s':>7s} {'x gt-script':>11s} {'x dtrove':>8s} "
          f"{'CPU s':>6s} {'CPU x gt':>8s} {'RSS MiB':>7s}  same tokens  engine")
    for name, r in runs.items():
        same = "-" if "digest" not in r else ("yes" if r["digest"] == ref["digest"] else "NO")
        vs_dt = f"{dt['seconds'] / r['seconds']:8.2f}" if dt else f"{'':8s}"
        e = r["engine"]
        what = (engine_summary(e) if "version" in e else e["name"])[:100]
        print(f"  {name:18s} {r['seconds']:7.2f} {r['seconds'] / g['seconds']:11.2f} {vs_dt} "
              f"{r['cpu']:6.2f} {r['cpu'] / g['cpu']:8.2f} {r['rss'] / 2**20:7.0f}  {same:11s}"
              f"  {what}")
        if same == "NO":
            print(f"  !! {name}: different tokens from --engine hf")
    if "auto" in runs and "auto/check-off" in runs:
        a, b = runs["auto"], runs["auto/check-off"]
        wall = a["seconds"] - b["seconds"]
        print(f"  the sample check (auto - auto/check-off): wall {wall:+.2f} s"
              f" ({wall / a['seconds']:+.0%} of auto), CPU "
              f"{a['cpu'] - b['cpu']:+.2f} s ({(a['cpu'] - b['cpu']) / a['cpu']:+.0%})")


def check_cost(corpus: Path, tok: Path, workers: int, workdir: Path) -> None:
    """The sample check's own cost: the reference (`tokenizers`, its thread pool off, as on
    packtool's checker threads) re-encoding exactly the documents the check picks, CPU
    seconds in this process, against the CPU of a whole ``--engine auto`` run."""
    import resource

    import orjson
    from tokenizers import Tokenizer

    from packtool.engines import sample_picks

    texts = [orjson.loads(line)["text"] for line in corpus.open("rb")]
    sizes = np.array([len(t.encode("utf-8", "surrogatepass")) for t in texts], np.int64)
    picks, state = sample_picks(0, sizes)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    ref = Tokenizer.from_file(str(tok))
    sub = [texts[i] for i in picks]
    cpu = []
    for _ in range(3):
        c0 = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        ref.encode_batch_fast(sub, add_special_tokens=False)
        cpu.append(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) - c0)
    auto = best([run_packtool(corpus, workdir / "tok-check-cost", workers, "auto", "sample", tok)
                 for _ in range(3)])
    print(f"  {corpus.name}: the check re-encodes {len(picks)} of {len(sizes):,} documents, "
          f"{state.checked:,} of {state.seen:,} bytes ({state.checked / state.seen:.2%}): "
          f"{min(cpu):.3f} s of reference CPU = {min(cpu) / auto['cpu']:.1%} of a whole auto "
          f"run's {auto['cpu']:.2f} s CPU ({auto['seconds']:.2f} s wall)")


def bench_issue22(args) -> None:
    from bench_corpora import bpe_tokenizer, code_corpus, prose_corpus, split_files

    tok = args.tokenizer.resolve() if args.tokenizer else bpe_tokenizer(args.workdir)
    names = args.engines.split(",")
    summary = []
    if args.check_cost:
        print(f"== the sample check's own cost (load {os.getloadavg()})")
        for make in (prose_corpus, code_corpus):
            check_cost(make(args.workdir, args.size_mb), tok, args.workers, args.workdir)
        return
    which = "median" if args.median else "fastest"
    print(f"load before: {os.getloadavg()}; {args.workers} threads; {which} of {args.repeat} "
          f"(hf, datatrove: of {args.slow_repeat})")
    for kind, make in (("prose", prose_corpus), ("code", code_corpus)):
        if kind not in args.kinds.split(","):
            continue
        one = make(args.workdir, args.size_mb)
        for n in (int(x) for x in args.shapes.split(",")):
            src = one if n == 1 else split_files(one, n)
            runs = _issue22_shape(src, kind, n, tok, names, args)
            _print_shape(f"{kind}, {n} file(s), {one.stat().st_size / 1e6:,.0f} MB", runs)
            summary.append((f"{kind} x{n}", runs))
    print(f"\n== targets (load now {os.getloadavg()})")
    print(f"  {'shape':12s} {'auto / gt-script':>16s} {'(CPU)':>6s} {'datatrove / auto':>16s} "
          f"{'check, % of auto wall':>22s} {'(CPU)':>6s}")
    for shape, runs in summary:
        a, g, dt = runs.get("auto"), runs["gigatoken-script"], runs.get("datatrove")
        off = runs.get("auto/check-off")
        if a is None:
            continue
        print(f"  {shape:12s} {a['seconds'] / g['seconds']:16.2f} {a['cpu'] / g['cpu']:6.2f} "
              + (f"{dt['seconds'] / a['seconds']:16.2f}" if dt else f"{'-':>16s}")
              + (f" {(a['seconds'] - off['seconds']) / a['seconds']:22.1%}"
                 f" {(a['cpu'] - off['cpu']) / a['cpu']:6.1%}" if off else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=100)
    ap.add_argument("--corpora", default="prose,mixed")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--slow-repeat", type=int, default=None,
                    help="--issue22: repeats of --engine hf and datatrove (20-60 s a run here; "
                         "default: --repeat)")
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--flat", action="store_true", help="also run a 3x corpus to show flat memory")
    ap.add_argument("--engines", default="hf,fastokens,tokie,auto,auto/check-off,auto/check-full",
                    help="comma list of --engine values (/check-off, /check-full: --engine-check)")
    ap.add_argument("--datatrove", action="store_true",
                    help="also time datatrove's DocumentTokenizer (throwaway venv, see above)")
    ap.add_argument("--issue22", action="store_true",
                    help="prose and code corpora, 1/4/2,000 files, the gigatoken script (above)")
    ap.add_argument("--shapes", default="1,4,2000", help="--issue22: numbers of files")
    ap.add_argument("--kinds", default="prose,code", help="--issue22: corpora")
    ap.add_argument("--median", action="store_true",
                    help="--issue22: the median run of --repeat (default: the fastest)")
    ap.add_argument("--check-cost", action="store_true",
                    help="--issue22: only the sample check's own CPU (the reference on exactly "
                         "the documents it picks) against a whole auto run, per corpus")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="--issue22: tokenizer (default: the 70k BPE of bench_corpora.py)")
    args = ap.parse_args()
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    # packtool's bytecode, as an installed package has it: with PYTHONDONTWRITEBYTECODE set
    # (as here) a checkout is compiled again by every process, ~0.1 s of CPU each
    compileall.compile_dir(ROOT / "packtool", quiet=1)
    if args.issue22:
        if args.engines == ap.get_default("engines"):
            args.engines = "auto,auto/check-off,hf,gigatoken,fastokens,tokie"
        args.slow_repeat = args.slow_repeat or args.repeat
        if args.size_mb == ap.get_default("size_mb"):
            args.size_mb = 50
        bench_issue22(args)
        return
    for kind in args.corpora.split(","):
        bench_corpus(kind, args)


if __name__ == "__main__":
    main()
