"""``pack --group-docs G`` (packtool/pack/streamed.py): each job plans and writes one group of
documents; the held-out and repeated documents are the global plan's, drawn in memory of the
sample (packtool/pack/selection.py). Checked against the global plan, with both layouts, a
mixture and a held-out fraction, as array tasks with --finalize, and with a job killed
mid-group; every output through ``verify --source``."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run as run_cli
from conftest import slow
from synth import lognormal_lengths, write_token_corpus

import packtool
from packtool.options import PackOptions
from packtool.pack import entries, pack
from packtool.pack.mixture import mixture_plan
from packtool.pack.selection import choice_bits, get_bits, selection_bits
from packtool.verify import verify_packed

ROOT = Path(__file__).resolve().parent.parent
SEQ = 256
GROUP = 4_000


def verify_cli(out, corpora):
    res = run_cli("verify", out, *(x for s in specs(corpora) for x in ("--source", s)))
    assert res.exit_code == 0, res.output
    return res


# ------------------------------------------------------------------- the selection
@pytest.mark.parametrize("n,size", [(5_000, 4_000), (50_000, 500), (50_000, 1_001),
                                    (50_000, 30_000), (50_000, 49_999), (50_000, 50_000),
                                    (20_001, 20_000), (2_200_000, 1_100_000)])
def test_choice_set_is_numpys_choice(n, size):
    """Both of numpy's paths (Floyd's below n/50, the shuffle of arange(n) above, whose set
    choice_bits makes without the array), across the 2**20 chunk of draws."""
    for seed in range(1 if n > 1_000_000 else 6):
        want = np.sort(np.random.default_rng([seed, 7]).choice(n, size=size, replace=False))
        bits = choice_bits(np.random.default_rng([seed, 7]), n, size)
        assert np.array_equal(np.flatnonzero(get_bits(bits, 0, n)), want), (n, size, seed)


def chunked(lengths_per_source, chunk=1_000):
    def chunks(k):
        x = lengths_per_source[k]
        for a in range(0, x.size, chunk):
            yield x[a:a + chunk]
    return chunks


@pytest.mark.parametrize("held", [{"valid_fraction": 0.05}, {"valid_docs": 700}, {}])
def test_selection_is_the_global_plans(held):
    """The bitmaps give exactly the global plan's copies and held-out documents (sources of
    more than 10,000 documents: numpy's arange path in the global plan)."""
    rng = np.random.default_rng(1)
    per = [rng.integers(0, 50, n) for n in (14_000, 3_000, 12_500)]  # zeros: empty documents
    factors = [1.5, 0.25, 2.0]
    opts = PackOptions(SEQ, seed=5, **held)
    sizes = [x.size for x in per]
    want_reps, want_held = mixture_plan(np.concatenate(per), sizes, factors, opts)
    held_bits, extra_bits = selection_bits(chunked(per), sizes, factors, opts)
    got_held = get_bits(held_bits, 0, sum(sizes))
    reps = np.concatenate([np.full(n, int(f)) for n, f in zip(sizes, factors, strict=True)])
    reps[get_bits(extra_bits, 0, sum(sizes))] += 1
    reps[got_held] = 0
    assert np.array_equal(got_held, want_held) and np.array_equal(reps, want_reps)


