"""How fast the packed reader delivers packs, against reading their bare tokens in the same
run (issue 20's target: all the per-token arrays of an 8,192-token pack in at most 20 us of
CPU beyond the token read, i.e. >= 4e8 tokens/s per core, from the page cache).

    python scripts/bench_reader.py [--docs 200000] [--seq-len 8192] [--repeat 5]

For each layout (index: tokens read from the source corpus; tokens: from the shard), CPU
seconds per pack, best of ``--repeat`` interleaved passes over every pack, of:

    bare   the pack's tokens as a numpy array (what any loader must read)
    full   ``ds[i]``: input_ids, labels, position_ids, doc_ids, cu_seqlens, max_seqlen,
           source_docs, source_offsets

and ``full - bare`` per pack, as microseconds and as tokens per second per core.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def passes(ds, repeat: int) -> tuple[float, float]:
    n = len(ds)
    for i in range(n):  # warm: checksums, page cache, kernels
        ds[i]
    bare = full = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for i in range(n):
            np.array(ds.tokens(i)[0])
        bare = min(bare, time.process_time() - t)
        t = time.process_time()
        for i in range(n):
            ds[i]
        full = min(full, time.process_time() - t)
    return bare / n, full / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", default=str(ROOT / "bench-out" / "reader"))
    a = ap.parse_args()
    import packtool
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
    from synth import lognormal_lengths, write_token_corpus

    work = Path(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    write_token_corpus(work / "c", lognormal_lengths(a.docs, median=500, cap=4 * a.seq_len,
                                                     seed=2))
    print("| layout | packs | tokens/pack | bare us/pack | full us/pack | extra us/pack | "
          "extra: tokens/s per core |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for layout in ("index", "tokens"):
        out = work / layout
        subprocess.run([sys.executable, "-m", "packtool", "pack", str(work / "c"), "-L",
                        str(a.seq_len), "-o", str(out), "--layout", layout, "-q"],
                       check=True, cwd=ROOT)
        ds = packtool.open_packed(out)
        bare, full = passes(ds, a.repeat)
        tok = float(np.mean([len(ds.tokens(i)[0]) for i in range(min(len(ds), 500))]))
        extra = max(full - bare, 1e-12)
        print(f"| {layout} | {len(ds):,} | {tok:,.0f} | {bare * 1e6:.1f} | {full * 1e6:.1f} | "
              f"{extra * 1e6:.1f} | {tok / extra:,.3g} |")


if __name__ == "__main__":
    main()
