"""SentencePiece ``.model`` files (Llama-2, Mistral, Gemma-style byte-fallback BPE, Unigram, and
any other model the library loads): the `sentencepiece` library itself is the reference
(:func:`reference`), and packtool's conversion to a `tokenizers` Tokenizer is what the fast
engines read (``--engine hf`` runs it in `tokenizers`), each used only where :mod:`.select`
proves it equal to the reference on the probe and the run's sample.

Why a conversion as well: every part of packtool (special-token lookups, the id space, the
fast engines) speaks the `tokenizers` API, and the fast engines read a ``tokenizer.json``;
so a ``.model`` is converted once, in-process. The conversion follows transformers'
``SpmConverter.build_tokenizer_from_spm_proto`` (transformers 5.x: the model's normalizer
spec, BPE merges ranked by piece score, user-defined pieces kept whole) but reads the model
with a 30-line protobuf reader instead of importing transformers and protobuf (seconds of
import, two heavy dependencies). Control pieces (``<s>``, ``</s>``) stay ordinary vocabulary
entries, as in sentencepiece: a literal ``<s>`` in the text is characters, never the control
id; ``--bos '<s>'`` adds the id.

The conversion is not always equal: `tokenizers`' Precompiled normalizer drops a second
combining mark that sentencepiece keeps (``"a\u0308\u0323"``), which is every model trained
with the library's default normalizer (nmt_nfkc); its Unigram lattice takes a literal
``</s>`` sentencepiece never emits; word and char models are not converted at all (a
vocabulary of the pieces stands in for lookups, :func:`conversion_refused` says why). There
the reference runs: sentencepiece's batched C++ encoder (``pip install
'packtool[sentencepiece]'``). tests/test_spm.py proves the conversion equal on hypothesis
texts where the probe passes, and the reference's output equal to ``sp.encode`` everywhere.
"""

from __future__ import annotations

import os
import re
import struct
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import PacktoolError
from .base import Engine, narrow, version

# sentencepiece_model.proto field numbers
_PIECES, _TRAINER, _NORMALIZER = 1, 2, 3
_P_PIECE, _P_SCORE, _P_TYPE = 1, 2, 3
_T_MODEL_TYPE, _T_BYTE_FALLBACK, _T_UNK_ID, _T_UNK_PIECE = 3, 35, 40, 45
_T_WHITESPACE_SUFFIX = 24
_N_CHARSMAP, _N_DUMMY_PREFIX, _N_REMOVE_EXTRA_WS, _N_ESCAPE_WS = 2, 3, 4, 5
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE = 1, 2


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7


