"""Starting the fast engine before the reference is loaded: the reference in a child process.

In one process, loading the `tokenizers` reference holds the GIL (0.15-0.2 s for the 70k
byte-level BPE of scripts/bench_corpora.py, plus 0.1 s to serialize and parse its JSON), as
does gigatoken's load (0.15 s) and the first encode's import of awkward (0.18 s): whatever
the threads, they run one after the other while the second core idles; the ordinary setup
took 0.50-0.56 s of a 1.5 s run over 50 MB. So for a large part (:data:`MIN_BYTES`) of a
BPE ``tokenizer.json`` whose engine would be gigatoken, the run loads gigatoken from the file
itself (:func:`packtool.tokenizer.plain_json`) and starts tokenizing, while a child process
(:class:`ReferenceProcess`, a script that imports only `tokenizers`:
:mod:`._reference_child`) loads the reference as the ordinary path does, on the other core,
then encodes for the load probe and the sample check.

Nothing is trusted before it is checked: on a thread beside the run
(:meth:`Selection.confirm_early <packtool.engines.select.Selection.confirm_early>`),
:meth:`ReferenceProcess.confirm` compares what the reference says (the id space as the
ordinary path computes it, the special tokens' ids, the family, no dropout, the same
`tokenizers` version) with what the run took from the file, and runs the load probe. The
part commits only after that has passed, and any error of the part waits for it first. Any
difference, or a child that fails, dies, garbles or stalls, raises :class:`Unconfirmed`, and
the part is made again the ordinary way, so an error, a refusal or a probe difference reads
exactly as it would have: the output and its manifest are the ordinary path's byte for byte
(tests/test_engines.py). A Ray worker's parts never start early (their runs are the
driver's), so no child outlives its run.

Measured: the first tokens are written 0.08-0.14 s sooner (prose, 50 MB); the child costs
0.2 s of CPU (python, `tokenizers`, the load), which on 2 busy cores is taken from the run,
so the whole run gains 0-9% here (README); with packtool and numpy imported and the JSON
serialized and parsed again (the ordinary load), the child took 0.47 s and the run was no
faster.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from . import ranking
from ._reference_child import recv, send
from .base import Engine, Unconfirmed, narrow, version
from .select import LOADERS, Selection, declared_refusal, first_difference, probe_texts

MIN_BYTES = 16 << 20  # a part this large (input bytes) starts before its reference is loaded
CHILD = Path(__file__).with_name("_reference_child.py")  # what the child runs
TIMEOUT = 300.0  # seconds the child may take to answer before it is killed (and not trusted)


class ReferenceProcess:
    """The reference tokenizer of ``path``, loaded in a child process started at once;
    ``tokens``: the special tokens whose ids the run needs (``--bos``/``--eos``). The child
    runs with this process's ``sys.path`` (the same `tokenizers`, which it reports) and not
    its own folder on it (``-P``). Anything wrong with it (an error, an early end, a garbled
    or late answer) raises :class:`Unconfirmed` and kills it."""

    def __init__(self, path: Path, tokens: tuple[str, ...] = ()):
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(CHILD), str(path), *tokens], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._lock = threading.Lock()
        self._facts: dict | None = None
        self.engine = Engine("hf", version("hf"), self.encode, offsets=False)

    def _gone(self, why: str) -> Unconfirmed:
        self.proc.kill()  # out of step or stuck: nothing more from it is trusted
        return Unconfirmed(f"the reference process {why}")

    def _reply(self):
        try:
            ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
            if not ready:
                raise self._gone(f"gave no answer in {TIMEOUT:.0f} s")
            status, payload = recv(self.proc.stdout)
        except Unconfirmed:
            raise
        except Exception as e:  # an early end, or bytes that are not an answer
            raise self._gone(f"ended or garbled its answer ({type(e).__name__}; exit status "
                             f"{self.proc.poll()})") from None
        if status != "ok":
            raise self._gone(f"failed: {str(payload)[:300]}")
        return payload

    def facts(self) -> dict:
        """What the reference says (waits for the child's load): ``id_space`` (as
        :func:`packtool.tokenizer.id_space` computes it), ``ids`` (token -> id or None),
        ``added`` (the added tokens' texts), ``model`` (its type, ``dropout``,
        ``byte_fallback``), ``pre_tokenizer`` and ``decoder`` (their JSON), ``version``."""
        with self._lock:
            if self._facts is None:
                self._facts = self._reply()
            return self._facts

    def encode(self, texts, add_special, dtype):
        """The reference's ``encode_batch_fast`` in the child: (lengths int64, ids dtype)."""
        self.facts()
        with self._lock:
            try:
                send(self.proc.stdin, (list(texts), bool(add_special)))
            except Exception as e:
                raise self._gone(f"ended ({type(e).__name__})") from None
            reply = self._reply()
            try:
                lengths, ids = (np.frombuffer(b, t) for b, t in zip(reply, (np.int64, np.uint32),
                                                                     strict=True))
            except Exception as e:
                raise self._gone(f"garbled its answer ({type(e).__name__})") from None
        return lengths, narrow(ids, dtype)

    def confirm(self, engine: Engine, id_space: int, ids: dict, family: str) -> None:
        """Raise :class:`Unconfirmed` unless the reference agrees with what the run started
        from (``id_space``, the ``--bos``/``--eos`` ``ids`` and the ``family``, all read from
        the file; a BPE without dropout), it is the `tokenizers` this process would load,
        and ``engine`` gives its ids on the load probe."""
        f = self.facts()
        spec = {"model": f["model"], "pre_tokenizer": f["pre_tokenizer"],
                "decoder": f["decoder"]}
        wrong = [what for what, bad in (
            ("the tokenizers version", f["version"] != self.engine.version),
            ("the id space", f["id_space"] != id_space),
            ("the special tokens", f["ids"] != ids),
            ("the model", f["model"].get("type") != "BPE" or bool(f["model"].get("dropout"))),
            ("the family", ranking.family(spec) != family)) if bad]
        if wrong:
            raise Unconfirmed(f"the reference disagrees on {', '.join(wrong)}")
        diff = first_difference(engine, self.engine, probe_texts(f["added"]), False)
        if diff:
            raise Unconfirmed(f"{engine.name} differs on the load probe: {diff}")

    def close(self) -> None:
        """End the child: its stdin closed, then reaped (killed after 5 s); its stdout closed
        last, once nothing can be blocked reading it."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            self.proc.stdout.close()


def early_selection(requested: str, check: str, path: Path, spec: dict, reference: Engine
                    ) -> Selection | None:
    """The selection the ordinary path would make for the ``tokenizer.json`` at ``path``
    (parsed: ``spec``) when that is gigatoken, made without the loaded reference
    (this module): gigatoken loaded from the file, ``reference`` (the reference process's
    engine) for its checks. None where the ordinary path must decide: another engine
    requested or first in the family's order, a declared refusal, a failed load. The caller
    starts :meth:`Selection.confirm_early` before trusting it."""
    name, fam = "gigatoken", ranking.family(spec)
    if (requested not in ("auto", name) or check not in ("sample", "off")
            or (requested == "auto" and ranking.order(fam)[0] != name)
            or declared_refusal(name, spec)):
        return None
    try:
        engine = LOADERS[name](path, None)
        # its first call imports awkward (0.18 s, holding the GIL): here, alone, it is 0.1-0.2
        # s faster than in the first batch's worker, against the reader thread
        engine.encode(["a"], False, np.uint32)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # not installed, cannot load it, or a Rust panic: the ordinary
        return None        # path says which
    return Selection(engine, requested, check, None if check == "off" else reference,
                     family=fam)
