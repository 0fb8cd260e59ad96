"""Feed packtool bad inputs and count the outcomes: clear error, traceback, or accepted.

    python scripts/probe_inputs.py [--module packtool] [--root .] [--workdir bench-out/probe]

Each probe runs the CLI in a fresh process (``python -m MODULE`` from ``--root``, so an
older checkout can be measured with ``--module packtool.cli``). A probe passes when the run
exits non-zero with an ``Error:`` line and no traceback, and leaves nothing at its output.
Prints one line per failing probe and a total.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def probes(w: Path, tok: str) -> list[tuple[str, list[str]]]:
    """(name, CLI arguments); files are created here."""
    def jsonl(name, text):
        (w / name).write_bytes(text if isinstance(text, bytes) else text.encode())
        return str(w / name)

    def tokenize(*a):
        return ["tokenize", *a, "-t", tok, "-o", str(w / "out" / "c"), "-q"]

    good = jsonl("good.jsonl", "".join(json.dumps({"text": f"doc {i} " * 20}) + "\n"
                                       for i in range(50)))
    (w / "src").mkdir(exist_ok=True)  # an older packtool does not make folders
    subprocess.run(run_args(["tokenize", good, "-t", tok, "-o", str(w / "src" / "c"), "-q"]),
                   cwd=ARGS.root, capture_output=True)
    src = str(w / "src" / "c")
    out = []
    out += [("invalid JSON", tokenize(jsonl("a.jsonl", '{"text": "x"}\n{"text": \n'))),
            ("missing field", tokenize(jsonl("b.jsonl", '{"body": "x"}\n'))),
            ("not a string", tokenize(jsonl("c.jsonl", '{"text": 3}\n'))),
            ("invalid UTF-8", tokenize(jsonl("d.jsonl", b'{"text": "\xff\xfe"}\n'))),
            ("lone surrogate", tokenize(jsonl("e.jsonl", '{"text": "\\ud800"}\n'))),
            ("JSON array file", tokenize(jsonl("f.json", '[{"text": "x"}]\n'))),
            ("deeply nested JSON", tokenize(jsonl("g.jsonl", '{"x": ' + "[" * 100000
                                                  + "]" * 100000 + "}\n"))),
            ("truncated gzip", tokenize(jsonl("h.jsonl.gz", gzip.compress(b'{"text":"x"}\n'
                                                                         * 999)[:40]))),
            ("0-byte gzip", tokenize(jsonl("i.jsonl.gz", b""))),
            ("0-byte zstd", tokenize(jsonl("j.jsonl.zst", b""))),
            ("not a zstd", tokenize(jsonl("k.jsonl.zst", b"nope"))),
            ("not a parquet", tokenize(jsonl("l.parquet", b"PAR1 nope"))),
            ("unsupported extension", tokenize(jsonl("m.csv", "text\nx\n"))),
            ("no such input", tokenize(str(w / "missing.jsonl"))),
            ("empty directory", tokenize(str(_mkdir(w / "empty")))),
            ("no such tokenizer", ["tokenize", good, "-t", str(w / "nope"), "-o",
                                   str(w / "out" / "c"), "-q"]),
            ("unknown --eos", tokenize(good, "--eos", "<nope>")),
            ("record over --max-record-bytes", tokenize(good, "--max-record-bytes", "10")),
            ("prompt without completion", tokenize(good, "--prompt-field", "text")),
            ("template that raises", tokenize(
                jsonl("n.jsonl", '{"m": [{"role": "user", "content": "hi"}]}\n'),
                "--messages-field", "m", "--chat-template",
                jsonl("t.jinja", "{{ raise_exception('roles must alternate') }}"))),
            ("template bomb", tokenize(
                jsonl("o.jsonl", '{"m": [{"role": "user", "content": "hi"}]}\n'),
                "--messages-field", "m", "--chat-template",
                jsonl("u.jinja", "{{ 'x' * 2000000000 }}"))),
            ("template 1//0", tokenize(
                jsonl("p.jsonl", '{"m": [{"role": "user", "content": "hi"}]}\n'),
                "--messages-field", "m", "--chat-template", jsonl("v.jinja", "{{ 1//0 }}"))),
            ("non-UTF-8 template", tokenize(
                jsonl("q.jsonl", '{"m": [{"role": "user", "content": "hi"}]}\n'),
                "--messages-field", "m", "--chat-template", jsonl("x.jinja", b"\xff{{ 1 }}"))),
            ]
    pack = ["pack", src, "-o", str(w / "out" / "p"), "-q"]
    out += [("huge --seq-len", pack + ["-L", "99999999999999999999999"]),
            ("zero --seq-len", pack + ["-L", "0"]),
            ("option the packer does not read", pack + ["-L", "64", "--max-depth", "4"]),
            ("unknown algo", pack + ["-L", "64", "-a", "nope"]),
            ("pack a missing corpus", ["pack", str(w / "nope"), "-L", "64", "-o",
                                       str(w / "out" / "p"), "-q"]),
            ("bad repeat factor", ["pack", src + ":-1", "-L", "64", "-o",
                                   str(w / "out" / "p"), "-q"]),
            ("--valid-docs too many", pack + ["-L", "64", "--valid-docs", "100000"])]
    for name, edit in (("corrupt boundaries", "boundaries"), ("bad manifest dtype", "dtype"),
                       ("non-numeric n_tokens", "n_tokens"), ("truncated .bin", "bin"),
                       ("flipped .bin byte", "flip"), ("unknown version", "version")):
        d = w / f"src-{edit}"
        shutil.copytree(w / "src", d)
        c = d / "c"
        if edit == "boundaries":
            e = np.fromfile(f"{c}.boundaries", "<i8")
            e[-2] = e[-1] + 5_000_000
            e.tofile(f"{c}.boundaries")
        elif edit in ("dtype", "n_tokens", "version"):
            m = json.loads(Path(f"{c}.json").read_text())
            m[edit] = {"dtype": "float32", "n_tokens": "many", "version": 99}[edit]
            Path(f"{c}.json").write_text(json.dumps(m))
        else:
            data = bytearray(Path(f"{c}.bin").read_bytes())
            if edit == "bin":
                data = data[:-2]
            else:
                data[len(data) // 2] ^= 0x10
            Path(f"{c}.bin").write_bytes(bytes(data))
        out.append((f"pack: {name}", ["pack", str(c), "-L", "64", "-o", str(w / "out" / "p"),
                                      "-q"]))
    out += [("stats: header-less CSV with a huge count",
             ["stats", "--lengths", jsonl("h.csv", "5,1000000000000\n")]),
            ("stats: negative lengths", ["stats", "--lengths", _npy(w / "n.npy", [3, -1])]),
            ("verify: not a dataset", ["verify", str(w / "nope")]),
            ("export: not a dataset", ["export", str(w / "nope"), "--format", "parquet", "-o",
                                       str(w / "out" / "x.parquet")])]
    return out


def _mkdir(p: Path) -> Path:
    p.mkdir(exist_ok=True)
    return p


def _npy(p: Path, values) -> str:
    np.save(p, np.array(values))
    return str(p)


def run_args(args: list[str]) -> list[str]:
    return [sys.executable, "-m", ARGS.module, *args]


def main() -> None:
    w = ARGS.workdir
    shutil.rmtree(w, ignore_errors=True)
    w.mkdir(parents=True)
    tok = str(Path(ARGS.root) / "fixtures" / "tokenizer")
    counts = {"clear error": 0, "traceback": 0, "accepted": 0, "left files": 0}
    cases = probes(w, tok)
    for name, args in cases:
        shutil.rmtree(w / "out", ignore_errors=True)
        (w / "out").mkdir()
        r = subprocess.run(run_args(args), cwd=ARGS.root, capture_output=True, text=True,
                           timeout=300)
        left = [p.name for p in (w / "out").rglob("*")]
        if "Traceback" in r.stderr:
            counts["traceback"] += 1
            print(f"traceback: {name}: {r.stderr.strip().splitlines()[-1][:120]}")
        elif r.returncode == 0:
            counts["accepted"] += 1
            print(f"accepted:  {name}")
        elif left:
            counts["left files"] += 1
            print(f"left files: {name}: {left[:4]}")
        else:
            counts["clear error"] += 1
    print(f"{len(cases)} bad inputs: " + ", ".join(f"{v} {k}" for k, v in counts.items()))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", default="packtool")
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-out" / "probe")
    ARGS = ap.parse_args()
    main()
