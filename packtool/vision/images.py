"""A record's images, found, sized and counted in the reader (so a missing or unreadable image
is a bad record of a known file, record and image; ``--skip-bad-records`` skips and counts
it): :class:`VisionReader` is the hook ``ReadOptions.vision`` calls on each record.

Where a record's images are::

    {"messages": [{"role": "user", "content": [          content parts (OpenAI / HF):
        {"type": "image", "image": "cat.png"},            a path, URL or data: URI
        {"type": "image_url", "image_url": {"url": "s3://b/k.jpg"}},
        {"type": "image"},                                the next of --images-field
        {"type": "text", "text": "What is it?"}]}, ...]}
    {"prompt": "<image>\\nWhat is it?", "completion": "A cat.", "images": ["cat.png"]}

Each image becomes the rule's placeholder text (``<|vision_start|><|image_pad|><|vision_end|>``
for Qwen-VL, ``<image>`` for LLaVA), which the tokenizer keeps as its special tokens; the
encoder then repeats the image token as many times as the image has vision tokens.

An image is a local path (relative to the input file's folder), a URL (``file://``,
``s3://``... through :mod:`packtool.storage`), inline base64 (``data:image/png;base64,...``)
or a Hugging Face ``Image`` column's ``{"bytes": ..., "path": ...}`` (Parquet, Arrow).
Its bytes are read once, hashed (sha256: the reference a loader proves them by) and sized
from the header (:mod:`.headers`); no pixel is decoded. A reference records where the bytes
are and what they are, never the pixels::

    {"uri": "/data/cat.png", "sha256": "...", "bytes": 48213, "format": "PNG",
     "size": [640, 480]}
    {"uri": "data:", "source": "in.jsonl", "record": 17, "index": 0, ...}   # inline: image
                                                   0 of the record on line 17 of in.jsonl
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass, field

from ..errors import PacktoolError
from ..sources import ReadOptions, as_input, file_kind
from ..sources.records import BadRecord, check_messages, check_text, get_field, json_type
from .headers import image_size
from .rules import PLACEHOLDER, RULES, Rule


@dataclass
class Image:
    ref: dict                     # the reference stored in .img_ref.jsonl
    grid: tuple[int, int, int]    # (t, h, w) in patches
    n_tokens: int


@dataclass
class VisionDoc:
    """A record's document (a text, a (prompt, completion) pair, or a rendered chat) whose
    text holds one placeholder per image, in order, and those images."""

    doc: object
    images: list[Image] = field(default_factory=list)

    def utf8_size(self) -> int:
        from ..sources.records import utf8_size

        return utf8_size(self.doc)

    def locate(self, source: str, record: int) -> None:
        """Name the input and record that hold its inline images."""
        for im in self.images:
            if im.ref.get("uri") == "data:":
                im.ref.update(source=source, record=record)


class VisionReader:
    """``(record, read options) -> VisionDoc``: the images of a record found, loaded, sized
    (``rule``, ``min_pixels``/``max_pixels``), and replaced by the rule's placeholder text."""

    def __init__(self, rule: Rule, images_field: str | None, min_pixels=None, max_pixels=None,
                 check: str = "sha256"):
        self.rule, self.images_field, self.check = rule, images_field, check
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.text = "".join(t for t in (rule.start_token, rule.image_token, rule.end_token)
                            if t)
        self.reserved = tuple(t for t in (rule.image_token, rule.start_token, rule.end_token)
                              if t)
        self.source = None  # the input file being read (set per file)

    def __call__(self, obj, opts) -> VisionDoc:
        doc, found = self.sources(obj, opts)
        if opts.mode == "messages" and opts.render is not None:
            doc = _render(opts.render, doc)
        return VisionDoc(doc, [self._image(k, src) for k, src in enumerate(found)])

    def sources(self, obj, opts) -> tuple[object, list]:
        """(the record's document with placeholders, its images' sources in order)."""
        listed = self._listed(obj)
        found: list = []
        if opts.mode == "messages":
            doc = self._messages(get_field(obj, opts.messages_field), opts.messages_field,
                                 listed, found)
        elif opts.mode == "prompt_completion":
            doc = tuple(self._text(check_text(get_field(obj, f), f), listed, found)
                        for f in (opts.prompt_field, opts.completion_field))
        else:
            doc = self._text(check_text(get_field(obj, opts.text_field), opts.text_field),
                             listed, found)
        if listed:
            raise BadRecord("bad_images", f"field {self.images_field!r} lists "
                            f"{len(found) + len(listed)} images but the record has "
                            f"{len(found)} {PLACEHOLDER} placeholders or image parts for them")
        return doc, found

    def _listed(self, obj) -> list:
        if not self.images_field:
            return []
        try:
            value = get_field(obj, self.images_field)
        except BadRecord as e:
            if e.reason == "missing_field":
                return []  # a text-only record of a mixed corpus
            raise
        if value is None:
            return []
        if not isinstance(value, list):
            raise BadRecord("bad_images", f"field {self.images_field!r} is "
                            f"{json_type(value)}, expected a list of images")
        return list(value)

    def _text(self, text: str, listed: list, found: list) -> str:
        """``text`` with each ``<image>`` taking the next listed image (with
        --images-field; without, the text is text, and the image tokens in it refused)."""
        plain = text.replace(PLACEHOLDER, "") if self.images_field else text
        for t in self.reserved:
            if t in plain:
                raise BadRecord("bad_images", f"the text holds {t!r} itself, which the "
                                f"model reserves for images; write images as {PLACEHOLDER} "
                                "with --images-field, or as image content parts")
        if not self.images_field:
            return text
        n = text.count(PLACEHOLDER)
        if n > len(listed):
            raise BadRecord("bad_images", f"{n + len(found)} {PLACEHOLDER} placeholders "
                            f"but {len(found) + len(listed)} images (field "
                            f"{self.images_field!r})")
        found += listed[:n]
        del listed[:n]
        return text if self.text == PLACEHOLDER else text.replace(PLACEHOLDER, self.text)

    def _messages(self, value, key: str, listed: list, found: list) -> list[dict]:
        if not isinstance(value, list):
            check_messages(value, key)  # names what is wrong
        out = []
        for i, m in enumerate(value):
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                m = dict(m, content=self._text(content, listed, found))
            elif isinstance(content, list):
                m = dict(m, content=[self._part(p, f"message {i} content part {j}", listed,
                                                found) for j, p in enumerate(content)])
            out.append(m)
        return check_messages(out, key)

    def _part(self, part, where: str, listed: list, found: list):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            return dict(part, text=self._text(part["text"], listed, found))
        if kind not in ("image", "image_url"):
            return part  # check_messages names what is wrong with it
        src = part.get("image")
        if kind == "image_url":
            url = part.get("image_url")
            src = url.get("url") if isinstance(url, dict) else url
        if src is None:
            if not listed:
                raise BadRecord("bad_images", f"{where} is an image with no source and no "
                                f"image left in field {self.images_field!r}")
            src = listed.pop(0)
        found.append(src)
        return {"type": "text", "text": self.text}

    def _image(self, k: int, src) -> Image:
        shown = (src if len(src) <= 80 else src[:60] + "...") if isinstance(src, str) else (
            "inline bytes" if isinstance(src, dict) and src.get("bytes") else
            src.get("path") if isinstance(src, dict) else json_type(src))
        try:
            where = self.where(src)
            if self.check == "header" and isinstance(where, str):
                (width, height, fmt), ref = self.probe(where)
            else:
                data, ref = self._read(where)
                width, height, fmt = image_size(data)
                ref.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
            grid = self.rule.grid(width, height, self.min_pixels, self.max_pixels)
        except (PacktoolError, OSError) as e:
            raise BadRecord("bad_image", f"image {k} ({shown}): {e}") from None
        if ref["uri"] == "data:":
            ref["index"] = k
        ref.update(format=fmt, size=[width, height])
        return Image(ref, grid, self.rule.tokens(grid))

    def fetch(self, src) -> tuple[bytes, dict]:
        """The bytes of an image as a record gives it (:meth:`where`), and the start of its
        reference."""
        return self._read(self.where(src))

    def _read(self, where: bytes | str) -> tuple[bytes, dict]:
        if isinstance(where, bytes):
            return where, {"uri": "data:"}
        if "://" in where:
            from ..storage import filesystem

            fs, path = filesystem(where)
            try:
                with fs.open(path, "rb") as f:
                    return f.read(), {"uri": where}
            except FileNotFoundError:
                raise PacktoolError("no such object") from None
        try:
            with open(where, "rb") as f:
                return f.read(), {"uri": where}
        except FileNotFoundError:
            raise PacktoolError(f"no such file {where}") from None

    def probe(self, uri: str) -> tuple[tuple[int, int, str], dict]:
        """(width, height, format) of the file or object at ``uri`` from its header alone,
        and its reference: its size and what changes with its content (a local file's
        mtime, an object's ETag or version), not a hash of bytes never read."""
        from ..sources import identity

        try:
            if "://" in uri:
                from ..storage import filesystem

                fs, path = filesystem(uri)
                size, tag = identity(as_input(uri))
                with fs.open(path, "rb", block_size=1 << 16) as f:
                    return image_size(f), {"uri": uri, "bytes": size, "fingerprint": tag}
            with open(uri, "rb") as f:
                st = os.fstat(f.fileno())
                return image_size(f), {"uri": uri, "bytes": st.st_size,
                                       "fingerprint": f"mtime_ns:{st.st_mtime_ns}"}
        except FileNotFoundError:
            raise PacktoolError(f"no such file or object {uri}") from None

    def where(self, src) -> bytes | str:
        """An image as a record gives it: a path (relative to the input file), a URL or a
        data: URI, or a Hugging Face ``Image`` feature's ``{"bytes": ..., "path": ...}``
        (bytes inline, else the path): its bytes (inline), or its absolute path or URL."""
        if isinstance(src, dict) and isinstance(src.get("bytes"), (bytes, bytearray)):
            return bytes(src["bytes"])
        if isinstance(src, dict) and isinstance(src.get("path"), str):
            src = src["path"]
        if not isinstance(src, str) or not src:
            raise PacktoolError(f"a {json_type(src)}, expected a path, a URL, a data: URI or "
                                '{"bytes": ..., "path": ...}')
        if src.startswith("data:"):
            head, sep, payload = src.partition(",")
            if not sep or not head.endswith(";base64"):
                raise PacktoolError("a data: URI that is not base64 (data:image/...;base64,...)")
            try:
                return base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError) as e:
                raise PacktoolError(f"invalid base64 ({e})") from None
        from ..storage import is_url, join, local_path, parent

        if is_url(src):
            return src
        path = local_path(src)
        if not os.path.isabs(path) and self.source is not None:
            where = join(parent(self.source), path)
            return str(where) if is_url(where) else os.path.abspath(where)
        return os.path.abspath(path)


