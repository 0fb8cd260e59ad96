"""Images for the trainer: a packed row's pixels loaded for its own images only, in the
DataLoader's workers, beside the row's mRoPE positions.

A row packed from a corpus tokenized with ``--vision`` carries its images' references (where
the bytes are, never the pixels), their grids, and the 3-row position ids each document got at
tokenize time. :class:`ImageCollator` turns a batch of such rows into what a Qwen-VL model's
forward takes::

    row             a a [v v v v] a | b [v v] b [v v v] b | c [v v v v] c
    image_refs      img0              img1      img2          img3         (row order)
    pixel_values    the processor's patches of img0 .. img3, concatenated
    image_grid_thw  [[1,4,4], [1,2,4], [1,2,6], [1,4,4]]       (the stored grids, checked)
    position_ids    [4, 1, N]: text positions, then mRoPE t, h, w; each restarts per document
    cu_seq_lens_q   [0, |a|, |a|+|b|, N]

    from packtool.torch import TorchPackedDataset, model_inputs
    from packtool.train.vision import ImageCollator
    ds = TorchPackedDataset("out/packed")
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=8,   # images read in workers
                        collate_fn=ImageCollator.for_packed(AutoProcessor.from_pretrained(name),
                                                            ds))
    loss = model(**model_inputs(batch), use_cache=False).loss

Only the row's own images are read: a reference names a file (a local path or any fsspec URL),
or a byte range inside one (an image inlined as base64 in a JSONL record), with the size and
sha256 it had at tokenize time; bytes that differ are refused by name, since the document's
image-token count was fixed from them.

The processor's grids must equal the stored ones: the stored grid fixed how many image tokens
the document holds, and a processor with other ``min_pixels`` / ``max_pixels`` (or another
patch size) gives other grids. The model would refuse the mismatch as a count of features far
from its cause; the collator refuses it here, naming the image and both grids.
"""

from __future__ import annotations

import base64
import hashlib
import io

from ..errors import PacktoolError

INSTALL = "pip install 'packtool[torch]' transformers pillow"


def read_image(ref: dict, storage_options: dict | None = None) -> bytes:
    """The bytes of the image ``ref`` names (a reference as tokenize stored it), checked
    against its ``bytes`` and ``sha256``: ``uri`` a path, ``file://`` or fsspec URL
    (optionally ``offset``/``length``, a byte range inside it, and ``encoding`` "base64"),
    or ``"data:"``, an image inlined in the input: record ``record`` (its line, from 1) of
    ``source``, found there by its sha256."""
    uri = ref.get("uri") if isinstance(ref, dict) else None
    if not isinstance(uri, str) or not uri:
        raise PacktoolError(f"image reference {ref!r} names no file (no \"uri\"): pass the "
                            "row's image_refs as the packed reader returns them")
    if uri == "data:":
        return _inline(ref, storage_options)
    offset, length = int(ref.get("offset", 0)), ref.get("length")
    data = _read(uri, offset, None if length is None else int(length), storage_options)
    if ref.get("encoding") == "base64":
        data = base64.b64decode(data)
    return _checked(ref, uri, data)


def _read(uri: str, offset: int, length: int | None, storage_options) -> bytes:
    from .. import storage

    try:
        if storage.is_url(uri):
            fs = storage.filesystem(uri, storage_options)
            return fs.cat_file(uri, start=offset or None,
                               end=None if length is None else offset + length)
        with open(storage.local_path(uri), "rb") as f:
            f.seek(offset)
            return f.read(-1 if length is None else length)
    except OSError as e:
        raise PacktoolError(f"cannot read image {uri}: {e.strerror or e}; the packed rows "
                            "name their images' files: keep them where tokenize read them, "
                            "or pass read= to ImageCollator to map the references") from None


def _inline(ref: dict, storage_options) -> bytes:
    """An inline (base64 ``data:``) image: its record's line read, the data URIs in it
    decoded, the one of the recorded sha256 returned."""
    import json

    source, line = ref.get("source"), int(ref.get("record", 0))
    if not isinstance(source, str) or line < 1:
        raise PacktoolError(f"inline image reference {ref!r} names no input line (source, "
                            "record): pass image_refs as the packed reader returns them")
    text = _read(source, 0, None, storage_options).split(b"\n")
    where = f"image {ref.get('index', '?')} of record {line} of {source}"
    if line > len(text):
        raise PacktoolError(f"{where}: the file has {len(text):,} lines; it changed since "
                            "tokenize: tokenize again")
    found = []

    def walk(v):
        if isinstance(v, str) and v.startswith("data:") and ";base64," in v[:64]:
            found.append(base64.b64decode(v.split(",", 1)[1]))
        elif isinstance(v, (dict, list)):
            for x in v.values() if isinstance(v, dict) else v:
                walk(x)

    walk(json.loads(text[line - 1]))
    want = ref.get("sha256")
    data = next((d for d in found if hashlib.sha256(d).hexdigest() == want), None)
    if data is None:
        raise PacktoolError(f"{where}: no inline image of sha256 {str(want)[:12]}... in that "
                            "record; the input changed since tokenize: tokenize again")
    return data


