"""What ``pack --align K`` and ``pack --max-docs K`` cost, in tokens and packs.

    python scripts/bench_align.py [--docs 1000000] [--corpus PREFIX]

Three length distributions, each cut into segments as ``pack`` cuts them (--overflow split)
and packed with bfd (pack's default) through :func:`packtool.pack.plan.plan_pack`, the very
planner ``pack`` runs:

    bundled      fixtures/corpus tokenized with fixtures/tokenizer (1,220 documents, ~240k
                 tokens; or --corpus PREFIX, a token corpus), at L = 1024 and 4096
    squad11-384  packtool/data/squad11-384.histogram.csv (88,641 SQuAD v1.1 examples, BERT
                 tokens, at most 384), at L = 512
    lognormal    --docs lengths, median 300, sigma 1, clipped to [1, 4096] (the lengths of
                 scripts/bench_pack.py), at L = 4096

For --align K = 8, 16, 64: the pad tokens (and their share of the real tokens) and the packs
against the unaligned packs; for --max-docs K = 4, 8, 16: the packs against the uncapped ones
(and the efficiency, real tokens / (packs x L)). Prints measurements only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this work tree

from packtool.lengths import load_histogram_csv, reference_histogram  # noqa: E402
from packtool.options import PackOptions  # noqa: E402
from packtool.pack.plan import plan_pack  # noqa: E402

ALIGNS = (8, 16, 64)
CAPS = (4, 8, 16)


def bundled_lengths(prefix: str | None) -> np.ndarray:
    """The bundled corpus's document lengths (tokenized into a temporary folder)."""
    import packtool

    if prefix:
        return packtool.open_tokens(prefix).lengths
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "packtool", "tokenize", str(ROOT / "fixtures" /
                        "corpus"), "-t", str(ROOT / "fixtures" / "tokenizer"), "--eos",
                        "<|eos|>", "-o", f"{d}/c", "-q"], check=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": ""})
        return np.asarray(packtool.open_tokens(f"{d}/c").lengths).copy()


def packs(lengths: np.ndarray, seq_len: int, **kw) -> tuple[int, int]:
    """(packs, pad tokens) of pack's plan with these options."""
    lay = plan_pack(lengths, PackOptions(seq_len=seq_len, **kw))
    return lay.n_packs, lay.counts.get("n_align_tokens", 0)


def report(name: str, lengths: np.ndarray, seq_len: int) -> None:
    base, _ = packs(lengths, seq_len)
    tokens = int(lengths.sum())
    print(f"\n{name}: {lengths.size:,} documents, {tokens:,} tokens, L = {seq_len:,}: "
          f"{base:,} packs unaligned and uncapped "
          f"(efficiency {100 * tokens / (base * seq_len):.2f}%)")
    for k in ALIGNS:
        n, pads = packs(lengths, seq_len, align=k)
        print(f"  --align {k:<3} +{pads:>12,} pad tokens ({100 * pads / tokens:6.2f}%)  "
              f"{n:>9,} packs (+{n - base:,}, {100 * (n - base) / base:+.2f}%)")
    for k in CAPS:
        n, _ = packs(lengths, seq_len, max_docs=k)
        print(f"  --max-docs {k:<3} {n:>21,} packs (+{n - base:,}, "
              f"{100 * (n - base) / base:+.2f}%), efficiency "
              f"{100 * tokens / (n * seq_len):.2f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=1_000_000, help="lognormal documents")
    ap.add_argument("--corpus", help="a token corpus instead of the bundled one")
    args = ap.parse_args()
    bundled = bundled_lengths(args.corpus)
    for seq_len in (1024, 4096):
        report("bundled corpus", bundled, seq_len)
    report("squad11-384", load_histogram_csv(reference_histogram("squad11-384")), 512)
    rng = np.random.default_rng(0)
    lognormal = np.clip(np.round(rng.lognormal(np.log(300), 1.0, args.docs)), 1, 4096
                        ).astype(np.int64)
    report(f"lognormal (median 300, sigma 1, {args.docs:,})", lognormal, 4096)


if __name__ == "__main__":
    main()
