"""Every combination of the layout features is exact or refused by name (issue 38, item 5).

Hypothesis draws a pack (plain documents, pairs or groups, or records with images tokenized
with --vision qwen2-vl; --align, --max-docs, --vsl, --share-prompt, --share-prefix,
--overflow, --layout, --max-images/--max-vision-tokens, a tiny --seq-len), a way to read two of
its rows
(``get(pad_to=, pad_multiple=, per_segment=)``), a collate (``pad_multiple``,
``per_segment``, ``max_docs``) and a consumer (``model_inputs`` 4-D mask or varlen
boundaries, ``block_mask``, ``cp_shard`` balanced or zigzag). Each draw is refused with a
message naming what :mod:`packtool.conflicts` (or a limit the test computes itself) predicts,
or the batch is exact: a one-layer attention model in numpy (float64) gives every document
piece, and every sequence of a pair or group (``sequence_logps``), the log-probabilities it
gets alone. A --share-prefix pack that is not refused is read through the reader's tree keys
(the ancestor mask from tree_in/tree_out, two comparisons): every record's path, root to
leaf, gets the log-probabilities it gets alone. Rows with images: every row's images
(references, grids) are its segments' in row order, under the caps, and its 3-D positions
are each document's stored ``positions3`` restarting per segment; the model then also embeds
the batch's ``position_ids_3d``, so every trained token's log-probs prove them (padded and
collated) equal to the document's alone. Packed datasets are shared across draws (one
per distinct pack)."""

import zlib
from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TOKENIZER, write_jsonl  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from synth import (  # noqa: E402
    group_records,
    image_records,
    lognormal_lengths,
    tokenize_vision,
    write_token_corpus,
)

import packtool  # noqa: E402
from packtool import conflicts  # noqa: E402
from packtool.errors import PacktoolError  # noqa: E402
from packtool.formats.packed import open_packed  # noqa: E402
from packtool.formats.packed.batching import collate_numpy  # noqa: E402
from packtool.pack import pack_corpus  # noqa: E402
from packtool.tokenize import TokenizeOptions, tokenize_files  # noqa: E402
from packtool.torch import block_mask, model_inputs  # noqa: E402
from packtool.train import sequence_logps  # noqa: E402
from packtool.train.cp import cp_shard  # noqa: E402
from packtool.train.trees import is_shared  # noqa: E402

VOCAB, L, ALIGN, MAX_ALIGN = 2048, 512, 8, 2**20
V, D = 64, 8  # the model sees token ids modulo V: as exact a test, and cheap
rng = np.random.default_rng(0)
W = {"E": rng.normal(size=(V, D)), "P": rng.normal(size=(2048, D)),
     **{k: rng.normal(size=(D, D)) / 4 for k in ("q", "k", "v")},
     "out": rng.normal(size=(D, V)), "P3": rng.normal(size=(3, 2048, D))}


def logprobs(ids, pos, mask, pos3=None) -> np.ndarray:
    """[T, V] log-probabilities of a one-layer attention model over ``ids`` at ``pos`` (and
    at the mRoPE ids ``pos3`` [3, T], each row its own embedding, where given), query t
    attending to the keys ``mask[t]``."""
    h = W["E"][np.asarray(ids) % V] + W["P"][pos]
    if pos3 is not None:
        h = h + sum(W["P3"][k][np.asarray(pos3[k])] for k in range(3))
    s = (h @ W["q"]) @ (h @ W["k"]).T / np.sqrt(D)
    s = np.where(mask, s, -np.inf)
    a = np.exp(s - s.max(1, keepdims=True))
    logits = (h + (a / a.sum(1, keepdims=True)) @ (h @ W["v"])) @ W["out"]
    return logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)
                           ) - logits.max(1, keepdims=True)


