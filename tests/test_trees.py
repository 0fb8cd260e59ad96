"""Prefix trees (packed format version 6): ``pack --share-prefix`` over plain records and
groups, ``--share-prompt`` as the depth-1 tree, the reader's tree keys (seg_parent, seg_end,
tree_in/out, positions from the parent path), validate/verify of seg_up, stats' exact
prediction, and version-5 datasets (fixtures/v5-shared, made before version 6) read as
they were."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from synth import write_docs

import packtool
from packtool.cli import cli
from packtool.errors import PacktoolError
from packtool.formats.packed.files import ValidationError
from packtool.formats.packed.validate import validate_packed
from packtool.pack import pack_corpus
from packtool.pack.trees import keys_of, trie
from packtool.stats import stats
from packtool.verify import verify_packed
from packtool.verify.trees import naive_trie

V5 = Path(__file__).resolve().parent.parent / "fixtures" / "v5-shared"


def chat_records(n_conv=12, turns=4, sys_len=40, seed=0):
    """Records of conversations: each record a conversation's first k turns (successive
    records of one conversation share its history), all under one system prompt; the loss
    mask on the answers."""
    rng = np.random.default_rng(seed)
    system = rng.integers(10, 1000, sys_len)
    docs, masks = [], []
    for _ in range(n_conv):
        ids, mask = [system], [np.zeros(sys_len, np.uint8)]
        for _ in range(turns):
            q, a = rng.integers(10, 1000, rng.integers(3, 12)), rng.integers(10, 1000,
                                                                           rng.integers(2, 20))
            ids += [q, a]
            mask += [np.zeros(q.size, np.uint8), np.ones(a.size, np.uint8)]
            docs.append(np.concatenate(ids))
            masks.append(np.concatenate(mask))
    return docs, masks


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    docs, masks = chat_records()
    write_docs(d / "chat", docs, masks, vocab_size=1000)
    pack_corpus([d / "chat"], d / "trees", 256, share_prefix=True, min_shared=4,
                layout="tokens")
    pack_corpus([d / "chat"], d / "flat", 256, layout="tokens")
    return d, docs, masks


def ancestor_mask(ex):
    tin, tout = ex["tree_in"], ex["tree_out"]
    n = tin.size
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    return (k <= q) & (tin[k] <= tin[q]) & (tin[q] < tout[k])


def test_records_share_their_prefixes_and_every_sequence_reads_whole(chat):
    d, docs, masks = chat
    ds = validate_packed(d / "trees")
    idx = ds.index
    assert ds.version == 6 and idx["trees"]["source"] == "records"
    flat = sum(len(x) for x in docs)
    assert idx["trees"]["n_tokens_flat"] == flat
    assert idx["n_tokens"] == idx["trees"]["n_tokens_stored"] < flat / 2
    seen = set()
    for i in range(len(ds)):
        ex = ds[i]
        vis = ancestor_mask(ex)
        for s, leaf in enumerate(ex["seq_leaf"]):
            doc = int(ex["seq_doc"][s])
            toks = np.flatnonzero(ex["tree_in"] == leaf)
            q = int(toks[-1])  # the leaf's last token sees exactly its sequence
            seqtok = np.flatnonzero(vis[q])
            assert np.array_equal(ex["input_ids"][seqtok], docs[doc])
            assert np.array_equal(ex["completion_mask"][seqtok], masks[doc])
            assert np.array_equal(ex["position_ids"][seqtok], np.arange(len(docs[doc])))
            assert ex["seq_role"][s] == 65535 and doc not in seen
            seen.add(doc)
        assert np.array_equal(ex["seg_prompt"], ex["seg_parent"])
    assert seen == set(range(len(docs)))


def test_verify_source_recomputes_the_trie_and_stats_predicts_pack(chat):
    d, docs, _ = chat
    res = verify_packed(d / "trees", [d / "chat"])
    assert res.sources_checked
    got = stats([str(d / "chat")], seq_lens=(256,), share_prefix=True, min_shared=4)
    s = got.report["share_prefix"]["seq_lens"][0]
    idx = packtool.open_packed(d / "trees").index
    assert (s["n_packs"], s["n_tokens"]) == (idx["n_packs"], idx["n_tokens"])
    assert s["tokens_saved"] == sum(len(x) for x in docs) - idx["n_tokens"]
    r = CliRunner().invoke(cli, ["stats", str(d / "chat"), "-L", "256", "--share-prefix",
                                 "--min-shared", "4"])
    assert r.exit_code == 0 and f"{idx['n_packs']:,} packs" in r.output, r.output
    r = CliRunner().invoke(cli, ["pack", str(d / "chat"), "-L", "256", "--share-prefix",
                                 "--min-shared", "4", "-o", str(d / "again")])
    assert r.exit_code == 0 and f"{idx['n_tokens']:,} tokens stored of " in r.output, r.output


def test_verify_refuses_a_shared_segment_that_is_not_its_records(chat, tmp_path):
    d, docs, masks = chat
    bad = [x.copy() for x in docs]
    bad[1][5] += 1  # the second record no longer begins like the first
    write_docs(tmp_path / "chat", bad, masks, vocab_size=1000)
    shutil.copytree(d / "trees", tmp_path / "trees")
    with pytest.raises(PacktoolError):
        verify_packed(tmp_path / "trees", [tmp_path / "chat"])


@pytest.mark.parametrize("array,match", [("seg_up", "seg_up"), ("seg_role", "always a leaf")])
def test_validate_refuses_a_tree_out_of_order(chat, tmp_path, array, match):
    """A parent outside its pack (seg_up), and a shared segment made a record's end
    (seg_role): each refused by the validator, the files' checksums made to agree."""
    d, *_ = chat
    shutil.copytree(d / "trees", tmp_path / "t")
    f = tmp_path / "t" / f"shard-00000.{array}.npy"
    a = np.load(f)
    up = np.load(tmp_path / "t" / "shard-00000.seg_up.npy")
    s = int(np.flatnonzero(up)[0])
    if array == "seg_up":
        a[s] = s + 5  # points before its pack's first segment
    else:
        a[s - int(up[s])] = 1  # the parent of a segment becomes a record's leaf
    np.save(f, a)
    idx = json.loads((tmp_path / "t" / "index.json").read_text())
    from packtool._io import crc32_file
    from packtool.formats._manifest import digest

    idx["shards"][0]["files"][array]["crc32"] = crc32_file(f)
    idx["shards"][0]["files"][array]["bytes"] = f.stat().st_size
    idx["index_sha256"] = digest(idx, "index_sha256")
    (tmp_path / "t" / "index.json").write_text(json.dumps(idx))
    with pytest.raises(ValidationError, match=match):
        validate_packed(tmp_path / "t")


