"""Images in token files (issue 42): sizes from headers (no pixel decoded), vision tokens per
model equal to transformers' image processors, mRoPE positions equal to each Qwen-VL model's
``get_rope_index`` on the document alone, and ``tokenize --vision`` end to end: placeholders
expanded, mask 0 on image tokens, spans, grids, references, positions, bad images named and
skipped, parts and resume. The comparisons with transformers import it (~10 s): slow."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from conftest import TOKENIZER, write_jsonl  # noqa: E402
from PIL import Image  # noqa: E402

import packtool  # noqa: E402
from packtool.errors import PacktoolError  # noqa: E402
from packtool.options import VISION_RULES  # noqa: E402
from packtool.tokenize import TokenizeOptions, tokenize_files  # noqa: E402
from packtool.vision import COUNTER, RULES, BadImage, image_size, mrope_positions  # noqa: E402

SIZES = [(640, 480), (33, 57), (5, 5), (28, 28), (29, 27), (1000, 7), (7, 1000), (300, 1),
         (123, 456), (1920, 1080), (4000, 3000), (57, 4), (2, 399)]
SPECIALS = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<image>", "</s>"]


def encoded(size, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    Image.new("RGBA" if fmt == "WEBP" and kw.pop("alpha", False) else "RGB", size,
              (200, 30, 10)).save(b, fmt, **kw)
    return b.getvalue()


# ------------------------------------------------------------------------------ headers
@pytest.mark.parametrize("fmt,kw", [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}),
                                    ("GIF", {}), ("BMP", {}), ("WEBP", {}),
                                    ("WEBP", {"lossless": True}),
                                    ("WEBP", {"alpha": True, "lossless": False})])
def test_header_sizes_equal_pillow_without_decoding(fmt, kw):
    for w, h in [(640, 480), (1, 1), (3, 1000), (16383, 2)]:
        data = encoded((w, h), fmt, **dict(kw))
        COUNTER.reset()
        got = image_size(data)
        assert got[:2] == (w, h) == Image.open(io.BytesIO(data)).size, (fmt, kw, got)
        assert COUNTER.decodes == 0 and COUNTER.bytes_read <= 64 + (fmt == "JPEG") * 600


def test_jpeg_size_found_past_exif_and_from_a_file(tmp_path):
    """A 20 KB EXIF block before the frame header is skipped by its length, not read."""
    exif = Image.Exif()
    exif[0x010E] = "x" * 20_000  # ImageDescription
    exif[0x0112] = 6  # orientation: the stored size is what counts (module docstring)
    p = tmp_path / "a.jpg"
    p.write_bytes(encoded((301, 17), "JPEG", exif=exif.tobytes()))
    COUNTER.reset()
    assert image_size(p) == (301, 17, "JPEG")
    assert COUNTER.bytes_read < 200 and COUNTER.decodes == 0


def test_other_formats_go_to_pillow_and_are_counted():
    data = encoded((31, 9), "TIFF")
    COUNTER.reset()
    assert image_size(data)[:2] == (31, 9)
    assert COUNTER.decodes == 1


@pytest.mark.parametrize("data", [b"", b"not an image at all", encoded((9, 9), "PNG")[:20],
                                  encoded((9, 9), "JPEG")[:40], b"\x89PNG\r\n\x1a\n" + b"\0" * 30])
def test_what_is_not_an_image_is_refused_by_name(data):
    with pytest.raises(BadImage):
        image_size(data)


# -------------------------------------------------------------------------------- rules
def test_rules_are_the_options_choices():
    assert tuple(RULES) == VISION_RULES


def test_qwen2_vl_rule_by_hand():
    """640x480 -> 644x476 (multiples of 28) -> grid (1, 34, 46) -> 391 tokens; the aspect
    ratio over 200 the processor refuses is a BadImage."""
    rule = RULES["qwen2-vl"]
    assert rule.grid(640, 480) == (1, 34, 46) and rule.tokens((1, 34, 46)) == 391
    assert rule.grid(10, 10) == (1, 4, 4)  # raised to min_pixels 3,136 = 56 x 56
    assert rule.grid(640, 480, max_pixels=28 * 28 * 16) == (1, 6, 8)
    assert RULES["llava"].tokens(RULES["llava"].grid(9, 9999)) == 576
    with pytest.raises(BadImage, match="aspect ratio"):
        rule.grid(1000, 4)


def _processor(name: str, lo: int, hi: int):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(patch_size=RULES[name].patch, merge_size=RULES[name].merge,
                                    min_pixels=lo, max_pixels=hi)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
@pytest.mark.parametrize("bounds", [None, (28 * 28 * 4, 28 * 28 * 64)])
def test_rules_equal_the_image_processors(name, bounds):
    rule = RULES[name]
    lo, hi = bounds or (rule.min_pixels, rule.max_pixels)
    proc = _processor(name, lo, hi)
    for w, h in SIZES:
        im = Image.new("RGB", (w, h))
        try:
            want = proc(images=[im], return_tensors="np")["image_grid_thw"][0].tolist()
        except ValueError:  # the processor refuses it: so does the rule
            with pytest.raises(BadImage):
                rule.grid(w, h, lo, hi)
            continue
        grid = rule.grid(w, h, lo, hi)
        assert list(grid) == want, (name, w, h)
        n = proc(images=[im], return_tensors="np")["pixel_values"].shape[0]
        assert rule.tokens(grid) == n // rule.merge**2


@pytest.mark.slow
def test_llava_count_equals_the_clip_processor_and_model_config():
    from transformers import CLIPImageProcessor, LlavaConfig

    proc = CLIPImageProcessor(size={"shortest_edge": 336}, crop_size=336)
    cfg = LlavaConfig()
    patch = cfg.vision_config.patch_size
    for w, h in SIZES[:4]:
        px = proc(images=[Image.new("RGB", (w, h))], return_tensors="np")["pixel_values"]
        assert (px.shape[-2] // patch) * (px.shape[-1] // patch) == RULES["llava"].tokens(
            RULES["llava"].grid(w, h))


# --------------------------------------------------------------------------------- rope
def test_mrope_positions_of_the_docstring_example():
    pos = mrope_positions(11, [(3, 6)], [(1, 4, 6)], merge=2)
    assert pos.tolist() == [[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
                            [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
                            [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]]
    with pytest.raises(ValueError):
        mrope_positions(11, [(3, 5)], [(1, 4, 6)], merge=2)


def _tiny_model(arch: str):
    """A tiny Qwen-VL model from its config class: get_rope_index is a method of it."""
    import transformers as tf

    text = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64,
            "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
            "bos_token_id": None, "eos_token_id": None}
    vision = {"depth": 1, "hidden_size": 16, "num_heads": 2, "spatial_merge_size": 2}
    ids = {"image_token_id": 60, "vision_start_token_id": 61, "vision_end_token_id": 62}
    if arch == "qwen2_vl":
        cfg = tf.Qwen2VLConfig(text_config=text, vision_config={**vision, "embed_dim": 16},
                               **ids)
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel as M
    elif arch == "qwen2_5_vl":
        cfg = tf.Qwen2_5_VLConfig(text_config=text, vision_config={
            **vision, "intermediate_size": 32, "out_hidden_size": 16}, **ids)
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel as M
    else:
        cfg = tf.Qwen3VLConfig(text_config={**text, "head_dim": 8, "rope_scaling": {
            "mrope_section": [1, 1, 2], "mrope_interleaved": True, "rope_type": "default"}},
            vision_config={**vision, "intermediate_size": 32, "out_hidden_size": 16,
                           "patch_size": 16, "deepstack_visual_indexes": []}, **ids)
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel as M
    return M(cfg)


def _document(rng, grids, merge=2):
    """Token ids of a document: text, then per image S, its pads, E, and text."""
    ids, spans = list(rng.integers(0, 50, rng.integers(0, 5))), []
    for t, h, w in grids:
        ids.append(61)
        spans.append((len(ids), t * h * w // merge**2))
        ids += [60] * spans[-1][1] + [62] + list(rng.integers(0, 50, rng.integers(0, 4)))
    return np.array(ids), np.array(spans).reshape(-1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_mrope_positions_equal_get_rope_index(arch):
    import torch

    model = _tiny_model(arch)
    rng = np.random.default_rng(1)
    for _ in range(30):
        k = int(rng.integers(0, 4))
        grids = [(1, 2 * int(rng.integers(1, 7)), 2 * int(rng.integers(1, 7))) for _ in range(k)]
        ids, spans = _document(rng, grids)
        if not len(ids):
            continue
        x = torch.tensor(ids)[None]
        want, _ = model.get_rope_index(x, (x == 60).int(),
                                       torch.tensor(grids).reshape(-1, 3) if k else None)
        got = mrope_positions(len(ids), spans, np.array(grids).reshape(-1, 3), merge=2)
        assert np.array_equal(got, want[:, 0].numpy()), (arch, grids)


# ----------------------------------------------------------------------------- tokenize
@pytest.fixture(scope="module")
def vlm_tokenizer(tmp_path_factory):
    """The test tokenizer with the Qwen-VL and LLaVA image tokens added, in-process."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.add_special_tokens(SPECIALS)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    return d / "tokenizer.json"


