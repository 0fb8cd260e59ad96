"""States saved by the samplers of commit 2b77772 (three samplers, three state formats) load
into today's sampler and continue exactly as the old code did: every rank's next steps are
the rows the old code dealt (tests/data/sampler-states, made by
scripts/make_sampler_states.py with the old code)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FIXTURES = sorted((HERE / "data" / "sampler-states").glob("*.json"))
sys.path.insert(0, str(HERE.parent / "scripts"))
from make_sampler_states import STEPS, build  # noqa: E402


def test_every_kind_has_a_saved_state():
    kinds = {json.loads(p.read_text())["kind"] for p in FIXTURES}
    assert kinds == {"fixed", "budget", "mixture"}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_old_state_continues_as_the_old_code_did(path):
    case = json.loads(path.read_text())
    kind, make, resume = case["kind"], case["make"], case["resume"]
    got = []
    for rank in range(resume["world_size"]):
        s = build(kind, make, rank, resume)
        s.load_state_dict(case["state"])
        it = s.steps(until=s.start_step + STEPS) if kind == "mixture" else s.steps()
        mine = []
        for batch in it:
            mine.append([list(x) if isinstance(x, tuple) else int(x) for x in batch])
            if len(mine) == STEPS:
                break
        got.append(mine)
    assert [[got[r][k] for r in range(len(got))] for k in range(STEPS)] == case["next"]


def test_one_state_schema_for_every_rule_and_a_rule_continues_only_its_own():
    """Every step rule saves one format and version with its rule named (issue 38: three
    formats); another rule's state is refused by name, with the sampler that continues it."""
    import numpy as np

    from packtool.errors import PacktoolError
    from packtool.train import MixtureSampler, PackSampler

    samplers = {
        "fixed": PackSampler(40, rank=0, world_size=2, batch_size=2),
        "budget": PackSampler(np.repeat([512, 1024], [40, 20]), rank=0, world_size=2,
                              tokens_per_step=4096),
        "mixture": MixtureSampler({"a": 30, "b": 20}, {"a": 0.5, "b": 0.5}, rank=0,
                                  world_size=2, batch_size=2),
    }
    states = {rule: s.state_dict(step=2) for rule, s in samplers.items()}
    assert {(st["format"], st["version"]) for st in states.values()} == {
        ("packtool.train.sampler", 5)}
    assert {rule: st["rule"] for rule, st in states.items()} == {r: r for r in samplers}
    for rule, s in samplers.items():
        s.load_state_dict(states[rule])
        for other, st in states.items():
            if other != rule:
                with pytest.raises(PacktoolError, match=f"rule {other!r}.*rule is {rule!r}"):
                    s.load_state_dict(st)
