"""``packtool which``: a step's source documents and where a record went, from the segment
tables and the sources' manifests (issue 23.3)."""

import json

import numpy as np
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
