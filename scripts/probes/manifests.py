"""Issue 18.4: manifests that do not match their schema (every digest recomputed, so only
the schema can refuse them) and out-of-range options are clear errors naming the file and
field, never a traceback, in every command that reads them."""

from __future__ import annotations

import numpy as np

from . import Ctx, Probe, edit_json, rehash_tokens

MEMORY = "ulimit -v 8000000;"  # a probe that allocates without bound fails, not the machine
LOAD = "import packtool\nds = packtool.open_packed('p')\n[ds[i] for i in range(len(ds))]"


def _part(m: dict) -> dict:
    return (m.get("parts") or [m])[0]


def _token_edit(fn):
    def setup(case):
        edit_json(case.dir / "c.json", fn)
    return setup


def _del(key):
    return lambda m: m.pop(key, None)


def _put(key, value):
    return lambda m: m.__setitem__(key, value)


def _checksum(field, value):
    def edit(m):
        ck = _part(m).get("checksums") or m.get("checksums")
        if field is None:
            ck["bin"] = value
        else:
            ck["bin"][field] = value
    return edit


def _no_mask_checksums(m):
    m["mask"] = True
    for q in m.get("parts", []):
        q.get("checksums", {}).pop("mask", None)


def _boundaries(kind):
    def setup(case):
        e = np.fromfile(case.dir / "c.boundaries", "<i8")
        if kind == "decreasing":
            e[3], e[4] = e[4], e[3]
        else:
            e[-1] += 7
        e.tofile(case.dir / "c.boundaries")
        rehash_tokens(case.dir / "c")
    return setup


TOKEN_EDITS = {
    '"mask": true without mask checksums': _token_edit(_no_mask_checksums),
    'checksum bytes "x"': _token_edit(_checksum("bytes", "x")),
    "checksum sha256 123": _token_edit(_checksum("sha256", 123)),
    "a checksum given as a string": _token_edit(_checksum(None, "abc")),
    "tokenizer missing": _token_edit(_del("tokenizer")),
    "tokenizer null": _token_edit(_put("tokenizer", None)),
    'dtype "nonsense"': _token_edit(_put("dtype", "nonsense")),
    'dtype "uint8"': _token_edit(_put("dtype", "uint8")),
    "vocab_size 0": _token_edit(_put("vocab_size", 0)),
    'vocab_size "big"': _token_edit(_put("vocab_size", "big")),
    "n_docs -1": _token_edit(_put("n_docs", -1)),
    'parts "x"': _token_edit(_put("parts", "x")),
    "parts []": _token_edit(_put("parts", [])),
    "a part without a name": _token_edit(lambda m: _part(m).pop("name", None)),
    'version "3" (a string)': _token_edit(lambda m: m.__setitem__("version", str(
        m["version"]))),
    "the manifest a JSON list": lambda c: (c.dir / "c.json").write_text("[]"),
    'bos_id "x"': _token_edit(_put("bos_id", "x")),
    "decreasing boundaries (checksums recomputed)": _boundaries("decreasing"),
    "boundaries past n_tokens (checksums recomputed)": _boundaries("past"),
}


def token_manifest_probes(ctx: Ctx) -> list[Probe]:
    out = []
    for label, setup in TOKEN_EDITS.items():
        out.append(Probe(f"token manifest {label}: verify", "4", ["verify", "c"], setup,
                         needs=("corpus",)))
        out.append(Probe(f"token manifest {label}: pack", "4",
                         ["pack", "c", "-L", "64", "-o", "out/p", "-q"], setup,
                         needs=("corpus",)))
    for label in ("tokenizer null", 'dtype "nonsense"', "parts []"):
        out.append(Probe(f"token manifest {label}: stats", "4", ["stats", "c", "-L", "64"],
                         TOKEN_EDITS[label], needs=("corpus",)))
        out.append(Probe(f"token manifest {label}: export", "4",
                         ["export", "c", "--format", "megatron", "-o", "out/m", "-q"],
                         TOKEN_EDITS[label], needs=("corpus",)))
    return out


def _index_edit(fn, folder="p"):
    def setup(case):
        edit_json(case.dir / folder / "index.json", fn)
    return setup


def _file(field, value):
    def edit(idx):
        f = next(iter(idx["shards"][0]["files"].values()))
        if value is None:
            f.pop(field, None)
        else:
            f[field] = value
    return edit


