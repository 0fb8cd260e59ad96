"""Issue 18.2.8-2.10: mixtures and held-out splits that would train on nothing, or on the
wrong thing, are refused with a bounded, clear message; the sampler trusts no saved state
and its order owes nothing to the packer's."""

from __future__ import annotations

import shutil

from . import Ctx, Probe, edit_json


def _alias(case) -> None:
    """c:2.* beside c.*: is `c:2` the corpus c:2 or c twice?"""
    for p in list(case.dir.glob("c.*")):
        shutil.copy(p, case.dir / p.name.replace("c.", "c:2.", 1))


def _other_tokenizer(case) -> None:
    edit_json(case.dir / "b.json", lambda m: m["tokenizer"].__setitem__("sha256", "1" * 64))


OUT = ("out", "out/*", "out/*/*", "out/*/*/*")


def _warned_and_trains(case, stdout: str, stderr: str) -> str | None:
    if "held out for validation" not in stderr:
        return "no warning that most documents were held out"
    return None if case.json("out/p/index.json")["n_packs"] > 0 else "no training pack"


def _trains_on(name: str):
    def check(case, stdout: str, stderr: str) -> str | None:
        src = [s for s in case.json("out/p/index.json")["sources"]
               if s["prefix"].rsplit("/", 1)[-1] == name]
        return None if src and src[0]["docs_used"] >= 1 else f"{name} trains on nothing"
    return check


def mixture_probes(ctx: Ctx) -> list[Probe]:
    def pack(*sources, extra=()):
        return ["pack", *sources, "-L", "64", "-o", "out/p", "-q", *extra]

    def m(name, cmd, **kw):
        return Probe(name, "2.8", cmd, needs=kw.pop("needs", ("mix",)), **kw)

    out = [
        Probe("c:2 with both c.json and c:2.json", "2.8", pack("c:2"), _alias,
              needs=("corpus",), on_accept="wrong data", want="c:2"),
        m("a:0 (nothing of the only source)", pack("a:0")),
        m("a:1e-9", pack("a:1e-9")),
        m("a:0 b:0 (an all-zero mixture)", pack("a:0", "b:0")),
        # held-out splits never take a source's last document (held_out rule 2): these work,
        # the first saying how little training is left, the second training on `one`
        m("--valid-fraction 0.999999", pack("a", extra=("--valid-fraction", "0.999999")),
          expect="ok", mutable=OUT, check=_warned_and_trains),
        m("a source whose only document is held out", pack("a", "one", extra=(
            "--valid-docs", "5")), expect="ok", mutable=OUT, check=_trains_on("one")),
        m("a:999999 (50 documents)", pack("a:999999"), timeout=90),
        m("a:1e400", pack("a:1e400")),
        m("a:nan", pack("a:nan")),
        m("a:inf", pack("a:inf")),
        m("a:-0.5", pack("a:-0.5")),
        m("a:2:3", pack("a:2:3")),
        m("a: (an empty factor)", pack("a:")),
        m("a given twice", pack("a", "a")),
        m("a and a:2 together", pack("a", "a:2")),
        m("--valid-docs and --valid-fraction together", pack(
            "a", extra=("--valid-docs", "2", "--valid-fraction", "0.1"))),
        m("--valid-docs 0", pack("a", extra=("--valid-docs", "0"))),
        m("--valid-fraction 1.0", pack("a", extra=("--valid-fraction", "1.0"))),
        m("--valid-docs as many as the documents", pack("a", extra=("--valid-docs", "60"))),
        m("sources of two tokenizers", pack("a", "b"), setup=_other_tokenizer),
        m("a 0-document source in a mixture", pack("a", "zero:2")),
        m("a:2 b:0.5 packs and verifies", ["verify", "out/p", "--source", "a:2",
                                            "--source", "b:0.5"],
          before=[pack("a:2", "b:0.5")], expect="ok"),
    ]
    return out


SAMPLER = """
import numpy as np
from packtool import open_packed
from packtool.train.sampler import PackSampler
n = len(open_packed("p"))
def make(**kw):
    return PackSampler(n, rank=0, world_size=2, batch_size=2, seed=0, **kw)
state = make().state_dict(2)
{edit}
s = make()
s.load_state_dict(state)
print(len(list(s.steps())), "steps")  # accepted: 0 steps, or steps replayed, is wrong data
"""

OTHER_COSTS = """
import numpy as np
from packtool import open_packed
from packtool.train.sampler import PackSampler
n = len(open_packed("p"))
costs = np.arange(1, n + 1, dtype=float)
def make(c):
    return PackSampler(n, rank=0, world_size=2, batch_size=2, seed=0, balance=c)
state = make(costs).state_dict(2)
s = make(costs[::-1].copy())
s.load_state_dict(state)
print(len(list(s.steps())))
"""

REPLAY = """
import numpy as np
from packtool import open_packed
from packtool.train.sampler import PackSampler
shuffled, created = open_packed("p"), open_packed("p0")
where = {{bytes(np.asarray(created[i]["input_ids"]).data): i for i in range(len(created))}}
s = PackSampler(shuffled, rank=0, world_size=1, batch_size=1, seed={seed})
order = [i for step in s.steps() for i in step]
seq = np.array([where[bytes(np.asarray(shuffled[i]["input_ids"]).data)] for i in order])
r = float(np.corrcoef(seq, np.arange(seq.size))[0, 1])
print(r)
"""


def _replay_check(case, out, err):
    r = float(out.strip().splitlines()[-1])
    return None if abs(r) < 0.5 else \
        f"epoch 0 follows the packer's order (correlation {r:.2f} with pack creation)"


def sampler_probes(ctx: Ctx) -> list[Probe]:
    edits = {"step=-3": 'state["step"] = -3', "step=10**6": 'state["step"] = 10**6',
             "step=None": 'state["step"] = None', "epoch='x'": 'state["epoch"] = "x"',
             "epoch=-1": 'state["epoch"] = -1', "step missing": 'del state["step"]',
             "seed missing": 'del state["seed"]', "epoch missing": 'del state["epoch"]',
             "not a dict": "state = [1, 2]", "version 99": 'state["version"] = 99',
             "another seed": 'state["seed"] = 1', "another pack count": 'state["n_packs"] += 1',
             "step=2.5": 'state["step"] = 2.5', "step='2'": 'state["step"] = "2"'}
    wrong = {"step=-3", "step=10**6", "another seed", "another pack count", "step=2.5"}
    out = [Probe(f"sampler state {label}", "2.9", ["python", SAMPLER.format(edit=edit)],
                 needs=("ds",), on_accept="wrong data" if label in wrong else
                 "silently accepted") for label, edit in edits.items()]
    out.append(Probe("sampler state saved under other per-pack costs", "2.9",
                     ["python", OTHER_COSTS], needs=("ds",), on_accept="wrong data"))
    for seed in (0, 3):
        out.append(Probe(f"sampler seed {seed}: epoch 0 independent of the packs' order", "2.10",
                         ["python", REPLAY.format(seed=seed)], needs=("ds",), expect="ok",
                         before=[["pack", "c", "-L", "64", "-o", "p", "--seed", str(seed),
                                  "--overwrite", "-q"],
                                 ["pack", "c", "-L", "64", "-o", "p0", "--no-shuffle", "-q"]],
                         mutable=("p", "p/*"), check=_replay_check))
    return out


def probes(ctx: Ctx) -> list[Probe]:
    return mixture_probes(ctx) + sampler_probes(ctx)