def alone(piece, pos3=None) -> np.ndarray:
    """Per token t >= 1 of ``piece`` alone (at mRoPE ids ``pos3``): log p(piece[t] |
    piece[:t])."""
    n = len(piece)
    lp = logprobs(piece, np.arange(n), np.tril(np.ones((n, n), bool)), pos3)
    return lp[np.arange(n - 1), piece[1:] % V]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("combos")
    write_token_corpus(d / "plain", np.maximum(lognormal_lengths(40, 20, 1.0, 100), 2),
                       vocab_size=VOCAB)
    pair = [{"q": r["q"], "a": r["outs"][0], "b": r["outs"][-1] + " x"}
            for r in group_records(14, seed=5)]
    tokenize_files([str(write_jsonl(d / "pairs.jsonl", pair))], TOKENIZER, d / "pairs",
                   TokenizeOptions(prompt_field="q", chosen_field="a", rejected_field="b"))
    grouped = [{"q": r["q"], "outs": r["outs"][:2]} for r in group_records(14)]
    tokenize_files([str(write_jsonl(d / "groups.jsonl", grouped))], TOKENIZER,
                   d / "groups", TokenizeOptions(prompt_field="q", completions_field="outs"))
    # 14 records with 0-3 images each (4-64 image tokens an image), tokenized once
    tokenize_vision(d, image_records(d, 14, max_words=40), "images")
    return d, {}


PACKS = st.fixed_dictionaries({  # weighted toward what packs: most of the time goes to reading
    "corpus": st.sampled_from(["plain", "plain", "pairs", "groups", "images", "images"]),
    "seq_len": st.sampled_from([L] * 5 + [1]),
    "align": st.sampled_from([None] * 5 + [ALIGN, "cp", "fp8", MAX_ALIGN]),
    "max_docs": st.sampled_from([None] * 3 + [3]), "vsl": st.sampled_from([None] * 5 + ["16:512"]),
    "share_prompt": st.sampled_from([False] * 3 + [True]),
    "share_prefix": st.sampled_from([False] * 3 + [True]),
    "overflow": st.sampled_from(["split"] * 4 + ["truncate", "drop"]),
    "layout": st.sampled_from(["index", "tokens"]),
    "caps": st.sampled_from([None] * 4 + [(3, 150), (2, None)])})  # --max-images/-vision-tokens
READS = st.fixed_dictionaries({
    "pad_to": st.booleans(), "pad_multiple": st.sampled_from([None, ALIGN]),
    "per_segment": st.booleans(), "collate_multiple": st.sampled_from([None, ALIGN]),
    "collate_per_segment": st.booleans(), "max_docs": st.booleans(),
    "consumer": st.sampled_from(["4d", "varlen", "block_mask", "balanced", "zigzag"])})


def pack_features(p: dict) -> set:
    return {f for f, on in (
        ("groups", p["corpus"] in ("pairs", "groups")),
        ("plain", p["corpus"] in ("plain", "images")), ("images", p["corpus"] == "images"),
        ("layout_tokens", p["layout"] == "tokens"),
        ("vsl", p["vsl"]), ("align", p["align"]), ("max_docs", p["max_docs"]),
        ("share_prompt", p["share_prompt"]), ("share_prefix", p["share_prefix"]),
        ("truncate", p["overflow"] == "truncate"),
        ("drop", p["overflow"] == "drop")) if on}


def packed(world, p: dict):
    """(dataset or None, the error message or None), packed once per distinct ``p``."""
    d, cache = world
    key = tuple(sorted(p.items()))
    if key not in cache:
        seq_len = p["align"] if p["align"] == MAX_ALIGN else p["seq_len"]
        opts = {k: v for k, v in p.items()
                if k not in ("corpus", "seq_len", "align", "caps") and v}
        if p["caps"]:
            opts["max_images"], opts["max_vision_tokens"] = p["caps"]
        if p["share_prefix"]:
            opts["min_shared"] = 2  # the tiny corpora share short beginnings
        opts.update({"cp": {"cp": 4}, "fp8": {"fp8": True}}.get(p["align"], {"align": p["align"]}))
        if p["vsl"]:
            seq_len = None
        if p["align"]:
            opts["pad_id"] = 0  # a synthetic corpus has no tokenizer to take it from
        out = d / f"p{zlib.crc32(repr(key).encode()):08x}"  # one per pack, whatever came first
        try:
            pack_corpus([d / p["corpus"]], out, seq_len, **opts)
        except PacktoolError as e:
            cache[key] = (None, str(e))
        else:  # what pack wrote, its readers take
            cache[key] = (open_packed(out), None)
    return cache[key]


