"""``verify --source`` streams (packtool/verify/): its own recomputation of the mixture's draws
equals the planner's, and a miscount found by the fingerprints is named by document."""

import json

import numpy as np
import pytest
from synth import lognormal_lengths, write_token_corpus

import packtool
from packtool._io import crc32_file
from packtool.formats.packed import index_digest
from packtool.options import PackOptions
from packtool.pack import pack
from packtool.pack.mixture import mixture_plan
from packtool.verify import VerifyError, verify_packed
from packtool.verify.draws import Selection, choice_marks


@pytest.mark.parametrize("n,size", [(8_000, 7_000), (60_000, 1_000), (60_000, 1_201),
                                    (60_000, 59_999), (30_000, 30_000)])
def test_choice_marks_is_numpys_choice(n, size):
    """verify's own draw, on both of numpy's paths."""
    for seed in range(4):
        want = np.sort(np.random.default_rng([seed, 3]).choice(n, size=size, replace=False))
        got = np.flatnonzero(choice_marks(np.random.default_rng([seed, 3]), n, size))
        assert np.array_equal(got, want), (n, size, seed)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify")
    for name, n, seed in (("a", 14_000, 1), ("b", 3_000, 2), ("c", 12_500, 3)):
        x = lognormal_lengths(n, median=12, sigma=1.0, cap=300, seed=seed)
        x[::41] = 0
        write_token_corpus(d / name, x, vocab_size=500, seed=seed)
    return d


@pytest.mark.parametrize("held", [{"valid_fraction": 0.05}, {"valid_docs": 600}, {}])
def test_verify_draws_are_the_plans(sources, held):
    """Selection (verify's code) gives the copies and held-out documents mixture_plan (the
    planner's) gives, for sources of more than 10,000 documents."""
    corpora = [packtool.open_tokens(sources / n) for n in "abc"]
    factors = [1.5, 0.25, 2.0]
    opts = PackOptions(64, seed=9, **held)
    lengths = np.concatenate([c.lengths for c in corpora])
    reps, held_mask = mixture_plan(lengths, [len(c) for c in corpora], factors, opts)
    index = {"seed": 9, "sources": [{"factor": f} for f in factors],
             "held_out": ({"valid_docs": None, "valid_fraction": None, "rule": 2, **held}
                          if held else None)}
    sel = Selection(index, corpora)
    train = np.concatenate([sel.copies(k, 0, len(c))[0] for k, c in enumerate(corpora)])
    valid = np.concatenate([sel.copies(k, 0, len(c))[1] for k, c in enumerate(corpora)])
    assert np.array_equal(valid.astype(bool), held_mask)
    assert np.array_equal(train, np.ones_like(train) if reps is None else reps)


def test_a_miscounted_document_is_named(sources, tmp_path):
    """A segment made a copy of another (checksums and index digest recomputed): one document
    twice, one lost; the fingerprints differ and one more pass names the document."""
    pack([str(sources / "b")], tmp_path / "p", PackOptions(64, shard_size=5_000))
    d = tmp_path / "p"
    idx = json.loads((d / "index.json").read_text())
    sh = idx["shards"][1]
    arrays = {a: np.load(d / sh["files"][a]["name"]).copy()
              for a in ("seg_doc", "seg_offset", "seg_length")}
    ln = arrays["seg_length"]
    i, j = next((i, j) for i in range(ln.size) for j in range(i + 1, ln.size)
                if ln[i] == ln[j] and arrays["seg_offset"][i] == arrays["seg_offset"][j] == 0)
    lost, twice = int(arrays["seg_doc"][j]), int(arrays["seg_doc"][i])
    arrays["seg_doc"][j] = twice
    f = d / sh["files"]["seg_doc"]["name"]
    np.save(f, arrays["seg_doc"])
    sh["files"]["seg_doc"]["crc32"] = crc32_file(f)
    idx["index_sha256"] = index_digest(idx)
    (d / "index.json").write_text(json.dumps(idx))
    first = min(lost, twice)
    want = (f"source document {first:,} \\(offset 0\\) is in the packs "
            f"{2 if first == twice else 0} time\\(s\\), expected 1: segment mismatch")
    with pytest.raises(VerifyError, match=want):
        verify_packed(d, [sources / "b"])


# ------------------------------------------------- options as users type them (item 7)
def test_sources_repeated_or_comma_separated_and_the_ambiguous_refused(sources, tmp_path):
    """`verify P --source a b` failed with click's "unexpected extra argument": --source a,b
    and --source a --source b both work, the extra argument is named with both spellings,
    and a comma value that is itself a corpus beside its pieces is refused."""
    from click.testing import CliRunner

    from packtool.cli import cli

    pack([str(sources / "a"), str(sources / "b")], tmp_path / "p", PackOptions(seq_len=128))
    a, b, p = str(sources / "a"), str(sources / "b"), str(tmp_path / "p")

    def run(*args):
        return CliRunner().invoke(cli, ["verify", p, *args])
    for args in (["--source", f"{a},{b}"], ["--source", a, "--source", b],
                 ["-s", f"{a}, {b}"]):
        r = run(*args)
        assert r.exit_code == 0 and r.stdout.startswith("OK"), (args, r.output)
    r = run("--source", a, b)
    assert r.exit_code == 2 and f"got {b} too" in r.output
    assert "--source a,b or --source a --source b" in r.output
    assert run("--source", f"{a},").exit_code == 2  # an empty name: not silently one source
    both = [sources / f"a,b{s}" for s in (".json", ".bin", ".boundaries")]
    try:  # a corpus whose name has the comma, beside a (the module's sources: removed after)
        for f in both:
            f.symlink_to(sources / f.name.replace("a,b", "a"))
        r = run("--source", f"{a},b")
        assert r.exit_code == 2 and "exist; rename one, or give each with its own --source" \
            in r.output, r.output
    finally:
        for f in both:
            f.unlink(missing_ok=True)


# --------------------------------------------------------- files its index does not list
def test_a_packed_folder_holding_unlisted_files_fails_verify(sources, tmp_path):
    """A packed folder with an export written inside it verified OK: the files its index does
    not list (in it or in valid/) are now named; packtool's own dead leftovers are not."""
    from click.testing import CliRunner

    from packtool.cli import cli

    p = tmp_path / "p"
    pack([str(sources / "b")], p, PackOptions(seq_len=128, valid_docs=50))
    (p / ".index.json.tmp-999999999-abcdef").write_text("")  # a dead run's: ours, ignored
    assert verify_packed(p).kind == "packed"
    (p / "ex").mkdir()
    (p / "ex" / "part-0.parquet").write_bytes(b"x")
    (p / "notes.txt").write_text("mine")
    with pytest.raises(VerifyError, match=r"holds 2 file\(s\) its index.json does not list "
                                          r"\(ex/part-0.parquet, notes.txt\)"):
        verify_packed(p)
    r = CliRunner().invoke(cli, ["verify", str(p)])
    assert r.exit_code == 1 and "move them out of it" in r.output, r.output
    (p / "notes.txt").unlink()
    import shutil

    shutil.rmtree(p / "ex")
    (p / "valid" / "stray.npy").write_bytes(b"")
    with pytest.raises(VerifyError, match=r"holds 1 file\(s\) .*\(valid/stray.npy\)"):
        verify_packed(p)


def test_expected_segments_of_no_documents_is_empty():
    """verify's own group loop over sources without a document expects no segment (it
    raised on zip(strict=True) of its group starts)."""
    from collections import Counter

    from packtool.verify.groups import expected_segments

    assert expected_segments([], False, 100, False) == (Counter(), Counter())