def _data_uri(size) -> str:
    return "data:image/png;base64," + base64.b64encode(encoded(size, "PNG")).decode()


@pytest.fixture()
def records(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img/a.png").write_bytes(encoded((640, 480), "PNG"))
    (tmp_path / "img/b.jpg").write_bytes(encoded((100, 30), "JPEG"))
    return [{"prompt": "<image>\nWhat is it?", "completion": "A box.", "images": ["img/a.png"]},
            {"prompt": "no image", "completion": "ok"},
            {"prompt": "<image> and <image>", "completion": "two",
             "images": ["img/b.jpg", _data_uri((40, 40))]}]


def _tokenize(tmp_path, tok, recs, name="c", **kw):
    src = write_jsonl(tmp_path / f"{name}.jsonl", recs)
    opts = {"prompt_field": "prompt", "completion_field": "completion", "vision": "qwen2-vl",
            "images_field": "images", "eos": "</s>", **kw}
    tokenize_files([str(src)], tok, tmp_path / "out" / name, TokenizeOptions(**opts))
    return packtool.open_tokens(tmp_path / "out" / name)


def _check_document(c, i, want_grids):
    v = c.vision
    ids, mask, im = np.asarray(c[i]), np.asarray(c.doc_mask(i)), c.images(i)
    assert im["grid"].tolist() == [list(g) for g in want_grids]
    pads = np.flatnonzero(ids == v["image_token_id"])
    covered = np.concatenate([np.arange(a, a + n) for a, n in im["span"]] or [[]])
    assert np.array_equal(pads, covered) and not mask[pads].any()
    for (a, n), g in zip(im["span"], im["grid"], strict=True):
        assert n == RULES[v["rule"]].tokens(g)
        assert ids[a - 1] == v["vision_start_id"] and ids[a + n] == v["vision_end_id"]
    want = mrope_positions(len(ids), im["span"], im["grid"], merge=v["merge"])
    assert np.array_equal(c.positions3(i), want)


def test_prompt_completion_images_expanded_masked_and_recorded(tmp_path, vlm_tokenizer,
                                                                records):
    c = _tokenize(tmp_path, vlm_tokenizer, records)
    assert c.meta["version"] == 5 and c.vision["n_images"] == 3
    assert c.vision["n_vision_tokens"] == 391 + 4 + 4
    for i, grids in enumerate([[(1, 34, 46)], [], [(1, 2, 8), (1, 4, 4)]]):
        _check_document(c, i, grids)
    refs = c.images(0)["refs"] + c.images(2)["refs"]
    assert refs[0]["uri"] == str(tmp_path / "img/a.png") and refs[0]["size"] == [640, 480]
    inline = refs[2]
    assert inline["uri"] == "data:" and inline["record"] == 3 and inline["index"] == 1
    assert inline["source"] == str(tmp_path / "c.jsonl")
    blob = base64.b64decode(records[2]["images"][1].split(",", 1)[1])
    assert inline["sha256"] == hashlib.sha256(blob).hexdigest()


def test_chat_image_parts_from_every_source(tmp_path, vlm_tokenizer, records):
    (tmp_path / "img").mkdir(exist_ok=True)
    (tmp_path / "img/c.png").write_bytes(encoded((64, 64), "PNG"))
    chat = [{"messages": [
        {"role": "user", "content": [
            {"type": "image", "image": "img/c.png"},
            {"type": "image_url", "image_url": {"url": (tmp_path / "img/c.png").as_uri()}},
            {"type": "image"},
            {"type": "text", "text": "Which is <image> odd?"}]},
        {"role": "assistant", "content": "None."}], "images": ["img/c.png", "img/c.png"]}]
    src = write_jsonl(tmp_path / "chat.jsonl", chat)
    tokenize_files([str(src)], vlm_tokenizer, tmp_path / "out" / "chat", TokenizeOptions(
        messages_field="messages", vision="qwen3-vl", images_field="images", eos="</s>"))
    c = packtool.open_tokens(tmp_path / "out" / "chat")
    _check_document(c, 0, [(1, 16, 16)] * 4)  # min_pixels 65,536 = 256 x 256
    assert c.doc_mask(0).sum() > 0  # the answer is trained on


def test_llava_gives_576_tokens_an_image_and_no_positions(tmp_path, vlm_tokenizer, records):
    c = _tokenize(tmp_path, vlm_tokenizer, records, vision="llava")
    assert c.vision["mrope"] is False and c.vision["n_vision_tokens"] == 3 * 576
    assert np.count_nonzero(np.asarray(c[2]) == c.vision["image_token_id"]) == 1152
    with pytest.raises(PacktoolError, match="no 3-D positions"):
        c.positions3(0)


@pytest.mark.parametrize("bad,why", [
    ({"images": ["img/missing.png"]}, "no such file"),
    ({"images": [_data_uri((9, 9))[:-8] + "!!!!"]}, "base64"),
    ({"images": ["img/not.png"]}, "not an image"),
    ({"images": []}, "placeholders"),
    ({"images": ["img/a.png", "img/a.png"]}, "lists 2 images"),
])
def test_a_bad_image_is_a_bad_record_named_and_skipped(tmp_path, vlm_tokenizer, records, bad,
                                                      why):
    (tmp_path / "img/not.png").write_bytes(b"hello")
    recs = [records[0], {**records[0], **bad}, records[1]]
    with pytest.raises(PacktoolError, match=why) as e:
        _tokenize(tmp_path, vlm_tokenizer, recs)
    assert "line 2" in str(e.value) and "c.jsonl" in str(e.value)
    c = _tokenize(tmp_path, vlm_tokenizer, recs, name="d", skip_bad_records=True)
    assert len(c) == 2 and c.meta["inputs"][0]["skipped_records"] == [2]


@pytest.mark.slow
def test_parts_resume_and_images_from_a_bucket(tmp_path, vlm_tokenizer, records, s3,
                                               monkeypatch):
    """Two inputs in two parts (each with its own image files, checksummed), one from an
    S3 bucket by URL; a run resumed before its commit skips both parts."""
    monkeypatch.setenv("PACKTOOL_STORAGE_OPTIONS", json.dumps(s3.options))
    b = s3.bucket()
    s3.fs.pipe(f"{b}/k.jpg", encoded((300, 200), "JPEG"))
    write_jsonl(tmp_path / "a.jsonl", records)
    write_jsonl(tmp_path / "b.jsonl", [{"prompt": "<image>", "completion": "s3",
                                        "images": [f"s3://{b}/k.jpg"]}])
    opts = TokenizeOptions(prompt_field="prompt", completion_field="completion",
                           vision="qwen2.5-vl", images_field="images", part_bytes=1)
    out = tmp_path / "out" / "p"
    tokenize_files([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], vlm_tokenizer, out,
                   opts)
    c = packtool.open_tokens(out)
    assert len(c.parts) == 2 and c.vision["n_images"] == 4
    assert c.images(3)["refs"][0]["uri"] == f"s3://{b}/k.jpg"
    _check_document(c, 3, [(1, 14, 22)])
    for q in c.parts:
        assert {"images", "img_grid", "img_span", "img_ref.jsonl", "pos3"} <= set(
            q.entry["checksums"])
    before = (tmp_path / "out" / "p.json").read_bytes()
    (tmp_path / "out" / "p.json").unlink()  # a run killed before its commit: resumed
    again = tokenize_files([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
                           vlm_tokenizer, out, opts)
    assert again.n_parts_skipped == 2
    assert json.loads((tmp_path / "out" / "p.json").read_bytes())["parts"] == json.loads(
        before)["parts"]
    from packtool.verify import verify

    assert verify(out).images["n_images"] == 4  # the object read again from the bucket
    h = tmp_path / "out" / "h"  # header only: the object's ETag is its proof
    tokenize_files([str(tmp_path / "b.jsonl")], vlm_tokenizer, h,
                   TokenizeOptions(**{**opts.__dict__, "image_check": "header"}))
    ref = packtool.open_tokens(h).images(0)["refs"][0]
    assert ref["fingerprint"].split(":")[0] in ("ETag", "VersionId") and "sha256" not in ref
    assert verify(h).images["n_images"] == 1
    s3.fs.pipe(f"{b}/k.jpg", encoded((300, 201), "JPEG"))
    with pytest.raises(PacktoolError, match="not the image tokenized"):
        verify(h)


def test_options_refused_by_name():
    for kw, why in (({"images_field": "images"}, "pass --vision"),
                    ({"vision": "llava", "max_pixels": 10}, "576"),
                    ({"vision": "qwen2-vl", "min_pixels": 9, "max_pixels": 3}, "swap"),
                    ({"vision": "qwen2-vl", "prompt_field": "p", "chosen_field": "c",
                      "rejected_field": "r"}, "images")):
        with pytest.raises(PacktoolError, match=why):
            TokenizeOptions(**kw).check()


def test_a_tokenizer_without_the_image_tokens_is_refused(tmp_path, records):
    with pytest.raises(PacktoolError, match="image_pad"):
        _tokenize(tmp_path, TOKENIZER, records, eos="<|eos|>")


# ------------------------------------------------------------------------------- verify
@pytest.mark.slow
def test_verify_reads_every_image_again_and_recomputes_positions(tmp_path, vlm_tokenizer,
                                                                  records):
    from packtool.verify import verify

    _tokenize(tmp_path, vlm_tokenizer, records)
    r = verify(tmp_path / "out" / "c")
    assert r.images == {"n_images": 3, "n_vision_tokens": 399, "reread": True}
    assert "3 images read again" in r.summary()
    (tmp_path / "img/a.png").write_bytes(encoded((640, 480), "PNG")[:-1] + b"\1")
    with pytest.raises(PacktoolError, match="not the image tokenized"):
        verify(tmp_path / "out" / "c")
    (tmp_path / "img/a.png").write_bytes(encoded((640, 480), "PNG"))
    verify(tmp_path / "out" / "c")
    src = tmp_path / "c.jsonl"  # the inline image is re-read from its record
    lines = src.read_text().splitlines()
    lines[2] = json.dumps({**records[2], "images": ["img/b.jpg", _data_uri((41, 40))]})
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(PacktoolError, match="inline image 1 of .*c.jsonl record 3"):
        verify(tmp_path / "out" / "c")


@pytest.mark.parametrize("key,edit,why", [
    ("pos3", lambda a: a.__setitem__(5, a[5] + 1), "mRoPE position"),
    ("img_grid", lambda a: a.__setitem__(1, 32), "grid"),
    ("img_span", lambda a: a.__setitem__(0, 2), "span"),
])
def test_verify_refuses_stored_images_and_positions_that_are_wrong(
        tmp_path, vlm_tokenizer, records, monkeypatch, key, edit, why):
    """What check_images reads, changed (past the checksums, which a forger recomputes):
    each is named."""
    from packtool.formats.tokens.corpus import TokenPart
    from packtool.verify.images import check_images

    c = _tokenize(tmp_path, vlm_tokenizer, records)
    real = TokenPart.per_doc

    def per_doc(self, k):
        a = real(self, k)
        if k != key:
            return a
        a = np.array(a)
        edit(a)
        return a

    monkeypatch.setattr(TokenPart, "per_doc", per_doc)
    with pytest.raises(PacktoolError, match=why):
        check_images(c)


def test_expected_positions_equal_the_writer_rule_on_random_documents():
    """verify's positions (its own arithmetic) against packtool.vision.rope's."""
    from packtool.verify.images import expected_positions

    rng = np.random.default_rng(5)
    for _ in range(200):
        grids, spans, at = [], [], int(rng.integers(0, 4))
        for _ in range(int(rng.integers(0, 4))):
            g = (1, 2 * int(rng.integers(1, 6)), 2 * int(rng.integers(1, 6)))
            n = g[1] * g[2] // 4
            spans.append((at, n))
            grids.append(g)
            at += n + int(rng.integers(0, 3))
        n = at + int(rng.integers(0, 3))
        s, g = np.array(spans).reshape(-1, 2), np.array(grids).reshape(-1, 3)
        assert np.array_equal(expected_positions(n, s, g, 2), mrope_positions(n, s, g, merge=2))


def test_cli_tokenize_and_verify_with_images(tmp_path, vlm_tokenizer, records):
    from conftest import run

    src = write_jsonl(tmp_path / "c.jsonl", records)
    r = run("tokenize", src, "-t", vlm_tokenizer, "-o", tmp_path / "out" / "c", "-q",
            "--prompt-field", "prompt", "--completion-field", "completion", "--vision",
            "qwen2-vl", "--images-field", "images", "--max-pixels", 28 * 28 * 16,
            catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = run("tokenize", src, "-t", vlm_tokenizer, "-o", tmp_path / "out" / "j", "--json",
            "--prompt-field", "prompt", "--completion-field", "completion", "--vision",
            "qwen2-vl", "--images-field", "images", "--max-pixels", 28 * 28 * 16)
    assert json.loads(r.stdout)["images"] == {"n_images": 3, "n_vision_tokens": 12 + 4 + 4}
    c = packtool.open_tokens(tmp_path / "out" / "c")
    assert c.images(0)["grid"].tolist() == [[1, 6, 8]] and c.vision["max_pixels"] == 12544
    r = run("verify", tmp_path / "out" / "c", catch_exceptions=False)
    assert r.exit_code == 0 and "3 images read again" in r.output, r.output
    r = run("tokenize", src, "-t", vlm_tokenizer, "-o", tmp_path / "out" / "d", "--vision",
            "llava", "--max-pixels", 9)
    assert r.exit_code != 0 and "576" in r.output


@pytest.mark.parametrize("vision", ["qwen2-vl", "llava"])
def test_image_tokens_written_as_text_are_bad_records(tmp_path, vlm_tokenizer, vision):
    """Without --images-field "<image>" is text (Qwen) or refused (LLaVA, its image token);
    the model's own image tokens (LLaVA has no start/end tokens) in a text are refused, as a
    bad record; a batch with no image in it writes its empty image arrays."""
    chat = [{"messages": [{"role": "user", "content": "<image> is a tag"},
                          {"role": "assistant", "content": "Yes."}]},
            {"messages": [{"role": "user", "content": "say <|vision_start|>"},
                          {"role": "assistant", "content": "No."}]}]
    src = write_jsonl(tmp_path / "t.jsonl", chat)
    tokenize_files([str(src)], vlm_tokenizer, tmp_path / "out" / "t", TokenizeOptions(
        messages_field="messages", vision=vision, eos="</s>", skip_bad_records=True))
    c = packtool.open_tokens(tmp_path / "out" / "t")
    assert c.meta["inputs"][0]["skipped_records"] == ([2] if vision == "qwen2-vl" else [1])


@pytest.mark.slow
def test_verify_with_a_source_holding_images_reads_them_again(tmp_path, vlm_tokenizer,
                                                              records):
    from packtool.pack import pack_corpus
    from packtool.verify import verify

    _tokenize(tmp_path, vlm_tokenizer, records)
    pack_corpus([tmp_path / "out" / "c"], tmp_path / "packed", 1024)
    assert verify(tmp_path / "packed", [tmp_path / "out" / "c"]).sources_checked
    (tmp_path / "img/b.jpg").write_bytes(encoded((100, 31), "JPEG"))
    with pytest.raises(PacktoolError, match="b.jpg is not the image tokenized"):
        verify(tmp_path / "packed", [tmp_path / "out" / "c"])


@pytest.mark.slow
def test_parquet_image_columns_equal_jsonl_paths_and_data_uris(tmp_path, vlm_tokenizer, records):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{**r, "images": r.get("images", [])} for r in records]
    inline = base64.b64decode(rows[2]["images"][1].split(",", 1)[1])
    rows[2]["images"] = [{"bytes": None, "path": "img/b.jpg"}, {"bytes": inline, "path": "x"}]
    rows[0]["images"] = [{"bytes": None, "path": "img/a.png"}]  # a datasets Image column
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    opts = TokenizeOptions(prompt_field="prompt", completion_field="completion",
                           vision="qwen2-vl", images_field="images", eos="</s>")
    tokenize_files([str(tmp_path / "c.parquet")], vlm_tokenizer, tmp_path / "out" / "pq", opts)
    a = _tokenize(tmp_path, vlm_tokenizer, records)
    b = packtool.open_tokens(tmp_path / "out" / "pq")
    for i in range(3):
        assert np.array_equal(a[i], b[i]) and np.array_equal(a.positions3(i), b.positions3(i))
    assert b.images(2)["refs"][1]["source"] == str(tmp_path / "c.parquet")
    assert b.images(2)["refs"][1]["record"] == 3
    from packtool.verify import verify

    assert verify(tmp_path / "out" / "pq").images["n_images"] == 3  # inline: from its row


def test_mrope_batch_equals_a_call_a_document():
    """The writer's batch arithmetic against mrope_positions (itself equal to
    get_rope_index): empty documents, text-only ones, an image that ends its document."""
    from packtool.vision.rope import mrope_batch

    rng = np.random.default_rng(7)
    for _ in range(100):
        lengths, counts, spans, grids, want = [], [], [], [], []
        for _ in range(int(rng.integers(1, 6))):
            at, s, g = int(rng.integers(0, 3)), [], []
            for _ in range(int(rng.integers(0, 3))):
                t, h, w = 1 + int(rng.integers(0, 2)), 2 * int(rng.integers(1, 5)), 2 * int(
                    rng.integers(1, 5))
                s.append((at, t * h * w // 4))
                g.append((t, h, w))
                at += s[-1][1] + int(rng.integers(0, 3))
            n = at + int(rng.integers(0, 2)) if s or rng.random() < 0.7 else 0
            n = max(n, s[-1][0] + s[-1][1]) if s else n
            lengths.append(n)
            counts.append(len(s))
            spans += s
            grids += g
            want.append(mrope_positions(n, np.array(s).reshape(-1, 2),
                                        np.array(g).reshape(-1, 3), merge=2).T)
        got = mrope_batch(lengths, counts, np.array(spans).reshape(-1, 2),
                          np.array(grids).reshape(-1, 3), merge=2)
        assert np.array_equal(got, np.concatenate(want)), (lengths, spans, grids)


def test_load_ref_gives_every_image_its_bytes_proved(tmp_path, vlm_tokenizer, records):
    """What a training side's loader calls: a path's bytes, an inline image's from its
    record; a changed image is refused."""
    from packtool.vision.images import load_ref

    c = _tokenize(tmp_path, vlm_tokenizer, records)
    refs = c.images(0)["refs"] + c.images(2)["refs"]
    assert load_ref(refs[0], c.meta) == (tmp_path / "img/a.png").read_bytes()
    assert load_ref(refs[2], c.meta) == base64.b64decode(records[2]["images"][1].split(",")[1])
    (tmp_path / "img/b.jpg").write_bytes(encoded((100, 30), "PNG"))
    with pytest.raises(PacktoolError, match="not those tokenized"):
        load_ref(refs[1], c.meta)


def test_output_is_the_same_for_any_batch_size_and_workers(tmp_path, vlm_tokenizer, records):
    recs = records * 5
    _tokenize(tmp_path, vlm_tokenizer, recs, name="a", batch_size=1, workers=1)
    _tokenize(tmp_path, vlm_tokenizer, recs, name="b", batch_size=4, workers=2)
    for key in ("bin", "mask", "images", "img_grid", "img_span", "pos3"):
        a, b = (tmp_path / f"out/a.{key}").read_bytes(), (tmp_path / f"out/b.{key}").read_bytes()
        assert a == b, key


def test_image_check_header_reads_headers_only_and_still_proves_the_files(
        tmp_path, vlm_tokenizer, records):
    """--image-check header: a file's image costs its header (tens of bytes, not the
    file), its reference a size and mtime; verify and load_ref refuse a changed file."""
    from packtool.verify import verify
    from packtool.vision.images import load_ref

    (tmp_path / "img/a.png").write_bytes(encoded((640, 480), "PNG") + b"\0" * 50_000)
    COUNTER.reset()
    c = _tokenize(tmp_path, vlm_tokenizer, records, image_check="header")
    assert COUNTER.images == 3 and COUNTER.bytes_read < 200 and COUNTER.decodes == 0
    ref = c.images(0)["refs"][0]
    assert "sha256" not in ref and ref["fingerprint"].startswith("mtime_ns:")
    assert ref["bytes"] > 50_000 and "sha256" in c.images(2)["refs"][1]  # inline: hashed
    _check_document(c, 0, [(1, 34, 46)])
    assert len(load_ref(ref, c.meta)) == ref["bytes"]
    assert verify(tmp_path / "out" / "c").images["n_images"] == 3
    os.utime(tmp_path / "img/a.png", ns=(1, 1))
    with pytest.raises(PacktoolError, match="not the image tokenized"):
        verify(tmp_path / "out" / "c")
    with pytest.raises(PacktoolError, match="not the file tokenized"):
        load_ref(ref, c.meta)


def test_images_relative_to_an_input_given_by_a_relative_path(tmp_path, vlm_tokenizer,
                                                              records, monkeypatch):
    """The input named relative to the working directory (a path resolved twice found
    vlm/vlm/cat.png)."""
    monkeypatch.chdir(tmp_path.parent)
    src = write_jsonl(tmp_path / "c.jsonl", records)
    rel = str(src.relative_to(tmp_path.parent))
    tokenize_files([rel], vlm_tokenizer, tmp_path / "out" / "r", TokenizeOptions(
        prompt_field="prompt", completion_field="completion", vision="qwen2-vl",
        images_field="images"))
    c = packtool.open_tokens(tmp_path / "out" / "r")
    assert c.images(0)["refs"][0]["uri"] == str(tmp_path / "img/a.png")