def refused_as_predicted(message: str, found: list) -> None:
    """The refusal names one of the conflicts (options are checked before the sources)."""
    assert any(c.name in message for c in found), ([c.name for c in found], message)


PACK = {"corpus": "plain", "seq_len": L, "align": None, "max_docs": None, "vsl": None,
        "share_prompt": False, "share_prefix": False, "overflow": "split", "layout": "index",
        "caps": None}
READ = {"pad_to": False, "pad_multiple": None, "per_segment": False, "collate_multiple": None,
        "collate_per_segment": False, "max_docs": False, "consumer": "4d"}
DEFECTS = {  # issue 38's combination defects, each the draw that found it
    "1 pairs read with pad_to": ({"corpus": "pairs"}, {"pad_to": True}),
    "2 cp_shard of a shared prompt": ({"corpus": "groups", "share_prompt": True,
                                       "layout": "tokens"}, {"consumer": "balanced"}),
    "3 4-D mask of aligned rows": ({"align": ALIGN}, {}),
    "4 alignment the readers refuse": ({"align": MAX_ALIGN}, {}),
    "5 every document dropped": ({"seq_len": 1, "overflow": "drop"}, {}),
    "6 trees of plain records": ({"share_prefix": True, "overflow": "drop"}, {}),
    "7 trees of groups": ({"corpus": "groups", "share_prefix": True, "layout": "tokens"}, {}),
    "8 cp_shard of trees": ({"corpus": "groups", "share_prefix": True},
                            {"consumer": "balanced"}),
    "9 trees padded, through block_mask": ({"corpus": "groups", "share_prefix": True},
                                           {"pad_to": True, "collate_multiple": ALIGN,
                                            "consumer": "block_mask"}),
    "10 trees refused by varlen": ({"corpus": "groups", "share_prefix": True},
                                   {"consumer": "varlen"}),
}


IMAGES = {  # rows with images (issue 42) through every reader, collate and consumer
    "whole rows, 4-D mask": ({"corpus": "images"}, {}),
    "capped rows, padded": ({"corpus": "images", "caps": (3, 150)}, {"pad_to": True}),
    "segments padded, block_mask": ({"corpus": "images"}, {"pad_multiple": ALIGN,
                                                          "per_segment": True,
                                                          "consumer": "block_mask"}),
    "collated to max_docs, varlen": ({"corpus": "images", "max_docs": 3},
                                     {"collate_multiple": ALIGN, "collate_per_segment": True,
                                      "max_docs": True, "consumer": "varlen"}),
    "dropped over-long ones": ({"corpus": "images", "overflow": "drop"}, {}),
    "cp_shard refused": ({"corpus": "images"}, {"consumer": "zigzag"}),
    "--layout tokens refused": ({"corpus": "images", "layout": "tokens"}, {}),
    "truncate refused": ({"corpus": "images", "overflow": "truncate"}, {}),
    "alignment refused": ({"corpus": "images", "align": ALIGN}, {}),
    "--share-prefix refused": ({"corpus": "images", "share_prefix": True}, {}),
    "--vsl refused": ({"corpus": "images", "vsl": "16:512"}, {}),
    "a cap under a document's images": ({"corpus": "images", "caps": (2, None)}, {}),
    "caps without images": ({"caps": (3, 150)}, {}),
}


@pytest.mark.parametrize("name", IMAGES)
def test_images_are_exact_or_refused_with_every_feature(world, name):
    p, r = IMAGES[name]
    exact_or_refused(world, {**PACK, **p}, {**READ, **r})


@pytest.mark.parametrize("name", DEFECTS)
def test_the_defects_found_are_exact_or_refused(world, name):
    p, r = DEFECTS[name]
    exact_or_refused(world, {**PACK, **p}, {**READ, **r})


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(p=PACKS, r=READS)
def test_every_combination_is_exact_or_refused_by_name(world, p, r):
    exact_or_refused(world, p, r)


