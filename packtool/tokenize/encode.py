"""Records -> token ids (and a loss mask): ``make_encoder`` returns the function the worker
threads call on a batch of records, for each of the three modes.

    text               the tokens of each string
    prompt_completion  prompt tokens, then completion tokens, each encoded on its own (exactly
                       what the model is trained on); mask 1 on the completion
    messages           a conversation rendered by the chat template into text and the
                       character spans trained on; mask 1 on the tokens overlapping a span
    pairs, completions a prompt and its completions: one sequence each, prompt tokens
                       copied before each completion, mask 1 on the completions
                       (:mod:`.groups`, which also returns each sequence's role and prompt)

``--bos``/``--eos`` add special tokens around each document (BOS mask 0; EOS mask 1: the
model must learn to stop); in messages mode the template places EOS after assistant turns.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ..engines import Selection
from ..engines.base import hf, wrap_docs
from .groups import encode_groups, interleave


def add_bos_eos(lengths, ids, mask, dtype, bos_id, eos_id):
    """Insert BOS (mask 0) / EOS (mask 1) around each document."""
    return wrap_docs(lengths, ids.astype(dtype, copy=False), mask,
                     [] if bos_id is None else [bos_id], [] if eos_id is None else [eos_id])


def _messages(with_offsets, rendered, dtype):
    """(text, trained character spans) pairs -> ids and the mask of the tokens that overlap a
    span (a zero-width token counts where it stands). ``with_offsets``: the reference's
    ``texts -> [(ids, character offsets)]`` (:class:`packtool.engines.Engine`)."""
    encs = with_offsets([t for t, _ in rendered])
    lengths = np.fromiter((len(i) for i, _ in encs), dtype=np.int64, count=len(encs))
    ids = np.fromiter(chain.from_iterable(i for i, _ in encs), dtype=dtype,
                      count=int(lengths.sum()))
    mask = np.zeros(ids.size, np.uint8)
    pos = 0
    for (_, spans), (e, offsets) in zip(rendered, encs, strict=True):
        if spans and len(e):
            offs = np.array(offsets, dtype=np.int64).reshape(-1, 2)
            m = np.zeros(len(e), bool)
            for a, b in spans:
                m |= (offs[:, 1] > a) & (offs[:, 0] < b)
                m |= (offs[:, 0] == offs[:, 1]) & (offs[:, 0] >= a) & (offs[:, 0] < b)
            mask[pos:pos + len(e)] = m
        pos += len(e)
    return lengths, ids, mask


def tree_encoder(encode):
    """``encode`` of records tagged with their tree id (``--tree-field``,
    :class:`packtool.sources.records.Tagged`): its result, then the id of every document
    (a group's for each of its sequences)."""
    def run(records, pick=None):
        docs = [r.doc for r in records]
        out = encode(docs, pick)
        per = [len(d.completions) if hasattr(d, "completions") else 1 for d in docs]
        trees = np.repeat(np.array([r.tree for r in records], np.uint64), per)
        return (*out, None, trees) if len(out) == 3 else (*out, trees)

    return run


def make_encoder(tokenizer, dtype: np.dtype, add_special: bool, bos_id, eos_id,
                 mode: str = "text", renderer=None, engine=None):
    """Return ``encode(records, pick=None) -> (lengths int64, tokens dtype, mask or None)``.

    ``engine``: a ``packtool.engines.Selection`` (default: ``tokenizer`` itself, as the
    reference); ``pick``: the records its sample check covers. Messages are rendered by the
    reader (or by ``renderer`` here) and encoded with the selection's engine, which is then
    the reference (for a SentencePiece ``.model``, the sentencepiece library), the one that
    gives the character offsets the mask needs."""
    if engine is None:
        engine = Selection(hf(None, tokenizer), "hf", "none (the reference)")
    batch = engine.encode

    def encode(records, pick=None):
        if mode in ("pairs", "completions"):
            return encode_groups(batch, records, dtype, pick, bos_id, eos_id)
        if mode == "text":
            lengths, ids = batch(records, add_special, dtype, pick)
            mask = None
        elif mode == "prompt_completion":
            lengths, ids, mask = interleave(*batch([r[0] for r in records], False, dtype, pick),
                                            *batch([r[1] for r in records], False, dtype, pick),
                                            dtype)
        else:
            rendered = records if renderer is None else [renderer(r) for r in records]
            lengths, ids, mask = _messages(engine.engine.with_offsets, rendered, dtype)
        return add_bos_eos(lengths, ids, mask, dtype, bos_id, eos_id)

    return encode
