"""The JSONL reader's cost, before and after a change, in the same run (issue 34, item 1).

    python scripts/bench_jsonl.py [--before REV] [--size-mb 50] [--repeat 5] [--tokenize]
        [--workdir bench-out/jsonl]

Corpora from bench_corpora.py: prose (short records, ~2 kB, mixed scripts) and code (long
records, ~18 kB, Python source). ``--before REV`` (default: the merge base with main) is
checked out with ``git archive`` beside this tree; each measure runs in a fresh process with
``PYTHONPATH`` at one tree or the other, the two interleaved, ``--repeat`` times:

  reader     what the tokenize pipeline's reader thread does: ``pipeline.Reader`` (parse,
             the text field, UTF-8 sizes, batches, the file's crc32 and identity), its
             batches dropped as they come, CPU seconds of the process (the best of passes 2
             and 3: the first pays for the fresh process's memory) -> MB/s per core
  parsers    (this tree only) the text field of each line by json.loads, orjson and, if
             importable, msgspec with a one-field Struct (no checks, lines in memory)
  tokenize   (--tokenize) ``packtool tokenize --engine gigatoken --engine-check off -j 2``,
             whole process (wall, CPU of the process); ``engine``: the gigatoken adapter
             alone encoding the same texts in memory, in the pipeline's batches, on 2
             threads; ``beyond`` = tokenize CPU - engine CPU, per MB: what packtool costs
             beyond the engine (start-up, reader, writer, hashes, commit); and that less
             the fixed cost (the same command on a one-record file): the per-byte part

Medians of the repeats (the machine is shared: the load is printed before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
from bench_tokenize import timed  # noqa: E402

READER = """
import json, sys, threading, time
from pathlib import Path
from packtool.sources import ReadOptions
from packtool.tokenize import pipeline
def run():
    r = pipeline.Reader([Path(sys.argv[1])], ReadOptions(), 1024, 8 << 20, maxsize=4)
    t, c = time.perf_counter(), time.process_time()
    r.start()
    while r.queue.get() is not pipeline._DONE:  # batches dropped as the pipeline's are
        pass
    r.join()
    return {"cpu": time.process_time() - c, "wall": time.perf_counter() - t,
            "docs": r.stats[0].n_docs}
runs = [run() for _ in range(3)]  # the first pays for the process's fresh memory
print(json.dumps(sorted(runs[1:], key=lambda r: r["cpu"])[0]))
"""

PARSERS = """
import json, sys, time
from pathlib import Path
lines = Path(sys.argv[1]).read_bytes().splitlines()
def cpu(f):
    c = time.process_time(); f(); return time.process_time() - c
out = {"json.loads": cpu(lambda: [json.loads(x)["text"] for x in lines])}
import orjson
out["orjson"] = cpu(lambda: [orjson.loads(x)["text"] for x in lines])
try:
    import msgspec
except ImportError:
    pass
else:
    class T(msgspec.Struct):
        text: str
    dec = msgspec.json.Decoder(T)
    out["msgspec Struct"] = cpu(lambda: [dec.decode(x).text for x in lines])
print(json.dumps(out))
"""

ENGINE = """
import json, sys, threading, time, os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import numpy as np, orjson
from tokenizers import Tokenizer
from packtool.engines import gigatoken
os.environ["TOKENIZERS_PARALLELISM"] = "false"
texts = [orjson.loads(x)["text"] for x in Path(sys.argv[1]).read_bytes().splitlines()]
enc = gigatoken.load(None, Tokenizer.from_file(sys.argv[2])).encode
batches = [texts[i:i + 1024] for i in range(0, len(texts), 1024)]
c, t = time.process_time(), time.perf_counter()
with ThreadPoolExecutor(2) as pool:
    n = sum(int(lengths.sum()) for lengths, _ in pool.map(
        lambda b: enc(b, False, np.uint32), batches))
print(json.dumps({"cpu": time.process_time() - c, "wall": time.perf_counter() - t,
                  "tokens": n}))
