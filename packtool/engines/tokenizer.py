"""Loading a tokenizer for ``packtool tokenize``: a Hugging Face ``tokenizer.json``, a
SentencePiece ``.model`` (its reference is the sentencepiece library; converted for lookups
and as a checked engine, :mod:`packtool.engines.spm`), or a model folder holding
one, with padding and truncation off; special-token lookups, the id space that sets the token
dtype, and the refusals that keep an output what its flags say."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import PacktoolError


def resolve_tokenizer_path(tok: str | Path) -> Path:
    """A ``tokenizer.json``, a SentencePiece ``*.model``, or a folder holding one (the
    ``tokenizer.json`` first, as Hugging Face loads it), local or at a URL (fetched once into
    the cache: :func:`packtool.storage.place.fetch_tokenizer`)."""
    from ..storage import is_url, local_path

    tok = local_path(tok)
    if is_url(tok):
        from ..storage.place import fetch_tokenizer

        return fetch_tokenizer(str(tok))
    p = Path(tok)
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
        if (p / "tokenizer.model").is_file():
            return p / "tokenizer.model"
        raise PacktoolError(
            f"{p} holds no tokenizer.json or tokenizer.model; pass a Hugging Face fast tokenizer "
            "file (save one with tokenizer.save_pretrained(DIR) or Tokenizer.save(PATH)) or a "
            "SentencePiece .model"
        )
    if not p.exists():
        raise PacktoolError(f"tokenizer {p}: no such file or directory")
    return p


def load_tokenizer(tok: str | Path):
    """Load a ``tokenizer.json`` (or a model folder holding one) with padding and truncation
    switched off: packtool always stores every document's full token sequence. A SentencePiece
    ``.model`` is converted (:mod:`packtool.engines.spm`); the sentencepiece library must
    load it, since it is the reference the engine selection holds every engine to."""
    from tokenizers import Tokenizer

    path = resolve_tokenizer_path(tok)
    if path.suffix == ".model":
        from .spm import load_model

        tokenizer, _ = load_model(path)
        _remember(tokenizer)
        return tokenizer, path
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises plain Exception subclasses
        raise PacktoolError(
            f"cannot read tokenizer {path} ({str(e).splitlines()[0][:200]}); "
            "pass a Hugging Face tokenizer.json or a SentencePiece .model"
        ) from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    check_model(_remember(tokenizer)[1], path)
    return tokenizer, path


_JSON: dict[int, tuple] = {}  # id -> (tokenizer, text, spec), for what load_tokenizer made


def _remember(tokenizer) -> tuple[str, dict]:
    while len(_JSON) >= 4:
        del _JSON[next(iter(_JSON))]
    _JSON[id(tokenizer)] = (tokenizer, *tokenizer_json(tokenizer))
    return _JSON[id(tokenizer)][1:]


def tokenizer_json(tokenizer) -> tuple[str, dict]:
    """The tokenizer's own ``tokenizer.json`` text (``to_str()``: truncation and padding as
    set) and its parse. Made once for a tokenizer :func:`load_tokenizer` returned (packtool
    never changes one after): the load check, the engine selection and gigatoken's loader
    each asked for them, and for the 70k BPE of scripts/bench_corpora.py (1.9 MB of JSON)
    each to_str took 40 ms of CPU and each json.loads 66 ms (orjson: 42 ms). Any other
    tokenizer is serialized afresh."""
    hit = _JSON.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1], hit[2]
    text = tokenizer.to_str()
    return text, parse_json(text)


def parse_json(text: str):
    """``json.loads``, through orjson when installed (``packtool[fast]``), which refuses a
    few things JSON allows (lone surrogate escapes, integers over 64 bits): those go to
    ``json.loads``."""
    try:
        import orjson
    except ImportError:
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def check_model(spec: dict, path: Path) -> None:
    """Refuse a tokenizer that is valid JSON but cannot give byte-identical, complete outputs,
    naming the setting: BPE ``dropout`` (merges skipped at random: two runs differ), an empty
    vocabulary (every document 0 tokens), an ``unk_token`` missing from a WordLevel or
    WordPiece vocabulary (the first unknown word fails the run mid-way). ``spec``: the
    tokenizer's parsed JSON (:func:`tokenizer_json`)."""
    model = spec.get("model") or {}
    kind, vocab = model.get("type"), model.get("vocab")
    fix = f"fix it in {path} (or save the tokenizer again without it)"
    if kind == "BPE" and model.get("dropout"):
        raise PacktoolError(
            f"tokenizer {path}: model.dropout is {model['dropout']}: BPE dropout skips merges at "
            f"random, so two runs give different tokens; set it to null: {fix}")
    if vocab is not None and not len(vocab):
        raise PacktoolError(f"tokenizer {path}: model.vocab is empty ({kind}): every document "
                            f"would be 0 tokens; {fix}")
    unk = model.get("unk_token")
    if kind in ("WordLevel", "WordPiece") and isinstance(vocab, dict) and unk not in vocab:
        raise PacktoolError(
            f"tokenizer {path}: model.unk_token {unk!r} is not in model.vocab ({kind}): the "
            f"first word outside the vocabulary would fail the run; add it to the vocabulary "
            f"or set unk_token to one of its tokens: {fix}")


def special_token_id(tokenizer, token: str, flag: str) -> int:
    tid = tokenizer.token_to_id(token)
    if tid is None:
        added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
        have = ", ".join(repr(t) for t in added[:40]) or "none"
        raise PacktoolError(
            f"{flag} {token!r} is not in the tokenizer's vocabulary; its special/added tokens "
            f"are: {have}"
        )
    return tid


def id_space(tokenizer) -> int:
    """Ids run 0..id_space-1: the dtype must hold the largest id, not just the count. Read
    from the tokenizer's JSON (:func:`tokenizer_json`): the model's vocabulary (a token -> id
    map, or for Unigram a list in id order) and the added tokens, which is what
    ``get_vocab(with_added_tokens=True)`` holds; that call built a 70k-entry dict, 55 ms of
    CPU for the 70k BPE."""
    spec = tokenizer_json(tokenizer)[1]
    vocab = (spec.get("model") or {}).get("vocab")
    top = max((t["id"] for t in spec.get("added_tokens") or ()), default=-1)
    if isinstance(vocab, dict):
        top = max(top, max(vocab.values(), default=-1))
    elif isinstance(vocab, list):
        top = max(top, len(vocab) - 1)
    return max(top + 1, tokenizer.get_vocab_size(with_added_tokens=True))


def refuse_doubled_specials(tok, opts, bos_id, eos_id) -> None:
    """--special-tokens with a --bos/--eos the post-processor already writes would give every
    document that token twice (BERT: ``[SEP] [SEP]``): refused, rather than silently adding
    one of the two, so the output is what the flags say."""
    enc = tok.encode("a", add_special_tokens=True)
    ids, added = enc.ids, enc.special_tokens_mask
    for flag, token, tid, at in (("--bos", opts.bos, bos_id, 0), ("--eos", opts.eos, eos_id, -1)):
        if tid is not None and ids and added[at] and ids[at] == tid:
            where = "starts" if at == 0 else "ends"
            raise PacktoolError(
                f"{flag} {token!r}: the tokenizer's post-processor already {where} every "
                f"document with {token!r} (id {tid}) under --special-tokens, so it would appear "
                f"twice; drop {flag} or --special-tokens")


