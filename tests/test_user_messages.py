"""Issue 18.6: what a user reads. A --seq-len that splits many documents is said so, with the
figure and the fix; a long packer run shows it is working (stderr only); verify's summary
says what it checked: the held-out split in packs and tokens, the parent of a ``valid/``
given with --source, and never "packed exactly once" for a mixture that repeats or samples."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT
from synth import write_token_corpus

from packtool import _progress
from packtool.cli import cli
from packtool.pack import pack_corpus
from packtool.pack.result import DISCARD_WARN_SHARE, SPLIT_WARN_SHARE, split_warning
from packtool.verify import verify_packed


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("msg")
    rng = np.random.default_rng(2)
    write_token_corpus(d / "web", rng.integers(5, 120, 200), vocab_size=500, seed=1)
    write_token_corpus(d / "books", rng.integers(5, 120, 80), vocab_size=500, seed=2)
    return d


# ------------------------------------------------------------------ --overflow split warning
def test_a_seq_len_that_splits_many_documents_is_warned_of(corpora, tmp_path):
    lengths = np.fromfile(corpora / "web.boundaries", "<i8")
    lengths = np.diff(lengths, prepend=0)
    share = float((lengths > 64).mean())
    assert share > SPLIT_WARN_SHARE
    res = pack_corpus([corpora / "web"], tmp_path / "p", 64)
    (w,) = [w for w in res.warnings if "--overflow split" in w]
    assert f"{100 * share:.1f}%" in w and f"{int((lengths > 64).sum()):,} of 200" in w
    assert "raise it" in w and "--overflow truncate or drop" in w  # the ways out
    # at a length that splits few (or none) nothing is said
    res = pack_corpus([corpora / "web"], tmp_path / "q", 115)
    assert (lengths > 115).mean() <= SPLIT_WARN_SHARE
    assert not [w for w in res.warnings if "--overflow split" in w]


@pytest.mark.parametrize("overflow", ["truncate", "drop"])
def test_truncate_or_drop_discarding_many_tokens_is_warned_of(corpora, tmp_path, overflow):
    """`pack -L 64 --overflow truncate` kept 1% of a corpus's tokens and exited 0 with only a
    count in the summary: more than DISCARD_WARN_SHARE of the tokens discarded is now a
    warning on stderr with the share and both fixes; at a --seq-len that fits, none."""
    lengths = np.diff(np.fromfile(corpora / "web.boundaries", "<i8"), prepend=0)
    lost = (np.maximum(lengths - 16, 0).sum() if overflow == "truncate"
            else lengths[lengths > 16].sum())
    share = lost / lengths.sum()
    assert share > DISCARD_WARN_SHARE
    r = CliRunner().invoke(cli, ["pack", str(corpora / "web"), "-L", "16", "--overflow",
                                 overflow, "-o", str(tmp_path / "p"), "--json"])
    assert r.exit_code == 0, r.output
    (w,) = [w for w in json.loads(r.stdout)["warnings"] if "discarded" in w]
    assert w.startswith(f"--overflow {overflow} discarded {lost:,} of {lengths.sum():,} tokens "
                        f"({100 * share:.1f}%")
    assert "--overflow split" in w and "larger --seq-len" in w
    assert f"warning: {w}" in r.stderr
    res = pack_corpus([corpora / "web"], tmp_path / "q", 118, overflow=overflow)
    assert res.counts["n_truncated"] + res.counts["n_dropped"] > 0  # some, but few tokens
    assert not [w for w in res.warnings if "discarded" in w]


def test_a_held_out_split_of_most_documents_is_warned_of(corpora, tmp_path):
    """--valid-fraction 0.9 for 0.09: the run does what was asked (a source keeps at least
    one document) and says how little training is left."""
    res = pack_corpus([corpora / "web"], tmp_path / "p", 256, valid_fraction=0.9)
    (w,) = [w for w in res.warnings if "held out for validation" in w]
    assert f"{res.valid['n_docs_held_out']:,} of 200 documents" in w and "training keeps" in w
    res = pack_corpus([corpora / "web"], tmp_path / "q", 256, valid_fraction=0.1)
    assert not [w for w in res.warnings if "held out" in w]


def test_a_lengths_file_of_no_document_is_refused(tmp_path):
    (tmp_path / "e.csv").write_text("")
    np.save(tmp_path / "e.npy", np.empty(0, np.int64))
    for name in ("e.csv", "e.npy"):
        r = CliRunner().invoke(cli, ["stats", "--lengths", str(tmp_path / name), "-L", "64"])
        assert r.exit_code == 1 and "holds no document lengths" in r.output, r.output


def test_split_share_counts_copies_and_pieces_exactly():
    # 3 of 10 documents split into 7 pieces: 10 - 3 + 7 = 14 segments
    counts = {"n_split": 3, "n_split_pieces": 7, "n_segments": 14}
    assert "3 of 10 documents (30.0%" in split_warning(counts, 64)[0]
    assert split_warning({**counts, "n_split": 1, "n_split_pieces": 2, "n_segments": 11},
                         64) == []  # 1 of 10: not over the share
    assert split_warning({"n_split": 0, "n_split_pieces": 0, "n_segments": 0}, 64) == []


def test_pack_quiet_or_json_still_prints_warnings_on_stderr(corpora, tmp_path):
    r = CliRunner().invoke(cli, ["pack", str(corpora / "web"), "-L", "64", "-o",
                                 str(tmp_path / "p"), "--json"])
    assert r.exit_code == 0
    assert "--overflow split cut" in r.stderr
    assert json.loads(r.stdout)["warnings"]  # and in the JSON, stdout JSON alone


# ------------------------------------------------------------------ progress of long packers
def test_activity_shows_only_when_asked_and_on_stderr(capsys):
    with _progress.activity("work", unit="column", delay=0) as tick:
        tick(3)
    assert capsys.readouterr() == ("", "")  # nobody asked: nothing
    with _progress.shown(), _progress.activity("solving", unit="column", delay=0) as tick:
        tick(2)
        time.sleep(1.2)  # no step: the clock still moves
    out, err = capsys.readouterr()
    assert out == ""
    assert "solving: 2 columns" in err and "00:01 elapsed" in err
    with _progress.shown(), _progress.activity("quick", delay=1.0):
        pass  # shorter than its delay: never shown
    assert capsys.readouterr() == ("", "")


def test_a_bar_on_a_log_is_lines_not_redraws(capsys, monkeypatch):
    """stderr not a terminal (a log file, CI): a line when a bar starts, one every
    LOG_INTERVAL seconds and one when it ends, never ``\\r`` redraws piled onto one line
    (~60 of them a minute before)."""
    monkeypatch.setattr(_progress, "LOG_INTERVAL", 0.3)
    bar = _progress.progress_bar(1000, "tokenize")
    for _ in range(14):
        bar.update(50)
        time.sleep(0.05)  # 0.7 s: at most two lines in between
    bar.update(300)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert 2 <= len(lines) <= 5 and all(line.startswith("tokenize:") for line in lines), lines
    assert "1.00k/1.00k" in lines[-1]


def test_optimal_and_nnlshp_show_progress_in_pack(corpora, tmp_path, monkeypatch, capsys):
    from functools import partial

    from packtool.packers import optimal

    monkeypatch.setattr(optimal, "activity", partial(_progress.activity, delay=0))
    rng = np.random.default_rng(1)  # lengths where best fit misses the bounds: the LP runs
    write_token_corpus(tmp_path / "hard", rng.integers(10, 40, 120), vocab_size=500)
    pack_corpus([tmp_path / "hard"], tmp_path / "p", 64, "optimal", progress=True)
    out, err = capsys.readouterr()
    assert "optimal: cutting-stock LP, 120 documents into packs of 64 tokens:" in err
    assert " columns, " in err and out == ""
    pack_corpus([tmp_path / "hard"], tmp_path / "q", 64, "nnlshp", progress=True)
    assert "nnlshp: NNLS over" in capsys.readouterr().err
    pack_corpus([tmp_path / "hard"], tmp_path / "r", 64, "optimal")  # progress off
    assert "optimal: cutting-stock LP" not in capsys.readouterr().err


def test_stats_progress_names_the_seq_len_not_the_warm_up(tmp_path, monkeypatch):
    """`stats --seq-len 512 --algos optimal` showed "optimal: LP at L=4": the progress line of
    the 3-document warm-up that compiles the kernels. Only the real runs show one, naming
    the --seq-len."""
    from functools import partial

    from packtool.packers import nnlshp, optimal

    for module in (optimal, nnlshp):
        monkeypatch.setattr(module, "activity", partial(_progress.activity, delay=0))
    rng = np.random.default_rng(1)
    write_token_corpus(tmp_path / "hard", rng.integers(10, 40, 120), vocab_size=500)
    r = CliRunner().invoke(cli, ["stats", str(tmp_path / "hard"), "-L", "64", "--algos",
                                 "optimal,nnlshp"])
    assert r.exit_code == 0, r.output
    shown = {line.split(":")[0] + ":" + line.split(":")[1]
             for line in r.stderr.replace("\r", "\n").splitlines()
             if line.startswith(("optimal:", "nnlshp:"))}
    assert shown, r.stderr
    assert all("packs of 64 tokens" in s for s in shown), shown


def test_stats_shows_progress_on_stderr_and_json_on_stdout(corpora):
    r = subprocess.run([sys.executable, "-m", "packtool", "stats", str(corpora / "web"),
                        "-L", "64", "--algos", "nnlshp", "--json"], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "nnlshp: NNLS over" in r.stderr
    assert json.loads(r.stdout)["seq_lens"][0]["algos"][0]["algo"] == "nnlshp"


# ------------------------------------------------------------------ verify's summary
def test_verify_counts_the_held_out_split_in_packs_and_tokens(corpora, tmp_path):
    pack_corpus([corpora / "web"], tmp_path / "p", 128, valid_docs=20)
    train = json.loads((tmp_path / "p" / "index.json").read_text())
    valid = json.loads((tmp_path / "p" / "valid" / "index.json").read_text())
    for sources in ([], [corpora / "web"]):
        res = verify_packed(tmp_path / "p", sources)
        assert (res.n_packs, res.n_tokens) == (train["n_packs"], train["n_tokens"])
        assert res.valid["n_packs"] == valid["n_packs"] > 0
        assert res.valid["n_tokens"] == valid["n_tokens"] > 0
        text = res.summary()
        assert f"{train['n_packs']:,} packs, {train['n_tokens']:,} tokens" in text
        assert (f"valid/ checked too: {valid['n_packs']:,} packs, {valid['n_tokens']:,} tokens"
                in text)
    # every source token is in one of the two splits
    total = int(np.fromfile(corpora / "web.boundaries", "<i8")[-1])
    assert train["n_tokens"] + valid["n_tokens"] == total
    r = CliRunner().invoke(cli, ["verify", str(tmp_path / "p"), "--json"])
    assert json.loads(r.stdout)["valid"]["n_tokens"] == valid["n_tokens"]


def test_verify_of_valid_with_sources_points_to_the_parent(corpora, tmp_path):
    pack_corpus([corpora / "web"], tmp_path / "p", 128, valid_docs=20)
    r = CliRunner().invoke(cli, ["verify", str(tmp_path / "p" / "valid"), "--source",
                                 str(corpora / "web")])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "held-out split of" in r.stderr and str(tmp_path / "p") in r.stderr
    assert f"verify {tmp_path / 'p'} --source" in r.stderr  # the command that works
    r = CliRunner().invoke(cli, ["verify", str(tmp_path / "p" / "valid")])  # alone: fine
    assert r.exit_code == 0 and r.stdout.startswith("OK")


@pytest.mark.parametrize("factors", [("2", "1"), ("0.5", "1"), ("1", "1.5")])
def test_verify_never_says_exactly_once_for_a_mixture(corpora, tmp_path, factors):
    specs = [f"{corpora / 'web'}:{factors[0]}", f"{corpora / 'books'}:{factors[1]}"]
    pack_corpus(specs, tmp_path / "p", 128, valid_docs=10)
    text = verify_packed(tmp_path / "p", specs).summary()
    assert "exactly once" not in text
    assert "as often as the mixture asks" in text
    assert f"web x{float(factors[0]):g}" in text and f"books x{float(factors[1]):g}" in text


def test_verify_says_exactly_once_when_every_source_is_used_once(corpora, tmp_path):
    specs = [str(corpora / "web"), str(corpora / "books")]
    pack_corpus(specs, tmp_path / "p", 128)
    text = verify_packed(tmp_path / "p", specs).summary()
    assert "packed exactly once" in text and "mixture" not in text
