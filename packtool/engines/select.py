"""Choosing, trusting and checking an engine: the `tokenizers` library is the reference for a
``tokenizer.json``, the `sentencepiece` library for a SentencePiece ``.model``
(:func:`reference_engine`); faster engines (the Rust ones, one module each beside this one,
and for a ``.model`` its conversion run by `tokenizers`, ``hf``) are used only with the
promise kept:

1. **At load**, an engine refuses what it declares it cannot do (fastokens: BertNormalizer;
   gigatoken: WordPiece, Unigram; only the reference gives the character offsets that chat
   masks need; nothing reads a ``.model`` packtool does not convert),
   then encodes a fixed probe (all scripts, whitespace runs, control characters, every added
   token in context) and must match the reference on every probe text, else it is refused
   with the first difference.
2. **During the run** (``check="sample"``), the engine's output is compared with the reference
   on a sample that is a pure function of the corpus (:mod:`.sample`: the first documents, a
   seeded fraction, the longest, within a byte budget: a few percent of the run), so the
   manifest is byte-identical whatever the workers and batch size. ``check="full"``
   re-encodes everything.
3. **On any difference** ``auto`` raises :class:`EngineMismatch`; ``tokenize_files`` discards
   the partial output and runs again with the reference, saying why. Output files are
   byte-identical whichever engine ran.

``auto`` tries the engines in the measured order for the tokenizer's family
(:mod:`packtool.engines.ranking`) and takes the first that loads and passes the probe, else
the reference (for a ``.model`` not ``hf``, its conversion run by `tokenizers`: slower than
sentencepiece itself, ``ranking.HF_ON_A_MODEL``); the selection records, for every faster
engine, why it was not used, and which library was the reference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import PacktoolError
from . import fastokens, gigatoken, ranking, spm, tokie
from .base import Engine, EngineMismatch, EngineRefused, version
from .base import hf as _hf
from .tokenizer import tokenizer_json

# select_engine's counters belong to one part; what it decided does not (Selection.fresh)
_PER_PART = {"checked_docs", "checked_tokens"}
FASTEST_FIRST = ranking.FAST_ENGINES  # every fast engine; auto's order is per family
ENGINE_NAMES = ("auto", "hf", "sentencepiece", *FASTEST_FIRST)
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


def _is_model(path) -> bool:
    return Path(path).suffix == ".model"


def reference_engine(path: Path, reference) -> Engine:
    """What every other engine must equal: the sentencepiece library for a ``.model``, the
    `tokenizers` library (``reference`` itself) for anything else."""
    return spm.reference(path) if _is_model(path) else _hf(path, reference)


def probe_texts(added: list[str]) -> list[str]:
    """The load probe: fixed texts, then each added token (``added``: their texts) in
    context, then all of them together."""
    return _PROBE + [f"a{t}b {t} x{t}{t}\n{t}" for t in added] + [" ".join(added)]


def declared_refusal(name: str, spec: dict) -> str | None:
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


def load_engine(name: str, path: Path, reference, add_special: bool,
                need_offsets: bool = False, spec: dict | None = None,
                against: Engine | None = None) -> Engine:
    """Load engine ``name`` for the tokenizer at ``path`` (already loaded as ``reference``, a
    `tokenizers.Tokenizer` with truncation and padding off), proven equal on the load probe
    to ``against`` (default: :func:`reference_engine`), or raise :class:`EngineRefused`.
    ``name`` naming the reference itself returns it. ``spec``: the tokenizer's parsed JSON,
    when the caller has it already."""
    against = reference_engine(path, reference) if against is None else against
    if name == against.name:
        return against
    reason = _refusal(name, path, reference, need_offsets, spec)
    if reason:
        raise EngineRefused(reason)
    try:
        engine = (_hf(path, reference) if name == "hf"
                  else LOADERS[name](spm.conversion_file(tokenizer_json(reference)[0])
                                     if _is_model(path) else Path(path), reference))
    except ImportError:
        raise EngineRefused(f"{name} is not installed (pip install 'packtool[fast]')") from None
    except Exception as e:  # the Rust side raises its own exception types
        raise EngineRefused(f"{name} cannot load it ({str(e).splitlines()[0][:200]})") from None
    texts = probe_texts([t.content for t in reference.get_added_tokens_decoder().values()])
    if _is_model(path):  # and its own: its pieces in context
        texts += spm.probe_texts(path)
    try:
        diff = first_difference(engine, against, texts, add_special)
    except EngineRefused:
        raise
    except EngineMismatch as e:
        diff = str(e)
    except Exception as e:
        diff = f"it failed on the probe ({type(e).__name__}: {str(e)[:200]})"
    if diff:
        raise EngineRefused(f"{name} {engine.version} differs from {against.library} on the "
                            f"load probe: {diff}")
    return engine


def _refusal(name: str, path: Path, reference, need_offsets: bool, spec: dict | None
             ) -> str | None:
    """Why engine ``name`` (not the reference) cannot be used, known before loading it."""
    if need_offsets:
        if name == "hf":  # a .model's conversion: its offsets would go unchecked
            return ("chat masks are made with the reference's character offsets (the sample "
                    "check compares ids, not offsets)")
        return f"{name} gives no character offsets, which chat masks need"
    unconverted = spm.conversion_refused(reference) if _is_model(path) else None
    if unconverted:
        return f"{name} would encode packtool's conversion, and there is none: {unconverted}"
    if name == "hf":
        return None
    return declared_refusal(name, tokenizer_json(reference)[1] if spec is None else spec)


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
    # the reference library and version: tokenizers, or sentencepiece for a .model
    reference_name: str = field(default_factory=lambda: f"tokenizers {version('hf')}")
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
            for f in self._futures:  # every check done: raise the first difference found
                f.result()
            self._futures = []
            if self._failed is not None:
                raise self._failed
        finally:
            self._pool = None

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
        elif pick is not None and pick.size:
            ends = np.cumsum(lengths)
            checked = ([texts[i] for i in pick], add_special, dtype, lengths[pick],
                       np.concatenate([ids[ends[i] - lengths[i]:ends[i]] for i in pick]))
            if self._pool is None:  # no checker threads (a direct call): check here
                self._verify(*checked)
            else:
                self._slots.acquire()
                future = self._pool.submit(self._verify, *checked)
                future.add_done_callback(lambda _: self._slots.release())
                self._futures.append(future)
        return lengths, ids

    def _verify(self, texts, add_special, dtype, lengths, ids) -> None:
        rl, ri = self.reference.encode(texts, add_special, dtype)
        same = np.array_equal(rl, lengths) and np.array_equal(ri, ids)
        if not same:
            diff = first_difference(self.engine, self.reference, texts, add_special)
            err = EngineMismatch(f"{self.engine.name} {self.engine.version} differs from "
                                 f"{self.reference.library} on the corpus: {diff}")
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
    tokenizer's family (:mod:`.ranking`) that loads and passes the probe, else the reference
    (:func:`reference_engine`; for a ``.model`` ``hf``, its conversion run by tokenizers, is
    not tried: ``ranking.HF_ON_A_MODEL``). ``fallback``
    (a reason) forces the reference. The selection's ``reasons`` say why each engine tried
    before the one chosen was not used."""
    if requested not in ENGINE_NAMES:
        raise PacktoolError(f"--engine {requested!r} is not one of {', '.join(ENGINE_NAMES)}")
    if check not in CHECKS:
        raise PacktoolError(f"--engine-check {check!r} is not one of {', '.join(CHECKS)}")
    ref = reference_engine(path, reference)
    if requested == "sentencepiece" and ref.name != requested:
        raise PacktoolError(f"--engine sentencepiece runs a SentencePiece .model, and {path} is "
                            "not one; use --engine auto or hf")
    spec = tokenizer_json(reference)[1]
    fam = ranking.family(spec)
    label = f"{ref.library} {ref.version}"
    if fallback is not None or requested == ref.name:
        return Selection(ref, requested, "none (the reference)", fallback=fallback, family=fam,
                         reference_name=label)
    reasons = {}
    for name in (requested,) if requested != "auto" else ranking.order(fam):
        try:
            engine = load_engine(name, path, reference, add_special, need_offsets, spec=spec,
                                 against=ref)
        except EngineRefused as e:
            reasons[name] = str(e)
            continue
        return Selection(engine, requested, check, None if check == "off" else ref, reasons,
                         family=fam, reference_name=label)
    if requested != "auto":
        raise PacktoolError(f"--engine {requested}: {reasons[requested]}; use --engine auto "
                            f"(falls back to {ref.library}) or --engine {ref.name}")
    if ref.name != "hf":  # a .model: why its conversion did not run in tokenizers either
        reasons["hf"] = (_refusal("hf", path, reference, need_offsets, spec)
                         or ranking.HF_ON_A_MODEL)
    return Selection(ref, requested, "none (the reference)", reasons=reasons, family=fam,
                     reference_name=label)