def _fields(buf: bytes):
    """``(field number, value)`` of a protobuf message: ints for varints, bytes otherwise."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {i}")
        if i > len(buf):
            raise ValueError("truncated protobuf message")
        yield num, value


def parse_model(data: bytes) -> dict:
    """The parts of a ``ModelProto`` a conversion needs: ``pieces`` [(piece, score, type)],
    ``trainer`` and ``normalizer`` (field number -> last value), with proto defaults."""
    pieces, trainer, norm = [], {}, {}
    for num, value in _fields(data):
        if num == _PIECES:
            p = dict(_fields(value))
            score = struct.unpack("<f", p.get(_P_SCORE, b"\0\0\0\0"))[0]
            pieces.append((p.get(_P_PIECE, b"").decode("utf-8"), score, p.get(_P_TYPE, NORMAL)))
        elif num == _TRAINER:
            trainer = dict(_fields(value))
        elif num == _NORMALIZER:
            norm = dict(_fields(value))
    if not pieces:
        raise ValueError("no pieces: not a SentencePiece model")
    return {"pieces": pieces, "trainer": trainer, "normalizer": norm}


def _normalizer(norm: dict):
    """sentencepiece's normalization (charsmap, whitespace, dummy prefix) as tokenizers'."""
    from tokenizers import Regex, normalizers

    steps = []
    charsmap = norm.get(_N_CHARSMAP, b"")
    if charsmap:
        steps.append(normalizers.Precompiled(charsmap))
    strip = norm.get(_N_REMOVE_EXTRA_WS, 1)
    if strip:
        # sentencepiece drops leading spaces and collapses runs of spaces (not other
        # whitespace, not a literal "▁"), then, once spaces are "▁", drops trailing "▁"s
        steps += [normalizers.Replace(Regex(r"\A +"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    steps.append(normalizers.Replace(" ", "▁"))
    if strip:
        steps.append(normalizers.Replace(Regex("▁+\\z"), ""))
    if norm.get(_N_DUMMY_PREFIX, 1):
        # in the normalizer, not Metaspace's prepend_scheme: that one skips the prefix when
        # the text already starts with "▁" or lost leading spaces, sentencepiece does not
        steps.append(normalizers.Prepend("▁"))
    return normalizers.Sequence(steps)


def convert(data: bytes):
    """A `tokenizers.Tokenizer` that encodes like ``SentencePieceProcessor.encode`` (no BOS/EOS:
    packtool adds them with ``--bos``/``--eos``)."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE as BPEModel
    from tokenizers.models import Unigram

    m = parse_model(data)
    pieces, trainer, norm = m["pieces"], m["trainer"], m["normalizer"]
    model_type = trainer.get(_T_MODEL_TYPE, UNIGRAM)
    byte_fallback = bool(trainer.get(_T_BYTE_FALLBACK, 0))
    if trainer.get(_T_WHITESPACE_SUFFIX, 0):
        raise ValueError("treat_whitespace_as_suffix models are not supported")
    if not norm.get(_N_ESCAPE_WS, 1):
        raise ValueError("escape_whitespaces=false models are not supported")
    user_defined = [p for p, _, t in pieces if t == USER_DEFINED]
    if model_type == BPE:
        vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
        normal = {p: (s, i) for i, (p, s, t) in enumerate(pieces) if t == NORMAL}
        ranked = []
        for token, (score, i) in normal.items():
            for k in range(1, len(token)):
                left, right = token[:k], token[k:]
                if left in normal and right in normal:
                    ranked.append((-score, i, left, right))
        merges = [(left, right) for _, _, left, right in sorted(ranked)]
        unk = trainer.get(_T_UNK_PIECE, b"<unk>").decode("utf-8")
        tok = Tokenizer(BPEModel(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                                 byte_fallback=byte_fallback, dropout=None,
                                 ignore_merges=bool(user_defined)))
    elif model_type == UNIGRAM:
        # sentencepiece never matches control, unknown, unused or byte pieces in the text (a literal
        # "<s>" is characters): far below every other score, the lattice never takes them
        low = min((s for _, s, t in pieces if t == NORMAL), default=0.0) - 1e6
        vocab = [(p, low if t in (CONTROL, UNKNOWN, UNUSED, BYTE) else s) for p, s, t in pieces]
        tok = Tokenizer(Unigram(vocab, trainer.get(_T_UNK_ID, 0), byte_fallback))
    else:
        kind = {3: "word", 4: "char"}.get(model_type, model_type)
        raise ValueError(f"model_type {kind!r}: only BPE and Unigram models are supported")
    tok.normalizer = _normalizer(norm)
    if user_defined:  # sentencepiece emits them whole and never merges across them
        pattern = "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    dec = [decoders.Replace("▁", " ")] + ([decoders.ByteFallback()] if byte_fallback else [])
    dec += [decoders.Fuse()] + ([decoders.Strip(" ", 1, 0)] if norm.get(_N_DUMMY_PREFIX, 1) else [])
    tok.decoder = decoders.Sequence(dec)
    return tok


_PROBE = [
    "Hello world", " leading space", "trailing space ", "  two  spaces  inside",
    "\ttab\tand\nnewline\n", "", " ", "▁already▁escaped", "a ▁ b ▁",
    "café naïve Straße 日本語 東京 🙂🚀 👨‍👩‍👧", "ﬁ ① Ｆｕｌｌ ＡＢＣ ｶﾀｶﾅ",
    "e\u0301 a\u0308\u0323", "\x00\x01\x7f\u200b\ufeff\u00a0\u3000", "12345 678.9 0x1F",
    "def f(x):\n    return x  # comment\n", "<s> </s> <unk> <pad> <0x41> [INST] literal",
    "\U00010348\U0001d11e", "x" * 500,
]


def probe_texts(path: Path) -> list[str]:
    """The ``.model``'s own probe texts, beside :mod:`.select`'s fixed probe: whitespace and
    normalization cases, its user-defined pieces in context, a control piece isolated between
    user pieces (tokenizers' BPE with ``ignore_merges`` emits it whole, sentencepiece never
    does), and some ordinary pieces (the ``▁`` as the space it stands for)."""
    try:
        pieces = parse_model(Path(path).read_bytes())["pieces"]
    except (ValueError, IndexError, UnicodeDecodeError, struct.error):
        return list(_PROBE)
    user = [p for p, _, t in pieces if t == USER_DEFINED]
    step = max(1, len(pieces) // 200)
    normal = [p.replace("▁", " ") for p, _, t in pieces if t == NORMAL][::step]
    control = [p for p, _, t in pieces if t in (CONTROL, UNKNOWN)]
    after = [f"{u}{c}" for u in user[:1] for c in control]
    return (_PROBE + [f"a{p}b {p} x{p}{p}\n{p}" for p in user] + after
            + [" ".join(normal), "".join(normal)])


@lru_cache(maxsize=4)
def _processor(path: str, mtime_ns: int, size: int):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=path)


