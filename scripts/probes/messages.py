"""Issue 18.6: what a user reads. --json is JSON whatever runs; verify says what it checked;
errors say what was read and how to fix it; a glob reads an export; the README's library
call works on real corpora."""

from __future__ import annotations

import json
import re

from . import Ctx, Probe

HARD = ("import numpy as np\nfrom synth import write_token_corpus\n"
        "write_token_corpus('h', np.random.default_rng(1).integers(10, 40, 120), "
        "vocab_size=1000)")  # best fit misses the bounds at L=64: the LP runs


def _json(case, out, err):
    try:
        json.loads(out)
    except json.JSONDecodeError as e:
        return f"stdout is not JSON ({e}): {out[:80]!r}"
    return None


def _says(pattern: str, stream: str = "err", absent: bool = False):
    def check(case, out, err):
        text = err if stream == "err" else out
        found = re.search(pattern, text, re.S)
        if bool(found) == absent:
            return f"{stream} {'says' if absent else 'lacks'} /{pattern}/: " \
                   f"{text.strip()[-160:]!r}"
        return None
    return check


def _valid_counted(case, out, err):
    v = json.loads((case.dir / "p" / "valid" / "index.json").read_text())
    if "valid/" not in out or f"{v['n_tokens']:,}" not in out:
        return f"verify does not say valid/ was checked with its {v['n_tokens']:,} tokens: " \
               f"{out.strip()[-200:]!r}"
    return None


def json_probes(ctx: Ctx) -> list[Probe]:
    def j(name, cmd, **kw):
        return Probe(f"--json is JSON: {name}", "6", cmd + ["--json"], expect="ok",
                     check=_json, **kw)

    lengths = ("import numpy as np\nnp.save('h.npy', np.random.default_rng(1).integers("
               "10, 40, 120))")
    return [
        j("stats --algos all, the LP running", ["stats", "--lengths", "h.npy", "-L", "64",
                                                "--algos", "all"], before=[["python", lengths]]),
        j("pack --algo optimal, the LP running", ["pack", "h", "-L", "64", "--algo",
                                                  "optimal", "-o", "out/p"],
          before=[["python", HARD]]),
        j("pack with warnings", ["pack", "c", "-L", "16", "-o", "out/p"], needs=("corpus",)),
        j("tokenize", ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "out/c"],
          needs=("corpus",)),
        j("verify --source", ["verify", "p", "--source", "c"], needs=("dsv",)),
        j("export", ["export", "p", "--format", "parquet", "-o", "out/x.parquet"],
          needs=("ds",)),
        j("which --step", ["which", "p", "--step", "0"], needs=("ds",)),
    ]


def verify_probes(ctx: Ctx) -> list[Probe]:
    return [
        Probe("verify: the held-out split named and counted", "6",
              ["verify", "p", "--source", "c"], needs=("dsv",), expect="ok",
              check=_valid_counted, check_kind="unclear error"),
        Probe("verify DIR/valid --source points to the parent", "6",
              ["verify", "p/valid", "--source", "c"], needs=("dsv",),
              want=r"held-out split.*\bp\b"),
        Probe("verify of a mixture never says 'packed exactly once'", "6",
              ["verify", "out/p", "--source", "a:2", "--source", "b:0.5"], needs=("mix",),
              before=[["pack", "a:2", "b:0.5", "-L", "64", "-o", "out/p", "-q"]],
              expect="ok", check=_says("exactly once", "out", absent=True),
              check_kind="unclear error"),
    ]


def error_probes(ctx: Ctx) -> list[Probe]:
    return [
        Probe("--valid-docs 1 on a 0-document corpus", "6",
              ["pack", "zero", "-L", "64", "--valid-docs", "1", "-o", "out/p", "-q"],
              needs=("mix",), want=r"\A(?!.*from 1 to -1)"),
        Probe("c:2 with no c: the :2 read as a factor is said", "6",
              ["pack", "nope:2", "-L", "64", "-o", "out/p", "-q"], want="factor"),
        Probe("pack prose.jsonl suggests tokenize", "6",
              ["pack", "good.jsonl", "-L", "64", "-o", "out/p", "-q"], needs=("corpus",),
              want="tokenize"),
        Probe("pack of a tokenizer.json suggests what to pass", "6",
              ["pack", str(ctx.tok / "tokenizer.json"), "-L", "64", "-o", "out/p", "-q"],
              want="tokenize"),
        Probe("export llmc --eos-id on a corpus tokenized with --eos", "6",
              ["export", "c", "--format", "llmc", "--eos-id", "7", "-o", "out/l", "-q"],
              needs=("corpus",), before=[["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "c",
                                          "--eos", "<|eos|>", "--overwrite", "-q"]],
              want="eos"),
    ]


def _glob_reads(case, out, err):
    return None if out.strip().endswith("rows ok") else f"stdout: {out.strip()[-160:]!r}"


GLOB = """
import sys, datasets
try:
    ds = datasets.load_dataset("parquet", data_files="out/x/*", split="train",
                               cache_dir="hf-cache")
except Exception as e:  # the reader's call failed: the export is not what it says
    sys.exit(f"Error: load_dataset('parquet', data_files='out/x/*'): {e}")
print(ds.num_rows, "rows ok")
"""
ASSIGN = """
import packtool
corpus = packtool.open_tokens("c")
packs = packtool.assign_packs(corpus.lengths, 16, algo="bfd", overflow="truncate")
assert len(packs) == len(corpus)
"""


def positive_probes(ctx: Ctx) -> list[Probe]:
    return [
        Probe("-L 16 splitting most documents is warned of", "6",
              ["pack", "c", "-L", "16", "-o", "out/p"], needs=("corpus",), expect="ok",
              check=_says(r"warning.*split"), check_kind="unclear error"),
        Probe("the tokenize summary names the engine that ran", "6",
              ["tokenize", "good.jsonl", "-t", ctx.tok, "-o", "out/c"], needs=("corpus",),
              expect="ok", check=_says(r"engine|\bhf\b|tokenizers", "out"),  # the result: stdout
              check_kind="unclear error"),
        Probe("datasets reads a parquet export through DIR/*", "6", ["python", GLOB],
              needs=("ds",), before=[["export", "p", "--format", "parquet", "-o", "out/x",
                                      "-q"]], expect="ok", check=_glob_reads, timeout=240),
        Probe("assign_packs on a corpus with documents over seq_len (README)", "6",
              ["python", ASSIGN], needs=("corpus",), expect="ok"),
    ]


def probes(ctx: Ctx) -> list[Probe]:
    return json_probes(ctx) + verify_probes(ctx) + error_probes(ctx) + positive_probes(ctx)

