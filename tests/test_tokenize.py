"""packtool tokenize: every input kind round-trips against direct `tokenizers` encoding."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TOKENIZER, corpus_docs, encode_all, write_jsonl
from tokenizers import Tokenizer, models, pre_tokenizers

import packtool
from packtool.tokenize import TokenizeOptions, tokenize_files


def run(inputs, out, **kw):
    tok = kw.pop("tokenizer", TOKENIZER)
    return tokenize_files([str(i) for i in inputs], tok, out, TokenizeOptions(**kw))


@pytest.mark.parametrize("kind", ["jsonl", "json", "jsonl.gz", "jsonl.zst"])
def test_jsonl_kinds_round_trip(tmp_path, tokenizer, docs, kind):
    compress = kind.split(".")[1] if "." in kind else None
    rows = [{"text": d, "n": i} for i, d in enumerate(docs)]
    path = write_jsonl(tmp_path / f"in.{kind}", rows, compress)
    res = run([path], tmp_path / "out")
    assert res.n_docs == len(docs) and res.n_empty == 1
    assert corpus_docs(tmp_path / "out") == encode_all(tokenizer, docs)


def test_parquet_round_trip_in_batches(tmp_path, tokenizer, docs):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=7)
    tokenize_files([str(path)], TOKENIZER, tmp_path / "out", TokenizeOptions())
    assert corpus_docs(tmp_path / "out") == encode_all(tokenizer, docs)


def test_nested_field_jsonl_and_parquet(tmp_path, tokenizer, docs):
    write_jsonl(tmp_path / "a.jsonl", [{"meta": {"body": d}} for d in docs])
    pq.write_table(pa.table({"meta": [{"body": d, "x": 1} for d in docs]}), tmp_path / "b.parquet")
    run([tmp_path / "a.jsonl", tmp_path / "b.parquet"], tmp_path / "out", text_field="meta.body")
    assert corpus_docs(tmp_path / "out") == encode_all(tokenizer, docs + docs)


@pytest.mark.parametrize("split", ["file", "line", "blank-line"])
def test_txt_splits(tmp_path, tokenizer, split):
    text = "first line\nsecond line\n\n\nnew para ünïcode\nmore\n\nlast"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    expected = {
        "file": [text],
        "line": text.split("\n"),
        "blank-line": ["first line\nsecond line", "new para ünïcode\nmore", "last"],
    }[split]
    run([tmp_path / "a.txt"], tmp_path / "out", txt_split=split)
    assert corpus_docs(tmp_path / "out") == encode_all(tokenizer, expected)


def test_directory_and_glob_inputs_are_sorted(tmp_path, tokenizer):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("bee")
    (d / "a.txt").write_text("ay")
    (d / "sub" / "c.txt").write_text("see")
    (d / "ignored.csv").write_text("x")
    res = run([d], tmp_path / "o1")
    assert [i["path"].rsplit("/", 1)[1] for i in res.inputs] == ["a.txt", "b.txt", "c.txt"]
    res = run([str(d / "*.txt")], tmp_path / "o2")
    assert res.n_docs == 2
    assert corpus_docs(tmp_path / "o2") == encode_all(tokenizer, ["ay", "bee"])


def test_manifest_contents(tmp_path, docs):
    write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in docs[:10]])
    write_jsonl(tmp_path / "b.jsonl", [{"text": d} for d in docs[10:]])
    run([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "out", eos="<|eos|>",
        part_bytes=1)  # a part per file
    meta = json.loads((tmp_path / "out.json").read_text())
    assert meta["format"] == "packtool.tokens" and meta["version"] == 3
    assert meta["dtype"] == "uint16" and meta["n_docs"] == len(docs)
    assert [i["n_docs"] for i in meta["inputs"]] == [10, len(docs) - 10]
    assert meta["eos_id"] == 2 and meta["bos_id"] is None
    import hashlib
    import zlib

    assert meta["tokenizer"]["sha256"] == hashlib.sha256(TOKENIZER.read_bytes()).hexdigest()
    assert [q["name"] for q in meta["parts"]] == ["out.part-00000", "out.part-00001"]
    assert meta["plan"]["n_parts"] == 2
    for part, n in zip(meta["parts"], (10, len(docs) - 10), strict=True):
        assert part["n_docs"] == n and [i["n_docs"] for i in part["inputs"]] == [n]
        for key in ("bin", "boundaries"):
            data = (tmp_path / f"{part['name']}.{key}").read_bytes()
            expected = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                        "crc32": f"{zlib.crc32(data):08x}"}
            assert part["checksums"][key] == expected
    c = packtool.open_tokens(tmp_path / "out")
    c.verify_checksums()
    assert int(c.lengths.sum()) == meta["n_tokens"] == c.n_tokens


def test_bos_eos_and_special_tokens(tmp_path, tokenizer, docs):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in docs])
    run([path], tmp_path / "o1", bos="<|bos|>", eos="<|eos|>")
    bos, eos = tokenizer.token_to_id("<|bos|>"), tokenizer.token_to_id("<|eos|>")
    assert corpus_docs(tmp_path / "o1") == [[bos, *ids, eos] for ids in encode_all(tokenizer, docs)]
    run([path], tmp_path / "o2", special_tokens=True)
    assert corpus_docs(tmp_path / "o2") == encode_all(tokenizer, docs, add_special_tokens=True)
    assert corpus_docs(tmp_path / "o2")[0][0] == bos  # the fixture's template adds <|bos|>


def test_a_run_without_eos_says_so_in_one_line(tmp_path):
    """A missing --eos went unnoticed through tokenize, pack and export: a text run without
    one notes it (once, one line, with the fix); with --eos, or a chat template that places
    its own, nothing is said."""
    from click.testing import CliRunner

    from packtool.cli import cli

    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello there"}])
    r = CliRunner().invoke(cli, ["tokenize", str(path), "-t", str(TOKENIZER), "-o",
                                 str(tmp_path / "o1")])
    assert r.exit_code == 0, r.output
    (line,) = [x for x in r.stderr.splitlines() if "--eos" in x]
    assert line.startswith("warning: no --eos: documents do not end with an end-of-text token")
    assert "Pass --eos TOKEN" in line
    assert [w for w in run([path], tmp_path / "o2").warnings if "no --eos" in w]
    assert not [w for w in run([path], tmp_path / "o3", eos="<|eos|>").warnings
                if "--eos" in w]


def test_unknown_special_token_lists_vocabulary(tmp_path, docs):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    with pytest.raises(packtool.PacktoolError, match=r"'</s>' is not in .*'<\|eos\|>'"):
        run([path], tmp_path / "out", eos="</s>")
    assert not list(tmp_path.glob("out*"))


def test_tokenizer_padding_and_truncation_settings_are_ignored(tmp_path, tokenizer, docs):
    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.enable_truncation(8)
    tok.enable_padding(length=64, pad_id=0, pad_token="<|pad|>")
    (tmp_path / "model").mkdir()
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in docs])
    run([path], tmp_path / "out", tokenizer=tmp_path / "model")  # a model folder
    assert corpus_docs(tmp_path / "out") == encode_all(tokenizer, docs)


def test_uint32_for_large_vocabulary(tmp_path):
    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["[UNK]"] = 70_000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "big.json"))
    texts = ["w1 w69999 w65536", "", "w65535 nope w0"]
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    run([path], tmp_path / "out", tokenizer=tmp_path / "big.json")
    c = packtool.open_tokens(tmp_path / "out")
    assert c.dtype == np.dtype("<u4") and c.meta["dtype"] == "uint32"
    assert [c[i].tolist() for i in range(3)] == [[1, 69999, 65536], [], [65535, 70000, 0]]


def test_uint16_boundary_vocabulary_of_65536(tmp_path):
    vocab = {f"w{i}": i for i in range(65_536)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "t.json"))
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "w65535 w1"}])
    run([path], tmp_path / "out", tokenizer=tmp_path / "t.json")
    c = packtool.open_tokens(tmp_path / "out")
    assert c.dtype == np.dtype("<u2") and c[0].tolist() == [65535, 1]


@pytest.mark.parametrize("workers,batch_size", [(1, 1), (2, 7), (3, 1024), (0, 13)])
def test_output_identical_whatever_workers_and_batch(tmp_path, docs, workers, batch_size):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in docs * 5])
    run([path], tmp_path / "ref", workers=1, batch_size=1024)
    run([path], tmp_path / "out", workers=workers, batch_size=batch_size)
    for suffix in (".bin", ".boundaries"):
        assert (tmp_path / f"out{suffix}").read_bytes() == (tmp_path / f"ref{suffix}").read_bytes()


def test_bundled_corpus_round_trip(tmp_path, tokenizer):
    """The fixture corpus (all five input kinds) against direct encoding."""
    from conftest import CORPUS

    from packtool.sources import InputStats, ReadOptions, expand_inputs, iter_documents

    texts = []
    for p in expand_inputs([str(CORPUS)]):
        texts.extend(iter_documents(p, ReadOptions(), InputStats(str(p), "x")))
    res = run([CORPUS], tmp_path / "out", eos="<|eos|>")
    assert res.n_docs == len(texts) == 1220
    eos = tokenizer.token_to_id("<|eos|>")
    assert corpus_docs(tmp_path / "out") == [ids + [eos] for ids in encode_all(tokenizer, texts)]
