"""Choosing, trusting and checking an engine: the `tokenizers` library (or, for a SentencePiece
``.model``, its conversion, proven against the sentencepiece library at load) is the
reference; faster Rust engines (one module each beside this one) are used only with the
promise kept:

1. **At load**, an engine refuses what it declares it cannot do (fastokens: BertNormalizer;
   gigatoken: WordPiece, Unigram; none gives the character offsets that chat masks need),
   then encodes a fixed probe (all scripts, whitespace runs, control characters, every added
   token in context) and must match the reference on every probe text, else it is refused
   with the first difference.
2. **During the run** (``check="sample"``), the engine's output is compared with the reference
   on a sample that is a pure function of the corpus (:mod:`.sample`): the first
   ``FIRST_DOCS`` documents, a ``RANDOM_RATE`` of all documents drawn by a hash of their global
   index, and the longest documents (where rare paths hide): in input order, each one more
   than ``GROWTH`` times as long as the last so checked; all within a byte budget, so that
   the check costs a few percent of the run. The same corpus checks the same documents
   whatever the workers and batch size, so the manifest is byte-identical between runs.
   ``check="full"`` re-encodes everything.
3. **On any difference** ``auto`` raises :class:`EngineMismatch`; ``tokenize_files`` discards
   the partial output and runs again with the reference, saying why. Output files are
   byte-identical whichever engine ran.

``auto`` tries the engines in the measured order for the tokenizer's family
(:mod:`packtool.engines.ranking`) and takes the first that loads and passes the probe; the
selection records, for every faster engine, why it was not used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import PacktoolError
from ..tokenizer import tokenizer_json
from . import fastokens, gigatoken, ranking, tokie
from .base import Engine, EngineMismatch, EngineRefused
from .base import hf as _hf

# select_engine's counters belong to one part; what it decided does not (Selection.fresh)
_PER_PART = {"checked_docs", "checked_tokens"}
FASTEST_FIRST = ranking.FAST_ENGINES  # every fast engine; auto's order is per family
ENGINE_NAMES = ("auto", "hf", *FASTEST_FIRST)
CHECKS = ("sample", "full", "off")

# component types an engine declares it cannot reproduce (found by tests/test_engines.py or
# stated by the engine's own documentation); the probe catches the rest at load
_UNSUPPORTED = {"fastokens": fastokens.UNSUPPORTED, "tokie": tokie.UNSUPPORTED,
                "gigatoken": gigatoken.UNSUPPORTED}
LOADERS = {"hf": _hf, "fastokens": fastokens.load, "tokie": tokie.load,
           "gigatoken": gigatoken.load}


_PROBE = [
    "", " ", "a", "Hello, world!", "  leading and trailing  ", "tabs\tand\nnewlines\r\n\n\n",
    "x" * 3000, "supercalifragilistic" * 40, "12345 678.9 0x1F -3e10", "don't I'll we're",
    "café naïve Straße señor", "日本語の文章です。数据 東京", "λόγος привет Ωmega",
    "مرحبا بالعالم שלום עולם", "🙂🚀👨‍👩‍👧 🏳️‍🌈", "e\u0301 a\u0308\u0323 \u0915\u094d\u0937",
    "\x00\x01\x07\x1b[0m\x7f", "\u200b\u200d\ufeff\u00a0\u3000", "\U00010348\U0001d11e\U000e0041",
    "   \n   \t  \u2028 \u2029", "<html><body>x &amp; y</body></html>", "snake_case camelCase",
]


def _probe_texts(reference) -> list[str]:
    added = [t.content for t in reference.get_added_tokens_decoder().values()]
    return _PROBE + [f"a{t}b {t} x{t}{t}\n{t}" for t in added] + [" ".join(added)]


def _spec(reference) -> dict:
    """The reference's own ``tokenizer.json`` (truncation and padding off): what every engine
    is given, also for a converted SentencePiece ``.model``."""
    return tokenizer_json(reference)[1]


def _declared_refusal(name: str, spec: dict) -> str | None:
    def types(node):
        if not isinstance(node, dict):
            return set()
        found = {node.get("type")}
        for child in node.get("normalizers") or node.get("pretokenizers") or []:
            found |= types(child)
        return found

    for part, bad in _UNSUPPORTED[name].items():
        hit = types(spec.get(part)) & bad
        if hit:
            return f"{name} does not support the {part} {', '.join(sorted(hit))}"
    return None


_JSON_DIR: list = []


def _json_path(path: Path, reference) -> Path:
    """A ``tokenizer.json`` for engines that read a file: ``path`` itself, or for a
    SentencePiece ``.model`` its conversion, written once per process to a temporary folder."""
    if Path(path).suffix != ".model":
        return Path(path)
    import hashlib
    import tempfile

    if not _JSON_DIR:
        _JSON_DIR.append(tempfile.TemporaryDirectory(prefix="packtool-spm-"))
    text = tokenizer_json(reference)[0]
    out = Path(_JSON_DIR[0].name) / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not out.exists():
        out.write_text(text, encoding="utf-8")
    return out


def load_engine(name: str, path: Path, reference, add_special: bool,
                need_offsets: bool = False, spec: dict | None = None) -> Engine:
    """Load engine ``name`` for the tokenizer at ``path`` (already loaded as ``reference``, a
    `tokenizers.Tokenizer` with truncation and padding off), or raise :class:`EngineRefused`.
    ``spec``: the reference's parsed JSON, when the caller has it already."""
    if name == "hf":
        return _hf(path, reference)
    if need_offsets:
        raise EngineRefused(f"{name} gives no character offsets, which chat masks need")
    reason = _declared_refusal(name, _spec(reference) if spec is None else spec)
    if reason:
        raise EngineRefused(reason)
    try:
        engine = LOADERS[name](_json_path(path, reference), reference)
    except ImportError:
        raise EngineRefused(f"{name} is not installed (pip install 'packtool[fast]')") from None
    except Exception as e:  # the Rust side raises its own exception types
        raise EngineRefused(f"{name} cannot load it ({str(e).splitlines()[0][:200]})") from None
    texts = _probe_texts(reference)
    try:
        diff = first_difference(engine, _hf(path, reference), texts, add_special)
    except EngineRefused:
        raise
    except EngineMismatch as e:
        diff = str(e)
    except Exception as e:
        diff = f"it failed on the probe ({type(e).__name__}: {str(e)[:200]})"
    if diff:
        raise EngineRefused(f"{name} {engine.version} differs from tokenizers on the load probe: "
                            f"{diff}")
    return engine