INDEX_EDITS = {
    "held_out a string": ("dsv", _index_edit(_put("held_out", "valid"))),
    "n_tokens a string": ("ds", _index_edit(_put("n_tokens", "many"))),
    "a file's crc32 missing": ("ds", _index_edit(_file("crc32", None))),
    "a file's bytes a string": ("ds", _index_edit(_file("bytes", "x"))),
    'token_dtype "nonsense"': ("ds", _index_edit(_put("token_dtype", "nonsense"))),
    'seq_len "x"': ("ds", _index_edit(_put("seq_len", "x"))),
    "seq_len 0": ("ds", _index_edit(_put("seq_len", 0))),
    'shards "x"': ("ds", _index_edit(_put("shards", "x"))),
    "a shard without files": ("ds", _index_edit(lambda i: i["shards"][0].pop("files"))),
    'layout "nonsense"': ("ds", _index_edit(_put("layout", "nonsense"))),
    "version 99": ("ds", _index_edit(_put("version", 99))),
    "sources []": ("ds", _index_edit(_put("sources", []))),
    "n_packs -1": ("ds", _index_edit(_put("n_packs", -1))),
    "held_out.n_packs a string": ("dsv", _index_edit(
        lambda i: i["held_out"].__setitem__("n_packs", "x"))),
    "index.json a JSON list": ("ds", lambda c: (c.dir / "p" / "index.json").write_text("[]")),
    "index.json empty": ("ds", lambda c: (c.dir / "p" / "index.json").write_text("")),
}
FROM_THE_ISSUE = ("held_out a string", "n_tokens a string", "a file's crc32 missing",
                  "a file's bytes a string", 'token_dtype "nonsense"')


def index_probes(ctx: Ctx) -> list[Probe]:
    out = []
    for label, (fixture, setup) in INDEX_EDITS.items():
        out.append(Probe(f"index.json {label}: verify", "4", ["verify", "p"], setup,
                         needs=(fixture,)))
        if label in FROM_THE_ISSUE:
            out += [Probe(f"index.json {label}: stats", "4", ["stats", "p"], setup,
                          needs=(fixture,)),
                    Probe(f"index.json {label}: load", "4", ["python", LOAD], setup,
                          needs=(fixture,))]
    return out


def option_probes(ctx: Ctx) -> list[Probe]:
    pack = ["pack", "c", "-o", "out/p", "-q"]
    return [
        Probe("pack --seed -1", "4", pack + ["-L", "64", "--seed", "-1"], needs=("corpus",)),
        Probe("stats --seed -1", "4", ["stats", "c", "-L", "64", "--seed", "-1"],
              needs=("corpus",)),
        Probe("pack -L 2147483647 --algo optimal", "4",
              pack + ["-L", "2147483647", "--algo", "optimal"], needs=("corpus",), timeout=180,
              shell=MEMORY),
        Probe("stats -L 2147483647 --algos optimal", "4",
              ["stats", "c", "-L", "2147483647", "--algos", "optimal"], needs=("corpus",),
              timeout=180, shell=MEMORY),
        Probe("pack -L 2147483648", "4", pack + ["-L", "2147483648"], needs=("corpus",)),
        Probe("pack -o /", "4", ["pack", "c", "-L", "64", "-o", "/", "-q"],
              needs=("corpus",)),
        Probe("pack --shard-size 0", "4", pack + ["-L", "64", "--shard-size", "0"],
              needs=("corpus",)),
        Probe("pack --group-docs 0", "4", pack + ["-L", "64", "--group-docs", "0"],
              needs=("corpus",)),
        Probe("pack --work-limit -1 --algo optimal", "4",
              pack + ["-L", "64", "--algo", "optimal", "--work-limit", "-1"],
              needs=("corpus",)),
        Probe("pack --time-limit -1 --algo optimal", "4",
              pack + ["-L", "64", "--algo", "optimal", "--time-limit", "-1"],
              needs=("corpus",)),
        Probe("pack --max-depth 0 --algo spfhp", "4",
              pack + ["-L", "64", "--algo", "spfhp", "--max-depth", "0"], needs=("corpus",)),
        Probe("pack --tasks 2 --task 2", "4", pack + ["-L", "64", "--tasks", "2", "--task",
                                                       "2"], needs=("corpus",)),
        Probe("tokenize --tasks 0", "4", ["tokenize", "good.jsonl", "-t", ctx.tok, "-o",
                                          "out/c", "--tasks", "0", "--task", "0", "-q"],
              needs=("corpus",)),
        Probe("tokenize --part-bytes 0", "4", ["tokenize", "good.jsonl", "-t", ctx.tok, "-o",
                                               "out/c", "--part-bytes", "0", "-q"],
              needs=("corpus",)),
        Probe("which --world-size 0", "4", ["which", "p", "--step", "0", "--world-size", "0"],
              needs=("ds",)),
    ]


def probes(ctx: Ctx) -> list[Probe]:
    return token_manifest_probes(ctx) + index_probes(ctx) + option_probes(ctx)

