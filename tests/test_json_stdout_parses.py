"""Issue 18.6: ``--json`` is JSON. Every command that takes ``--json`` and every registered
packer, run as a user runs them (a fresh process, so output written from C to file
descriptor 1, as HiGHS's banner was, is caught too): stdout parses as one JSON value.

The corpus is synthetic: 120 documents of 10-39 tokens and 4 over 64, at --seq-len 64,
where best fit misses the lower bounds, so ``optimal`` really builds and solves its LP."""

import json
import os

import numpy as np
import pytest
from conftest import ROOT, TOKENIZER, slow_except, write_jsonl
from synth import write_token_corpus
from warm import python

from packtool.cli import cli
from packtool.packers import PACKERS

L = "64"


def run_json(*args, cwd=None) -> dict | list:
    """Run ``packtool ARGS --json`` in a fresh process (forked warm: tests/warm.py); its
    stdout, parsed."""
    r = python(["-m", "packtool", *map(str, args), "--json"], cwd=cwd, timeout=300,
               env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"stdout of {' '.join(map(str, args))} --json is not JSON ({e}):\n"
                    f"{r.stdout[:600]}")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("json")
    rng = np.random.default_rng(1)
    lengths = np.concatenate([rng.integers(10, 40, 120), [70, 130, 65, 200]])
    write_token_corpus(d / "c", lengths, vocab_size=1000)
    write_jsonl(d / "t.jsonl", [{"text": f"document {i} " * (i % 7 + 1)} for i in range(20)])
    return d


def test_every_json_command_is_covered():
    """A command given --json later must get a case here."""
    have = {name for name, cmd in cli.commands.items()
            if any("--json" in p.opts for p in cmd.params)}
    assert have == set(CASES) | {"pack"}, have


def _tokenize(d):
    return [["tokenize", d / "t.jsonl", "-t", TOKENIZER, "-o", d / "tok", "--eos", "<|eos|>"],
            ["tokenize", d / "t.jsonl", "-t", TOKENIZER, "-o", d / "tok2", "--plan"]]


def _verify(d):
    return [["verify", d / "packed-bfd"], ["verify", d / "packed-bfd", "--source", d / "c"],
            ["verify", d / "c"]]


def _stats(d):
    return [["stats", d / "c", "-L", L, "--algos", "all"], ["stats", d / "packed-bfd"],
            ["stats", "--lengths", d / "lengths.npy", "-L", L, "-L", "128", "--algos", "all"]]


def _export(d):
    return [["export", d / "packed-bfd", "--format", "parquet", "-o", d / "x.parquet"],
            ["export", d / "c", "--format", "megatron", "-o", d / "mega" / "c"]]


def _which(d):
    return [["which", d / "packed-bfd", "--step", 0, "--batch-size", 2],
            ["which", d / "packed-tok", "--record", f"{d / 't.jsonl'}:3"]]


def _conformance(d):  # gpt2: no FlexAttention, so nothing to compile (a few seconds)
    return [["conformance", "--arch", "gpt2"]]


CASES = {"tokenize": _tokenize, "verify": _verify, "stats": _stats, "export": _export,
         "which": _which, "conformance": _conformance}
LISTS = {"conformance"}  # commands whose JSON is a list of rows


@pytest.mark.parametrize("algo", slow_except(PACKERS, "bfd"))
def test_pack_json_for_every_packer(work, algo):
    out = run_json("pack", work / "c", "-L", L, "--algo", algo, "-o", work / f"packed-{algo}",
                   "--valid-docs", 5)
    assert out["algo"] == algo and out["n_packs"] > 0
    if algo == "optimal":  # the LP ran: the case that printed HiGHS's banner
        assert out["solver"]["columns"] > 0, out["solver"]


@pytest.mark.parametrize("command", slow_except(CASES, "tokenize"))
def test_json_for_every_command(work, command):
    if command == "conformance":
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    np.save(work / "lengths.npy", np.arange(1, 300))
    if not (work / "packed-bfd").exists():
        run_json("pack", work / "c", "-L", L, "-o", work / "packed-bfd")
    if command == "which" and not (work / "packed-tok").exists():
        run_json("tokenize", work / "t.jsonl", "-t", TOKENIZER, "-o", work / "t")
        run_json("pack", work / "t", "-L", L, "-o", work / "packed-tok")
    for args in CASES[command](work):
        assert isinstance(run_json(*args), list if command in LISTS else dict), args


# --------------------------------------------------- one stream for every summary (item 6)
def _summaries(d):
    """Each command as a user runs it without --json: (args, text its summary holds)."""
    return {
        "tokenize": (["tokenize", d / "t.jsonl", "-t", TOKENIZER, "-o", d / "s-tok"],
                     f"{d / 's-tok'}: 20 documents"),
        "pack": (["pack", d / "c", "-L", "16", "--overflow", "truncate", "-o", d / "s-p"],
                 f"{d / 's-p'}: "),
        "verify": (["verify", d / "s-p", "--source", d / "c"], "OK"),
        "stats": (["stats", d / "c", "-L", L, "--algos", "bfd"], "bfd"),
        "export": (["export", d / "s-p", "--format", "parquet", "-o", d / "s.parquet"],
                   f"{d / 's.parquet'}: parquet from packed"),
        "which": (["which", d / "s-p", "--step", 0], str(d / "c")),
    }


def test_every_summary_is_on_stdout_and_every_warning_on_stderr(work):
    """pack, tokenize and export printed their summary on stderr, verify and stats on stdout.
    One rule now, sqlite-utils' and --json's: the result on stdout (a pipe gets it), progress
    and warnings on stderr. Run in order: each case reads what the one before wrote."""
    from click.testing import CliRunner

    cases = _summaries(work)
    # conformance builds models (tests/test_conformance.py checks its stdout and stderr)
    assert set(cases) | {"demo", "conformance"} == set(cli.commands), "a new command: a case"
    for name, (args, text) in cases.items():
        r = CliRunner().invoke(cli, [str(a) for a in args])
        assert r.exit_code == 0, (name, r.output)
        assert text in r.stdout and text not in r.stderr, (name, r.stdout, r.stderr)
        assert "warning:" not in r.stdout, (name, r.stdout)
        if name in ("tokenize", "pack"):  # no --eos; --overflow truncate at 16 discards much
            assert "warning: " in r.stderr, (name, r.stderr)