def exact_or_refused(world, p: dict, r: dict) -> None:
    if p["vsl"] and p["seq_len"] == 1:
        p = {**p, "seq_len": L}
    found = conflicts.conflicts(pack_features(p))
    images = p["corpus"] == "images"
    limit = (p["align"] == MAX_ALIGN  # the readers' limit on the alignment
             or (p["seq_len"] == 1 and not p["vsl"] and (
                 p["overflow"] == "drop" or p["corpus"] != "plain"))  # nothing left, or
             or (p["align"] and p["seq_len"] == 1))  # every image cut; not a multiple
    # --max-images/--max-vision-tokens: refused without images, or under a document's 3
    capped = bool(p["caps"]) and (not images or p["caps"][0] < 3)
    ds, err = packed(world, p)
    if found or limit or capped:
        assert err is not None, f"packed though {[c.name for c in found]} / a limit"
        if found and not limit:
            refused_as_predicted(err, found)
        elif capped and not limit:
            assert "--max-images" in err, err
        return
    assert err is None, err
    assert len(ds) > 0
    if p["share_prefix"]:  # the reader's tree keys, then each consumer's (below)
        expect_trees(world, ds, p["corpus"])
    if images:
        expect_images(world, ds, p["caps"])
    read(world, ds, p, r)


def expect_trees(world, ds, name) -> None:
    """Every record of two rows: its path (the keys its leaf's last token sees under the
    ancestor mask) holds its document, at positions 0.., with the log-probs it has alone."""
    corpus = packtool.open_tokens(world[0] / name)
    for i in (0, len(ds) - 1):
        ex = ds[i]
        tin, tout = ex["tree_in"], ex["tree_out"]
        n = tin.size
        q, k = np.arange(n)[:, None], np.arange(n)[None, :]
        mask = (k <= q) & (tin[k] <= tin[q]) & (tin[q] < tout[k])
        ids, pos = ex["input_ids"].astype(np.int64), ex["position_ids"]
        lp = logprobs(ids, pos, mask)
        for leaf, doc in zip(ex["seq_leaf"], ex["seq_doc"], strict=True):
            path = np.flatnonzero(mask[np.flatnonzero(tin == leaf)[-1]])
            piece = np.asarray(corpus[int(doc)], np.int64)
            assert np.array_equal(ids[path], piece) and np.array_equal(pos[path],
                                                                       np.arange(piece.size))
            got = lp[path[:-1], piece[1:] % V].sum()
            assert abs(got - alone(piece).sum()) < 1e-6 * max(1.0, abs(got))


