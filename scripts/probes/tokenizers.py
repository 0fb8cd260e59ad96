"""Issue 18.2.11-2.12 and 4 (names): tokenizers that are valid JSON but not deterministic or
not usable are refused by their setting; a chat template's promise of an EOS is kept; names
that are not valid UTF-8 are refused by name, never with a traceback."""

from __future__ import annotations

import json
import os

import numpy as np

from . import Ctx, Probe

BAD = os.fsdecode(b"bad\xff")  # bytes that are not UTF-8, as Python passes them on


def _tokenizer(edit):
    """setup(case): the bundled tokenizer.json, edited, in t/."""
    def setup(case):
        body = json.loads((case.ctx.tok / "tokenizer.json").read_text())
        edit(body)
        case.write("t/tokenizer.json", json.dumps(body))
    return setup


def _set(path: str, value):
    def edit(body):
        node = body
        *keys, last = path.split(".")
        for k in keys:
            node = node[k]
        node[last] = value
    return edit


def _wordlevel(case) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel(vocab={"doc": 0, "1": 1}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    (case.dir / "t").mkdir()
    t.save(str(case.dir / "t" / "tokenizer.json"))


def _raw(data: bytes):
    return lambda case: case.write("t/tokenizer.json", data)


def tokenizer_probes(ctx: Ctx) -> list[Probe]:
    tok = ["tokenize", "good.jsonl", "-t", "t", "-o", "out/c", "-q"]

    def p(name, setup, **kw):
        return Probe(name, kw.pop("section", "2.11"), tok, setup, needs=("corpus",), **kw)

    return [
        p("BPE with dropout 0.5", _tokenizer(_set("model.dropout", 0.5)),
          on_accept="wrong data", want="dropout"),
        p("BPE with dropout 1.0", _tokenizer(_set("model.dropout", 1.0)),
          on_accept="wrong data", want="dropout"),
        p("an empty vocabulary", _tokenizer(lambda b: (_set("model.vocab", {})(b),
                                                       _set("model.merges", [])(b),
                                                       b.__setitem__("added_tokens", []))),
          on_accept="wrong data"),
        p("WordLevel whose unk_token is not in its vocabulary", _wordlevel, section="4"),
        p("tokenizer.json that is not JSON", _raw(b"{nope"), section="4"),
        p("tokenizer.json truncated", lambda c: c.write(
            "t/tokenizer.json", (c.ctx.tok / "tokenizer.json").read_bytes()[:500]),
          section="4"),
        p("tokenizer.json of an unknown model type", _tokenizer(_set("model.type", "Nope")),
          section="4"),
        p("tokenizer.json that is a JSON list", _raw(b"[]"), section="4"),
        p("a tokenizer folder without tokenizer.json", lambda c: c.write("t/readme", "x"),
          section="4"),
        p("a SentencePiece .model that is not one",
          lambda c: c.write("t/tokenizer.model", b"\x00garbage"), section="4"),
        p("a vocabulary id past uint32", _tokenizer(lambda b: b["model"]["vocab"].__setitem__(
            "zzzz", 5_000_000_000)), section="4"),
        p("a vocabulary id -1", _tokenizer(lambda b: b["model"]["vocab"].__setitem__(
            "zzzz", -1)), section="4"),
    ]


def _eos_after_turns(case, out, err, required: bool = False):
    """If the run says it adds EOS after assistant turns (or ``required``: --eos was given),
    the tokens must hold one per turn (8 turns in chat.jsonl)."""
    if not (case.dir / "out" / "c.json").exists():
        return None
    meta = json.loads((case.dir / "out" / "c.json").read_text())
    parts = meta.get("parts") or [{"name": "c"}]
    ids = np.concatenate([np.fromfile(case.dir / "out" / f"{q['name']}.bin", meta["dtype"])
                          for q in parts])
    eos = meta.get("eos_id")
    if eos is None:
        vocab = json.loads((case.dir / "tokenizer.json").read_text())
        eos = next((t["id"] for t in vocab.get("added_tokens", [])
                    if t["content"] == "<|eos|>"), None)
    promised = required or "EOS" in err or "eos" in err.lower() and "assistant" in err.lower()
    if promised and eos is not None and int((ids == eos).sum()) < 8:
        return f"the run promises an EOS after assistant turns; {int((ids == eos).sum())} of 8"
    return None


def chat_probes(ctx: Ctx) -> list[Probe]:
    base = ["tokenize", "chat.jsonl", "-t", "tokenizer.json", "--messages-field", "m", "-o",
            "out/c"]
    return [
        Probe("chat: --messages-field with --eos", "2.12", base + ["--eos", "<|eos|>"],
              needs=("chat",), expect="ok",
              check=lambda c, o, e: _eos_after_turns(c, o, e, required=True)),
        Probe("chat: built-in template, bare tokenizer.json: the EOS it promises", "2.12",
              base, needs=("chat",), expect="safe", check=_eos_after_turns),
        Probe("chat: a message without content", "2.12", base,
              lambda c: c.write("chat.jsonl", '{"m": [{"role": "user"}]}\n'),
              needs=("chat",)),
        Probe("chat: a role that is not a string", "2.12", base,
              lambda c: c.write("chat.jsonl", '{"m": [{"role": 3, "content": "x"}]}\n'),
              needs=("chat",)),
        Probe("chat: messages that are a string", "2.12", base,
              lambda c: c.write("chat.jsonl", '{"m": "hello"}\n'), needs=("chat",)),
    ]


def name_probes(ctx: Ctx) -> list[Probe]:
    def tok(inp, out="out/c"):
        return ["tokenize", inp, "-t", ctx.tok, "-o", out, "-q"]

    def bad_file(case):
        case.write(f"{BAD}.jsonl", '{"text": "hello"}\n')

    def bad_dir(case):
        case.write(f"in/{BAD}.jsonl", '{"text": "hello"}\n')
    return [
        Probe("an input name that is not UTF-8", "4", tok(f"{BAD}.jsonl"), bad_file),
        Probe("a folder holding an input name that is not UTF-8", "4", tok("in"), bad_dir),
        Probe("an --out name that is not UTF-8", "4", tok("good.jsonl", f"out/{BAD}"),
              needs=("corpus",)),
        Probe("pack --out name that is not UTF-8", "4",
              ["pack", "c", "-L", "64", "-o", f"out/{BAD}", "-q"], needs=("corpus",),
              expect="safe"),
        Probe("export --out name that is not UTF-8", "4",
              ["export", "p", "--format", "parquet", "-o", f"out/{BAD}.parquet", "-q"],
              needs=("ds",)),
    ]


def probes(ctx: Ctx) -> list[Probe]:
    return tokenizer_probes(ctx) + chat_probes(ctx) + name_probes(ctx)