def _checked(ref: dict, uri: str, data: bytes) -> bytes:
    size, sha = ref.get("bytes"), ref.get("sha256")
    if size is not None and len(data) != int(size):
        raise PacktoolError(f"image {uri} has {len(data):,} bytes, {int(size):,} at tokenize "
                            "time: the file changed since; tokenize again (its token count "
                            "came from the old image)")
    if sha is not None and hashlib.sha256(data).hexdigest() != sha:
        raise PacktoolError(f"image {uri}: sha256 {hashlib.sha256(data).hexdigest()[:12]}... "
                            f"!= {sha[:12]}... recorded at tokenize time: the file changed "
                            "since; tokenize again")
    return data


def open_image(data: bytes):
    """``data`` decoded as an RGB PIL image (what the Qwen-VL processors take)."""
    try:
        from PIL import Image
    except ImportError:
        raise PacktoolError(f"decoding images needs Pillow: {INSTALL}") from None
    image = Image.open(io.BytesIO(data))
    return image.convert("RGB")


class ImageCollator:
    """``collate_fn`` for rows with images: :func:`packtool.torch.collate_tensors`'s batch
    plus ``pixel_values`` (from ``processor``, the model's ``AutoProcessor`` or its image
    processor) and ``image_grid_thw`` for the batch's images in row order, the mRoPE ids
    as ``position_ids_3d`` ``[3, 1, N]`` (``model_inputs`` makes the model's ``[4, 1, N]``).

    ``read``: reference -> bytes (default: :func:`packtool.vision.images.load_ref` with the
    source corpus's manifest where ``manifests`` are given, as :meth:`for_packed` does, which
    reads every kind of reference tokenize writes; else :func:`read_image`);
    ``collate``: keyword arguments of ``collate_tensors`` (pad_multiple, per_segment, ...).
    Picklable: each DataLoader worker gets its own copy and reads its rows' images alone."""

    def __init__(self, processor, read=None, storage_options: dict | None = None,
                 manifests: list | None = None, **collate):
        self.processor = getattr(processor, "image_processor", processor)
        self.read, self.storage_options, self.collate = read, storage_options, collate
        self.manifests = manifests

    @classmethod
    def for_packed(cls, processor, packed, **kw) -> ImageCollator:
        """The collator of a packed dataset's rows (``open_packed(dir)`` or a
        ``TorchPackedDataset``): its source corpora's manifests held (plain dicts), so each
        image is loaded as its corpus says (files, URLs, inline images of JSONL or Parquet
        records, ``--image-check header`` references)."""
        reader = getattr(packed, "packed", packed)
        return cls(processor, manifests=[c.meta for c in reader.sources()], **kw)

    def __call__(self, examples: list[dict]) -> dict:
        from .torch import collate_tensors

        batch = collate_tensors(examples, **self.collate)
        refs = batch.pop("image_refs", [])
        source = batch.pop("image_source", None)
        if "image_grid_thw" not in batch:
            return batch
        if not len(refs):  # a batch of text rows: no image keys to confuse the model
            del batch["image_grid_thw"]
            return batch
        return {**batch, **self.pixels(refs, batch["image_grid_thw"], source)}

    def load(self, ref: dict, source) -> bytes:
        """One image's bytes: ``read``, the corpus's own loader, or :func:`read_image`."""
        if self.read is not None:
            return self.read(ref)
        if self.manifests is not None and source is not None:
            from ..vision.images import load_ref

            return load_ref(ref, self.manifests[int(source)])
        return read_image(ref, self.storage_options)

    def pixels(self, refs: list, grids, source=None) -> dict:
        """``pixel_values`` and ``image_grid_thw`` of the images ``refs``, whose stored grids
        are ``grids`` ([k, 3]) (``source``: each one's source corpus): refused by image where
        the processor's grid differs."""
        import torch

        if len(refs) != len(grids):
            raise PacktoolError(f"the batch has {len(refs)} image references and "
                                f"{len(grids)} grids: pass rows as the packed reader returns "
                                "them (one reference per grid)")
        sources = [None] * len(refs) if source is None else source.tolist()
        data = [self.load(r, s) for r, s in zip(refs, sources, strict=True)]
        out = self.processor(images=[open_image(d) for d in data], return_tensors="pt")
        got, want = torch.as_tensor(out["image_grid_thw"]), torch.as_tensor(grids)
        bad = (got != want).any(-1).nonzero().flatten().tolist()
        if bad:
            i = bad[0]
            raise PacktoolError(
                f"image {refs[i].get('uri', i)} (image {i} of the batch): the processor's grid "
                f"{got[i].tolist()} != {want[i].tolist()} stored at tokenize time ({len(bad)} "
                "images differ): the document holds the stored grid's image tokens; give the "
                "processor the min_pixels / max_pixels (and patch size) tokenize used")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": want.long()}