def first_difference(engine: Engine, reference: Engine, texts: list[str],
                     add_special: bool) -> str | None:
    """None if ``engine`` gives exactly the reference's ids on every text, else the first
    difference, worded for a user."""
    la, ia = engine.encode(texts, add_special, np.uint32)
    lb, ib = reference.encode(texts, add_special, np.uint32)
    if np.array_equal(la, lb) and np.array_equal(ia, ib):
        return None
    ends_a, ends_b = np.cumsum(la), np.cumsum(lb)
    for i, text in enumerate(texts):
        a = ia[ends_a[i] - la[i]:ends_a[i]]
        b = ib[ends_b[i] - lb[i]:ends_b[i]]
        if not np.array_equal(a, b):
            at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            return (f"a {len(text):,}-character text beginning {text[:40]!r} gives {len(a):,} "
                    f"tokens instead of {len(b):,}, first difference at token {at:,} "
                    f"({a[at:at + 3].tolist()} vs {b[at:at + 3].tolist()})")
    return "the batch's total differs"


@dataclass
class Selection:
    """The engine a run uses, how it is checked, and what the check found.

    The sample check runs beside the pipeline, not in it: a worker encodes its batch, hands the
    sampled documents (texts and the engine's ids) to a checker thread and goes on, so the
    in-order writer never waits for the reference. Inside the workers the check took 0.4-0.7 s
    of wall time (100 MB synthetic JSONL, fastokens, before the sample's byte budget): the
    batch holding the first 200 documents held the in-order writer, and with it the reader.
    What the sample is and costs: :mod:`.sample`. At most ``2 * workers``
    checks wait (memory stays flat); a difference is raised by the next ``encode`` call or on
    leaving :meth:`checking`. ``full`` re-encodes each batch in its worker, since the reference
    then sets the pace anyway: 22.9 s instead of 1.2 s, the cost of an ``hf`` run."""

    engine: Engine
    requested: str
    check: str
    reference: Engine | None = None
    reasons: dict = field(default_factory=dict)   # engine name -> why it was not used
    fallback: str | None = None                    # why a run fell back to the reference
    family: str = "other"                          # ranking.family of the tokenizer
    checked_docs: int = 0
    checked_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: object = None
    _slots: threading.Semaphore | None = None
    _futures: list = field(default_factory=list)
    _failed: EngineMismatch | None = None

    def fresh(self) -> Selection:
        """A copy for another part: what was decided, with check counters of its own."""
        kept = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.init and not f.name.startswith("_") and f.name not in _PER_PART}
        kept["reasons"] = dict(kept["reasons"])
        return type(self)(**kept)

    @contextlib.contextmanager
    def checking(self, workers: int):
        """Run sample checks on ``workers`` checker threads; on normal exit wait for them
        (raising :class:`EngineMismatch` on a difference), on an error drop the rest."""
        if self.reference is None or self.check != "sample":
            yield self
            return
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(workers, "packtool-check")
        self._slots = threading.Semaphore(2 * workers)
        try:
            yield self
        except BaseException:
            self._pool.shutdown(wait=True, cancel_futures=True)
            raise
        else:
            self._pool.shutdown(wait=True)
            self.finish()
        finally:
            self._pool = None

    def finish(self) -> None:
        """Wait for every submitted check; raise the first difference found."""
        for f in self._futures:
            f.result()
        self._futures = []
        if self._failed is not None:
            raise self._failed

    def encode(self, texts, add_special, dtype, pick: np.ndarray | None = None):
        """The engine's encode; the documents at ``pick`` (or all, with ``full``) are compared
        with the reference."""
        if self._failed is not None:
            raise self._failed
        lengths, ids = self.engine.encode(texts, add_special, dtype)
        if self.reference is None or not len(texts):
            return lengths, ids
        if self.check == "full":
            self._verify(texts, add_special, dtype, lengths, ids)
            return lengths, ids
        if pick is None or not pick.size:
            return lengths, ids
        ends = np.cumsum(lengths)
        sub = [texts[i] for i in pick]
        want = np.concatenate([ids[ends[i] - lengths[i]:ends[i]] for i in pick])
        if self._pool is None:  # no checker threads (a direct call): check here
            self._verify(sub, add_special, dtype, lengths[pick], want)
            return lengths, ids
        self._slots.acquire()
        future = self._pool.submit(self._verify, sub, add_special, dtype, lengths[pick], want)
        future.add_done_callback(lambda _: self._slots.release())
        self._futures.append(future)
        return lengths, ids

    def _verify(self, texts, add_special, dtype, lengths, ids) -> None:
        rl, ri = self.reference.encode(texts, add_special, dtype)
        same = np.array_equal(rl, lengths) and np.array_equal(ri, ids)
        if not same:
            diff = first_difference(self.engine, self.reference, texts, add_special)
            err = EngineMismatch(f"{self.engine.name} {self.engine.version} differs from "
                                 f"tokenizers on the corpus: {diff}")
        with self._lock:
            self.checked_docs += len(texts)
            self.checked_tokens += int(lengths.sum())
            if not same and self._failed is None:
                self._failed = err
        if not same:
            raise err