def test_trie_equals_the_naive_trie_on_random_records():
    rng = np.random.default_rng(1)
    for _ in range(60):
        n, m = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        base = rng.integers(0, 3, 12)
        recs = [np.concatenate([base[:rng.integers(0, 12)], rng.integers(0, 3,
                                                                         rng.integers(1, 6))])
                for _ in range(n)]
        keys = [keys_of(r, None) for r in recs]
        segs = trie(keys, m)
        below = [set() for _ in segs]
        for i, (r, _, e, _) in enumerate(segs):
            if e == keys[r].size:
                p = i
                while p >= 0:
                    below[p].add(r)
                    p = segs[p][3]
        got = {(frozenset(below[i]), s, e) for i, (_, s, e, _) in enumerate(segs)}
        assert got == naive_trie({i: tuple(k.tolist()) for i, k in enumerate(keys)}, m)
        assert sum(e == keys[r].size for r, _, e, _ in segs) == n  # each record one leaf


def test_a_token_is_shared_only_if_its_mask_bit_agrees():
    a, b = np.arange(10), np.arange(10)
    keys = [keys_of(a, np.zeros(10)), keys_of(b, np.r_[np.zeros(5), np.ones(5)])]
    segs = trie(keys, 2)
    assert segs[0][1:3] == (0, 5)  # shared up to the first token whose mask differs


