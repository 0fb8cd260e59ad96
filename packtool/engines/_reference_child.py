"""The child process of :mod:`packtool.engines.early`, run as a script by its path: it
imports nothing but the standard library and `tokenizers` (importing packtool and numpy
took 0.085 s of the child's 0.47 s of CPU, and the CPU a child spends is taken from the
run on a machine of few cores).

It loads the reference as :func:`packtool.tokenizer.load_tokenizer` does
(``Tokenizer.from_file``, truncation and padding off), answers with what the run started
from as the reference sees it (:func:`facts`), then encodes what it is sent (lengths as int64
and ids as uint32, native byte order) until its stdin closes. Messages: an 8-byte
little-endian length, then a pickle; each answer is ``("ok", payload)`` or ``("error",
text)``. SIGINT is ignored (the parent handles Ctrl-C).
"""

import os
import pickle
import signal
import struct
import sys
from array import array
from itertools import chain

IDS = next(c for c in "IL" if array(c).itemsize == 4)  # the ids' typecode: 4-byte unsigned
MAX_BYTES = 1 << 36  # a longer message is a garbled header


def send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def recv(f):
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    if n > MAX_BYTES:
        raise ValueError(f"a message of {n:,} bytes")
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def facts(tok, tokens: list[str]) -> dict:
    """What the parent started from, as the reference sees it: the id space as
    packtool.tokenizer.id_space computes it (the model's largest id, the added tokens',
    the vocabulary size), the ids of ``tokens``, the added tokens' texts (the load probe),
    and what packtool.engines.ranking.family reads (the model, pre-tokenizer, decoder)."""
    import json

    import tokenizers

    added = tok.get_added_tokens_decoder()
    top = max([*tok.get_vocab(with_added_tokens=False).values(), *added, -1])
    model = tok.model
    return {"id_space": max(top + 1, tok.get_vocab_size(with_added_tokens=True)),
            "ids": {t: tok.token_to_id(t) for t in tokens},
            "added": [t.content for t in added.values()],
            "model": {"type": type(model).__name__, "dropout": getattr(model, "dropout", None),
                      "byte_fallback": getattr(model, "byte_fallback", None)},
            "pre_tokenizer": (json.loads(tok.pre_tokenizer.__getstate__())
                              if tok.pre_tokenizer is not None else None),
            "decoder": (json.loads(tok.decoder.__getstate__())
                        if tok.decoder is not None else None),
            "version": tokenizers.__version__}


def main(path: str, tokens: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the protocol on a descriptor of its own; fd 1 (what any library prints) goes to stderr
    out, inp = os.fdopen(os.dup(1), "wb"), sys.stdin.buffer
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        tok.no_truncation()
        tok.no_padding()
        answer = facts(tok, tokens)
    except Exception as e:  # the parent makes the part the ordinary way, which says why
        send(out, ("error", f"{type(e).__name__}: {e}"))
        return
    send(out, ("ok", answer))
    while True:
        try:
            texts, special = recv(inp)
        except EOFError:
            return
        try:
            encs = tok.encode_batch_fast(texts, add_special_tokens=special)
            reply = ("ok", (array("q", map(len, encs)).tobytes(),
                            array(IDS, chain.from_iterable(e.ids for e in encs)).tobytes()))
        except Exception as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        send(out, reply)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
