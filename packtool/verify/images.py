"""A token corpus with images (version 5), proved with this module's own code, not the
writer's: every document's image spans inside it, in order, exactly where the image token is
(and the vision start/end tokens around each span where the model has them); every image
read again from its reference (its sha256 and size as recorded; an inline one from its input
record), sized from its header and counted with the model's rule: its grid and token count
as stored; every stored 3-D position equal to positions made here from the definition::

    text token i     (p, p, p), p = i - sum over earlier images of (count - max(h, w)/merge)
    image token k    base + (k // (h'w'), (k // w') % h', k % w'), base = the position the
                     token would have as text, h' = h/merge, w' = w/merge

What it costs: a pass over the tokens and positions (numpy per document), and a read of
every image (the bytes tokenize read; inline images by one pass over their inputs).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict

import numpy as np

from ..errors import PacktoolError
from ..formats.packed import ValidationError
from ..sources import ReadOptions
from ..vision import RULES, image_size
from ..vision.images import VisionReader, read_records


def check_images(corpus) -> dict:
    """Raise :class:`ValidationError` naming the first image, span or position that is not
    what it must be; return the counts checked (every image read again)."""
    v = corpus.vision
    rule = RULES[v["rule"]]
    reader = VisionReader(rule, v.get("images_field"), v["min_pixels"], v["max_pixels"],
                          v.get("image_check", "sha256"))
    n_images = n_tokens = 0
    inline = defaultdict(list)  # source -> [(record, index, ref, grid, where)]
    for q in corpus.parts:
        grids, spans, refs = _part_images(q)
        ends = np.asarray(q.ends, np.int64)
        img_ends = np.asarray(q.per_doc("images"), np.int64)
        if len(img_ends) and (np.any(np.diff(img_ends, prepend=0) < 0)
                              or img_ends[-1] != len(refs)):
            raise ValidationError(f"{q.path('images')}: image ends not increasing from 0 "
                                  f"to the part's {len(refs):,} images")
        tokens = np.asarray(q.tokens)
        pos3 = np.asarray(q.per_doc("pos3")).reshape(-1, 3) if v["mrope"] else None
        for d in range(len(q)):
            a, b = (int(ends[d - 1]) if d else 0), int(ends[d])
            i, j = (int(img_ends[d - 1]) if d else 0), int(img_ends[d])
            where = f"{q.prefix} document {d:,}"
            _check_spans(tokens[a:b], spans[i:j], grids[i:j], v, rule, where)
            if pos3 is not None:
                want = expected_positions(b - a, spans[i:j], grids[i:j], rule.merge)
                bad = np.flatnonzero((pos3[a:b] != want.T).any(1))
                if bad.size:
                    raise ValidationError(
                        f"{where}: token {int(bad[0]):,} is stored at position "
                        f"{pos3[a + bad[0]].tolist()}, its mRoPE position is "
                        f"{want[:, bad[0]].tolist()}")
            for k in range(i, j):
                if refs[k].get("uri") == "data:":
                    inline[refs[k].get("source")].append((refs[k], grids[k], where))
                else:
                    _check_image(_read_again(reader, refs[k], where), refs[k], grids[k], rule,
                                 v, where)
        n_images += len(refs)
        n_tokens += int(spans[:, 1].sum())
    for source, items in inline.items():
        _check_inline(corpus, reader, source, items, rule, v)
    if n_images != v["n_images"] or n_tokens != v["n_vision_tokens"]:
        raise ValidationError(f"{corpus.prefix}: {n_images:,} images and {n_tokens:,} image "
                              f"tokens, the manifest says {v['n_images']:,} and "
                              f"{v['n_vision_tokens']:,}")
    return {"n_images": n_images, "n_vision_tokens": n_tokens, "reread": True}


def _part_images(q):
    raw = bytes(np.asarray(q.per_doc("img_ref.jsonl")))
    lines = raw.split(b"\n")
    if lines[-1] != b"" or len(lines) - 1 != q.entry.get("n_images", 0):
        raise ValidationError(f"{q.path('img_ref.jsonl')}: {len(lines) - 1:,} lines for "
                              f"{q.entry.get('n_images', 0):,} images")
    try:
        refs = [json.loads(line) for line in lines[:-1]]
    except ValueError as e:
        raise ValidationError(f"{q.path('img_ref.jsonl')}: not JSON lines ({e})") from None
    grids = np.asarray(q.per_doc("img_grid"), np.int64).reshape(-1, 3)
    spans = np.asarray(q.per_doc("img_span"), np.int64).reshape(-1, 2)
    return grids, spans, refs


def _check_spans(ids, spans, grids, v, rule, where: str) -> None:
    pads = np.flatnonzero(ids == v["image_token_id"])
    prev = 0
    for (a, n), g in zip(spans.tolist(), grids.tolist(), strict=True):
        t, h, w = g
        if n != t * (h // rule.merge) * (w // rule.merge) or h % rule.merge or w % rule.merge:
            raise ValidationError(f"{where}: an image of grid {g} spans {n:,} tokens")
        if a < prev or a + n > len(ids):
            raise ValidationError(f"{where}: image span ({a:,}, {n:,}) overlaps the one "
                                  f"before or leaves the document of {len(ids):,} tokens")
        if v["vision_start_id"] is not None and (
                a < 1 or ids[a - 1] != v["vision_start_id"] or a + n >= len(ids)
                or ids[a + n] != v["vision_end_id"]):
            raise ValidationError(f"{where}: image span ({a:,}, {n:,}) is not between the "
                                  "vision start and end tokens")
        prev = a + n
    covered = sum(n for _, n in spans.tolist())
    inside = sum(int(np.count_nonzero(ids[a:a + n] == v["image_token_id"]))
                 for a, n in spans.tolist())
    if inside != covered or pads.size != covered:
        raise ValidationError(f"{where}: {pads.size:,} image tokens, {covered:,} in its "
                              "image spans")


def expected_positions(n: int, spans, grids, merge: int) -> np.ndarray:
    """[3, n] positions of a document from the definition (module docstring)."""
    drop = np.zeros(n + 1, np.int64)
    pos = np.empty((3, n), np.int64)
    for (a, c), (_, h, w) in zip(spans.tolist(), grids.tolist(), strict=True):
        drop[a + c] += c - max(h // merge, w // merge)
    pos[:] = np.arange(n) - np.cumsum(drop)[:n]
    for (a, c), (_, h, w) in zip(spans.tolist(), grids.tolist(), strict=True):
        hw, lw = (h // merge) * (w // merge), w // merge
        k = np.arange(c)
        base = pos[0, a]
        pos[:, a:a + c] = base + np.stack([k // hw, (k // lw) % (h // merge), k % lw])
    return pos


def _read_again(reader: VisionReader, ref: dict, where: str):
    """The image's bytes, or (tokenized with --image-check header) its (width, height,
    format) from its header, once its size and fingerprint are proved unchanged."""
    uri = str(ref.get("uri"))
    try:
        if "sha256" in ref:
            return reader.fetch(uri)[0]
        size, now = reader.probe(uri)
    except (PacktoolError, OSError) as e:
        raise ValidationError(f"{where}: image {uri} cannot be read again: {e}") from None
    if (now["bytes"], now["fingerprint"]) != (ref.get("bytes"), ref.get("fingerprint")):
        raise ValidationError(f"{where}: image {uri} is not the image tokenized (its size or "
                              f"{str(ref.get('fingerprint')).split(':')[0]} changed)")
    return size


def _check_image(data, ref: dict, grid, rule, v, where: str) -> None:
    """``data``: the image's bytes (proved by the sha256 here) or its header's size."""
    shown = ref.get("uri") if ref.get("uri") != "data:" else (
        f"inline image {ref.get('index')} of {ref.get('source')} record {ref.get('record')}")
    if isinstance(data, bytes):
        if len(data) != ref.get("bytes") or hashlib.sha256(data).hexdigest() != ref.get(
                "sha256"):
            raise ValidationError(f"{where}: image {shown} is not the image tokenized (its "
                                  "bytes or sha256 differ from the reference)")
        data = image_size(data)
    w, h, _ = data
    want = rule.grid(w, h, v["min_pixels"], v["max_pixels"])
    if list(want) != list(grid):
        raise ValidationError(f"{where}: image {shown} of {w}x{h} pixels has grid "
                              f"{list(want)} by {rule.name}'s rule, the corpus stores "
                              f"{list(grid)}")


def _check_inline(corpus, reader, source, items, rule, v) -> None:
    """Inline (base64) images, re-read from their input records in one pass over it."""
    o = corpus.meta.get("options", {})
    opts = ReadOptions(o.get("text_field") or "text", prompt_field=o.get("prompt_field"),
                       completion_field=o.get("completion_field"),
                       messages_field=o.get("messages_field"))
    wanted = defaultdict(list)
    for ref, grid, where in items:
        wanted[ref.get("record")].append((ref, grid, where))
    got = read_records(source, set(wanted))
    for record, group in wanted.items():
        if record not in got:
            raise ValidationError(f"{group[0][2]}: {source} has no record {record} holding "
                                  "its inline image")
        _, found = reader.sources(got[record], opts)
        for ref, grid, where in group:
            k = ref.get("index")
            if not isinstance(k, int) or not 0 <= k < len(found):
                raise ValidationError(f"{where}: {source} record {record} has no image {k}")
            try:
                data, _ = reader.fetch(found[k])
            except (PacktoolError, OSError) as e:
                raise ValidationError(f"{where}: inline image {k} of {source} record "
                                      f"{record} cannot be read again: {e}") from None
            _check_image(data, ref, grid, rule, v, where)