def test_records_over_seq_len_a_bucket_cut_into_sets_that_fit(tmp_path):
    docs, masks = chat_records(n_conv=30, turns=2, sys_len=60)
    write_docs(tmp_path / "c", docs, masks, vocab_size=1000)
    pack_corpus([tmp_path / "c"], tmp_path / "p", 200, share_prefix=True)
    ds = validate_packed(tmp_path / "p")
    assert ds.index["trees"]["n_split_trees"] >= 1
    verify_packed(tmp_path / "p", [tmp_path / "c"])
    docs.append(np.arange(300) % 900 + 10)
    masks.append(np.ones(300, np.uint8))
    write_docs(tmp_path / "c2", docs, masks, vocab_size=1000)
    with pytest.raises(PacktoolError, match="--overflow drop"):
        pack_corpus([tmp_path / "c2"], tmp_path / "p2", 200, share_prefix=True)
    pack_corpus([tmp_path / "c2"], tmp_path / "p2", 200, share_prefix=True, overflow="drop")
    assert packtool.open_packed(tmp_path / "p2").index["n_dropped"] == 1
    verify_packed(tmp_path / "p2", [tmp_path / "c2"])


def test_groups_share_prefix_depth_and_verify(tmp_path):
    pack_corpus([V5 / "groups"], tmp_path / "g", 1024, share_prefix=True, min_shared=2,
                layout="tokens")
    ds = validate_packed(tmp_path / "g")
    shared = packtool.open_packed(V5 / "groups-shared").index["n_tokens"]
    assert ds.index["trees"]["source"] == "groups" and ds.index["n_tokens"] < shared
    assert max(int(ds[i]["seg_parent"].size) for i in range(len(ds))) > 0
    depth = 0
    for i in range(len(ds)):
        par = ds[i]["seg_parent"]
        for s in range(par.size):
            k, p = 0, s
            while par[p] >= 0:
                p, k = par[p], k + 1
            depth = max(depth, k)
    assert depth >= 2  # completions that share a beginning branch again
    verify_packed(tmp_path / "g", [V5 / "groups"])


def test_version_5_datasets_read_as_before_and_share_prompt_writes_version_6(tmp_path):
    """fixtures/v5-shared: packed and read (expected.npz) before version 6 existed."""
    expected = np.load(V5 / "expected.npz")
    for name, src, kw in (("groups-shared", "groups", {"share_prompt": True,
                                                        "layout": "tokens"}),
                          ("groups-plain", "groups", {"layout": "tokens"}),
                          ("pairs-shared", "pairs", {"share_prompt": True})):
        old = packtool.open_packed(V5 / name)
        pack_corpus([V5 / src], tmp_path / name, 1024, **kw)
        new = validate_packed(tmp_path / name)
        assert old.version == 5 and new.version == (6 if kw.get("share_prompt") else 5)
        for i in range(len(old)):
            a, b = old[i], new[i]
            for key in {k.split("/")[2] for k in expected.files if k.startswith(f"{name}/")}:
                want = expected[f"{name}/{i}/{key}"]
                assert np.array_equal(np.asarray(a[key]), want), (name, i, key)
                assert np.array_equal(np.asarray(b[key]), want), (name, i, key)
            for key in ("seg_parent", "seg_end", "tree_in", "tree_out", "seq_leaf", "seq_doc"):
                assert np.array_equal(a[key], b[key]), (name, i, key)
        assert np.array_equal(old.attention_costs(), new.attention_costs())
        verify_packed(tmp_path / name, [V5 / src])
        verify_packed(V5 / name, [V5 / src])


def test_plain_datasets_keep_their_reader_output(tmp_path):
    """A dataset without trees reads exactly as before: no tree key, the same arrays."""
    docs, masks = chat_records(n_conv=3)
    write_docs(tmp_path / "c", docs, masks, vocab_size=1000)
    pack_corpus([tmp_path / "c"], tmp_path / "p", 128)
    ex = packtool.open_packed(tmp_path / "p")[0]
    assert set(ex) == {"input_ids", "labels", "position_ids", "doc_ids", "cu_seqlens",
                       "max_seqlen", "source_docs", "source_offsets"}


