"""Shared inputs, made once per run by the packtool under test (an older checkout writes its
own formats); a probe copies the ones it names (``Probe.needs``) into its folder. A fixture
this version cannot make is recorded, and the probes that need it are ``unsupported``.

    corpus/   good.jsonl (50 records), c.*  (tokenize)
    ds/       corpus + p/  (pack -L 64, the default layout)
    dsv/      corpus + p/  (pack -L 64 --valid-docs 5: a held-out split in p/valid)
    dst/      corpus + p/  (pack -L 64 --layout tokens)
    mix/      a.* (60 records), b.* (40), one.* (1), zero.* (0 documents, where possible)
    tamper/   scripts/tamper_probe.py's: a/c and b/c, 4 parts each, a/p-*
    chat/     chat.jsonl (messages), tokenizer.json alone (no tokenizer_config.json)
    many/     in/ (600 one-line files), c.* (600 parts: --part-bytes 1)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from . import Ctx, run_cmd


def _records(n: int, word: str = "doc", seed: int = 0) -> str:
    return "".join(json.dumps({"text": f"{word} {i} " * (10 + (i * 7 + seed) % 30)}) + "\n"
                   for i in range(n))


def _step(ctx: Ctx, d: Path, *cmd) -> None:
    rc, _, err, _ = run_cmd(ctx, list(cmd), d, 300)
    if rc != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd[:4]))}: "
                           + (err.strip().splitlines() or ["?"])[-1][:160])


def _corpus(ctx: Ctx, d: Path) -> None:
    (d / "good.jsonl").write_text(_records(50))
    _step(ctx, d, "tokenize", "good.jsonl", "-t", ctx.tok, "-o", "c", "-q")


def _packed(extra: tuple):
    def make(ctx: Ctx, d: Path) -> None:
        _corpus(ctx, d)
        _step(ctx, d, "pack", "c", "-L", 64, "-o", "p", "-q", *extra)
    return make


def _mix(ctx: Ctx, d: Path) -> None:
    for name, n, seed in (("a", 60, 1), ("b", 40, 2), ("one", 1, 3)):
        (d / f"{name}.jsonl").write_text(_records(n, name, seed))
        _step(ctx, d, "tokenize", f"{name}.jsonl", "-t", ctx.tok, "-o", name, "-q")
    (d / "zero.jsonl").write_text("")
    rc, _, _, _ = run_cmd(ctx, ["tokenize", "zero.jsonl", "-t", ctx.tok, "-o", "zero", "-q"],
                          d, 300)
    if rc != 0:  # this version refuses an empty input: write the corpus directly
        code = ("from synth import write_token_corpus\n"
                "write_token_corpus('zero', [], vocab_size=2048)")
        run_cmd(ctx, ["python", code], d, 300)


def _tamper(ctx: Ctx, d: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import tamper_probe

    shutil.rmtree(d)
    tamper_probe.build(ctx.root, d)


def _chat(ctx: Ctx, d: Path) -> None:
    rows = [{"m": [{"role": "user", "content": f"question {i}?"},
                   {"role": "assistant", "content": f"answer {i}."}]} for i in range(8)]
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(ctx.tok / "tokenizer.json", d / "tokenizer.json")


def _many(ctx: Ctx, d: Path) -> None:
    (d / "in").mkdir()
    for k in range(600):
        (d / "in" / f"f{k:04d}.jsonl").write_text(json.dumps({"text": f"file {k} " * 8}) + "\n")
    _step(ctx, d, "tokenize", "in", "-t", ctx.tok, "-o", "c", "--part-bytes", 1, "-q")


BUILDERS = {"corpus": _corpus, "ds": _packed(()), "dsv": _packed(("--valid-docs", 5)),
            "dst": _packed(("--layout", "tokens")), "mix": _mix, "tamper": _tamper,
            "chat": _chat, "many": _many}


def build(ctx: Ctx, log=print) -> None:
    for name, make in BUILDERS.items():
        d = ctx.fixtures / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        try:
            make(ctx, d)
        except (RuntimeError, subprocess.SubprocessError, SystemExit) as e:
            ctx.missing[name] = str(e)
            log(f"  fixture {name}: not made ({e})")
