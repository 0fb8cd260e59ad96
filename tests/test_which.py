"""``packtool which``: a step's source documents and where a record went, from the segment
tables and the sources' manifests (issue 23.3)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TOKENIZER, write_jsonl
from synth import make_documents

import packtool
from packtool.cli import cli
from packtool.train.sampler import PackSampler
from packtool.train.which import which_record, which_step


def build(tmp_path):
    docs = make_documents(120, seed=4, median_words=40, max_words=300)
    records = [{"text": t} for t in docs]
    records[10] = {"body": "not a text field"}  # a skipped bad record: line 11
    write_jsonl(tmp_path / "a.jsonl", records[:60])
    write_jsonl(tmp_path / "b.jsonl", records[60:])
    r = CliRunner().invoke(cli, ["tokenize", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"),
                                 "-t", str(TOKENIZER), "-o", str(tmp_path / "c"), "-q",
                                 "--skip-bad-records", "--part-bytes", "1"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["pack", str(tmp_path / "c"), "-L", "256", "-o",
                                 str(tmp_path / "p"), "-q"])
    assert r.exit_code == 0, r.output
    return docs


def test_step_names_every_segment_as_the_sampler_and_reader_see_it(tmp_path):
    docs = build(tmp_path)
    ds = packtool.open_packed(tmp_path / "p")
    sampler = PackSampler(ds, rank=0, world_size=2, batch_size=2, seed=3, drop_last=False)
    sched = sampler.global_schedule(1)
    res = which_step(tmp_path / "p", 1, 2, world_size=2, batch_size=2, seed=3)
    packs = sorted({s.pack for s in res.segments})
    assert packs == sorted(sched[2].ravel().tolist())
    texts = {(p.name, i + 1): t for p, part in ((tmp_path / "a.jsonl", docs[:60]),
                                               (tmp_path / "b.jsonl", docs[60:]))
             for i, t in enumerate(part)}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    for s in res.segments:
        ex = ds[s.pack]
        ids = ex["input_ids"][s.position[0]:s.position[1]].tolist()
        d = s.document
        text = texts[(d.input.rsplit("/", 1)[-1], d.record)]
        assert tok.encode(text, add_special_tokens=False).ids[s.tokens[0]:s.tokens[1]] == ids
    only = which_step(tmp_path / "p", 1, 2, rank=1, world_size=2, batch_size=2, seed=3)
    assert {s.rank for s in only.segments} == {1}


def test_record_lookup_round_trips_and_skips_count_as_lines(tmp_path):
    build(tmp_path)
    res = which_record(tmp_path / "p", f"{tmp_path / 'a.jsonl'}:12", 0, world_size=2)
    assert res.steps and all(s["step"] is not None for s in res.steps)
    pack = res.steps[0]["pack"]
    step = which_step(tmp_path / "p", 0, res.steps[0]["step"], res.steps[0]["rank"],
                      world_size=2)
    hits = [s for s in step.segments if s.pack == pack and s.document.record == 12
            and s.document.input.endswith("a.jsonl")]
    assert hits, "the step holding record 12 names it"
    with np.testing.assert_raises(packtool.PacktoolError):
        which_record(tmp_path / "p", f"{tmp_path / 'a.jsonl'}:11", 0)  # the skipped record


def test_cli(tmp_path):
    build(tmp_path)
    r = CliRunner().invoke(cli, ["which", str(tmp_path / "p"), "--step", "0", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["segments"] and out["segments"][0]["document"]["source"].endswith("c")
    r = CliRunner().invoke(cli, ["which", str(tmp_path / "p"), "--record", "b.jsonl:5"])
    assert r.exit_code == 0 and "document" in r.output, r.output
    r = CliRunner().invoke(cli, ["which", str(tmp_path / "p")])
    assert r.exit_code == 2 and "--step" in r.output


def test_record_numbers_skip_the_gaps_as_a_plain_loop_does():
    """The vectorised record number of a document equals the obvious count: walk the records,
    skipping gaps (bad records skipped, blank lines), until the document's turn."""
    from packtool.train.which import document_of, record_number

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        gaps = sorted(set(rng.integers(1, 2 * n + 2, size=int(rng.integers(0, n))).tolist()))
        inp = {"path": "f", "n_docs": n, "skipped_records": gaps}
        records = [r for r in range(1, n + len(gaps) + 1) if r not in set(gaps)][:n]
        for local in range(n):
            assert record_number(inp, local) == records[local]
            assert document_of(inp, records[local], "c") == local


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("which")
    build(d)
    return d


def yielded(ds, epoch, **kw):
    """Where iterating PackSampler (every rank) actually yields each pack: pack -> [(step,
    rank)], and each step's packs per rank."""
    places, steps = {}, {}
    for r in range(kw["world_size"]):
        s = PackSampler(ds, rank=r, **kw)
        s.set_epoch(epoch)
        for i, pack in enumerate(s):
            step = i // kw["batch_size"]
            places.setdefault(pack, []).append((step, r))
            steps.setdefault(step, {}).setdefault(r, []).append(pack)
    return places, steps


