"""Bad inputs (the campaign's first 40, kept): records, compressed files, templates, options,
corrupted corpora, lengths files, missing paths. Each must be refused by name, nothing
left behind."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from . import Ctx, Probe, edit_json, flip, rehash_tokens


def files(**named):
    """setup(case) writing ``named`` files (name with '.' spelled '__' where needed)."""
    def setup(case):
        for name, data in named.items():
            case.write(name.replace("__", "."), data)
    return setup


CHAT = '{"m": [{"role": "user", "content": "hi"}]}\n'


def tokenize_probes(ctx: Ctx) -> list[Probe]:
    def tok(*a):
        return ["tokenize", *a, "-t", ctx.tok, "-o", "out/c", "-q"]

    def p(name, args, **inputs):
        return Probe(name, "1", tok(*args), files(**inputs))

    template = ["--messages-field", "m", "--chat-template", "t.jinja"]
    return [
        p("invalid JSON", ["a.jsonl"], a__jsonl='{"text": "x"}\n{"text": \n'),
        p("missing field", ["b.jsonl"], b__jsonl='{"body": "x"}\n'),
        p("not a string", ["c.jsonl"], c__jsonl='{"text": 3}\n'),
        p("invalid UTF-8", ["d.jsonl"], d__jsonl=b'{"text": "\xff\xfe"}\n'),
        p("lone surrogate", ["e.jsonl"], e__jsonl='{"text": "\\ud800"}\n'),
        p("JSON array file", ["f.json"], f__json='[{"text": "x"}]\n'),
        p("deeply nested JSON", ["g.jsonl"],
          g__jsonl='{"x": ' + "[" * 100000 + "]" * 100000 + "}\n"),
        p("truncated gzip", ["h.jsonl.gz"],
          h__jsonl__gz=gzip.compress(b'{"text":"x"}\n' * 999)[:40]),
        p("0-byte gzip", ["i.jsonl.gz"], i__jsonl__gz=b""),
        p("0-byte zstd", ["j.jsonl.zst"], j__jsonl__zst=b""),
        p("not a zstd", ["k.jsonl.zst"], k__jsonl__zst=b"nope"),
        p("not a parquet", ["l.parquet"], l__parquet=b"PAR1 nope"),
        p("unsupported extension", ["m.csv"], m__csv="text\nx\n"),
        Probe("no such input", "1", tok("missing.jsonl")),
        Probe("empty directory", "1", tok("empty"), lambda c: (c.dir / "empty").mkdir()),
        Probe("no such tokenizer", "1", ["tokenize", "good.jsonl", "-t", "nope", "-o",
                                         "out/c", "-q"], needs=("corpus",)),
        Probe("unknown --eos", "1", tok("good.jsonl", "--eos", "<nope>"), needs=("corpus",)),
        Probe("record over --max-record-bytes", "1",
              tok("good.jsonl", "--max-record-bytes", "10"), needs=("corpus",)),
        Probe("prompt without completion", "1", tok("good.jsonl", "--prompt-field", "text"),
              needs=("corpus",)),
        p("template that raises", ["n.jsonl", *template], n__jsonl=CHAT,
          t__jinja="{{ raise_exception('roles must alternate') }}"),
        p("template bomb", ["n.jsonl", *template], n__jsonl=CHAT,
          t__jinja="{{ 'x' * 2000000000 }}"),
        p("template 1//0", ["n.jsonl", *template], n__jsonl=CHAT, t__jinja="{{ 1//0 }}"),
        p("non-UTF-8 template", ["n.jsonl", *template], n__jsonl=CHAT,
          t__jinja=b"\xff{{ 1 }}"),
    ]


def _corrupt(edit: str):
    def setup(case):
        c = case.dir / "c"
        if edit == "boundaries":
            e = np.fromfile(f"{c}.boundaries", "<i8")
            e[-2] = e[-1] + 5_000_000
            e.tofile(f"{c}.boundaries")
            rehash_tokens(c)
        elif edit in ("dtype", "n_tokens", "version"):
            value = {"dtype": "float32", "n_tokens": "many", "version": 99}[edit]
            edit_json(Path(f"{c}.json"), lambda m: m.__setitem__(edit, value))
        elif edit == "bin":
            data = Path(f"{c}.bin").read_bytes()
            Path(f"{c}.bin").write_bytes(data[:-2])
        else:
            flip(Path(f"{c}.bin"))
    return setup


def pack_probes(ctx: Ctx) -> list[Probe]:
    pack = ["pack", "c", "-o", "out/p", "-q"]

    def p(name, args):
        return Probe(name, "1", pack + args, needs=("corpus",))

    out = [p("huge --seq-len", ["-L", "99999999999999999999999"]),
           p("zero --seq-len", ["-L", "0"]),
           p("option the packer does not read", ["-L", "64", "--max-depth", "4"]),
           p("unknown algo", ["-L", "64", "-a", "nope"]),
           Probe("pack a missing corpus", "1", ["pack", "nope", "-L", "64", "-o", "out/p"]),
           Probe("bad repeat factor", "1", ["pack", "c:-1", "-L", "64", "-o", "out/p", "-q"],
                 needs=("corpus",)),
           p("--valid-docs too many", ["-L", "64", "--valid-docs", "100000"])]
    for name, edit in (("corrupt boundaries", "boundaries"), ("bad manifest dtype", "dtype"),
                       ("non-numeric n_tokens", "n_tokens"), ("truncated .bin", "bin"),
                       ("unknown version", "version")):
        out.append(Probe(f"pack: {name}", "1", ["pack", "c", "-L", "64", "-o", "out/p", "-q"],
                         _corrupt(edit), needs=("corpus",)))
    # an index-layout pack copies no token (the plan only): the flip must be refused where
    # tokens are read, at load and by verify; a tokens-layout pack copies them: refused there
    out += [Probe("flipped .bin byte: index layout, verify", "2.3", ["verify", "out/p"],
                  _corrupt("flip"), before=[["pack", "c", "-L", "64", "-o", "out/p", "-q"]],
                  needs=("corpus",)),
            Probe("flipped .bin byte: index layout, load", "2.3", ["python", (
                "import packtool\nds = packtool.open_packed('out/p')\n"
                "[ds[i] for i in range(len(ds))]")], _corrupt("flip"),
                before=[["pack", "c", "-L", "64", "-o", "out/p", "-q"]], needs=("corpus",),
                on_accept="wrong data"),
            Probe("flipped .bin byte: tokens layout, pack", "2.3",
                  ["pack", "c", "-L", "64", "--layout", "tokens", "-o", "out/p", "-q"],
                  _corrupt("flip"), needs=("corpus",), on_accept="wrong data")]
    return out


def other_probes(ctx: Ctx) -> list[Probe]:
    def lengths_npy(case):
        np.save(case.dir / "n.npy", np.array([3, -1]))
    return [
        Probe("stats: header-less CSV with a huge count", "1",
              ["stats", "--lengths", "h.csv"], files(h__csv="5,1000000000000\n")),
        Probe("stats: negative lengths", "1", ["stats", "--lengths", "n.npy"], lengths_npy),
        Probe("verify: not a dataset", "1", ["verify", "nope"]),
        Probe("export: not a dataset", "1", ["export", "nope", "--format", "parquet", "-o",
                                             "out/x.parquet"]),
        Probe("stats: lengths file of floats", "1", ["stats", "--lengths", "f.npy"],
              lambda c: np.save(c.dir / "f.npy", np.array([1.5, 2.0]))),
        Probe("stats: empty lengths file", "1", ["stats", "--lengths", "e.csv", "-L", "64"],
              files(e__csv="")),
        Probe("stats: 2-D lengths", "1", ["stats", "--lengths", "t.npy"],
              lambda c: np.save(c.dir / "t.npy", np.ones((2, 2), np.int64))),
        Probe("verify: a plain JSON file", "1", ["verify", "x.json"], files(x__json="{}")),
        Probe("which: not a dataset", "1", ["which", "nope", "--step", "0"]),
        Probe("which: step past the epoch", "1", ["which", "p", "--step", "100000"],
              needs=("ds",)),
        Probe("which: record of a file not in the corpus", "1",
              ["which", "p", "--record", "other.jsonl:1"], needs=("ds",)),
        Probe("which: record 0", "1", ["which", "p", "--record", "good.jsonl:0"],
              needs=("ds",)),
        Probe("export: unknown format", "1", ["export", "p", "--format", "nope", "-o",
                                              "out/x"], needs=("ds",)),
        Probe("export: llmc of a packed dataset", "1",
              ["export", "p", "--format", "llmc", "-o", "out/x"], needs=("ds",)),
        Probe("tokenize: --workers -1", "1", ["tokenize", "good.jsonl", "-t", ctx.tok, "-o",
                                             "out/c", "--workers", "-1", "-q"],
              needs=("corpus",)),
        Probe("tokenize: --text-field of a list", "1",
              ["tokenize", "l.jsonl", "-t", ctx.tok, "-o", "out/c", "-q"],
              files(l__jsonl=json.dumps({"text": ["a", "b"]}) + "\n")),
    ]


def probes(ctx: Ctx) -> list[Probe]:
    return tokenize_probes(ctx) + pack_probes(ctx) + other_probes(ctx)
