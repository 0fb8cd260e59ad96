"""packtool stats of pairs and groups: the packs predicted for a grouped corpus (a group one
item of its total length; with --share-prompt its prompt once plus each completion) are the
packs pack writes, for several packers, both layouts and --overflow drop; a seq_len that
pack would refuse is said so; stats of a grouped packed dataset names groups and
sequences."""

import json

import pytest
from conftest import TOKENIZER, run, write_jsonl
from synth import group_records

import packtool
from packtool.errors import PacktoolError
from packtool.formats.packed import open_packed
from packtool.pack import pack_corpus
from packtool.stats import stats
from packtool.tokenize import TokenizeOptions, tokenize_files


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    d = tmp_path_factory.mktemp("pref-stats")
    p = write_jsonl(d / "g.jsonl", group_records(80, seed=3))
    tokenize_files([str(p)], TOKENIZER, d / "g", TokenizeOptions(
        prompt_field="q", completions_field="outs"))
    return d, packtool.open_tokens(d / "g")


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("algo", ["bfd", "ffd"])
def test_stats_predicts_the_packs_of_groups(groups, share, algo):
    d, corpus = groups
    L = 1024
    rep = stats([str(corpus.prefix)], seq_lens=[L], algos=algo, share_prompt=share).report
    s = rep["seq_lens"][0]
    assert not s["refused"]
    out = d / f"p-{share}-{algo}"
    pack_corpus([corpus.prefix], out, L, algo, share_prompt=share, overwrite=True)
    idx = open_packed(out).index
    assert s["algos"][0]["packs"] == idx["n_packs"]
    assert rep["n_tokens"] == rep["groups"]["n_tokens"] == idx["n_tokens"]
    assert rep["n_docs"] == rep["groups"]["n_groups"] == idx["groups"]["n_groups"]
    assert rep["groups"]["n_sequences"] == len(corpus)
    # one packing factor, sequences per pack, in stats, pack, the packed stats and verify's
    # counts (pack printed segments per pack, 1.5x with --share-prompt; stats groups, issue 38)
    factor = len(corpus) / idx["n_packs"]
    assert s["algos"][0]["packing_factor"] == pytest.approx(factor)
    assert idx["packing_factor"] == pytest.approx(factor)
    assert s["algos"][0]["groups_per_pack"] == pytest.approx(idx["groups"]["n_groups"]
                                                             / idx["n_packs"])
    assert stats([str(out)]).report["packing_factor"] == pytest.approx(factor)
    if share:
        assert rep["groups"]["n_tokens"] < rep["groups"]["n_sequence_tokens"]
    else:
        assert rep["groups"]["n_tokens"] == corpus.n_tokens


def test_a_seq_len_pack_refuses_is_said_and_drop_predicted(groups):
    d, corpus = groups
    longest = int(stats([str(corpus.prefix)], seq_lens=[10**6]).report["length"]["max"])
    L = longest - 1
    rep = stats([str(corpus.prefix)], seq_lens=[L], algos="bfd").report
    s = rep["seq_lens"][0]
    assert s["refused"] and s["n_overlong"] >= 1 and "algos" not in s
    with pytest.raises(PacktoolError, match="longer than --seq-len"):
        pack_corpus([corpus.prefix], d / "refused", L)
    text = stats([str(corpus.prefix)], seq_lens=[L]).summary()
    assert "group(s) longer: pack refuses" in text
    rep = stats([str(corpus.prefix)], seq_lens=[L], algos="bfd", overflow="drop").report
    s = rep["seq_lens"][0]
    assert not s["refused"]
    pack_corpus([corpus.prefix], d / "dropped", L, overflow="drop", overwrite=True)
    idx = open_packed(d / "dropped").index
    assert s["algos"][0]["packs"] == idx["n_packs"]
    assert s["n_overlong"] == idx["groups"]["n_dropped_groups"]


def test_stats_cli_on_groups_and_options_pack_refuses(groups):
    _, corpus = groups
    r = run("stats", corpus.prefix, "-L", "1024", "--share-prompt", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["groups"]["share_prompt"] and rep["groups"]["kind"] == "completions"
    r = run("stats", corpus.prefix, "-L", "1024", "--share-prompt")
    assert "80 groups" in r.output and f"{len(corpus):,} sequences" in r.output
    assert "stored once (--share-prompt)" in r.output
    r = run("stats", corpus.prefix, "-L", "1024", "--max-docs", "4")
    assert r.exit_code != 0 and "pairs and groups x --max-docs" in r.output


def test_share_prompt_on_plain_documents_is_refused(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "one two three"}])
    tokenize_files([str(p)], TOKENIZER, tmp_path / "d", TokenizeOptions())
    r = run("stats", tmp_path / "d", "-L", "64", "--share-prompt")
    assert r.exit_code != 0 and "plain documents" in r.output


@pytest.mark.parametrize("share", [False, True])
def test_stats_of_a_grouped_packed_dataset(groups, share):
    d, corpus = groups
    out = d / f"pk-{share}"
    pack_corpus([corpus.prefix], out, 1024, share_prompt=share, overwrite=True)
    r = run("stats", out, "--json")
    assert r.exit_code == 0, r.output
    g = json.loads(r.stdout)["groups"]
    assert g["n_sequences"] == len(corpus) and g["n_groups_packed"] == 80
    assert g["n_shared_prompts"] == (80 if share else 0)
    text = run("stats", out).output
    assert f"80 groups whole in their rows (0 dropped over --seq-len), {len(corpus):,} " \
           "sequences" in text
    assert ("80 prompts stored once" in text) == share


