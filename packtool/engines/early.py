"""Starting the fast engine before the reference is loaded: the reference in a child process.

In one process, loading the `tokenizers` reference holds the GIL (0.15-0.2 s for the 70k
byte-level BPE of scripts/bench_corpora.py, plus 0.1 s to serialize and parse its JSON), as
does gigatoken's load (0.15 s) and the first encode's import of awkward (0.18 s): whatever
the threads, they run one after the other while the second core idles, and with the load
probe they were 0.65 s of a 1.7 s run over 50 MB. So for a large part (:data:`MIN_BYTES`)
whose engine would be gigatoken, the run starts gigatoken from the ``tokenizer.json`` itself
(:func:`packtool.tokenizer.plain_json`) and starts tokenizing, while a child process
(:class:`ReferenceProcess`) loads the reference the ordinary way
(:func:`packtool.tokenizer.load_tokenizer`) on the other core and reports what the ordinary
path would have decided: the id space, the special tokens' ids, the family, a declared
refusal, and the load probe's texts. The same process then encodes for the load probe and
the sample check.

Nothing is trusted before it is checked: :meth:`Selection.confirm_early
<packtool.engines.select.Selection.confirm_early>` compares those facts with the ones the
run started from and runs the load probe, on a thread beside the run; the part commits only
after that has passed. Any difference, or a child that fails or dies, raises
:class:`Unconfirmed`, and the part is made again the ordinary way (so an error, a refusal, a
probe difference reads exactly as it would have): the output and its manifest are the
ordinary path's byte for byte.

Protocol: length-prefixed pickles over the child's stdin and stdout; the child ignores
SIGINT and ends when its stdin closes, which this process's exit does however it exits.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from .base import Engine, Unconfirmed, narrow, version

MIN_BYTES = 16 << 20  # a part this large (input bytes) starts before its reference is loaded
_CHILD = "import sys; from packtool.engines.early import _child; _child(sys.argv[1:])"


def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _recv(f):
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


class ReferenceProcess:
    """The reference tokenizer of ``path``, loaded in a child process started at once;
    ``tokens``: the special tokens whose ids the run needs (``--bos``/``--eos``)."""

    def __init__(self, path: Path, tokens: tuple[str, ...] = ()):
        root = str(Path(__file__).resolve().parents[2])  # this packtool, whatever sys.path
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), *tokens],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._lock = threading.Lock()
        self._facts: dict | None = None
        self.engine = Engine("hf", version("hf"), self.encode, offsets=False)

    def _reply(self):
        try:
            status, payload = _recv(self.proc.stdout)
        except (EOFError, OSError, ValueError, pickle.UnpicklingError):
            raise Unconfirmed("the reference process ended (exit status "
                              f"{self.proc.poll()})") from None
        if status != "ok":
            raise Unconfirmed(f"the reference process failed: {payload}")
        return payload

    def facts(self) -> dict:
        """What the ordinary path decides (waits for the child's load): ``id_space``,
        ``ids`` (token -> id or None), ``family``, ``refusal`` (gigatoken's declared one, or
        None), ``probe`` (the load probe's texts)."""
        with self._lock:
            if self._facts is None:
                self._facts = self._reply()
            return self._facts

    def encode(self, texts, add_special, dtype):
        """The reference's ``encode_batch_fast`` in the child: (lengths int64, ids dtype)."""
        self.facts()
        with self._lock:
            try:
                _send(self.proc.stdin, (list(texts), bool(add_special)))
            except (OSError, ValueError):
                raise Unconfirmed("the reference process ended (exit status "
                                  f"{self.proc.poll()})") from None
            lengths, ids = self._reply()
        return lengths, narrow(ids, dtype)

    def close(self) -> None:
        """End the child (its stdin closed) and reap it."""
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _child(argv: list[str]) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C; EOF ends us
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    sys.stdout = sys.stderr  # nothing stray on the protocol stream
    try:
        from ..tokenizer import id_space, load_tokenizer, tokenizer_json
        from . import ranking
        from .base import flatten
        from .select import _declared_refusal, _probe_texts

        tok, _ = load_tokenizer(argv[0])
        spec = tokenizer_json(tok)[1]
        facts = {"id_space": id_space(tok), "ids": {t: tok.token_to_id(t) for t in argv[1:]},
                 "family": ranking.family(spec),
                 "refusal": _declared_refusal("gigatoken", spec), "probe": _probe_texts(tok)}
    except Exception as e:  # the parent makes the part the ordinary way, which says why
        _send(out, ("error", f"{type(e).__name__}: {e}"))
        return
    _send(out, ("ok", facts))
    while True:
        try:
            texts, special = _recv(inp)
        except EOFError:
            return
        try:
            reply = ("ok", flatten(tok.encode_batch_fast(texts, add_special_tokens=special),
                                   np.uint32))
        except Exception as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        _send(out, reply)