def processor(path: Path):
    """The model loaded by the sentencepiece library, once per process and file version;
    raises ImportError where the library is missing."""
    st = Path(path).stat()
    return _processor(str(path), st.st_mtime_ns, st.st_size)


def reference(path: Path) -> Engine:
    """The reference for a ``.model``: the sentencepiece library's batch encoder, its C++
    threads over the batch (``num_threads``: this machine's cores), ids as numpy arrays
    (no Python int per token: 1.1-1.5x the list output). Its own threads are the
    parallelism: it keeps the GIL while encoding (two Python threads of one C++ thread
    each: 8.0M tokens/s, one: 6.9M; one call of two threads: 15.3M; 32k Unigram, 20 MB of
    prose, 2 cores). No BOS/EOS (packtool adds them with ``--bos``/``--eos``, and the
    conversion has no post-processor either: ``--special-tokens`` changes nothing)."""
    sp = processor(path)
    threads = os.cpu_count() or 1

    def encode(texts, add_special, dtype):
        arrays = sp.encode(list(texts), return_type="numpy", num_threads=threads)
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        ids = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        return lengths, narrow(ids, dtype)

    def with_offsets(texts):
        out = sp.encode(list(texts), return_type="offset_mapping", num_threads=threads)
        return [(d["ids"], d["offsets"]) for d in out]

    return Engine("sentencepiece", version("sentencepiece"), encode, offsets=True,
                  with_offsets=with_offsets)


_JSON_DIR: list = []


def conversion_file(text: str) -> Path:
    """A conversion's ``tokenizer.json`` ``text`` as a file, for the engines that read one;
    written once per process (and conversion) to a temporary folder."""
    import hashlib
    import tempfile

    if not _JSON_DIR:
        _JSON_DIR.append(tempfile.TemporaryDirectory(prefix="packtool-spm-"))
    out = Path(_JSON_DIR[0].name) / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not out.exists():
        out.write_text(text, encoding="utf-8")
    return out


# id -> (tokenizer, why it is not a conversion), for the stand-ins load_model made
_UNCONVERTED: dict[int, tuple] = {}


def conversion_refused(tokenizer) -> str | None:
    """Why ``tokenizer`` (from :func:`load_model`) is only a vocabulary of the model's pieces
    and encodes nothing, or None for a conversion."""
    hit = _UNCONVERTED.get(id(tokenizer))
    return hit[1] if hit is not None and hit[0] is tokenizer else None


def _vocabulary(pieces: list, reason: str):
    """A `tokenizers` Tokenizer holding only the pieces at their ids (for ``--bos``/``--eos``
    lookups and the id space) of a model packtool does not convert: never an engine."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    unk = next((p for p, _, t in pieces if t == UNKNOWN), pieces[0][0])
    tok = Tokenizer(WordLevel({p: i for i, (p, _, _) in enumerate(pieces)}, unk_token=unk))
    while len(_UNCONVERTED) >= 4:
        del _UNCONVERTED[next(iter(_UNCONVERTED))]
    _UNCONVERTED[id(tok)] = (tok, reason)
    return tok


def load_model(path: Path):
    """The ``.model`` at ``path``, loaded by the sentencepiece library (the reference, which
    must be installed), and as a `tokenizers` Tokenizer: its conversion, or where packtool
    does not convert it a vocabulary of its pieces (:func:`conversion_refused`). Returns
    ``(tokenizer, sentencepiece version)``; whether the conversion encodes like the library
    is decided where an engine is chosen (:mod:`.select`), not here."""
    data = path.read_bytes()
    try:
        pieces = parse_model(data)["pieces"]
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        raise PacktoolError(f"cannot read SentencePiece model {path} ({e}); pass a "
                            "SentencePiece .model file or a Hugging Face tokenizer.json") from None
    try:
        processor(path)
    except ImportError:
        raise PacktoolError(
            f"{path} is a SentencePiece model: packtool tokenizes it with the sentencepiece "
            "library (or a conversion checked against it), which is not installed; pip "
            "install 'packtool[sentencepiece]' (or pass the model's tokenizer.json)") from None
    except Exception as e:  # sentencepiece raises plain RuntimeError/OSError
        raise PacktoolError(f"sentencepiece cannot load {path} ({str(e)[:200]})") from None
    try:
        tok = convert(data)
    except Exception as e:  # whatever the conversion cannot do, the reference still serves
        tok = _vocabulary(pieces, f"packtool does not convert this model ({e})")
    return tok, version("sentencepiece")
