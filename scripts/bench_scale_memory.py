"""Memory and time of ``pack`` and ``verify --source`` at 1e7 and 1e8 documents (issue 20).

    python scripts/bench_scale_memory.py [--sizes 10000000,100000000] [--group 100000]

Synthetic token corpora of short documents (lognormal, median 20 tokens, written without a
tokenizer by ``tests/synth.py.write_token_corpus``, cached in ``--workdir``). For each size:
peak anonymous memory (RssAnon, sampled; the corpus's memory maps are not counted) and wall
time of ``pack`` (index and tokens layouts, global and ``--group-docs``) and ``verify
--source`` of both layouts' global datasets; then the slope between the sizes in bytes per
document and its projection to 1e10 documents, and each run's load average (2 cores,
shared: timings under load > 2 include contention; memory does not). Also the re-pack: the
index-layout dataset made again at another ``--seq-len``, the corpus untouched (its files'
mtimes are checked). Large corpora stay in ``--workdir``: delete it afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from peak_memory import measure  # noqa: E402


def corpus(work: Path, n: int) -> Path:
    prefix = work / f"c{n}"
    if not Path(f"{prefix}.json").exists():
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
        from synth import lognormal_lengths, write_token_corpus

        for s in (".json", ".bin", ".boundaries"):
            Path(f"{prefix}{s}").unlink(missing_ok=True)
        write_token_corpus(prefix, lognormal_lengths(n, median=20, sigma=0.8, cap=2048,
                                                     seed=n % 1000))
    return prefix


def run(args: list[str]) -> tuple[float, float, float]:
    """(peak anonymous bytes, seconds, load average at the end) of ``packtool ARGS``."""
    kib, seconds, rc = measure([sys.executable, "-m", "packtool", *args])
    if rc:
        raise SystemExit(f"packtool {' '.join(args)} failed ({rc})")
    return kib * 1024, seconds, os.getloadavg()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000000,100000000")
    ap.add_argument("--group", type=int, default=100_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--workdir", default=str(ROOT / "bench-out" / "scale-memory"))
    ap.add_argument("--only", default="",
                    help="comma-separated words: run only the rows whose name has one "
                         "(e.g. group,verify); the re-pack runs when 'repack' is one")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in a.sizes.split(",")]
    cases = [("pack, index layout", ["--layout", "index"]),
             ("pack, tokens layout", ["--layout", "tokens"]),
             (f"pack, index layout, --group-docs {a.group:,}",
              ["--layout", "index", "--group-docs", str(a.group)]),
             (f"pack, tokens layout, --group-docs {a.group:,}",
              ["--layout", "tokens", "--group-docs", str(a.group)])]
    only = [w for w in a.only.split(",") if w]

    def wanted(name: str) -> bool:
        return not only or any(w in name for w in only)

    table: dict[str, dict[int, tuple[float, float, float]]] = {}
    for n in sizes:
        src = corpus(work, n)
        verify = wanted("verify")
        for name, extra in cases:
            if not wanted(name) and not (verify and "group" not in name):
                continue
            out = work / f"p{n}"
            shutil.rmtree(out, ignore_errors=True)
            table.setdefault(name, {})[n] = run(["pack", str(src), "-L", str(a.seq_len), "-o",
                                                 str(out), "-q", *extra])
            print(f"{name}, {n:.0e} documents: {table[name][n][0] / 2**20:,.0f} MiB, "
                  f"{table[name][n][1]:.1f} s, load {table[name][n][2]:.1f}", flush=True)
            if "group" not in name:
                keep = work / f"p{n}-{extra[1]}"
                shutil.rmtree(keep, ignore_errors=True)
                out.rename(keep)
        for layout in ("index", "tokens") if verify else ():
            name = f"verify --source ({layout} layout)"
            table.setdefault(name, {})[n] = run(["verify", str(work / f"p{n}-{layout}"),
                                                 "--source", str(src)])
            print(f"{name}, {n:.0e} documents: {table[name][n][0] / 2**20:,.0f} MiB, "
                  f"{table[name][n][1]:.1f} s, load {table[name][n][2]:.1f}", flush=True)
            shutil.rmtree(work / f"p{n}-{layout}", ignore_errors=True)
        shutil.rmtree(work / f"p{n}", ignore_errors=True)
    print("\n| run | " + " | ".join(f"{n:.0e} docs: peak MiB, s (load)" for n in sizes)
          + " | bytes/doc (slope) | projected at 1e10 docs |")
    print("| --- |" + " --- |" * (len(sizes) + 2))
    for name, row in table.items():
        cells = [f"{row[n][0] / 2**20:,.0f} MiB, {row[n][1]:.1f} s ({row[n][2]:.1f})"
                 for n in sizes]
        (n0, (m0, *_)), (n1, (m1, *_)) = list(row.items())[0], list(row.items())[-1]
        slope = (m1 - m0) / (n1 - n0) if n1 != n0 else m1 / n1
        print(f"| {name} | " + " | ".join(cells)
              + f" | {slope:.1f} | {(m1 + slope * (1e10 - n1)) / 2**30:,.1f} GiB |")
    if not wanted("repack"):
        return
    big = max(sizes)
    src = corpus(work, big)
    before = {s: os.stat(f"{src}{s}").st_mtime_ns for s in (".bin", ".boundaries", ".json")}
    out = work / f"p{big}-repack"
    shutil.rmtree(out, ignore_errors=True)
    mem, seconds, load = run(["pack", str(src), "-L", str(a.seq_len * 2), "-o", str(out),
                              "-q"])
    after = {s: os.stat(f"{src}{s}").st_mtime_ns for s in (".bin", ".boundaries", ".json")}
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"\nre-pack of {big:,} documents at --seq-len {a.seq_len * 2} (index layout, bfd): "
          f"{seconds:.1f} s (load {load:.1f}), peak {mem / 2**20:,.0f} MiB, {written / 1e6:,.0f} "
          f"MB written; corpus untouched: {before == after}")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