def load_ref(ref: dict, meta: dict) -> bytes:
    """The bytes of an image a corpus references (``ref``, a line of ``.img_ref.jsonl``;
    ``meta`` the corpus manifest), proved the same by their sha256: a path or URL read, an
    inline image taken from its input record (a pass over that input: cache what you load
    this way). What a training side's loader calls for each image of a row."""
    v, o = meta["images"], meta.get("options", {})
    reader = VisionReader(RULES[v["rule"]], v.get("images_field"))
    if ref.get("uri") != "data:" and "sha256" not in ref:  # --image-check header
        _, now = reader.probe(str(ref["uri"]))
        data, _ = reader.fetch(str(ref["uri"]))
        if (now["bytes"], now["fingerprint"]) != (ref.get("bytes"), ref.get("fingerprint")) \
                or len(data) != ref.get("bytes"):
            raise PacktoolError(f"image {ref['uri']}: not the file tokenized (its size or "
                                "fingerprint changed); tokenize again")
        return data
    if ref.get("uri") != "data:":
        data, _ = reader.fetch(str(ref.get("uri")))
    else:
        opts = ReadOptions(o.get("text_field") or "text", prompt_field=o.get("prompt_field"),
                           completion_field=o.get("completion_field"),
                           messages_field=o.get("messages_field"))
        record = read_records(ref.get("source"), {ref.get("record")}).get(ref.get("record"))
        if record is None:
            raise PacktoolError(f"{ref.get('source')} has no record {ref.get('record')}")
        found = reader.sources(record, opts)[1]
        if not 0 <= int(ref.get("index", -1)) < len(found):
            raise PacktoolError(f"{ref.get('source')} record {ref.get('record')} has no "
                                f"image {ref.get('index')}")
        data, _ = reader.fetch(found[int(ref["index"])])
    if len(data) != ref.get("bytes") or hashlib.sha256(data).hexdigest() != ref.get("sha256"):
        raise PacktoolError(f"image {ref.get('uri')}: its bytes are not those tokenized "
                            "(sha256 differs); tokenize again")
    return data


def _render(render, messages):
    try:
        return render(messages)
    except PacktoolError as e:  # the template refused this conversation
        raise BadRecord(getattr(e, "reason", "chat_template"), str(e)) from None


def read_records(source, numbers: set) -> dict:
    """The records ``numbers`` (1-based lines or rows, as a reference's ``record``) of an
    input, as objects: what holds an inline image (one pass over the input)."""
    path, kind = as_input(source), file_kind(as_input(source))
    out = {}
    if kind in ("parquet", "arrow"):
        import pyarrow.dataset as ds

        table = ds.dataset(str(path), format="parquet" if kind == "parquet" else "arrow")
        rows = table.to_table().to_pylist()
        return {n: rows[n - 1] for n in numbers if 0 < n <= len(rows)}
    from ..sources.jsonl import open_jsonl
    from ..sources.records import read_lines

    raw, f, _ = open_jsonl(path, kind)
    with raw:
        for n, (line, _) in enumerate(read_lines(f, 1 << 40), 1):
            if n in numbers and line is not None:
                out[n] = json.loads(line)
            if len(out) == len(numbers):
                break
    return out
