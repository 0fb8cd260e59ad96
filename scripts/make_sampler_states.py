"""Write tests/data/sampler-states/*.json: states saved by the sampler code of commit 2b77772
(three samplers, three state formats), with what that code dealt next, so that
tests/test_sampler_states.py can prove every later sampler continues them exactly.

Each file: ``kind`` and ``make`` (the constructor's arguments), ``state`` (state_dict at a
step), ``resume`` (the shape that loads it) and ``next``: every rank's rows of the steps the
old code dealt after loading it (a mixture: [source, row] pairs). Run once, from the repo
root, with the old code: ``python scripts/make_sampler_states.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "sampler-states"
STEPS = 6  # steps recorded after the resume


def build(kind: str, make: dict, rank: int, shape: dict):
    from packtool.train import MixtureSampler, PackSampler

    kw = {**make, **shape, "rank": rank}
    if kind == "mixture":
        kw["schedule"] = [tuple(p) for p in kw["schedule"]]
        return MixtureSampler(**kw)
    if "lengths" in kw:
        return PackSampler(np.asarray(kw.pop("lengths"), np.int64), **kw)
    return PackSampler(kw.pop("packs"), **kw)


def rows_after(kind: str, make: dict, state: dict, resume: dict) -> list:
    """Every rank's next STEPS steps after loading ``state`` under ``resume``."""
    per_rank = []
    for rank in range(resume["world_size"]):
        s = build(kind, make, rank, resume)
        s.load_state_dict(json.loads(json.dumps(state)))
        it = s.steps() if kind != "mixture" else s.steps(until=s.start_step + STEPS)
        got = []
        for batch in it:
            got.append([list(x) if isinstance(x, tuple) else int(x) for x in batch])
            if len(got) == STEPS:
                break
        per_rank.append(got)
    return [[per_rank[r][k] for r in range(len(per_rank))] for k in range(len(per_rank[0]))]


def saved(kind: str, make: dict, shape: dict, step: int, via=None) -> dict:
    """The state rank 0 saves at ``step``; ``via``: (shape, step) of an earlier save that this
    run resumed from (an elastic resume before the save)."""
    s = build(kind, make, 0, shape)
    if via is not None:
        first_shape, first_step = via
        s.load_state_dict(saved(kind, make, first_shape, first_step))
    if kind == "mixture":
        list(s.steps(until=step))
    return s.state_dict(step=step)


CASES = {
    "fixed": ("fixed", {"packs": 101, "seed": 5}, {"world_size": 2, "batch_size": 3}, 7,
              None, {"world_size": 2, "batch_size": 3}),
    "fixed-elastic": ("fixed", {"packs": 101, "seed": 5}, {"world_size": 2, "batch_size": 3},
                      7, None, {"world_size": 3, "batch_size": 2}),
    "fixed-balance": ("fixed", {"packs": 90, "seed": 3, "balance": [
        float(x) for x in (np.arange(90) % 7 + 1) ** 2 * 100.0]},
        {"world_size": 2, "batch_size": 2}, 5, None, {"world_size": 2, "batch_size": 2}),
    "fixed-wrap": ("fixed", {"packs": 50, "seed": 1, "drop_last": False},
                   {"world_size": 4, "batch_size": 1}, 3, None,
                   {"world_size": 4, "batch_size": 1}),
    "budget-curriculum": ("budget", {"lengths": [512] * 300 + [1024] * 120 + [4096] * 30,
                                     "seed": 2, "curriculum": "grow-p2"},
                          {"world_size": 2, "tokens_per_step": 8192}, 9, None,
                          {"world_size": 2, "tokens_per_step": 8192}),
    "budget-elastic": ("budget", {"lengths": [512] * 300 + [1024] * 120 + [4096] * 30,
                                  "seed": 2, "curriculum": "uniform"},
                       {"world_size": 1, "tokens_per_step": 16384}, 8,
                       ({"world_size": 2, "tokens_per_step": 8192}, 5),
                       {"world_size": 2, "tokens_per_step": 8192}),
    "mixture-schedule": ("mixture", {"datasets": {"web": 70, "code": 30, "math": 11},
                                     "schedule": [[0, {"web": 0.7, "code": 0.3}],
                                                  [6, {"web": 0.5, "code": 0.25,
                                                       "math": 0.25}]],
                                     "seed": 4},
                         {"world_size": 2, "batch_size": 3}, 9, None,
                         {"world_size": 2, "batch_size": 3}),
    "mixture-stop": ("mixture", {"datasets": {"web": 40, "code": 30}, "exhausted": "stop",
                                 "schedule": [[0, {"web": 0.6, "code": 0.4}]], "seed": 0},
                     {"world_size": 1, "batch_size": 4}, 3, None,
                     {"world_size": 2, "batch_size": 2}),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (kind, make, shape, step, via, resume) in CASES.items():
        state = saved(kind, make, shape, step, via)
        body = {"kind": kind, "make": make, "saved_at": shape, "state": state,
                "resume": resume, "next": rows_after(kind, make, state, resume)}
        (OUT / f"{name}.json").write_text(json.dumps(body, separators=(",", ":")) + "\n")
        print(name, state["step"], len(body["next"]))


if __name__ == "__main__":
    main()
