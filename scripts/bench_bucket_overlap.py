"""A bucket output over a link of known speed: tokenize and ``pack --layout tokens`` written to
a local folder, and to moto's S3 server through a throttling proxy (scripts/throttle_proxy.py:
100 MB/s and 2 ms each way by default), beside the transfer alone (the local run's output put
through the same proxy with s3fs, a file at a time, as packtool puts them).

    python scripts/bench_bucket_overlap.py [--size-mb 250] [--files 8] [--repeat 3]
        [--mbps 100] [--latency-ms 2] [--before DIR] [--workdir bench-out/overlap]

Every command runs as a whole process (``python -m packtool``) into a fresh output, inputs
local (only the output goes to the bucket: this measures the upload path), the median of
``--repeat`` kept; runs of each kind are interleaved, so a change of load on a shared machine
falls on all of them. The goal (issue 34 item 4): the bucket run within 1.2x of the larger of
the local run and the transfer alone, i.e. the upload hidden behind the work or the work
behind the upload. ``--before DIR``: a worktree of another commit (``git worktree add DIR
COMMIT``) whose packtool also runs the bucket runs, in the same sitting, for a before/after.

The corpus: ``--size-mb`` of JSONL (tests/synth.py prose, as bench_tokenize.py makes it) in
``--files`` files, one part each (``--part-bytes 1``); the pack cuts shards of about a
``--files``-th of the tokens, so both commands have ``--files`` jobs to publish.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "tests"), str(ROOT)]
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"


def packtool(tree: Path, args: list, env: dict) -> float:
    """Seconds of one ``python -m packtool ARGS`` of the packtool in ``tree``."""
    env = {**env, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "packtool", *map(str, args)], cwd=tree, env=env,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"packtool {' '.join(map(str, args))} ({tree}) failed:\n{r.stderr}")
    return time.perf_counter() - t0


def split_corpus(work: Path, size_mb: int, files: int) -> Path:
    from bench_tokenize import make_corpus

    folder = work / "in"
    if folder.is_dir() and len(list(folder.iterdir())) == files:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    whole = make_corpus(work / f"corpus-{size_mb}.jsonl", size_mb)
    lines = whole.read_text().splitlines(keepends=True)
    step = -(-len(lines) // files)
    for k in range(files):  # contiguous runs of lines: parts of equal size
        (folder / f"part-{k}.jsonl").write_text("".join(lines[k * step:(k + 1) * step]))
    return folder


def transfer(fs, folder: Path, dest: str) -> float:
    """The files of ``folder`` put through the proxy, a file at a time, in packtool's
    multipart size: the bytes' own cost on this link."""
    from packtool.storage.publish import CHUNK

    files = sorted(p for p in folder.rglob("*") if p.is_file())
    t0 = time.perf_counter()
    for p in files:
        fs.put_file(str(p), f"{dest}/{p.relative_to(folder).as_posix()}", chunksize=CHUNK)
    secs = time.perf_counter() - t0
    fs.rm(dest, recursive=True)
    return secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=250)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mbps", type=float, default=100.0)
    ap.add_argument("--latency-ms", type=float, default=2.0)
    ap.add_argument("--before", type=Path, help="a worktree of the commit to compare with")
    ap.add_argument("--workdir", default="bench-out/overlap")
    args = ap.parse_args()

    from storage_server import S3Process
    from throttle_proxy import Throttle

    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    inputs = split_corpus(work, args.size_mb, args.files)
    s3 = S3Process()  # moto in a process of its own: not sharing this one's GIL
    proxy = Throttle(("127.0.0.1", s3.port), args.mbps * 1e6, args.latency_ms / 1000).start()
    try:
        _bench(args, work, inputs, s3, proxy)
    finally:
        proxy.close()
        s3.stop()


