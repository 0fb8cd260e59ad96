"""tokenize -> pack -> verify --source for every packer and overflow policy; reader; collate."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TOKENIZER, slow, write_jsonl

import packtool
from packtool.cli import cli
from packtool.formats.packed import open_packed
from packtool.formats.packed.batching import collate_numpy as collate
from packtool.pack import pack_corpus
from packtool.pack.plan import make_segments
from packtool.packers import PACKERS
from packtool.tokenize import TokenizeOptions, tokenize_files
from packtool.verify import VerifyError, verify_packed


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A corpus with empty documents and documents far longer than the seq-lens used."""
    from synth import make_documents

    d = tmp_path_factory.mktemp("corpus")
    docs = make_documents(150, seed=11, median_words=30, max_words=700)
    docs[4] = ""
    docs[20] = ""
    write_jsonl(d / "a.jsonl", [{"text": t} for t in docs[:100]])
    write_jsonl(d / "b.jsonl", [{"text": t} for t in docs[100:]])
    tokenize_files([str(d / "a.jsonl")], TOKENIZER, d / "a", TokenizeOptions())
    tokenize_files([str(d / "b.jsonl")], TOKENIZER, d / "b", TokenizeOptions(eos="<|eos|>"))
    return d


def sources(corpus):
    return [corpus / "a", corpus / "b"]


def lengths_of(corpus):
    return np.concatenate([packtool.open_tokens(p).lengths for p in sources(corpus)])