def read(world, ds, p: dict, r: dict) -> None:
    groups, aligned = p["corpus"] in ("pairs", "groups"), bool(p["align"])  # to 8 or 16
    images = p["corpus"] == "images"
    if r["per_segment"] and not r["pad_multiple"]:
        r = {**r, "per_segment": False}  # a value error (no multiple), not a combination
    if r["collate_per_segment"] and not r["collate_multiple"]:
        r = {**r, "collate_per_segment": False}
    rows = [0, len(ds) - 1]
    cap = max(len(ds[i]["cu_seqlens"]) - 1 for i in rows) + 1
    pad_to = (-(-(max(ds.row_lengths()) + ALIGN * cap) // ALIGN) * ALIGN + ALIGN
              if r["pad_to"] else None)
    used = {"groups"} if groups else {"images"} if images else set()
    used |= {"share_prompt"} if p["share_prompt"] and groups else set()
    if any(is_shared(ds[i]) for i in rows):  # a tree row (a row of roots alone is plain)
        used.add("shared_rows")
    used |= {"per_segment"} if r["per_segment"] or r["collate_per_segment"] else set()
    if r["max_docs"]:
        used.add("collate_max_docs")
        if r["collate_multiple"] and not r["collate_per_segment"]:
            used.add("row_pad")
    used |= {"varlen": {"varlen"}, "balanced": {"cp_shard"},
             "zigzag": {"cp_shard"}}.get(r["consumer"], set())
    found = conflicts.conflicts(used)
    try:
        exs = [ds.get(i, pad_to=pad_to, pad_multiple=r["pad_multiple"],
                      per_segment=r["per_segment"]) if pad_to or r["pad_multiple"] else ds[i]
               for i in rows]
        batch = collate_numpy(exs, pad_multiple=r["collate_multiple"],
                              per_segment=r["collate_per_segment"],
                              max_docs=(max(len(e["cu_seqlens"]) - 1 for e in exs) + 1
                                        if r["max_docs"] else None))
        mask = attention(batch, r["consumer"], aligned or r["per_segment"]
                         or r["collate_per_segment"])
    except PacktoolError as e:
        assert found, f"refused, though no conflict applies: {e}"
        refused_as_predicted(str(e), found)
        return
    assert not found, f"{[c.name for c in found]} not refused"
    ids, pos = batch["input_ids"][0], batch["position_ids"][0]
    assert mask.shape == (ids.size, ids.size)
    lp = logprobs(ids, pos, mask, batch["position_ids_3d"][:, 0] if images else None)
    if p["share_prefix"]:
        expect_paths(world, lp, batch, mask, p["corpus"])
    elif groups:
        expect_sequences(world, ds, rows, lp, batch, p["corpus"])
    else:
        expect_pieces(world, ds, rows, lp, batch, p["corpus"])
    if images:  # the rows' images in row order, what a collator loads the pixels of
        exs = [ds[i] for i in rows]
        assert batch["image_grid_thw"].tolist() == [g for e in exs
                                                    for g in e["image_grid_thw"].tolist()]
        assert batch["image_refs"] == [ref for e in exs for ref in e["image_refs"]]


def expect_paths(world, lp, batch, mask, name) -> None:
    """A tree row as a consumer collated and masked it: every record's path (the keys its
    leaf's last token sees) holds its document at positions 0.., with its log-probs alone."""
    corpus = packtool.open_tokens(world[0] / name)
    ids, pos, tin = batch["input_ids"][0], batch["position_ids"][0], batch["tree_in"][0]
    for leaf, doc in zip(batch["seq_leaf"], batch["seq_doc"], strict=True):
        path = np.flatnonzero(mask[np.flatnonzero(tin == leaf)[-1]])
        piece = np.asarray(corpus[int(doc)], np.int64)
        assert np.array_equal(ids[path], piece)
        assert np.array_equal(pos[path], np.arange(piece.size))
        got = lp[path[:-1], piece[1:] % V].sum()
        assert abs(got - alone(piece).sum()) < 1e-6 * max(1.0, abs(got))


def attention(batch: dict, consumer: str, padded: bool) -> np.ndarray:
    """The [T, T] attention the consumer gives the batch (query, key)."""
    tb = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
    n = batch["input_ids"].shape[1]
    if consumer == "4d":
        return model_inputs(tb, mask="4d")["attention_mask"][0, 0].numpy()
    if consumer == "varlen":
        cu = model_inputs(tb)["cu_seq_lens_q"].numpy().astype(np.int64)
        doc = np.repeat(np.arange(cu.size - 1), np.diff(cu))
        return (doc[:, None] == doc[None, :]) & np.tri(n, dtype=bool)
    if consumer == "block_mask":  # its mask_mod, everywhere (torch's block sparsity is torch's)
        from torch.nn.attention import flex_attention

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(flex_attention, "create_block_mask", lambda mod, *a, **k: mod)
            mp.setattr("packtool.train.torch._masks", OrderedDict())
            mod = block_mask(tb)
        q = torch.arange(n)
        return mod(0, 0, q[:, None], q[None, :]).numpy()
    cp = 2
    if consumer == "zigzag":
        cup = np.asarray(batch.get("cu_seqlens_padded", batch["cu_seq_lens_q"]))
        if not padded or (np.diff(cup) % (2 * cp)).any():
            consumer = "balanced"  # zigzag takes rows aligned to 2 x cp_size: a value limit
    m = np.zeros((n, n), bool)
    seen = np.zeros(n, int)
    for rank in range(cp):
        s = cp_shard(batch, cp, rank, consumer)
        seen[s["positions"]] += 1
        for j in range(len(s["cu_seqlens_q"]) - 1):
            qs = s["positions"][s["cu_seqlens_q"][j]:s["cu_seqlens_q"][j + 1]]
            ks = s["key_positions"][s["cu_seqlens_k"][j]:s["cu_seqlens_k"][j + 1]]
            m[np.ix_(qs, ks)] = ks[None, :] <= qs[:, None]
    assert (seen == 1).all()
    return m


def piece_positions3(corpus, doc: int, off: int, length: int):
    """A piece's mRoPE ids alone: the document's stored ``positions3``, from the piece's
    first token (text: its three ids equal) on, restarting at 0; None without them."""
    if not (corpus.vision or {}).get("mrope"):
        return None
    p3 = np.asarray(corpus.positions3(int(doc)), np.int64)[:, off:off + length]
    assert (p3[:, 0] == p3[0, 0]).all()
    return p3 - p3[0, 0]


def expect_images(world, ds, caps) -> None:
    """Every row: its segments' images (grids, references) in row order, under the caps, and
    each segment's mRoPE ids its document's stored ones, restarting per segment."""
    corpus = packtool.open_tokens(world[0] / "images")
    for i in range(len(ds)):
        ex = ds[i]
        cu, grids, refs = ex["cu_seqlens"], [], []
        for s, (doc, off) in enumerate(zip(ex["source_docs"].tolist(),
                                           ex["source_offsets"].tolist(), strict=True)):
            n = int(cu[s + 1] - cu[s])
            im = corpus.images(doc)
            inside = (im["span"][:, 0] >= off) & (im["span"].sum(1) <= off + n)
            grids += im["grid"][inside].tolist()
            refs += [ref for ref, k in zip(im["refs"], inside, strict=True) if k]
            assert np.array_equal(ex["position_ids_3d"][:, cu[s]:cu[s + 1]],
                                  piece_positions3(corpus, doc, off, n))
        assert ex["image_grid_thw"].tolist() == grids and ex["image_refs"] == refs
        if caps:
            assert len(refs) <= caps[0]
            assert int(ex["image_grid_thw"].prod(-1).sum()) // 4 <= caps[1]


def expect_pieces(world, ds, rows, lp, batch, name) -> None:
    """Every document piece of the rows: the same log-probs as alone (at its mRoPE ids,
    summed over the batch's labels) and the same number of trained tokens."""
    corpus = packtool.open_tokens(world[0] / name)
    want, n = 0.0, 0
    for i in rows:
        ex = ds[i]
        for doc, off, length in zip(ex["source_docs"].tolist(), ex["source_offsets"].tolist(),
                                    np.diff(ex["cu_seqlens"]).tolist(), strict=True):
            piece = np.asarray(corpus[doc], np.int64)[off:off + length]
            keep = np.asarray(corpus.doc_mask(doc), bool)[off + 1:off + length]
            want += alone(piece, piece_positions3(corpus, doc, off, length))[keep].sum()
            n += int(keep.sum())
    labels = batch["labels"][0]
    t = np.flatnonzero(labels[1:] != -100) + 1
    assert t.size == n
    assert abs(lp[t - 1, labels[t] % V].sum() - want) < 1e-6 * max(1.0, abs(want))


def expect_sequences(world, ds, rows, lp, batch, name) -> None:
    """Every sequence's summed completion log-prob (sequence_logps) as alone."""
    corpus = packtool.open_tokens(world[0] / name)
    roles = corpus.per_doc("roles")
    tb = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
    tb["input_ids"] = tb["input_ids"] % V
    got = sequence_logps(torch.from_numpy(lp)[None], tb)
    want = {}
    for i in rows:
        ex = ds[i]
        cu = np.asarray(ex["cu_seqlens"], np.int64)
        is_seq = np.asarray(ex["seq_ids"])[cu[:-1]] >= 0
        for doc, g, role in zip(np.asarray(ex["source_docs"])[is_seq], ex["seq_group"],
                                ex["seq_role"], strict=True):
            piece = np.asarray(corpus[int(doc)], np.int64)
            keep = np.asarray(corpus.doc_mask(int(doc)), bool)[1:]
            from packtool.sources.groups import role_name

            assert roles[int(doc)] == role
            want[int(g), role_name(role)] = alone(piece)[keep].sum()
    assert set(got) == set(want)
    for k, v in want.items():
        assert abs(float(got[k]) - v) < 1e-4 * max(1.0, abs(v)), k  # float32 in sequence_logps
