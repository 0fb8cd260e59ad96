"""The training side of images (issue 42): rows with images collated for a Qwen-VL model.

The collator reads a row's own images (checked against their size and sha256), asks the
user's image processor for the pixels, refuses a grid that differs from the stored one, and
the mRoPE ids travel padded like every per-token array. ``packtool conformance --arch
qwen2_vl,qwen2_5_vl,qwen3_vl`` proves the layout on tiny models (packed = alone)."""

import base64
import hashlib
import io
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from synth import MAX_PIXELS, image_records, png, tokenize_vision  # noqa: E402

import packtool  # noqa: E402
from packtool.errors import PacktoolError  # noqa: E402
from packtool.formats.packed.batching import collate_numpy, pad_example  # noqa: E402
from packtool.train import attention as at  # noqa: E402
from packtool.train import conformance as cf  # noqa: E402
from packtool.train.torch import model_inputs  # noqa: E402
from packtool.train.vision import ImageCollator, read_image  # noqa: E402


def ref(uri, data, **kw):
    return {"uri": uri, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), **kw}


def processor():
    return cf.image_processor(cf.tiny_vision_config("qwen2_vl"))


def row(n, pos3, grids=(), refs=()):
    """One pack of one document of ``n`` tokens with mRoPE ids ``pos3`` [3, n]."""
    ids = np.arange(1, n + 1)
    return {"input_ids": ids, "labels": ids, "position_ids": np.arange(n),
            "cu_seqlens": np.array([0, n]), "position_ids_3d": np.asarray(pos3),
            "image_grid_thw": np.asarray(grids, np.int64).reshape(-1, 3), "image_refs": list(refs)}


def test_mrope_ids_pad_like_every_per_token_array():
    """A row pad restarts at 0 in all three rows, a segment's pads continue it, and the real
    tokens keep their stored (non-contiguous) ids: [3, N] aligned with input_ids."""
    pos3 = np.array([[0, 1, 1, 1, 3], [0, 1, 1, 2, 3], [0, 1, 2, 1, 3]])
    a, b = row(5, pos3), row(3, np.tile(np.arange(3), (3, 1)))
    out = collate_numpy([a, b], pad_multiple=4, per_segment=True)
    assert out["position_ids_3d"].shape == (3, 1, 12) == (3, *out["input_ids"].shape)
    got = out["position_ids_3d"][:, 0]
    assert (got[:, :5] == pos3).all()           # the real ids as stored
    assert (got[:, 5:8] == [[5, 6, 7]] * 3).all()   # a's pads continue its positions
    assert (got[:, 8:11] == np.arange(3)).all() and (got[:, 11] == 3).all()
    assert out["cu_seq_lens_q"].tolist() == [0, 8, 12]
    padded = pad_example(a, pad_to=8)
    assert (padded["position_ids_3d"][:, 5:] == np.arange(3)).all()
    assert padded["position_ids_3d"].shape == (3, 8)


def test_model_inputs_give_the_qwen_vl_layout():
    """[4, 1, N]: the text positions first (what transformers splits the row on), then t, h, w;
    the image keys passed on; the 4-D mask path keeps the same ids."""
    pos3 = np.array([[0, 1, 1, 3], [0, 1, 2, 3], [0, 2, 1, 3]])
    batch = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
             for k, v in collate_numpy([row(4, pos3, [[1, 2, 2]]), row(2, [[0, 1]] * 3)]).items()}
    batch["pixel_values"] = torch.zeros(4, 8)
    inputs = model_inputs(batch)
    assert inputs["position_ids"].shape == (4, 1, 6)
    assert inputs["position_ids"][0, 0].tolist() == [0, 1, 2, 3, 0, 1]
    assert inputs["position_ids"][1:, 0, :4].tolist() == pos3.tolist()
    assert inputs["image_grid_thw"].tolist() == [[1, 2, 2]] and "pixel_values" in inputs
    masked = model_inputs(batch, mask="4d")
    assert masked["position_ids"].shape == (4, 1, 6) and masked["attention_mask"].shape[-1] == 6


