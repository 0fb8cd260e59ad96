"""gigatoken 0.10.0 (Rust, SIMD pre-tokenizer and a word cache): byte-level BPE and
SentencePiece-style BPE with byte fallback, loaded from the reference's own ``tokenizer.json``
text (so truncation and padding are already off, and a converted SentencePiece ``.model``
loads the same way).

What it does and does not do (read from its stubs and measured, 2 shared cores, the 70k
byte-level BPE of scripts/bench_corpora.py, 50 MB JSONL each; best of 3, texts in memory,
batches of 1,024 documents, two Python threads as in the pipeline):

==========================  ===========  ===========  ==========  ===========
engine                      prose M/s    code M/s     vs hf       vs fastokens
==========================  ===========  ===========  ==========  ===========
gigatoken ``encode_batch``  64-68        87-142       ~60x        1.6-2.1x
fastokens                   41.5         67           ~38x        1
tokie                       9.1          24           ~8-25x
tokenizers (hf)             1.1          0.9          1
==========================  ===========  ===========  ==========  ===========

- ``encode_batch(texts, parallel=False)`` returns an awkward ``ListOffsetArray`` whose
  offsets (int64) and content (uint32) are numpy arrays: no Python object per token. With
  ``parallel=False`` two Python threads are no faster than one (the call holds the GIL for
  most of its work), so the adapter lets the engine's own thread pool (``parallel=True``,
  rayon) spread a batch over the cores instead.
- No post-processor: ``add_special`` is done here by wrapping each document in the constant
  prefix/suffix the reference's post-processor writes (found by encoding two texts with
  and without it); a post-processor that is not such a wrap is refused at load.
- Refuses WordPiece by name at load; Unigram and WordLevel are not implemented either
  (declared here, so the refusal says so); no character offsets (chat masks need them).
- ``encode_files`` reads JSONL/Parquet/text itself, but for JSONL it scans for the field
  lazily and *silently* stops at the first record it cannot read (a blank line of spaces, a
  missing field, invalid JSON: every later record is dropped), accepts what JSON refuses
  (trailing garbage, a missing closing brace), takes the first of duplicate keys (Python:
  the last), has no nested fields and reads one JSONL file on one thread: 0.29-0.36 s for
  50 MB of prose, against 0.12 s for packtool's reader plus 0.22 s for ``encode_batch``
  on two threads at once. So packtool keeps its own JSONL reader (packtool.sources.jsonl).
"""

from __future__ import annotations

import numpy as np

from .base import Engine, EngineRefused, narrow, version, wrap_docs
from .tokenizer import tokenizer_json

UNSUPPORTED = {"model": {"WordPiece", "Unigram", "WordLevel"}}
PARALLEL = True  # see the module docstring


def _wrap(reference) -> tuple[list[int], list[int]] | None:
    """The (prefix, suffix) ids the reference's post-processor puts around every document,
    or None when it is not a constant wrap."""
    found = set()
    for text in ("a", "hello world"):
        plain = reference.encode(text, add_special_tokens=False).ids
        full = reference.encode(text, add_special_tokens=True).ids
        n = len(plain)
        at = next((k for k in range(len(full) - n + 1) if full[k:k + n] == plain), None)
        if at is None or not n:
            return None
        found.add((tuple(full[:at]), tuple(full[at + n:])))
    if len(found) != 1:
        return None
    prefix, suffix = found.pop()
    return list(prefix), list(suffix)


def load(path, reference) -> Engine:
    import gigatoken

    backend = gigatoken.Tokenizer.from_json(tokenizer_json(reference)[0]).backend
    wrap = _wrap(reference)

    def encode(texts, add_special, dtype):
        layout = backend.encode_batch(texts, parallel=PARALLEL).layout
        offsets = np.asarray(layout.offsets.data)
        ids = np.asarray(layout.content.data)[offsets[0]:offsets[-1]]
        lengths = np.diff(offsets).astype(np.int64)
        if add_special:
            if wrap is None:
                raise EngineRefused("gigatoken has no post-processor, and this one is not a "
                                    "constant prefix/suffix packtool can add")
            lengths, ids, _ = wrap_docs(lengths, ids, None, *wrap)
        return lengths, narrow(ids, dtype)

    return Engine("gigatoken", version("gigatoken"), encode, offsets=False)