@pytest.mark.parametrize("world,batch,balance", [(1, 1, None), (3, 1, None), (2, 3, None),
                                                 (5, 2, None), (3, 2, "attention")])
@pytest.mark.parametrize("drop_last", [True, False])
def test_which_answers_where_the_sampler_yields(built, world, batch, balance, drop_last):
    """Every record's step and rank, and every step's packs, as iterating PackSampler with the
    same settings yields them; a step it never takes is refused, never filled."""
    ds = packtool.open_packed(built / "p")
    kw = dict(world_size=world, batch_size=batch, seed=5, balance=balance, drop_last=drop_last)
    places, steps = yielded(ds, 1, **kw)
    for spec in [f"a.jsonl:{k}" for k in range(1, 61) if k != 11] + \
            [f"b.jsonl:{k}" for k in range(1, 61)]:
        res = which_record(built / "p", spec, 1, **kw)
        for pack in {st["pack"] for st in res.steps}:
            got = [(st["step"], st["rank"]) for st in res.steps if st["pack"] == pack]
            assert got == sorted(places.get(pack, [(None, None)])), (spec, pack)
    for step in range(len(steps)):
        res = which_step(built / "p", 1, step, **kw)
        mine = {}
        for seg in res.segments:
            if not mine.get(seg.rank) or mine[seg.rank][-1] != seg.pack:
                mine.setdefault(seg.rank, []).append(seg.pack)
        assert mine == steps[step]
    with pytest.raises(packtool.PacktoolError, match=f"step {len(steps)}: the sampler takes "
                                                     f"steps 0..{len(steps) - 1} of epoch 1"):
        which_step(built / "p", 1, len(steps), **kw)


def test_cli_step_past_the_last_is_refused_with_drop_last(built):
    """92 packs at world size 3: drop_last (the sampler's default) takes steps 0..29 and leaves
    out 2 packs; --no-drop-last takes a step 30 filled with the epoch's first packs."""
    p = str(built / "p")
    assert len(packtool.open_packed(p)) == 92
    r = CliRunner().invoke(cli, ["which", p, "--step", "30", "--world-size", "3"])
    assert r.exit_code == 1 and "step 30: the sampler takes steps 0..29" in r.output \
        and "with drop_last" in r.output and "last 2 packs" in r.output, r.output
    r = CliRunner().invoke(cli, ["which", p, "--step", "30", "--world-size", "3",
                                 "--no-drop-last"])
    assert r.exit_code == 0 and "rank 2 pack" in r.output, r.output


@pytest.mark.parametrize("args,says", [
    (["--record", "a.jsonl:²"], "ASCII digits"),
    (["--record", "a.jsonl:0"], "1-based"),
    (["--record", ":5"], "FILE:RECORD"),
    (["--record", "a.jsonl"], "FILE:RECORD"),
    (["--step", "0", "--world-size", str(2**62)], f"world size {2**62:,} > 92 packs"),
    (["--step", "0", "--world-size", "1000000", "--balance", "attention"],
     "world size 1,000,000 > 92 packs"),
    (["--record", "a.jsonl:5", "--world-size", str(2**62), "--no-drop-last"], "> 92 packs"),
    (["--step", "0", "--world-size", "4", "--batch-size", str(2**62), "--no-drop-last"],
     "packs a step > 92 packs"),
    (["--step", "0", "--world-size", "4", "--batch-size", "24"], "takes no step"),
    (["--step", "0", "--world-size", "3", "--rank", "3"], "--rank 3"),
])
def test_cli_refuses_what_it_cannot_answer(built, args, says):
    r = CliRunner().invoke(cli, ["which", str(built / "p"), *args])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert says in r.output, r.output


def test_library_refuses_bad_settings(built):
    for kw in (dict(world_size=0), dict(world_size=-2), dict(batch_size=0), dict(seed=-1),
               dict(world_size=True), dict(world_size="2"), dict(world_size=2.0)):
        with pytest.raises(packtool.PacktoolError, match="must be an integer"):
            which_step(built / "p", 0, 0, **kw)
    with pytest.raises(packtool.PacktoolError, match="--epoch must be"):
        which_record(built / "p", "a.jsonl:5", -1)
    for step in (-1, "0", True):
        with pytest.raises(packtool.PacktoolError, match="the sampler takes steps"):
            which_step(built / "p", 0, step)


