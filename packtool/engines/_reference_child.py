"""The child process of :mod:`packtool.engines.early`, run as a script by its path: it
imports nothing but the standard library and `tokenizers` (importing packtool and numpy
took 0.085 s of the child's 0.47 s of CPU, and the CPU a child spends is taken from the
run on a machine of few cores).

It loads the reference as :func:`packtool.tokenizer.load_tokenizer` does
(``Tokenizer.from_file``, truncation and padding off), answers what the run started from
(the vocabulary size with added tokens, the ids of the tokens named on its command line,
the added tokens' texts for the load probe), then encodes what it is sent (lengths as int64
and ids as uint32, native byte order) until its stdin closes. Messages: an 8-byte
little-endian length, then a pickle; each answer is ``("ok", payload)`` or ``("error",
text)``. SIGINT is ignored (the parent handles Ctrl-C).
"""

import pickle
import signal
import struct
import sys
from array import array
from itertools import chain

IDS = next(c for c in "IL" if array(c).itemsize == 4)  # the ids' typecode: 4-byte unsigned


def send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def recv(f):
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def main(path: str, tokens: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    sys.stdout = sys.stderr  # nothing stray on the protocol stream
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        tok.no_truncation()
        tok.no_padding()
        facts = {"vocab_size": tok.get_vocab_size(with_added_tokens=True),
                 "ids": {t: tok.token_to_id(t) for t in tokens},
                 "added": [t.content for t in tok.get_added_tokens_decoder().values()]}
    except Exception as e:  # the parent makes the part the ordinary way, which says why
        send(out, ("error", f"{type(e).__name__}: {e}"))
        return
    send(out, ("ok", facts))
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