def test_parquet_export_carries_the_tree(chat, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    d, *_ = chat
    r = CliRunner().invoke(cli, ["export", str(d / "trees"), "--format", "parquet", "-o",
                                 str(tmp_path / "t.parquet"), "-q"])
    assert r.exit_code == 0, r.output
    t = pq.read_table(tmp_path / "t.parquet").to_pylist()
    ds = packtool.open_packed(d / "trees")
    for i, row in enumerate(t):
        ex = ds[i]
        up = np.asarray(row["seq_up"])
        par = np.where(up > 0, np.arange(up.size) - up, -1)
        assert np.array_equal(par, ex["seg_parent"])
        assert np.array_equal(row["position_ids"], ex["position_ids"])
    r = CliRunner().invoke(cli, ["export", str(d / "trees"), "--format", "megatron", "-o",
                                 str(tmp_path / "m"), "-q"])
    assert r.exit_code != 0 and "--share-prefix" in r.output


def test_tree_field_records_each_conversation_and_pack_groups_by_it(tmp_path):
    """tokenize --tree-field stores each record's id (.tree); pack --share-prefix then builds
    one tree per id: records of one conversation share its history, and two conversations
    sharing a system prompt are still two trees."""
    from conftest import TOKENIZER, write_jsonl

    from packtool.sources.records import tree_id
    from packtool.tokenize import TokenizeOptions, tokenize_files

    recs = []
    for c in range(4):
        hist = [{"role": "system", "content": "You are a helpful assistant, brief and kind."}]
        for t in range(3):
            hist = hist + [{"role": "user", "content": f"question {c} {t} alpha beta"},
                           {"role": "assistant", "content": f"answer {c} {t} gamma delta"}]
            recs.append({"messages": hist, "meta": {"conv": [c, "x"]}})
    tokenize_files([str(write_jsonl(tmp_path / "chat.jsonl", recs))], TOKENIZER,
                   tmp_path / "chat", TokenizeOptions(messages_field="messages",
                                                      tree_field="meta.conv"))
    c = packtool.open_tokens(tmp_path / "chat")
    assert c.meta["tree_field"] == "meta.conv"
    assert c.per_doc("tree").tolist() == [tree_id([k, "x"], "f") for k in range(4) for _ in "abc"]
    pack_corpus([tmp_path / "chat"], tmp_path / "p", 2048, share_prefix=True, min_shared=4)
    ds = validate_packed(tmp_path / "p")
    assert ds.index["trees"]["source"] == "tree_field" and ds.index["trees"]["n_trees"] == 4
    for i in range(len(ds)):
        ex = ds[i]
        conv = {int(g): {int(d) // 3 for d, h in zip(ex["seq_doc"], ex["seq_group"], strict=True)
                         if h == g} for g in ex["seq_group"]}
        assert all(len(v) == 1 for v in conv.values())  # a tree is one conversation
    verify_packed(tmp_path / "p", [tmp_path / "chat"])
    flat = sum(len(c[d]) for d in range(len(c)))
    assert ds.index["n_tokens"] < flat / 2


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "txt"])
def test_tree_field_on_plain_text_records_of_every_reader(tmp_path, kind):
    """--tree-field on text records: the readers' fast paths (orjson's bare string, Parquet's
    text column) handed on the text without its tree id (a traceback in the encoder, or a
    Parquet column refused); a .txt file, which has no fields, is refused by name."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import TOKENIZER
    from conftest import run as run_cli

    texts = [f"the same opening words of every record, then record {i}" for i in range(12)]
    convs = [f"c{i % 3}" for i in range(12)]
    src = tmp_path / f"t.{kind}"
    if kind == "jsonl":
        src.write_text("".join(json.dumps({"text": t, "conv": c}) + "\n"
                               for t, c in zip(texts, convs, strict=True)))
    elif kind == "parquet":
        pq.write_table(pa.table({"text": texts, "conv": convs}), src)
    else:
        src.write_text("\n".join(texts))
    r = run_cli("tokenize", src, "-t", TOKENIZER, "--eos", "<|eos|>", "--tree-field", "conv",
                "-o", tmp_path / "c", "-q", catch_exceptions=False)
    if kind == "txt":
        assert r.exit_code == 1 and "--tree-field need JSONL or Parquet" in r.output, r.output
        return
    assert r.exit_code == 0, r.output
    c = packtool.open_tokens(tmp_path / "c")
    from packtool.sources.records import tree_id
    assert c.per_doc("tree").tolist() == [tree_id(v, "f") for v in convs]
