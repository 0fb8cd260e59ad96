"""SentencePiece ``.model`` files (Llama-2, Mistral, Gemma-style byte-fallback BPE, and
Unigram) as a `tokenizers` Tokenizer, proven equal to the sentencepiece library at load.

Why a conversion, and this one: every part of packtool (special-token lookups, the id
space, engines, the sample check) speaks the `tokenizers` API, and the fast engines read a
``tokenizer.json``; so a ``.model`` is converted once, in-process, and then is an ordinary
reference. The conversion follows transformers' ``SpmConverter.build_tokenizer_from_spm_proto``
(transformers 5.x, the maintained converter that "encodes like SentencePieceProcessor.encode":
the model's normalizer spec, BPE merges ranked by piece score, user-defined pieces kept whole)
but reads the model with a 30-line protobuf reader instead of importing transformers and
protobuf (seconds of import, two heavy dependencies). Control pieces (``<s>``, ``</s>``) stay
ordinary vocabulary entries, as in sentencepiece: a literal ``<s>`` in the text is characters,
never the control id; ``--bos '<s>'`` adds the id.

The converted tokenizer is young code standing in for a reference, so :func:`load_model`
checks it against the `sentencepiece` library itself (``pip install 'packtool[sentencepiece]'``)
on probe texts and the model's own pieces in context, and refuses the model with the first
difference. tests/test_spm.py proves agreement on hypothesis texts for models trained
in-process (byte-fallback BPE, Unigram, with and without NFKC, user-defined pieces).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from ..errors import PacktoolError

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


def _probe_texts(pieces: list) -> list[str]:
    """The fixed probe plus the model's user-defined pieces and some ordinary pieces in
    context (the ``▁`` as the space it stands for)."""
    user = [p for p, _, t in pieces if t == USER_DEFINED]
    step = max(1, len(pieces) // 200)
    normal = [p.replace("▁", " ") for p, _, t in pieces if t == NORMAL][::step]
    control = [p for p, _, t in pieces if t in (CONTROL, UNKNOWN)]
    # a control piece isolated between user pieces: tokenizers' BPE (ignore_merges) emits it
    # whole, sentencepiece never does; such a model is refused here rather than differing
    after = [f"{u}{c}" for u in user[:1] for c in control]
    return (_PROBE + [f"a{p}b {p} x{p}{p}\n{p}" for p in user] + after
            + [" ".join(normal), "".join(normal)])


def sentencepiece_encode(model_path: Path):
    """``encode(texts) -> list of id lists`` with the sentencepiece library, or raise
    ImportError."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_path))
    return lambda texts: sp.encode(list(texts))


def load_model(path: Path):
    """Convert the ``.model`` at ``path`` and prove the result equal to the sentencepiece
    library on the probe; returns ``(tokenizer, sentencepiece version)``."""
    from importlib import metadata

    data = path.read_bytes()
    try:
        pieces = parse_model(data)["pieces"]
        tok = convert(data)
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        raise PacktoolError(f"cannot read SentencePiece model {path} ({e}); pass a "
                            "SentencePiece .model file or a Hugging Face tokenizer.json") from None
    try:
        encode = sentencepiece_encode(path)
    except ImportError:
        raise PacktoolError(
            f"{path} is a SentencePiece model: packtool converts it and checks the conversion "
            "against the sentencepiece library, which is not installed; pip install "
            "'packtool[sentencepiece]' (or pass the model's tokenizer.json)") from None
    except Exception as e:  # sentencepiece raises plain RuntimeError/OSError
        raise PacktoolError(f"sentencepiece cannot load {path} ({str(e)[:200]})") from None
    texts = _probe_texts(pieces)
    want = encode(texts)
    got = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    for text, g, w in zip(texts, got, want, strict=True):
        if g != w:
            raise PacktoolError(
                f"{path}: packtool's conversion of this SentencePiece model differs from the "
                f"sentencepiece library on {text[:40]!r} ({g[:8]} vs {w[:8]}); convert it to a "
                "tokenizer.json with transformers and pass that instead")
    return tok, metadata.version("sentencepiece")