def select_engine(requested: str, check: str, path: Path, reference, add_special: bool,
                  need_offsets: bool = False, fallback: str | None = None) -> Selection:
    """The engine for a run: ``requested`` by name, or with ``auto`` the fastest for the
    tokenizer's family (:mod:`.ranking`) that loads and passes the probe, else the reference.
    ``fallback`` (a reason) forces the reference. The selection's ``reasons`` say why each
    engine tried before the one chosen was not used."""
    if requested not in ENGINE_NAMES:
        raise PacktoolError(f"--engine {requested!r} is not one of {', '.join(ENGINE_NAMES)}")
    if check not in CHECKS:
        raise PacktoolError(f"--engine-check {check!r} is not one of {', '.join(CHECKS)}")
    hf = _hf(path, reference)
    spec = _spec(reference)
    fam = ranking.family(spec)
    if fallback is not None or requested == "hf":
        return Selection(hf, requested, "none (the reference)", fallback=fallback, family=fam)
    reasons = {}
    for name in ranking.order(fam) if requested == "auto" else (requested,):
        try:
            engine = load_engine(name, path, reference, add_special, need_offsets, spec=spec)
        except EngineRefused as e:
            reasons[name] = str(e)
            continue
        return Selection(engine, requested, check, None if check == "off" else hf, reasons,
                         family=fam)
    if requested != "auto":
        raise PacktoolError(f"--engine {requested}: {reasons[requested]}; use --engine auto "
                            "(falls back to tokenizers) or --engine hf")
    return Selection(hf, requested, "none (the reference)", reasons=reasons, family=fam)