def _bench(args, work: Path, inputs: Path, s3, proxy) -> None:
    import s3fs

    options = {**s3.options, "endpoint_url": f"http://127.0.0.1:{proxy.port}"}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    bucket = s3.bucket()
    env = {**s3.env, "PACKTOOL_STORAGE_OPTIONS": json.dumps(options),
           "PACKTOOL_CACHE_DIR": str(work / "cache")}
    trees = {"bucket": ROOT, **({"bucket, before": args.before.resolve()} if args.before
                                else {})}
    tok = ["-t", TOKENIZER, "--eos", "<|eos|>", "--part-bytes", 1, "-q"]

    def fresh(out: str) -> str:
        if out.startswith("s3://"):  # a corpus's folder (.../c: ...) or a packed folder
            folder = out.rsplit("/", 1)[0] if out.endswith("/c") else out
            if fs.exists(folder):
                fs.rm(folder, recursive=True)
            fs.invalidate_cache()
        else:  # a corpus's folder (tok/c: tok/) or a packed folder, whole
            folder = Path(out).parent if Path(out).parent.name == "tok" else Path(out)
            shutil.rmtree(folder, ignore_errors=True)
            folder.parent.mkdir(parents=True, exist_ok=True)
        return out

    times: dict = {}

    def rounds(label: str, cmd, local_out: Path, files) -> None:
        for _ in range(args.repeat):  # interleaved: local, bucket (each tree), transfer
            times.setdefault((label, "local"), []).append(
                packtool(ROOT, cmd(fresh(str(local_out))), env))
            for kind, tree in trees.items():
                url = f"s3://{bucket}/{kind.replace(', ', '-')}/{local_out.name}"
                times.setdefault((label, kind), []).append(packtool(tree, cmd(fresh(url)), env))
            times.setdefault((label, "transfer"), []).append(
                transfer(fs, files(), f"{bucket}/floor"))

    corpus = work / "tok" / "c"
    rounds("tokenize", lambda out: ["tokenize", inputs, *tok, "-o", out], corpus,
           lambda: _corpus_files(corpus, work / "floor"))
    n_tokens = json.loads(corpus.with_suffix(".json").read_text())["n_tokens"]
    pk = ["-L", 2048, "--layout", "tokens", "--shard-size", -(-n_tokens // args.files), "-q"]
    rounds("pack --layout tokens", lambda out: ["pack", corpus, *pk, "-o", out],
           work / "packed", lambda: work / "packed")
    _report(args, times, trees, proxy)


def _corpus_files(prefix: Path, into: Path) -> Path:
    """The files of the corpus at ``prefix`` (hard links) in a folder of their own."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir()
    for p in prefix.parent.iterdir():
        if p.name.startswith((prefix.name, f".{prefix.name}.")) and p.is_file() \
                and not p.name.endswith(".lock"):
            os.link(p, into / p.name)
    return into


def _report(args, times: dict, trees: dict, proxy) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    size = sum(p.stat().st_size for p in (Path(args.workdir) / "in").iterdir())
    print(f"{size / 1e6:.1f} MB of JSONL in {args.files} files; link {args.mbps:g} MB/s, "
          f"{args.latency_ms:g} ms each way; medians of {args.repeat}, whole processes; "
          f"{proxy.up.bytes / 1e6:,.0f} MB carried up")
    print("| command | local | transfer alone | " + " | ".join(trees) + " | "
          + " | ".join(f"{k} / max(local, transfer)" for k in trees) + " |")
    print("|" + " --- |" * (3 + 2 * len(trees)))
    for label in ("tokenize", "pack --layout tokens"):
        floor = max(med[(label, "local")], med[(label, "transfer")])
        cells = [f"{med[(label, 'local')]:.2f} s", f"{med[(label, 'transfer')]:.2f} s"]
        cells += [f"{med[(label, k)]:.2f} s" for k in trees]
        cells += [f"{med[(label, k)] / floor:.2f}x" for k in trees]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("all runs (s): " + "; ".join(f"{a} {b}: " + ", ".join(f"{t:.2f}" for t in v)
                                       for (a, b), v in times.items()))


if __name__ == "__main__":
    main()
