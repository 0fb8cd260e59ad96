"""The token format's writer: one part's ``.bin``, ``.boundaries`` (and ``.mask``) streamed
into temporary files, hashed (sha256 and crc32) as they are written;
:meth:`TokenWriter.finish` returns the part's entry of the manifest (``PART_KEYS``), so the
writer and the manifest cannot drift."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..._io import HashingWriter
from .schema import IMAGE_KEYS

# sha256: the file's identity (what ``verify`` checks); crc32: the check on first read and
# before pack copies the bytes (~10x faster; catches any corruption, not a forgery)
DIGESTS = ("sha256", "crc32")


class TokenWriter:
    """Streams one part into temporary files (``paths``: suffix key -> path)."""

    def __init__(self, paths: dict[str, Path], with_mask: bool):
        self.paths, self.with_mask = paths, with_mask
        # in the order an entry lists their checksums; pairs/groups (version 4): per
        # document its role, prompt length (and reward); images (version 5): per document
        # its images' end, per image grid, span, reference
        self.files = {k: HashingWriter(paths[k], DIGESTS) for k in FILE_KEYS
                      if k in paths and (k != "mask" or with_mask)}
        self.n_docs = self.n_tokens = self.n_empty = self.n_trained = self.n_groups = 0
        self.n_images = self.n_vision_tokens = 0

    def write(self, lengths: np.ndarray, ids: np.ndarray, mask: np.ndarray | None,
              groups: tuple | None = None, trees: np.ndarray | None = None,
              images: ImageBatch | None = None) -> None:
        """Append documents of ``lengths`` whose tokens are ``ids`` (and loss ``mask``; and
        for pairs/groups, ``groups`` = (roles, prompt lengths, rewards or None); with
        --tree-field, ``trees``: each document's tree id; with images, their
        :class:`ImageBatch`)."""
        w = self.files
        if "tree" in w:
            w["tree"].write(np.asarray(trees, "<u8"))
        if "images" in w:
            self._write_images(images)
        if "roles" in w:
            roles, prompt, rewards = groups
            w["roles"].write(roles.astype("<u2", copy=False))
            w["prompt"].write(prompt.astype("<u4", copy=False))
            if "rewards" in w:
                w["rewards"].write(rewards.astype("<f4", copy=False))
            self.n_groups += int(np.count_nonzero(group_starts(roles)))
        w["bin"].write(ids)
        if "mask" in w:
            w["mask"].write(mask)
            self.n_trained += int(mask.sum())
        w["boundaries"].write((np.cumsum(lengths) + self.n_tokens).astype("<i8", copy=False))
        self.n_docs += len(lengths)
        self.n_tokens += int(ids.size)
        self.n_empty += int(np.count_nonzero(lengths == 0))

    def _write_images(self, b: ImageBatch) -> None:
        w = self.files
        w["images"].write((np.cumsum(b.counts, dtype=np.int64) + self.n_images).astype("<i8"))
        w["img_grid"].write(np.ascontiguousarray(b.grids, "<u4").ravel())
        w["img_span"].write(np.ascontiguousarray(b.spans, "<i8").ravel())
        w["img_ref.jsonl"].write(np.frombuffer(b"".join(
            json.dumps(r, ensure_ascii=False, sort_keys=True).encode() + b"\n"
            for r in b.refs), np.uint8))
        if "pos3" in w:
            w["pos3"].write(np.ascontiguousarray(b.pos3, "<i4").ravel())
        self.n_images += len(b.refs)
        self.n_vision_tokens += int(np.asarray(b.spans, np.int64)[:, 1].sum())

    def abort(self) -> None:
        """Close and remove the files (each created here, exclusively, in the job's own
        folder): an attempt made again (an engine's fallback) starts from nothing."""
        for w in self.files.values():
            w.abort()
        for path in self.paths.values():
            Path(path).unlink(missing_ok=True)

    def finish(self, name: str, index: int, digest: str, inputs: list[dict]) -> dict:
        """Close the files; the part's entry: position, digest, counts, inputs, checksums."""
        entry = {"name": name, "index": index, "digest": digest, "n_docs": self.n_docs,
                 "n_tokens": self.n_tokens, "n_empty": self.n_empty,
                 "n_trained_tokens": self.n_trained if self.with_mask else self.n_tokens,
                 "inputs": inputs,
                 "checksums": {k: w.close() for k, w in self.files.items()}}
        if "roles" in self.files:
            entry["n_groups"] = self.n_groups
        if "images" in self.files:
            entry["n_images"], entry["n_vision_tokens"] = self.n_images, self.n_vision_tokens
        return entry


GROUP_KEYS = ("roles", "prompt", "rewards")
FILE_KEYS = ("bin", "boundaries", "mask", *GROUP_KEYS, *IMAGE_KEYS, "tree")


@dataclass
class ImageBatch:
    """The images of a batch of documents, in order: ``counts`` per document, ``grids``
    [k, 3] (t, h, w), ``spans`` [k, 2] (offset in its document, image tokens), ``refs`` (one
    JSON object each), ``pos3`` [n_tokens, 3] (mRoPE rules only, else None)."""

    counts: np.ndarray
    grids: np.ndarray
    spans: np.ndarray
    refs: list
    pos3: np.ndarray | None = None


def group_starts(roles: np.ndarray) -> np.ndarray:
    """True where a group starts: a chosen sequence (role 1) or a group's first completion
    (role 3); see packtool.sources.groups."""
    roles = np.asarray(roles)
    return (roles == 1) | (roles == 3)