def test_collator_reads_the_rows_images_and_checks_their_grids(tmp_path):
    """pixel_values for the batch's images alone, in row order, equal to the processor's own
    on those images; the grids are the stored ones."""
    blobs = {f"mem://{i}": png(28 + 20 * i, 60 - 10 * i, seed=i) for i in range(3)}
    proc = processor()
    grids = proc(images=[Image.open(io.BytesIO(b)).convert("RGB") for b in blobs.values()],
                 return_tensors="pt")
    g = grids["image_grid_thw"].numpy()
    refs = [ref(u, b) for u, b in blobs.items()]
    reads = []

    def read(r):
        reads.append(r["uri"])
        return blobs[r["uri"]]

    rows = [row(4, [[0, 1, 2, 3]] * 3, g[:1], refs[:1]),
            row(3, [[0, 1, 2]] * 3, g[1:], refs[1:])]
    batch = ImageCollator(proc, read=read)(rows)
    assert reads == list(blobs)
    assert torch.equal(batch["pixel_values"], grids["pixel_values"])
    assert batch["image_grid_thw"].tolist() == g.tolist()
    assert "image_refs" not in batch and batch["position_ids_3d"].shape == (3, 1, 7)
    text = ImageCollator(proc, read=read)([row(3, [[0, 1, 2]] * 3)])
    assert "image_grid_thw" not in text and "pixel_values" not in text


def test_a_grid_other_than_the_stored_one_is_refused_by_image():
    data = png(100, 40)
    bad = row(4, [[0, 1, 2, 3]] * 3, [[1, 2, 2]], [ref("mem://big.png", data)])
    with pytest.raises(PacktoolError, match=r"mem://big.png.*processor's grid \[1, \d+, \d+\] "
                                            r"!= \[1, 2, 2\].*min_pixels"):
        ImageCollator(processor(), read=lambda r: data)([bad])


def test_read_image_checks_bytes_and_reads_a_base64_range(tmp_path):
    data = png(30, 30)
    f = tmp_path / "a.png"
    f.write_bytes(data)
    assert read_image(ref(str(f), data)) == data
    assert read_image(ref(f"file://{f}", data)) == data
    line = json.dumps({"text": "hi", "image": base64.b64encode(data).decode()})
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(line + "\n")
    start = line.index(base64.b64encode(data).decode()[:20])
    inline = ref(str(jsonl), data, offset=start, length=len(base64.b64encode(data)),
                 encoding="base64")
    assert read_image(inline) == data
    f.write_bytes(data[:-1] + b"\0")  # same size, other bytes
    with pytest.raises(PacktoolError, match=r"a.png: sha256 .* tokenize again"):
        read_image(ref(str(f), data))
    with pytest.raises(PacktoolError, match=r"has 3 bytes, 4 at tokenize"):
        f.write_bytes(b"abc")
        read_image({"uri": str(f), "bytes": 4})
    with pytest.raises(PacktoolError, match="cannot read image .*missing.png"):
        read_image({"uri": str(tmp_path / "missing.png")})
    with pytest.raises(PacktoolError, match='no "uri"'):
        read_image({"sha256": "00"})


