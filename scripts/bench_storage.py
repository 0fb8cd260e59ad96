"""Object storage against local disk, in one run on the same data: tokenize and pack to a local
folder and to an S3 server on loopback (moto's ThreadedMotoServer, started here), and the
reader's throughput from the cache against local files.

    python scripts/bench_storage.py [--size-mb 50] [--parts 4] [--repeat 2]
                                    [--workdir bench-out/storage]

Every command runs as a whole process (``python -m packtool``: start, read, work, upload,
exit) into an output removed before each run (no resume), the fastest of ``--repeat``
kept:

    tokenize   JSONL (--parts files) -> a prefix          local -> local   vs  s3 -> s3
    pack       the prefix -> packs of 2,048, each layout  local -> local   vs  s3 -> s3

Goal (issue 21): the store's path within 1.5x of local on loopback. Then the reader: every
pack of the tokens layout read in order, from local files, then from the store through an
empty cache (first pass: fetched and verified) and again (from the cache). Prints
measurements only; moto is an in-process Python server, slower per request than S3 itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_DEFAULT_REGION": "us-east-1"}


def start_server() -> tuple[object, dict]:
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    os.environ.update(CREDENTIALS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, {"endpoint_url": f"http://127.0.0.1:{port}", "key": "bench",
                    "secret": "bench"}


def timed(args: list, env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "packtool", *map(str, args)], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"packtool {' '.join(map(str, args))} failed:\n{r.stderr}")
    return time.perf_counter() - t0


def best(n: int, fn) -> float:
    return min(fn() for _ in range(n))


def read_all(ds) -> tuple[int, float]:
    import numpy as np

    t0, n = time.perf_counter(), 0
    for i in range(len(ds)):
        n += int(np.asarray(ds[i]["input_ids"]).size)
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=50)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", default="bench-out/storage")
    args = ap.parse_args()

    import s3fs
    from bench_tokenize import make_corpus

    from packtool import open_packed
    from packtool.storage.cache import Cache

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    (work / "in").mkdir(parents=True)
    whole = make_corpus(work / "corpus.jsonl", args.size_mb)
    lines = whole.read_text().splitlines(keepends=True)
    for k in range(args.parts):
        (work / "in" / f"part-{k}.jsonl").write_text("".join(lines[k::args.parts]))
    server, options = start_server()
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    fs.put(str(work / "in"), f"{bucket}/in", recursive=True)
    env = {**os.environ, **CREDENTIALS, "PACKTOOL_STORAGE_OPTIONS": json.dumps(options),
           "PACKTOOL_CACHE_DIR": str(work / "cache")}
    tok = ["-t", TOKENIZER, "--eos", "<|eos|>", "-q"]

    def fresh(out) -> None:
        """Each timed run writes a new output (a second run over an existing one would only
        verify and skip its parts)."""
        if str(out).startswith("s3://"):
            if fs.exists(out):
                fs.rm(out, recursive=True)
            fs.invalidate_cache()
        else:
            shutil.rmtree(out, ignore_errors=True)

    def run(args: list, folder, name: str = "") -> float:
        fresh(folder)
        shutil.rmtree(work / "cache", ignore_errors=True)  # every run as on a fresh machine
        return timed([*args, "-o", f"{folder}/{name}" if name else folder], env)

    rows = []
    local = best(args.repeat, lambda: run(["tokenize", work / "in", *tok], work / "out", "c"))
    remote = best(args.repeat, lambda: run(["tokenize", f"s3://{bucket}/in", *tok],
                                           f"s3://{bucket}/out", "c"))
    rows.append(("tokenize (s3 -> s3 vs local -> local)", local, remote))
    for layout in ("index", "tokens"):
        pk = ["-L", 2048, "--layout", layout, "-q"]
        local = best(args.repeat, lambda pk=pk, layout=layout: run(
            ["pack", work / "out" / "c", *pk], work / layout))
        remote = best(args.repeat, lambda pk=pk, layout=layout: run(
            ["pack", f"s3://{bucket}/out/c", *pk], f"s3://{bucket}/{layout}"))
        rows.append((f"pack --layout {layout}", local, remote))
    def floor(gets: list[str], put: Path) -> float:
        """The transfer alone, on this server: the objects a command read fetched with
        s3fs, the folder it wrote uploaded (best of --repeat)."""
        def once() -> float:
            scratch = work / "floor"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            t0 = time.perf_counter()
            for k, key in enumerate(gets):
                fs.get(key, str(scratch / f"{k}-{Path(key).name}"))
            fs.put(str(put), f"{bucket}/floor", recursive=True)
            secs = time.perf_counter() - t0
            fs.rm(f"{bucket}/floor", recursive=True)
            shutil.rmtree(scratch)
            return secs
        return best(args.repeat, once)

    corpus = fs.find(f"{bucket}/out")
    floors = [floor(fs.find(f"{bucket}/in"), work / "out"),
              floor([k for k in corpus if not k.endswith((".bin", ".mask"))], work / "index"),
              floor(corpus, work / "tokens")]
    size = sum(p.stat().st_size for p in (work / "in").iterdir())
    print(f"{size / 1e6:.1f} MB of JSONL in {args.parts} files; fastest of {args.repeat}, "
          "whole processes")
    print("| run | local | object store | store / local | transfer alone | store / (local + "
          "transfer) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (label, a, b), f in zip(rows, floors, strict=True):
        print(f"| {label} | {a:.2f} s | {b:.2f} s | {b / a:.2f}x | {f:.2f} s | "
              f"{b / (a + f):.2f}x |")
    print("transfer alone: what the command read, fetched (s3fs get), and what it wrote, "
          "uploaded (s3fs put), on this server: the bytes' own cost, which a faster server "
          "or link shrinks; the last column is packtool's overhead beyond it")

    n, t_first = read_all(open_packed(work / "tokens"))  # files checked on first use
    _, t_local = read_all(open_packed(work / "tokens"))
    cache = Cache(work / "reader-cache")
    ds = open_packed(f"s3://{bucket}/tokens", storage_options=options, cache=cache)
    _, t_cold = read_all(ds)
    ds = open_packed(f"s3://{bucket}/tokens", storage_options=options, cache=cache)
    _, t_warm = read_all(ds)
    print(f"\nreader, {n:,} tokens in every pack of the tokens layout, in order:")
    print("| from | tokens/s | vs local |")
    print("| --- | --- | --- |")
    for label, t in (("local files, first read (crc32 of each file)", t_first),
                     ("local files", t_local),
                     ("the store, empty cache (fetch + verify)", t_cold),
                     ("the store, from the cache", t_warm)):
        print(f"| {label} | {n / t / 1e6:.1f}M | {t_local / t:.2f}x |")
    server.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