@pytest.mark.parametrize("algo", list(PACKERS))
@pytest.mark.parametrize("overflow", ["split", *slow("truncate", "drop")])
def test_pack_then_verify_every_algo_and_policy(tmp_path, corpus, algo, overflow):
    lengths = lengths_of(corpus)
    L = 128
    assert (lengths > L).sum() > 5 and (lengths == 0).sum() == 2
    res = pack_corpus(sources(corpus), tmp_path / "p", L, algo, overflow=overflow,
                      shard_size=3000, max_depth=None)
    assert verify_packed(tmp_path / "p", sources(corpus)).summary().startswith("OK")
    c = res.counts
    over = lengths > L
    assert c["n_empty"] == 2 and c["n_overlong"] == int(over.sum())
    kept = {"split": lengths.sum(), "truncate": np.minimum(lengths, L).sum(),
            "drop": lengths[~over].sum()}[overflow]
    assert res.n_tokens == kept
    if overflow == "truncate":
        assert c["n_truncated_tokens"] == int((lengths[over] - L).sum())
    if overflow == "drop":
        assert c["n_dropped_tokens"] == int(lengths[over].sum())
    if overflow == "split":
        assert c["n_split_pieces"] == int((-(-lengths[over] // L)).sum())
    assert res.n_shards > 1
    ds = open_packed(tmp_path / "p")
    assert len(ds) == res.n_packs
    assert sum(len(ds[i]["input_ids"]) for i in range(len(ds))) == res.n_tokens


def test_reader_matches_sources(tmp_path, corpus):
    pack_corpus(sources(corpus), tmp_path / "p", 96, "bfd", shard_size=2000)
    ds = open_packed(tmp_path / "p")
    docs = [packtool.open_tokens(p) for p in sources(corpus)]
    flat = [d[i] for d in docs for i in range(len(d))]
    seen = 0
    for i in range(len(ds)):
        ex = ds[i]
        cu = ex["cu_seqlens"]
        assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == len(ex["input_ids"]) <= 96
        assert ex["max_seqlen"] == np.diff(cu).max()
        for k, (d, o) in enumerate(zip(ex["source_docs"], ex["source_offsets"], strict=True)):
            a, b = cu[k], cu[k + 1]
            assert np.array_equal(ex["input_ids"][a:b], flat[d][o:o + b - a])
            assert np.array_equal(ex["position_ids"][a:b], np.arange(b - a))
            assert (ex["doc_ids"][a:b] == k).all()
            assert ex["labels"][a] == -100
            assert np.array_equal(ex["labels"][a + 1:b], ex["input_ids"][a + 1:b])
            seen += 1
    assert seen == ds.index["n_segments"]


def test_shuffle_and_no_shuffle(tmp_path, corpus):
    a = pack_corpus(sources(corpus), tmp_path / "a", 128, "ffd", shuffle=False)
    pack_corpus(sources(corpus), tmp_path / "b", 128, "ffd", seed=1)
    pack_corpus(sources(corpus), tmp_path / "c", 128, "ffd", seed=1)
    ia, ib = open_packed(tmp_path / "a"), open_packed(tmp_path / "b")
    fills = [len(ia[i]["input_ids"]) for i in range(len(ia))]
    assert fills[0] == 128 and a.n_packs == len(ib)
    order_b = [tuple(ib[i]["source_docs"]) for i in range(len(ib))]
    order_a = [tuple(ia[i]["source_docs"]) for i in range(len(ia))]
    assert order_a != order_b and sorted(order_a) == sorted(order_b)
    for name in ("shard-00000.seg_doc.npy", "index.json"):
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()


def test_get_padded_and_collate(tmp_path, corpus):
    pack_corpus(sources(corpus), tmp_path / "p", 128, "bfd")
    ds = open_packed(tmp_path / "p")
    i = min(range(len(ds)), key=lambda j: len(ds[j]["input_ids"]))
    ex, n = ds.get(i, pad_id=7), len(ds[i]["input_ids"])
    assert n < 128
    assert all(len(ex[k]) == 128 for k in ("input_ids", "labels", "position_ids", "doc_ids"))
    assert (ex["input_ids"][n:] == 7).all() and (ex["labels"][n:] == -100).all()
    assert (ex["doc_ids"][n:] == -1).all()
    assert np.array_equal(ex["position_ids"][n:], np.arange(128 - n))
    assert ex["cu_seqlens"][-2:].tolist() == [n, 128]
    assert ex["max_seqlen"] == np.diff(ex["cu_seqlens"]).max()
    with pytest.raises(packtool.PacktoolError, match="pad_to"):
        ds.get(i, pad_to=n - 1)
    row = collate([ds[0], ds[1], ds[2]])
    n_tok = sum(len(ds[j]["input_ids"]) for j in range(3))
    for k in ("input_ids", "labels", "position_ids", "seq_idx"):
        assert row[k].shape == (1, n_tok)
    cu = row["cu_seq_lens_q"]
    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == n_tok
    assert np.array_equal(cu, row["cu_seq_lens_k"])
    assert row["max_length_q"] == row["max_length_k"] == np.diff(cu).max()
    # positions restart exactly at the cu_seqlens boundaries
    assert set(np.flatnonzero(row["position_ids"][0] == 0)) == set(cu[:-1].tolist())
    assert np.array_equal(np.bincount(row["seq_idx"][0]), np.diff(cu))


def test_refuses_existing_output_and_unknown_version(tmp_path, corpus):
    pack_corpus(sources(corpus), tmp_path / "p", 128)
    with pytest.raises(packtool.PacktoolError, match="not empty.*--overwrite"):
        pack_corpus(sources(corpus), tmp_path / "p", 128)
    pack_corpus(sources(corpus), tmp_path / "p", 64, overwrite=True)
    assert open_packed(tmp_path / "p").seq_len == 64
    idx = json.loads((tmp_path / "p" / "index.json").read_text())
    idx["version"] = 7
    (tmp_path / "p" / "index.json").write_text(json.dumps(idx))
    with pytest.raises(packtool.FormatError, match="packtool.packed version 7 is not supported"):
        open_packed(tmp_path / "p")


def test_verify_catches_a_flipped_byte_anywhere(tmp_path, corpus):
    pack_corpus(sources(corpus), tmp_path / "p", 128, shard_size=4000)
    files = sorted((tmp_path / "p").iterdir())
    rng = np.random.default_rng(0)
    for f in files:
        data = bytearray(f.read_bytes())
        for pos in {0, len(data) // 2, len(data) - 2, int(rng.integers(len(data)))}:
            flipped = bytearray(data)
            flipped[pos] ^= 0x01
            f.write_bytes(bytes(flipped))
            with pytest.raises(packtool.PacktoolError):
                verify_packed(tmp_path / "p", sources(corpus))
        f.write_bytes(bytes(data))
    assert verify_packed(tmp_path / "p", sources(corpus)).summary().startswith("OK")


def test_verify_catches_inconsistent_content_with_valid_checksums(tmp_path, corpus):
    """Even with checksums recomputed, broken invariants and lost tokens are found."""
    from packtool._io import crc32_file
    from packtool.formats.packed import index_digest

    pack_corpus(sources(corpus), tmp_path / "p", 128, layout="tokens")

    def tamper(array_name, fn, match, with_sources=False):
        d = tmp_path / "p"
        index_text = (d / "index.json").read_text()
        idx = json.loads(index_text)
        f = d / idx["shards"][0]["files"][array_name]["name"]
        original = f.read_bytes()
        arr = np.load(f).copy()
        fn(arr)
        np.save(f, arr)
        idx["shards"][0]["files"][array_name]["crc32"] = crc32_file(f)
        idx["index_sha256"] = index_digest(idx)
        (d / "index.json").write_text(json.dumps(idx))
        with pytest.raises(VerifyError, match=match):
            verify_packed(d, sources(corpus) if with_sources else None)
        f.write_bytes(original)
        (d / "index.json").write_text(index_text)

    def swap(a):
        a[[3, 4]] = a[[4, 3]]

    def shift(a):  # one token moves between two segments of one pack: its length holds
        ps = np.load(tmp_path / "p" / "shard-00000.pack_seg.npy").astype(int)
        j = next(j for j in range(len(ps) - 1) if ps[j + 1] - ps[j] >= 2)
        i = int(ps[j]) if a[ps[j]] > 1 else int(ps[j]) + 1
        a[i] -= 1
        a[2 * int(ps[j]) + 1 - i] += 1

    tamper("pack_seg", swap, "offsets are not increasing")
    tamper("seg_length", shift, "mismatch", with_sources=True)
    tamper("tokens", swap, "differs from its source document", with_sources=True)
    # a piece starts at a multiple of seq_len: caught without the sources
    tamper("seg_offset", lambda a: a.__setitem__(0, a[0] + 1), "not a multiple of seq_len")


def test_verify_wrong_source(tmp_path, corpus):
    pack_corpus([corpus / "a"], tmp_path / "p", 128)
    with pytest.raises(VerifyError, match="not the corpus that was packed"):
        verify_packed(tmp_path / "p", [corpus / "b"])
    with pytest.raises(VerifyError, match="prefixes given"):
        verify_packed(tmp_path / "p", sources(corpus))


def test_make_segments_accounting():
    segs = make_segments(np.array([0, 5, 10, 11, 25]), 10, "split")
    assert segs.doc.tolist() == [1, 2, 3, 3, 4, 4, 4]
    assert segs.offset.tolist() == [0, 0, 0, 10, 0, 10, 20]
    assert segs.length.tolist() == [5, 10, 10, 1, 10, 10, 5]
    assert segs.counts["n_split"] == 2 and segs.counts["n_split_pieces"] == 5
    t = make_segments(np.array([0, 5, 11, 25]), 10, "truncate")
    assert t.length.tolist() == [5, 10, 10] and t.counts["n_truncated_tokens"] == 16
    d = make_segments(np.array([0, 5, 11, 25]), 10, "drop")
    assert d.doc.tolist() == [1] and d.counts["n_dropped_tokens"] == 36


def test_cli_pack_verify_demo(tmp_path, corpus):
    runner = CliRunner()
    r = runner.invoke(cli, ["pack", str(corpus / "a"), str(corpus / "b"), "-L", "128",
                            "-a", "spfhp", "--max-depth", "4", "-o", str(tmp_path / "p"),
                            "--json", "-q"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["algo"] == "spfhp" and summary["n_packs"] > 0
    assert 0 < summary["efficiency"] <= 1 and summary["lower_bound_packs"] <= summary["n_packs"]
    r = runner.invoke(cli, ["verify", str(tmp_path / "p"),
                            "-s", str(corpus / "a"), "-s", str(corpus / "b")])
    assert r.exit_code == 0 and r.output.startswith("OK"), r.output
    r = runner.invoke(cli, ["verify", str(tmp_path / "nope")])
    assert r.exit_code == 1 and "not a directory" in r.output
    r = runner.invoke(cli, ["demo", "--out", str(tmp_path / "demo")])
    assert r.exit_code == 0, r.output
    assert "OK" in r.output and "every source token accounted for" in r.output


def test_overwrite_never_deletes_foreign_directories(tmp_path, corpus):
    import shutil

    d = tmp_path / "data"
    d.mkdir()
    for suffix in (".bin", ".boundaries", ".json"):
        shutil.copy(corpus / f"a{suffix}", d / f"corpus{suffix}")
    shutil.copy(corpus / ".a.part.json", d / ".a.part.json")  # renamed a -> corpus: still read
    with pytest.raises(packtool.PacktoolError, match="contains the source"):
        pack_corpus([d / "corpus"], d, 128, overwrite=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(packtool.PacktoolError, match="only replaces a previous packtool output"):
        pack_corpus([corpus / "a"], tmp_path / "other", 128, overwrite=True)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    with pytest.raises(packtool.PacktoolError, match="given twice"):
        pack_corpus([corpus / "a", corpus / "." / "a"], tmp_path / "p2", 128)


def test_verify_source_checksums(tmp_path, corpus):
    import shutil

    for suffix in (".bin", ".boundaries", ".json", ".part.json"):  # a corpus and its
        name = f".a{suffix}" if suffix == ".part.json" else f"a{suffix}"  # hidden manifest
        shutil.copy(corpus / name, tmp_path / name)
    pack_corpus([tmp_path / "a"], tmp_path / "p", 128)
    data = bytearray((tmp_path / "a.bin").read_bytes())
    data[10] ^= 1
    (tmp_path / "a.bin").write_bytes(bytes(data))
    with pytest.raises(packtool.PacktoolError, match="sha256"):
        verify_packed(tmp_path / "p", [tmp_path / "a"])


def test_tokens_layout_refuses_a_corrupt_source_checked_while_writing(tmp_path, corpus):
    """The tokens layout copies its sources' bytes: their crc32 (recorded by tokenize) runs in
    a thread while the shards are written, and a flipped byte (same size) fails the pack
    before anything is committed; intact, the result says the sources were verified."""
    import shutil

    for name in ("a.bin", "a.boundaries", "a.json", ".a.part.json"):
        shutil.copy(corpus / name, tmp_path / name)
    res = pack_corpus([tmp_path / "a"], tmp_path / "ok", 128, layout="tokens")
    assert res.sources_verified
    data = bytearray((tmp_path / "a.bin").read_bytes())
    data[10] ^= 1
    (tmp_path / "a.bin").write_bytes(bytes(data))
    with pytest.raises(packtool.PacktoolError, match=r"a\.bin: crc32 .* does not match"):
        pack_corpus([tmp_path / "a"], tmp_path / "p", 128, layout="tokens")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.part.json", "a.bin",
                                                          "a.boundaries", "a.json", "ok"]


@pytest.mark.parametrize("chunk", [97, None])
def test_tokens_layout_shards_are_the_sources_segments_byte_for_byte(tmp_path, corpus,
                                                                     monkeypatch, chunk):
    """Each tokens file is its npy header and then the segments' tokens, in order, read here
    from the sources document by document (no packtool kernel), its crc32 the one index.json
    records, and verify passes: with chunks of 97 tokens (many a shard, so the gathering
    thread's crc32 runs ahead of the writes) and of the default size."""
    import zlib

    from packtool._io import npy_header
    from packtool.formats.packed import writer

    if chunk:
        monkeypatch.setattr(writer, "CHUNK_TOKENS", chunk)
    pack_corpus(sources(corpus), tmp_path / "p", 128, layout="tokens", shard_size=1500)
    docs = [d for c in (packtool.open_tokens(p) for p in sources(corpus))
            for d in (c[i] for i in range(len(c)))]
    index = json.loads((tmp_path / "p" / "index.json").read_text())
    assert len(index["shards"]) > 2
    for sh in index["shards"]:
        arr = {a: np.load(tmp_path / "p" / f["name"]) for a, f in sh["files"].items()}
        want = np.concatenate([docs[int(d)][int(o):int(o) + int(n)] for d, o, n in zip(
            arr["seg_doc"], arr["seg_offset"], arr["seg_length"], strict=True)])
        raw = (tmp_path / "p" / sh["files"]["tokens"]["name"]).read_bytes()
        dtype = arr["tokens"].dtype
        assert raw == npy_header(dtype, want.size) + want.astype(dtype).tobytes()
        assert f"{zlib.crc32(raw):08x}" == sh["files"]["tokens"]["crc32"]
    assert verify_packed(tmp_path / "p", sources(corpus)).summary().startswith("OK")


def _forge_crc32(data: bytearray, pos: int) -> None:
    """Rewrite data[pos:pos + 4] so that zlib.crc32(data) is what it was before data[:pos]
    changed: CRC-32 is linear, so 4 bytes chosen by running the register back from the
    wanted value set it (a forgery a checksum does not catch; sha256 does)."""
    import zlib

    table = [0] * 256
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table[i] = c
    by_top = {t >> 24: i for i, t in enumerate(table)}  # the top bytes are all distinct
    want = zlib.crc32(bytes(data)) ^ 0xFFFFFFFF
    for b in reversed(data[pos + 4:]):  # back over the suffix, whose bytes are known
        i = by_top[want >> 24]
        want = (((want ^ table[i]) << 8) | (i ^ b)) & 0xFFFFFFFF
    data[0] ^= 1  # the change the forgery hides
    idx, r = [], want
    for _ in range(4):  # back over the 4 free bytes: which table entry each step used
        i = by_top[r >> 24]
        idx.append(i)
        r = ((r ^ table[i]) << 8) & 0xFFFFFFFF
    reg = zlib.crc32(bytes(data[:pos])) ^ 0xFFFFFFFF
    for k, i in enumerate(reversed(idx)):
        data[pos + k] = (reg ^ i) & 0xFF
        reg = table[i] ^ (reg >> 8)


def test_check_sha256_refuses_a_source_whose_crc32_was_forged(tmp_path, corpus):
    """--check crc32 (the default: ~4 GB/s, catches any flipped byte) cannot see a source
    edited to keep its crc32; --check sha256 reads the sources for their sha256 too and
    refuses it by name, before anything is committed."""
    import shutil
    import zlib

    for name in ("a.bin", "a.boundaries", "a.json", ".a.part.json"):
        shutil.copy(corpus / name, tmp_path / name)
    data = bytearray((tmp_path / "a.bin").read_bytes())
    before = zlib.crc32(bytes(data))
    _forge_crc32(data, len(data) - 8)
    assert zlib.crc32(bytes(data)) == before
    (tmp_path / "a.bin").write_bytes(bytes(data))
    res = pack_corpus([tmp_path / "a"], tmp_path / "crc", 128, layout="tokens")
    assert res.sources_verified  # the crc32 matched: the default check passed it
    with pytest.raises(packtool.PacktoolError, match=r"a\.bin: sha256 .* does not match"):
        pack_corpus([tmp_path / "a"], tmp_path / "p", 128, layout="tokens",
                     source_check="sha256")
    assert not (tmp_path / "p").exists()
    r = CliRunner().invoke(cli, ["pack", str(tmp_path / "a"), "-L", "128", "--layout",
                                 "tokens", "--check", "sha256", "-o", str(tmp_path / "q")])
    assert r.exit_code != 0 and "sha256" in r.output and not (tmp_path / "q").exists()


def test_verify_says_what_the_policy_removed(tmp_path, corpus):
    """Issue 11.6: after --overflow truncate, verify said "every source token accounted for"
    although most tokens were cut away by request; it now names what was cut, and drop."""
    lengths = lengths_of(corpus)
    L = 64
    cut = int((lengths[lengths > L] - L).sum())
    pack_corpus(sources(corpus), tmp_path / "t", L, "bfd", overflow="truncate")
    text = verify_packed(tmp_path / "t", sources(corpus)).summary()
    assert f"{cut:,} truncated away" in text and "--overflow truncate" in text
    pack_corpus(sources(corpus), tmp_path / "d", L, "bfd", overflow="drop")
    text = verify_packed(tmp_path / "d", sources(corpus)).summary()
    dropped = int(lengths[lengths > L].sum())
    assert f"{dropped:,} in {int((lengths > L).sum()):,} documents dropped" in text
    text = verify_packed(tmp_path / "d").summary()
    assert "accounted for" not in text  # without sources nothing is claimed about them


def test_pack_options_are_sections_each_with_its_own_check():
    """Issue 38 item 4: PackOptions is composed of small sections, each checking its own
    options; the call forms users have (every option by name, or positional) build the
    same value, and a conflict between sections is refused by the one table."""
    from packtool import conflicts
    from packtool.errors import PacktoolError
    from packtool.options import (
        SECTIONS,
        Alignment,
        Mixture,
        Order,
        Output,
        Packer,
        PackOptions,
        Rows,
    )

    flat = PackOptions(4096, align=16, seed=3, valid_docs=5, layout="tokens", algo="ffd")
    composed = PackOptions(rows=Rows(4096), padding=Alignment(align=16), order=Order(seed=3),
                           mixture=Mixture(valid_docs=5), output=Output(layout="tokens"),
                           packer=Packer(algo="ffd"))
    assert flat == composed and flat.align == flat.padding.align == 16 and flat.alignment == 16
    names = [f.name for f in PackOptions.option_fields()]
    assert len(names) == len(set(names)) == 28 and set(SECTIONS) == {
        "rows", "packer", "output", "order", "mixture", "padding"}
    assert flat.replace(group_docs=7).order.group_docs == 7 and flat.group_docs is None
    with pytest.raises(TypeError, match="bogus"):
        PackOptions(4096, bogus=1)
    with pytest.raises(TypeError, match="Rows"):
        PackOptions(rows=Rows(512), seq_len=1024)
    for check, match in [
            (lambda: Rows(0).check(), "--seq-len must be an integer"),
            (lambda: Rows(512, overflow="cut").check(), "--overflow 'cut': choose one of"),
            (lambda: Rows(512, vsl="64:1024").check(), "not --vsl's MAX"),
            (lambda: Alignment(tp=2).check(4096), "add --sequence-parallel"),
            (lambda: Alignment(align=48).check(4096), "--seq-len 4,128 or 4,080"),
            (lambda: Alignment(pad_id=3).check(4096), "--pad-id is the id of alignment pads"),
            (lambda: Order(balance="cost").check(), "--balance 'cost': choose one of"),
            (lambda: Order(seed=-1).check(), "--seed must be an integer >= 0"),
            (lambda: Mixture(tokens=0).check(), "--tokens must be a positive integer"),
            (lambda: Output(source_check="md5").check(), "--check 'md5': choose one of"),
            (lambda: Output(shard_size=True).check(), "--shard-size must be a positive")]:
        with pytest.raises(PacktoolError, match=match):
            check()
    Rows(1024, vsl="64:1024").check()  # each section alone passes what it allows
    with pytest.raises(PacktoolError, match=conflicts.conflicts({"vsl", "align"})[0].name):
        PackOptions(vsl="64:1024", align=16).check()
    assert PackOptions(512, "ffd", "drop", 4) == PackOptions(seq_len=512, algo="ffd",
                                                            overflow="drop", seed=4)