def test_a_bidirectional_layer_runs_both_ways():
    """A vision encoder's call (is_causal=False, no boundaries: one image) sees every patch of
    its image, in both packtool attention functions; before, the varlen reference ran it
    causal (0.35 off on Qwen2-VL) and packtool's own refused it."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    want = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1) @ v
    layer = torch.nn.Linear(1, 1)
    for fn in (at.packtool_attention, at.varlen_attention):
        out, _ = fn(layer, q, k, v, None, is_causal=False)
        assert (out - want.transpose(1, 2)).abs().max() < 1e-6, fn.__name__
    layer.is_causal = False
    out, _ = at.packtool_attention(layer, q, k, v, None)
    assert (out - want.transpose(1, 2)).abs().max() < 1e-6


@pytest.mark.slow
def test_qwen_vl_models_see_packed_documents_alone():
    """The issue's bar on tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL (CPU, float32): every
    document's logits packed equal alone within 1e-5 through the [4, 1, N] ids, the varlen
    kwargs and a 4-D mask; the three mRoPE rows alone leak, and so does the control."""
    result = cf.conformance(["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    assert result.ok, result.summary()
    for arch in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        paths = {r["path"]: r for r in result.rows if r["arch"] == arch}
        # the ids packtool stores (packtool.vision) are the model's get_rope_index, exactly
        assert paths["mrope_ids"]["verdict"] == "exact" and paths["mrope_ids"]["max_abs_diff"] == 0
        for path in ("position_ids", "varlen", "mask_4d"):
            assert paths[path]["verdict"] == "exact", paths[path]
            assert paths[path]["max_abs_diff"] <= 1e-5
        for path in ("position_ids_3d", "none"):
            assert paths[path]["verdict"] == "leaks" and paths[path]["max_abs_diff"] > 0.1


# ------------------------------------------------------------------ packed rows with images
@pytest.fixture(scope="module")
def image_corpus(tmp_path_factory):
    """24 records with 0-3 images of varied sizes (files and inline base64)."""
    d = tmp_path_factory.mktemp("vision")
    tokenize_vision(d, image_records(d, 24))
    pack(d, "packed", "--seq-len", "1024")  # whole documents, 24 in a few rows
    return d


def pack(d, name, *args):
    from conftest import packtool_process

    packtool_process("pack", d / "corpus", "--out", d / name, *args)
    return packtool.open_packed(d / name)


def test_rows_carry_their_documents_images_and_positions(image_corpus):
    """Every row: its segments' images in row order (grids, references), and the stored mRoPE
    ids of each document restarting per segment, [3, N] beside input_ids; the torch dataset
    yields them and the collator turns them into the model's keys."""
    from packtool.torch import TorchPackedDataset

    c = packtool.open_tokens(image_corpus / "corpus")
    ds = packtool.open_packed(image_corpus / "packed")
    seen = 0
    for i in range(len(ds)):
        ex = ds[i]
        docs = ex["source_docs"].tolist()
        assert not ex["source_offsets"].any()  # whole documents (a split: the next test)
        want = [c.images(j) for j in docs]
        assert ex["image_grid_thw"].tolist() == [g for w in want for g in w["grid"].tolist()]
        assert ex["image_refs"] == [r for w in want for r in w["refs"]]
        assert ex["position_ids_3d"].shape == (3, len(ex["input_ids"]))
        cu = ex["cu_seqlens"]
        for s, j in enumerate(docs):
            assert np.array_equal(ex["position_ids_3d"][:, cu[s]:cu[s + 1]], c.positions3(j))
        seen += len(ex["image_refs"])
    assert seen == c.vision["n_images"]
    item = TorchPackedDataset(image_corpus / "packed", pad_to=1024)[0]
    assert item["position_ids_3d"].shape == (3, 1024) and isinstance(item["image_refs"], list)
    proc = type(processor())(patch_size=14, merge_size=2, temporal_patch_size=2,
                             min_pixels=56 * 56, max_pixels=MAX_PIXELS)
    assert item["image_source"].tolist() == [0] * len(item["image_refs"])
    own = ImageCollator(proc)([item])  # files and inline base64 read, grids as stored
    assert own["image_grid_thw"].tolist() == item["image_grid_thw"].tolist()
    assert own["pixel_values"].shape[0] == int(item["image_grid_thw"].prod(-1).sum())
    ds = TorchPackedDataset(image_corpus / "packed", pad_to=1024)
    batch = ImageCollator.for_packed(proc, ds)([item])  # the corpus's own load_ref
    assert torch.equal(batch["pixel_values"], own["pixel_values"])
    assert "image_source" not in batch and "image_refs" not in batch