# ------------------------------------------------------------------- packs
@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Two sources: 12,000 short documents (some empty, some longer than SEQ) and 3,000 with
    a loss mask."""
    d = tmp_path_factory.mktemp("groups")
    a = lognormal_lengths(12_000, median=20, sigma=1.2, cap=700, seed=1)
    a[::97] = 0
    write_token_corpus(d / "a", a, vocab_size=1_000, seed=1)
    write_token_corpus(d / "b", lognormal_lengths(3_000, median=40, cap=700, seed=2),
                       vocab_size=1_000, seed=2, mask=True)
    return d


def specs(d):
    return [f"{d / 'a'}:1.5", f"{d / 'b'}:0.5"]


def segments(directory) -> list:
    """Every segment (document, offset, length) of a dataset, sorted: what it holds."""
    ds = packtool.open_packed(directory)
    rows = [np.stack([np.asarray(a, np.int64) for a in (sh.seg_doc, sh.seg_offset,
                                                          sh.seg_length)], 1)
            for sh in (ds.shard(k) for k in range(ds.n_shards))]
    rows = np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)
    return sorted(map(tuple, rows.tolist()))


@pytest.mark.parametrize("layout", ["index", *slow("tokens")])
def test_grouped_pack_holds_the_global_segments(corpora, tmp_path, layout):
    """Four groups (one across the sources' boundary), a mixture and a 3% held-out split:
    the same segments in each split as the global plan, counts added up, and verify
    --source passes."""
    kw = dict(layout=layout, valid_fraction=0.03, shard_size=40_000, seed=3)
    pack(specs(corpora), tmp_path / "global", PackOptions(SEQ, **kw))
    res = pack(specs(corpora), tmp_path / "grouped", PackOptions(SEQ, group_docs=GROUP, **kw))
    assert res.n_packs > 0 and res.valid["n_packs"] > 0
    for split in ("", "valid"):
        assert segments(tmp_path / "grouped" / split) == segments(tmp_path / "global" / split)
        g, o = (json.loads((tmp_path / x / split / "index.json").read_text())
                for x in ("grouped", "global"))
        for key in ("n_docs", "n_empty", "n_split", "n_split_pieces", "n_segments", "n_tokens"):
            assert g[key] == o[key], (split, key)
        assert [s["docs_used"] for s in g["sources"]] == [s["docs_used"] for s in o["sources"]]
        assert g["group_docs"] == GROUP and g["n_packs"] >= o["n_packs"]
        assert {sh["name"][:12] for sh in g["shards"]} == {
            f"shard-{k:05d}-" for k in range(4)}, "every group writes shards of its own"
    grouped = packtool.open_packed(tmp_path / "grouped")
    for i in range(0, len(grouped), 37):  # a pack never mixes two groups
        assert len(set((grouped[i]["source_docs"] // GROUP).tolist())) == 1
    out = verify_packed(tmp_path / "grouped", specs(corpora))
    assert out.sources_checked and out.valid["n_packs"] == res.valid["n_packs"]


def test_one_group_is_the_global_plan(corpora, tmp_path):
    """A single group, unshuffled, is the global plan: the same shard files, byte for byte,
    under the group's names."""
    kw = dict(layout="tokens", valid_docs=40, shuffle=False, shard_size=50_000)
    pack(specs(corpora), tmp_path / "global", PackOptions(SEQ, **kw))
    pack(specs(corpora), tmp_path / "one", PackOptions(SEQ, group_docs=10**6, **kw))
    for split, tag in (("", ""), ("valid", "v")):
        glob = sorted((tmp_path / "global" / split).glob("shard-*.npy"))
        assert glob
        for f in glob:
            k, array = f.name.split(".", 1)
            twin = tmp_path / "one" / split / f"shard-00000-{tag}{int(k[6:]):03d}.{array}"
            assert twin.read_bytes() == f.read_bytes(), twin.name


def test_group_tasks_then_finalize(corpora, tmp_path):
    """Array tasks share the groups (round robin); --finalize names a group not yet written,
    then assembles the same dataset as one process."""
    out = tmp_path / "p"
    base = ["pack", *specs(corpora), "-L", SEQ, "--group-docs", GROUP, "--valid-fraction",
            0.03, "--layout", "tokens", "--shard-size", 40_000, "-o", out, "-q"]
    assert run_cli(*base, "--tasks", 3, "--task", 1).exit_code == 0
    res = run_cli(*base, "--finalize")
    assert res.exit_code == 1 and "3 of 4 groups" in res.output
    assert "group 0 (documents 0..3,999): missing" in res.output
    assert not out.exists()
    for k in (0, 2):
        assert run_cli(*base, "--tasks", 3, "--task", k).exit_code == 0
    res = run_cli(*base, "--finalize")
    assert res.exit_code == 0, res.output
    assert run_cli(*base[:-3], "-o", tmp_path / "local", "-q").exit_code == 0
    assert shard_bytes(out) == shard_bytes(tmp_path / "local") != {}
    assert leftovers(tmp_path) == []
    verify_cli(out, corpora)


def shard_bytes(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("shard-*.npy"))}


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*")
                  if ".tmp-" in p.name or ".staging-" in p.name
                  or p.name.endswith((".lock", ".entry.json")))


def test_bad_group_entry_is_redone(corpora, tmp_path):
    """An entry of another version, or one that is not an entry, is named at --finalize
    and the group written again by its task; the files it lists are not trusted."""
    out = tmp_path / "p"
    base = ["pack", *specs(corpora), "-L", SEQ, "--group-docs", GROUP, "-o", out, "-q"]
    for k in (0, 1):
        assert run_cli(*base, "--tasks", 2, "--task", k).exit_code == 0
    staging = next(tmp_path.glob(".p.staging-*"))
    e1 = staging / entries.group_entry_name(1)
    m = json.loads(e1.read_text())
    e1.write_text(json.dumps({**m, "version": 9}))
    e2 = staging / entries.group_entry_name(2)
    e2.write_text(json.dumps({**json.loads(e2.read_text()), "splits": {"train": {}}}))
    res = run_cli(*base, "--finalize")
    assert res.exit_code == 1 and "2 of 4 groups" in res.output
    assert "packtool.packed.group version 9, this packtool reads version 1" in res.output
    assert "missing key 'shards'" in res.output
    assert run_cli(*base, "--tasks", 2, "--task", 1).exit_code == 0  # owns groups 1 and 3
    assert run_cli(*base, "--tasks", 2, "--task", 0).exit_code == 0
    assert run_cli(*base, "--finalize").exit_code == 0
    verify_cli(out, corpora)


SLOW_TASK = """
import sys, time
from packtool.pack import streamed as groups
real = groups.ShardWriter
class Slow(real):
    def write(self, *a, **k):
        entry = super().write(*a, **k)
        time.sleep(30)  # the shard's files sit in .group-G.tmp-PID-X/: killed here
        return entry
groups.ShardWriter = Slow
from packtool.cli import cli
cli.main(sys.argv[1:], prog_name="packtool")
"""


@pytest.mark.parametrize("tasks", [False, *slow(True)])
def test_job_killed_mid_group_is_reclaimed(corpora, tmp_path, tasks):
    """SIGKILL a pack (a local run, or an array task) while a group's shard sits in its
    temporary folder: the next run reclaims it, and the dataset is the same bytes as one
    never interrupted, with nothing of the killed process left."""
    out = tmp_path / "p"
    base = ["pack", *specs(corpora), "-L", SEQ, "--group-docs", GROUP, "--layout", "tokens",
            "--valid-fraction", 0.03, "-o", out, "-q"]
    share = ["--tasks", 2, "--task", 0] if tasks else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_TASK, *map(str, base + share)], env=env)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".p.*/.group-*.tmp-*")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if tasks:
        for k in (0, 1):
            assert run_cli(*base, "--tasks", 2, "--task", k).exit_code == 0
        res = run_cli(*base, "--finalize")
    else:
        res = run_cli(*base)
    assert res.exit_code == 0, res.output
    assert run_cli(*base[:-3], "-o", tmp_path / "clean", "-q").exit_code == 0
    assert shard_bytes(out) == shard_bytes(tmp_path / "clean") != {}
    assert leftovers(tmp_path) == []
    verify_cli(out, corpora)
