"""What every engine is: ``encode(texts, add_special, dtype) -> (lengths int64, ids dtype)``,
with no truncation or padding, and the two ways an engine is turned down."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from itertools import chain

import numpy as np

_PIP_NAMES = {"fastokens": "fastokens", "tokie": "tokie", "gigatoken": "gigatoken",
              "hf": "tokenizers", "sentencepiece": "sentencepiece"}


class EngineRefused(Exception):
    """An engine cannot (or will not be trusted to) encode this tokenizer; the reason says why."""


class EngineMismatch(Exception):
    """A fast engine's ids differ from the reference's on a checked document."""


@dataclass
class Engine:
    """``encode(texts, add_special, dtype) -> (lengths int64, ids dtype)``, no truncation or
    padding; ``offsets``: whether it can give the character offsets chat masks need, and
    ``with_offsets(texts) -> [(ids, [(start, end), ...]), ...]`` gives them (the references:
    chat masks are made by the reference, since the sample check compares ids only)."""

    name: str
    version: str
    encode: Callable
    offsets: bool
    with_offsets: Callable | None = None

    @property
    def library(self) -> str:
        """The library by its pip name (``tokenizers`` for ``hf``), as messages name it."""
        return _PIP_NAMES.get(self.name, self.name)


def version(name: str) -> str:
    return metadata.version(_PIP_NAMES[name])


def flatten(encs, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Encodings (objects with ``.ids`` lists) -> (lengths int64, concatenated ids)."""
    lengths = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
    ids = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=dtype,
                      count=int(lengths.sum()))
    return lengths, ids


def narrow(ids: np.ndarray, dtype) -> np.ndarray:
    """uint32 ids -> the corpus dtype, refusing ids it cannot hold rather than wrapping them."""
    if np.dtype(dtype) == ids.dtype:
        return ids
    if ids.size and int(ids.max()) > np.iinfo(dtype).max:
        raise EngineMismatch(f"the engine gave id {int(ids.max())}, beyond the vocabulary")
    return ids.astype(dtype)


def wrap_docs(lengths, ids, mask, prefix, suffix):
    """(lengths, ids, mask) with the ids ``prefix`` inserted before and ``suffix`` after each
    document's ids; a loss ``mask`` (or None) gets 0 on the prefix and 1 on the suffix (the
    model must learn to stop)."""
    if not prefix and not suffix:
        return lengths, ids, mask
    lengths = lengths + len(prefix) + len(suffix)
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if len(ends) else 0, ids.dtype)
    out_mask = None if mask is None else np.empty(len(out), np.uint8)
    keep = np.ones(len(out), bool)
    places = [(ends - lengths + k, tid, 0) for k, tid in enumerate(prefix)]
    places += [(ends - len(suffix) + k, tid, 1) for k, tid in enumerate(suffix)]
    for where, tid, m in places:
        out[where] = tid
        keep[where] = False
        if out_mask is not None:
            out_mask[where] = m
    out[keep] = ids
    if out_mask is not None:
        out_mask[keep] = mask
    return lengths, out, out_mask


def hf(path, reference) -> Engine:
    """The `tokenizers` library's own batch call: the reference for a ``tokenizer.json``, a
    checked engine for a SentencePiece ``.model``'s conversion."""
    def encode(texts, add_special, dtype):
        return flatten(reference.encode_batch_fast(texts, add_special_tokens=add_special), dtype)

    def with_offsets(texts):
        return [(e.ids, e.offsets)
                for e in reference.encode_batch(texts, add_special_tokens=False)]

    return Engine("hf", version("hf"), encode, offsets=True, with_offsets=with_offsets)