"""


def child(code: str, tree: Path, *args) -> dict:
    path = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])  # msgspec's there
    env = {**os.environ, "PYTHONPATH": path}
    # run outside both trees: "-c" puts the working directory first on the path
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env,
                       capture_output=True, text=True, cwd=tree.parent)
    if p.returncode:
        sys.exit(f"a child in {tree} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def checkout(rev: str, workdir: Path) -> Path:
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], capture_output=True,
                         text=True, check=True).stdout.strip()
    tree = workdir / f"tree-{sha[:10]}"
    if not tree.exists():
        tmp = Path(tempfile.mkdtemp(dir=workdir))
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "packtool"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        tmp.rename(tree)
    return tree


def tokenize(tree: Path, corpus: Path, tok: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "packtool", "tokenize", str(corpus), "-t", str(tok), "-o",
           str(out / "tok"), "-q", "--json", "-j", "2", "--engine", "gigatoken",
           "--engine-check", "off"]
    p = timed(cmd, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree.parent)
    if p["returncode"]:
        sys.exit(f"packtool tokenize in {tree} failed:\n{p['stderr'][-3000:]}")
    digest = subprocess.run(["sha256sum", *sorted(map(str, out.glob("tok*.bin")))],
                            capture_output=True, text=True).stdout.split()[::2]
    return {"cpu": p["cpu"], "wall": p["seconds"], "digest": digest}


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default=None, help="revision to compare (default: merge base "
                    "with main)")
    ap.add_argument("--size-mb", type=float, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokenize", action="store_true")
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out" / "jsonl")
    a = ap.parse_args()
    from bench_corpora import bpe_tokenizer, code_corpus, prose_corpus

    a.workdir.mkdir(parents=True, exist_ok=True)
    before = a.before or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
                                        capture_output=True, text=True).stdout.strip()
    trees = {"before": checkout(before, a.workdir), "after": ROOT}
    corpora = {"prose": prose_corpus(a.workdir, a.size_mb),
               "code": code_corpus(a.workdir, a.size_mb)}
    print(f"before = {before[:10]}, after = this tree; medians of {a.repeat}; "
          f"load {os.getloadavg()}")
    print("\n| corpus | parser | MB/s per core (lines in memory, text field only) |")
    print("| --- | --- | --- |")
    for name, corpus in corpora.items():
        mb = corpus.stat().st_size / 1e6
        runs = [child(PARSERS, ROOT, corpus) for _ in range(a.repeat)]
        for parser in runs[0]:
            print(f"| {name} | {parser} | {mb / med(runs, parser):,.0f} |")
    print("\n| corpus | MB | reader before: CPU s, MB/s | after: CPU s, MB/s | after / before |")
    print("| --- | --- | --- | --- | --- |")
    for name, corpus in corpora.items():
        mb = corpus.stat().st_size / 1e6
        runs: dict[str, list] = {k: [] for k in trees}
        for _ in range(a.repeat):
            for k, tree in trees.items():
                runs[k].append(child(READER, tree, corpus))
        b, f = med(runs["before"], "cpu"), med(runs["after"], "cpu")
        print(f"| {name} | {mb:.0f} | {b:.3f}, {mb / b:,.0f} | {f:.3f}, {mb / f:,.0f} | "
              f"{f / b:.2f} |")
    if a.tokenize:
        tok = bpe_tokenizer(a.workdir)
        one = a.workdir / "one-record.jsonl"
        one.write_text('{"text": "hello"}\n')
        fixed = {k: med([tokenize(tree, one, tok, a.workdir / "out-one") for _ in
                         range(a.repeat)], "cpu") for k, tree in trees.items()}
        print("\nfixed cost (one record: start-up, tokenizer and engine load, commit): CPU s "
              + ", ".join(f"{k} {v:.2f}" for k, v in fixed.items()))
        print("\n| corpus | run | wall s | CPU s | engine CPU s | beyond the engine: CPU s, "
              "ms/MB | less the fixed cost: ms/MB |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, corpus in corpora.items():
            mb = corpus.stat().st_size / 1e6
            runs = {k: [] for k in [*trees, "engine"]}
            for _ in range(a.repeat):
                for k, tree in trees.items():
                    runs[k].append(tokenize(tree, corpus, tok, a.workdir / f"out-{k}"))
                runs["engine"].append(child(ENGINE, ROOT, corpus, tok))
            digests = {tuple(r["digest"]) for k in trees for r in runs[k]}
            if len(digests) != 1:
                sys.exit(f"{name}: the token files differ between runs: {digests}")
            eng = med(runs["engine"], "cpu")
            for k in trees:
                cpu = med(runs[k], "cpu")
                print(f"| {name} | {k} | {med(runs[k], 'wall'):.2f} | {cpu:.2f} | {eng:.2f} | "
                      f"{cpu - eng:.2f}, {(cpu - eng) / mb * 1e3:.1f} | "
                      f"{(cpu - eng - fixed[k]) / mb * 1e3:.1f} |")
    print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