def test_plot_of_a_grouped_corpus_is_refused(groups, tmp_path):
    _, corpus = groups
    r = run("stats", corpus.prefix, "-L", "1024", "--plot", tmp_path / "x.png")
    assert r.exit_code != 0 and "reported as groups" in r.output
    assert not (tmp_path / "x.png").exists()


def test_a_grouped_dataset_records_what_was_done_with_overlong_groups(groups, tmp_path):
    """A group is never cut, so index.json says "refuse" (the default --overflow split
    included) or "drop", never "split"; --overflow truncate is refused by name, by pack and
    stats alike; a reader refuses an index claiming a cut for pairs or groups, and a plain
    dataset still records its option as given."""
    import shutil

    from packtool.errors import FormatError
    from packtool.formats._manifest import digest
    from packtool.formats.packed.schema import DIGEST_KEY

    d, corpus = groups
    pack_corpus([corpus.prefix], tmp_path / "kept", 1024)
    assert open_packed(tmp_path / "kept").index["overflow"] == "refuse"
    assert stats([str(corpus.prefix)], seq_lens=[1024]).report["overflow"] == "refuse"
    longest = int(stats([str(corpus.prefix)], seq_lens=[10**6]).report["length"]["max"])
    pack_corpus([corpus.prefix], tmp_path / "dropped", longest - 1, overflow="drop")
    idx = open_packed(tmp_path / "dropped").index
    assert idx["overflow"] == "drop" and idx["groups"]["n_dropped_groups"] >= 1
    for call in (lambda: pack_corpus([corpus.prefix], tmp_path / "t", 1024, overflow="truncate"),
                 lambda: stats([str(corpus.prefix)], seq_lens=[1024], overflow="truncate")):
        with pytest.raises(PacktoolError, match="never cut"):
            call()
    assert not (tmp_path / "t").exists()
    forged = tmp_path / "forged"
    shutil.copytree(tmp_path / "kept", forged)
    index = json.loads((forged / "index.json").read_text())
    index["overflow"] = "truncate"
    index[DIGEST_KEY] = digest(index, DIGEST_KEY)
    (forged / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match="pairs or groups"):
        open_packed(forged)
    plain = write_jsonl(tmp_path / "p.jsonl", [{"text": "one two three four"}] * 3)
    tokenize_files([str(plain)], TOKENIZER, tmp_path / "p", TokenizeOptions())
    for policy in ("split", "truncate", "drop"):
        res = pack_corpus([tmp_path / "p"], tmp_path / f"pp-{policy}", 64, overflow=policy)
        idx = open_packed(tmp_path / f"pp-{policy}").index
        assert idx["overflow"] == res.overflow == policy
        assert "groups" not in idx and res.groups is None


def test_what_a_grouped_pack_reports_of_its_overflow(groups, tmp_path):
    """Pack's summary, --json and warning, stats of the dataset and verify --source say
    what was done to groups over --seq-len (refused, or dropped whole and counted), never
    that they were split, and never offer --overflow split as the fix; verify counts the
    dropped groups itself and refuses an index that miscounts them."""
    import shutil

    from packtool.errors import FormatError
    from packtool.formats._manifest import digest
    from packtool.formats.packed.schema import DIGEST_KEY
    from packtool.stats.render import render_corpus, render_packed
    from packtool.verify import VerifyError, verify

    d, corpus = groups
    r = run("pack", corpus.prefix, "-L", 1024, "-o", tmp_path / "kept", "-q", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["overflow"] == "refuse"
    assert "groups over seq_len refused" in render_packed(stats([str(tmp_path / "kept")]).report)
    assert "refused, as pack does" in render_corpus(
        stats([str(corpus.prefix)], seq_lens=[1024]).report)
    L = int(stats([str(corpus.prefix)], seq_lens=[10**6]).report["length"]["p50"])
    res = pack_corpus([corpus.prefix], tmp_path / "dropped", L, overflow="drop")
    idx = open_packed(tmp_path / "dropped").index
    n_groups = idx["groups"]["n_dropped_groups"]
    assert res.overflow == "drop" and res.groups == idx["groups"] and n_groups >= 1
    assert (f"dropped {n_groups:,} groups over --seq-len ({idx['n_dropped']:,} sequences, "
            f"{idx['n_dropped_tokens']:,} tokens)") in res.summary()
    warned = [w for w in res.warnings if "--overflow drop discarded" in w]
    assert warned and "--overflow split" not in warned[0] and "never cut" in warned[0]
    assert f"dropped whole: {n_groups:,} groups" in render_packed(
        stats([str(tmp_path / "dropped")]).report)
    said = verify(tmp_path / "dropped", [corpus.prefix]).summary()
    assert (f"{idx['n_dropped_tokens']:,} in {idx['n_dropped']:,} sequences of {n_groups:,} "
            "groups dropped whole by --overflow drop") in said
    forged = tmp_path / "forged"
    shutil.copytree(tmp_path / "dropped", forged)
    index = json.loads((forged / "index.json").read_text())
    index["groups"]["n_dropped_groups"] -= 1
    index[DIGEST_KEY] = digest(index, DIGEST_KEY)
    (forged / "index.json").write_text(json.dumps(index))
    with pytest.raises((VerifyError, FormatError), match="dropped over seq_len"):
        verify(forged, [corpus.prefix])