@pytest.mark.slow
def test_a_split_document_keeps_its_images_whole_and_its_pieces_alone(tmp_path):
    """--overflow split where no cut falls in an image: each piece's ids are its own (moved
    down, as get_rope_index of the piece alone gives them); a cut inside an image is refused
    by name."""
    from conftest import packtool_process

    from packtool.vision import mrope_positions

    (tmp_path / "a.png").write_bytes(png(200, 120))
    (tmp_path / "b.png").write_bytes(png(60, 90, seed=1))
    words = " ".join(["word"] * 150)
    tokenize_vision(tmp_path, [{"prompt": f"<image> {words}", "completion": f"{words} <image> end",
                          "images": ["a.png", "b.png"]}])
    c = packtool.open_tokens(tmp_path / "corpus")
    (a, n), (b, m) = c.images(0)["span"].tolist()
    L = next(L for L in range(a + n + 1, len(c[0])) if (b // L == (b + m - 1) // L)
             and b % L > 3)  # both images whole, the second not at a piece's start
    ds = pack(tmp_path, "split", "--seq-len", str(L))
    pieces = 0
    for i in range(len(ds)):
        ex = ds[i]
        cu = ex["cu_seqlens"]
        for s, off in enumerate(ex["source_offsets"].tolist()):
            size = int(cu[s + 1] - cu[s])
            im = c.images(0)
            keep = (im["span"][:, 0] >= off) & (im["span"].sum(1) <= off + size)
            want = mrope_positions(size, im["span"][keep] - [off, 0], im["grid"][keep], merge=2)
            assert np.array_equal(ex["position_ids_3d"][:, cu[s]:cu[s + 1]], want)
            pieces += 1
    assert pieces == -(-len(c[0]) // L) >= 3
    r = packtool_process("pack", tmp_path / "corpus", "--out", tmp_path / "cut",
                         "--seq-len", str(a + n // 2), check=False)
    assert r.returncode == 1 and "would cut its image" in r.stderr


def test_caps_hold_and_every_document_is_placed_once():
    """cap_packs against the obvious checks on random documents: every pack under each cap
    and --seq-len, every document placed once, the packer's rows kept where they fit."""
    from packtool.pack.caps import cap_packs
    from packtool.packers import assign_packs

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 400, 3000)
    images = rng.integers(0, 4, 3000)
    vt = images * rng.integers(4, 64, 3000)
    packs = assign_packs(lengths, 1024)
    out, added = cap_packs(packs, lengths, 1024, {"--max-images": (images, 6),
                                                  "--max-vision-tokens": (vt, 300)})
    n = int(out.max()) + 1
    assert n == int(packs.max()) + 1 + added and added > 0
    assert np.bincount(out, lengths, n).max() <= 1024
    assert np.bincount(out, images, n).max() <= 6 and np.bincount(out, vt, n).max() <= 300
    assert set(np.unique(out)) == set(range(n))
    kept = out == packs
    assert kept.mean() > 0.5
    with pytest.raises(PacktoolError, match=r"document \d+ alone needs \d+ against "
                                            r"--max-images 1: raise --max-images"):
        cap_packs(packs, lengths, 1024, {"--max-images": (images, 1)})


@pytest.mark.slow
def test_pack_caps_images_per_row(image_corpus):
    ds = pack(image_corpus, "capped", "--seq-len", "2048", "--max-images", "3",
              "--max-vision-tokens", "150")
    free = packtool.open_packed(image_corpus / "packed")
    rows = [ds[i] for i in range(len(ds))]
    assert max(len(r["image_refs"]) for r in rows) <= 3
    assert max(int((r["image_grid_thw"].prod(-1) // 4).sum()) for r in rows) <= 150
    assert sum(len(r["image_refs"]) for r in rows) == sum(
        len(free[i]["image_refs"]) for i in range(len(free)))


@pytest.mark.parametrize("args,error", [
    (["--layout", "tokens"], "images x --layout tokens"),
    pytest.param(["--group-docs", "5"], "images x --group-docs", marks=pytest.mark.slow),
    pytest.param(["--align", "8"], "images x alignment", marks=pytest.mark.slow),
])
def test_what_images_cannot_combine_with_is_refused(image_corpus, args, error):
    from conftest import packtool_process

    r = packtool_process("pack", image_corpus / "corpus", "--out", image_corpus / "no",
                         "--seq-len", "512", *args, check=False)
    assert r.returncode == 1 and error in r.stderr


def test_the_cost_model_counts_the_vision_encoder(image_corpus):
    """A row's vision term is the sum over its images of (h w)^2 patches (t = 1), from the
    sources' image tables without parsing a reference; stats reports images per row, the
    image tokens' share and the encoder's share of the cost."""
    from conftest import packtool_process

    from packtool.formats.packed.balance import attention_costs

    ds = packtool.open_packed(image_corpus / "packed")
    rows = [ds[i] for i in range(len(ds))]
    patches2 = np.array([float(((r["image_grid_thw"][:, 1] * r["image_grid_thw"][:, 2]) ** 2
                                ).sum()) for r in rows])
    text = attention_costs(ds, vision=0)
    assert np.allclose(attention_costs(ds, vision=0.5) - text, 0.5 * patches2)
    # balance="attention" on rows with images: both terms, the fingerprint of what it balances
    assert np.allclose(attention_costs(ds), text + patches2)
    from packtool.formats.packed.balance import cost_table

    table, costs = cost_table(ds, "attention", 1.2, len(ds))  # computed: no stored grid of 1.2
    assert np.allclose(costs, text + patches2) and table.fingerprint == ds.costs_fingerprint()
    sums = ds.image_sums()
    assert sums["images"].tolist() == [len(r["image_refs"]) for r in rows]
    rep = json.loads(packtool_process("stats", image_corpus / "packed", "--json").stdout)
    v = rep["images"]
    c = packtool.open_tokens(image_corpus / "corpus")
    assert v["n_images"] == c.vision["n_images"]
    assert v["n_image_tokens"] == c.vision["n_vision_tokens"]
    assert v["images_per_row"]["max"] == max(len(r["image_refs"]) for r in rows)
    assert abs(v["vision_cost_share"] - patches2.sum() / (patches2.sum() + text.sum())) < 1e-9
    assert 0 < v["vision_token_share"] < 1


def test_stored_cost_classes_count_the_vision_term(image_corpus, tmp_path, monkeypatch):
    """index.json's cost_classes count language and vision (cost_vision 1.0), so a balanced
    sampler starts from the counts, no segment table read, with the classes and fingerprint
    it would compute; verify recomputes them with its own code and catches counts of the
    language term alone. Before, datasets with images stored language-only classes and
    skipped them."""
    from packtool.formats.packed import index_digest
    from packtool.formats.packed.balance import CostClasses, cost_table
    from packtool.formats.packed.costs import dataset_digest, digest, shard_entry
    from packtool.train.sampler import PackSampler
    from packtool.verify import verify_packed

    ds = pack(image_corpus, "costs", "--seq-len", "512", "--overflow", "drop")
    assert ds.index["cost_vision"] == 1.0
    both = ds.attention_costs()
    assert both.tolist() != ds.attention_costs(vision=0).tolist()
    shards = ds.index["shards"]
    cuts = np.cumsum([0] + [sh["n_packs"] for sh in shards])
    for sh, a, b in zip(shards, cuts[:-1], cuts[1:], strict=True):
        assert {k: sh[k] for k in ("cost_classes", "costs_sha256")} == shard_entry(both[a:b])
    computed = CostClasses.from_costs(both, 1.1, dataset_digest(
        [digest(both[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]))
    fresh = packtool.open_packed(image_corpus / "costs")
    monkeypatch.setattr(type(fresh), "shard_costs", lambda *a, **k: 1 / 0)  # nothing read
    table, costs = cost_table(fresh, "attention", 1.1, len(fresh))
    assert costs is None and table.sizes.tolist() == computed.sizes.tolist()
    assert table.fingerprint == computed.fingerprint
    sampler = PackSampler(fresh, rank=0, world_size=2, balance="attention")
    monkeypatch.undo()
    assert sampler.fingerprint == computed.fingerprint == ds.costs_fingerprint()
    assert sampler.class_sizes.tolist() == computed.sizes.tolist()
    verify_packed(image_corpus / "costs")
    import shutil

    shutil.copytree(image_corpus / "costs", tmp_path / "bad")
    text = ds.attention_costs(vision=0)
    index = json.loads((tmp_path / "bad/index.json").read_text())
    index["shards"][0].update(shard_entry(text[:cuts[1]]))  # the language term alone
    index["index_sha256"] = index_digest(index)
    (tmp_path / "bad/index.json").write_text(json.dumps(index))
    with pytest.raises(PacktoolError, match="cost_classes is not its packs'"):
        verify_packed(tmp_path / "bad")
    # a dataset packed before cost_vision (classes of the language term alone): not used
    for sh, a, b in zip(index["shards"], cuts[:-1], cuts[1:], strict=True):
        sh.update(shard_entry(text[a:b]))
    del index["cost_vision"]
    index["index_sha256"] = index_digest(index)
    (tmp_path / "bad/index.json").write_text(json.dumps(index))
    old = packtool.open_packed(tmp_path / "bad")
    assert old.cost_classes(1.1) is None and old.costs_fingerprint() == digest(both)
    verify_packed(tmp_path / "bad")


def test_exports_carry_images_or_refuse_them_by_name(image_corpus, tmp_path):
    """parquet: each row's references, grids and mRoPE ids beside its tokens; the formats with
    no place for them refused, naming why (a trainer would get image tokens, no pixels)."""
    import pyarrow.parquet as pq

    from packtool.export import export

    ds = packtool.open_packed(image_corpus / "packed")
    export(image_corpus / "packed", "parquet", tmp_path / "x.parquet")
    table = pq.read_table(tmp_path / "x.parquet").to_pylist()
    for i, row in enumerate(table):
        ex = ds[i]
        assert [json.loads(r) for r in row["image_refs"]] == ex["image_refs"]
        assert row["image_grid_thw"] == ex["image_grid_thw"].tolist()
        assert row["mrope_position_ids"] == ex["position_ids_3d"].tolist()
    for fmt in ("megatron", "mds", "parquet-packed"):
        with pytest.raises(PacktoolError, match=f"holds images.*--format {fmt} cannot carry"):
            export(image_corpus / "packed", fmt, tmp_path / f"y-{fmt}")
    with pytest.raises(PacktoolError, match="holds images.*--format megatron"):
        export(image_corpus / "corpus", "megatron", tmp_path / "z")


@pytest.mark.slow
def test_the_balance_figure_script_runs():
    """scripts/bench_vision_balance.py on 4,000 documents: its three rows, the vision term
    evening the vision encoder's work across ranks against text-only balance."""
    import subprocess
    import sys

    from conftest import ROOT

    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_vision_balance.py"),
                        "--docs", "4000"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {line[:34].strip(): line[34:].split() for line in r.stdout.splitlines()[2:5]}
    text, both = rows["text tokens only"], rows["+ vision term (balance)"]
    assert text[0] == both[0]  # the same rows
    assert float(both[3]) < float(text[3]) and float(both[4]) <= float(text[4])


def test_stored_ids_that_differ_from_the_models_fail_the_architecture():
    """The mrope_ids row is no path: exact ids alone pass nothing, wrong ids fail an
    architecture whose paths are exact."""
    ok = [cf.path_row("m", "position_ids", 1e-6, tol=cf.VISION_TOL),
          cf.path_row("m", "none", 3.0, tol=cf.VISION_TOL)]
    assert cf.ConformanceResult([cf.path_row("m", cf.IDS, 0, tol=0), *ok]).ok
    assert not cf.ConformanceResult([cf.path_row("m", cf.IDS, 1, tol=0), *ok]).ok
    alone = [cf.path_row("m", cf.IDS, 0, tol=0), ok[1]]
    assert cf.ConformanceResult(alone).failing() == ["m"]


def test_pack_balance_counts_the_vision_encoder():
    """pack --balance attention with images: rows of equal length, every other one with a
    large image, come out in blocks of --balance-ranks rows all with or all without one
    (balanced_rank's vision term); on the squared lengths alone they mix."""
    from packtool.pack.order import balanced_rank
    from packtool.pack.segments import make_segments

    segs = make_segments(np.full(64, 300), 512)
    vision = np.where(np.arange(64) % 2 == 0, 0.0, 4e6)
    rank = np.random.default_rng(0).permutation(64)
    for v in (None, vision):
        order = np.argsort(balanced_rank(rank, np.arange(64), [segs], 8, v))
        img = (vision[order] > 0).reshape(-1, 8)
        apart = (img.all(axis=1) | ~img.any(axis=1)).all()
        assert apart == (v is not None)


def test_context_parallel_shards_of_rows_with_images_are_refused(image_corpus):
    from packtool.train.cp import cp_shard

    ex = packtool.open_packed(image_corpus / "packed")[0]
    with pytest.raises(PacktoolError, match="this row holds images: images x cp_shard"):
        cp_shard(ex, 2, 0, mode="balanced")
