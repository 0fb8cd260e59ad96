"""tokie (Rust): reads ``tokenizer.json`` itself; numpy arrays straight from Rust (0.1.4+).

Its offsets are byte offsets into the normalized text, not the reference's character offsets
into the input: not used for chat masks."""

from __future__ import annotations

import numpy as np

from .base import Engine, narrow, version

UNSUPPORTED: dict = {}


def load(path, reference) -> Engine:
    import tokie

    tok = tokie.Tokenizer.from_json(str(path))
    tok.no_truncation()
    tok.no_padding()

    def encode(texts, add_special, dtype):
        ids, lengths = tok.encode_batch_flat(texts, add_special_tokens=add_special)
        return lengths.astype(np.int64), narrow(ids, dtype)

    return Engine("tokie", version("tokie"), encode, offsets=False)