def test_record_by_any_path_to_the_same_file(tmp_path, monkeypatch):
    """Tokenized as data/prose.jsonl (relative): the record is found by that spelling, ./data/...,
    the absolute path and a symlink; two inputs of one base name are refused by name."""
    docs = make_documents(30, seed=2, median_words=40, max_words=200)
    for name, part in (("data/prose.jsonl", docs[:10]), ("x/a.jsonl", docs[10:20]),
                       ("y/a.jsonl", docs[20:])):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        write_jsonl(tmp_path / name, [{"text": t} for t in part])
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "data" / "prose.jsonl")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["tokenize", "data/prose.jsonl", "x/a.jsonl", "y/a.jsonl", "-t",
                                 str(TOKENIZER), "-o", "c", "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["pack", "c", "-L", "128", "-o", "p", "-q"])
    assert r.exit_code == 0, r.output
    want = which_record("p", "data/prose.jsonl:7").question.split(" in epoch")[0]
    assert want.endswith("(document 6)")
    for spelling in ("./data/prose.jsonl", str(tmp_path / "data" / "prose.jsonl"),
                     str(tmp_path / "link.jsonl"), "data/../data/prose.jsonl", "prose.jsonl"):
        r = CliRunner().invoke(cli, ["which", "p", "--record", f"{spelling}:7"])
        assert r.exit_code == 0 and "(document 6)" in r.output, (spelling, r.output)
    r = CliRunner().invoke(cli, ["which", "p", "--record", "a.jsonl:3"])
    assert r.exit_code == 1 and "2 inputs match: x/a.jsonl" in r.output \
        and "y/a.jsonl" in r.output, r.output
    r = CliRunner().invoke(cli, ["which", "p", "--record", "y/a.jsonl:3"])
    assert r.exit_code == 0 and "(document 22)" in r.output, r.output


def test_mixture_step_and_record_name_each_source_as_the_sampler_yields(tmp_path):
    """`packtool which web=DIR code=DIR --schedule ...` (issue 32.3): every rank's rows of a
    step, named by source, equal what MixtureSampler yields, and a record's row is found at
    the step and rank the sampler gives it."""
    from packtool.train.mixture import MixtureSampler

    build(tmp_path)
    r = CliRunner().invoke(cli, ["pack", str(tmp_path / "c"), "-L", "128", "-o",
                                 str(tmp_path / "q"), "-q"])
    assert r.exit_code == 0, r.output
    paths = {"web": tmp_path / "p", "code": tmp_path / "q"}
    schedule = [[0, {"web": 0.7, "code": 0.3}], [3, {"web": 0.2, "code": 0.8}]]
    (tmp_path / "s.json").write_text(json.dumps(schedule))
    args = ["which", f"web={paths['web']}", f"code={paths['code']}", "--schedule",
            str(tmp_path / "s.json"), "--world-size", "2", "--batch-size", "3", "--seed", "5"]
    sampler = MixtureSampler({n: packtool.open_packed(p) for n, p in paths.items()},
                             [tuple(p) for p in schedule], rank=1, world_size=2, batch_size=3,
                             seed=5)
    yielded = list(sampler.steps(until=6))
    for step in (1, 4):
        r = CliRunner().invoke(cli, args + ["--step", str(step), "--rank", "1", "--json"])
        assert r.exit_code == 0, r.output
        segs = json.loads(r.output)["segments"]
        named = list(dict.fromkeys((s["source"], s["pack"]) for s in segs))
        assert named == yielded[step]
        for s in segs:  # the segment's tokens are the row's, from the named source's corpus
            row = packtool.open_packed(paths[s["source"]])[s["pack"]]
            assert s["position"][1] <= len(row["input_ids"])
    r = CliRunner().invoke(cli, args + ["--record", "b.jsonl:5", "--json"])
    assert r.exit_code == 0, r.output
    steps = json.loads(r.output)["steps"]
    assert {s["source"] for s in steps} == {"web", "code"}  # both packed from one corpus
    for s in steps:
        assert [(s["step"], s["rank"])] == sampler.where(s["pack"], s["source"], 0)
    text = CliRunner().invoke(cli, args + ["--step", "0"]).output
    assert "web row" in text or "code row" in text
    base = ["which", f"web={paths['web']}", f"code={paths['code']}"]
    inline = ["--schedule", json.dumps(schedule)]
    for bad, says in ((["--schedule", "{", "--step", "1"], "not valid JSON"),
                      (inline + ["--balance", "attention", "--step", "1"], "MixtureSampler"),
                      (inline + ["--step", "0", "--epoch", "1"], "drop --epoch"),
                      (["--step", "1"], "--schedule"),
                      (inline + ["--step", "1", "--rank", "2", "--world-size", "2"], "--rank")):
        r = CliRunner().invoke(cli, base + bad)
        assert r.exit_code != 0 and says in r.output, (bad, r.output)
    r = CliRunner().invoke(cli, ["which", f"web={paths['web']}", str(paths["code"]),
                                 "--schedule", "{}", "--step", "0"])
    assert r.exit_code == 1 and "NAME=DIR" in r.output
