"""fastokens (Rust): reads ``tokenizer.json`` itself; one flat little-endian buffer per batch.

Declared limits: no BertNormalizer; no character offsets (chat masks need them)."""

from __future__ import annotations

import numpy as np

from .base import Engine, narrow, version

UNSUPPORTED = {"normalizer": {"BertNormalizer"}}


def load(path, reference) -> Engine:
    import fastokens

    tok = fastokens.Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()

    def encode(texts, add_special, dtype):
        # one flat little-endian buffer per batch: no Python object per token
        ids, offsets = tok.encode_batch_flat(texts, add_special_tokens=add_special)
        lengths = np.diff(np.frombuffer(offsets, "<u8")).astype(np.int64)
        return lengths, narrow(np.frombuffer(ids, "<u4"), dtype)

    return Engine("fastokens", version("fastokens"), encode, offsets=False)
