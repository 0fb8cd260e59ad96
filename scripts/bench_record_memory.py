"""Peak memory of tokenizing one large record (issue 18, item 5), per record size: what
``sources.MEMORY_PER_RECORD_BYTE`` (the factor in the large-record warning and the
--max-record-bytes refusal) must be for the warning to be true.

Each size runs ``packtool tokenize`` in a fresh process on a JSONL file of one record of that
many bytes, and reads the child's peak RSS from ``wait4``; a run on a 1 kB record gives the
baseline (interpreter, tokenizer, engines). The factor is (peak - baseline) / record bytes;
``of peak`` is peak / record bytes (what a user sees in ``top``). Texts: ``prose``
(``tests/synth.py``), ``cjk`` (Japanese, 3 bytes a character), ``dense`` (``"a, "``
repeated: a token every 1.5 bytes, the pathological case). Memory follows the tokens, not the
bytes: the more tokens a byte, the larger the factor.

    PYTHONPATH=$PWD python scripts/bench_record_memory.py [--mb 4 8 16] [--engines auto hf]
        [--texts prose cjk dense]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"


UNITS = {"cjk": "日本語の文章です。東京で書かれた長い記録、", "dense": "a, "}


def record_file(path: Path, nbytes: int, kind: str = "prose") -> int:
    if kind in UNITS:
        unit = UNITS[kind]
        text = unit * max(1, nbytes // len(unit.encode()))
    else:
        sys.path.insert(0, str(ROOT))
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synth.py
        from synth import make_documents

        docs = make_documents(400, seed=3, median_words=300, max_words=3000)
        parts, size, i = [], 0, 0
        while size < nbytes:
            parts.append(docs[i % len(docs)])
            size += len(parts[-1].encode()) + 1
            i += 1
        text = "\n".join(parts)[:nbytes]
    line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
    path.write_text(line, encoding="utf-8")
    return len(text.encode())


def peak_rss(args: list) -> int:
    """Peak resident bytes of the child running ``packtool *args``."""
    proc = subprocess.Popen([sys.executable, "-m", "packtool", *map(str, args)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode()
    if proc.returncode:
        raise SystemExit(f"packtool {' '.join(map(str, args))} failed: {err[-500:]}")
    return usage.ru_maxrss * 1024  # kB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[4, 8, 16])
    ap.add_argument("--engines", nargs="+", default=["auto", "hf"])
    ap.add_argument("--texts", nargs="+", default=["prose", "cjk"], choices=["prose", "cjk",
                                                                             "dense"])
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="packtool-rss-"))
    try:
        rows = []
        print(f"{'engine':8} {'text':6} {'record':>9} {'baseline':>9} {'peak RSS':>9} "
              f"{'factor':>7} {'of peak':>8}")
        for engine in a.engines:
            tiny = work / "tiny.jsonl"
            record_file(tiny, 1000)
            base = peak_rss(["tokenize", tiny, "-t", TOKENIZER, "-o", work / f"o0-{engine}", "-q",
                             "--engine", engine])
            for kind in a.texts:
                for mb in a.mb:
                    src = work / f"r-{kind}-{mb:g}.jsonl"
                    size = record_file(src, int(mb * 1e6), kind)
                    out = work / f"o-{engine}-{kind}-{mb:g}"
                    peak = peak_rss(["tokenize", src, "-t", TOKENIZER, "-o", out, "-q",
                                     "--engine", engine, "--max-record-bytes", str(1 << 30)])
                    rows.append((engine, kind, size, base, peak))
                    for p in work.glob(f"o-{engine}-{kind}-{mb:g}*"):
                        p.unlink()
                    print(f"{engine:8} {kind:6} {size / 1e6:7.1f}MB {base / 1e6:7.0f}MB "
                          f"{peak / 1e6:7.0f}MB {(peak - base) / size:6.0f}x "
                          f"{peak / size:7.0f}x", flush=True)
        for kind in a.texts:
            worst = max((peak - base) / size for _, k, size, base, peak in rows if k == kind)
            print(f"{kind}: largest factor (peak - baseline) / record bytes {worst:.0f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
