"""Token-budget steps under a real 2-process ``torch.distributed`` group (gloo, CPU).

The fixture starts this file once per rank as a worker (``python tests/test_budget_distributed.py
WORKDIR``) over a real ``pack --vsl 256:2048`` dataset (757 rows: 655 of 256, 73 of 512, 27 of
1024, 2 of 2048; at T = 8192 that is 32, 16, 8, 4 rows a step, 27 steps); each rank takes its
rank and world size from its process group and all-gathers what it was dealt every step:

- ``plain``: ``PackSampler(ds, rank, world_size, tokens_per_step=T)``, its steps through a
  DataLoader, every rank's ``state_dict(step=K)``;
- ``curriculum``: the torch batch sampler ``PackBatchSampler(..., curriculum="grow-p2",
  balance="attention")`` as a DataLoader's ``batch_sampler`` over rows padded to their slot
  (a step's rows stack into one ``[rows, L]`` tensor), its ``state_dict()`` after K batches;
- ``elastic``: the states a 1-rank run saved after step J, at T and at 2T, resumed by the 2
  ranks of the group at T.

Checked: every global step one slot length and exactly T token slots, dealt evenly, no row
twice in the epoch; the ranks' steps are those one process computes; every rank saves the same
state; a resume on 1 or 4 ranks, or from 1 rank onto the group, deals exactly the rows the
epoch has left (the uninterrupted run's steps, where the settings are the same).
"""

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORLD, T, K, J = 2, 8192, 5, 7


def worker(workdir: Path) -> None:
    import torch
    import torch.distributed as dist

    from packtool.torch import PackBatchSampler, TorchPackedDataset
    from packtool.train.sampler import PackSampler

    class Rows(TorchPackedDataset):  # a row as the loader reads it, and which row it is
        def __getitem__(self, i):
            return {**super().__getitem__(i), "row": i}

    def gather(obj) -> list:
        everyone = [None] * world
        dist.all_gather_object(everyone, obj)
        return everyone

    def through_loader(sampler, stateful_at=None) -> dict:
        """Every step as all ranks got it from a DataLoader: (rows, width of the stacked
        input_ids) per rank; with ``stateful_at``, every rank's state_dict() after it."""
        loader = torch.utils.data.DataLoader(
            Rows(workdir / "v", pad_rows=True), batch_sampler=sampler, num_workers=0,
            collate_fn=lambda rs: ([r["row"] for r in rs],
                                   int(torch.stack([r["input_ids"] for r in rs]).shape[1])))
        out = {"len": len(loader), "steps": [], "states": None}
        for k, batch in enumerate(loader):
            out["steps"].append(gather(batch))
            if k + 1 == stateful_at:
                out["states"] = gather(sampler.state_dict())
        return out

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = TorchPackedDataset(workdir / "v")
    s = PackSampler(ds.packed, rank=rank, world_size=world, tokens_per_step=T)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=s.steps(), num_workers=0,
        collate_fn=lambda rows: [len(r["input_ids"]) for r in rows])
    steps, mine = [], list(s.steps())  # the same rows the loader is dealt (checked below)
    for k, tokens in enumerate(loader):
        assert len(tokens) == len(mine[k])
        steps.append(gather(mine[k]))
    result = {"plain": {"steps": steps, "states": gather(s.state_dict(step=K))}}

    grow = PackBatchSampler(ds.packed, rank=rank, world_size=world, tokens_per_step=T,
                            curriculum="grow-p2", balance="attention")
    result["curriculum"] = through_loader(grow, stateful_at=K)
    result["elastic"] = []
    for state in json.loads((workdir / "one.json").read_text()):
        resumed = PackBatchSampler(ds.packed, rank=rank, world_size=world, tokens_per_step=T)
        resumed.load_state_dict(state)
        result["elastic"].append(through_loader(resumed))
    (workdir / f"rank-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads torn down at finalization abort now and then (pytorch#179291)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    """The bundled corpus packed ``--vsl 256:2048``, 1-rank states after step J (at T and
    2T), and the 2-rank run: (dataset, the ranks' results)."""
    pytest.importorskip("torch")
    from conftest import launch_ranks

    import packtool
    from packtool.train.sampler import PackSampler

    tmp = tmp_path_factory.mktemp("budget-gloo")
    fx = ROOT / "fixtures"
    packtool.tokenize_files(sorted(str(f) for f in (fx / "corpus").glob("part-*")),
                            fx / "tokenizer", tmp / "all",
                            packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
    packtool.pack_corpus([tmp / "all"], tmp / "v", 2048, "bfd", vsl="256:2048")
    ds = packtool.open_packed(tmp / "v")
    ones = [PackSampler(ds, rank=0, world_size=1, tokens_per_step=t) for t in (T, 2 * T)]
    (tmp / "one.json").write_text(json.dumps([one.state_dict(step=J) for one in ones]))
    launch_ranks(Path(__file__), [tmp], WORLD)
    results = [json.loads((tmp / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    assert results[0] == results[1]  # every rank gathered the same steps and states
    return ds, results[0]


def check_steps(steps: list, lengths) -> list[int]:
    """Every step one slot length, T token slots, dealt evenly; no row twice. The rows."""
    for step in steps:
        rows = [i for r in step for i in r]
        assert len({int(lengths[i]) for i in rows}) == 1  # one slot length
        assert int(lengths[rows].sum()) == T  # exactly T token slots
        assert len({len(r) for r in step}) == 1  # dealt evenly
    flat = [i for step in steps for r in step for i in r]
    assert len(flat) == len(set(flat))  # no row twice in the epoch
    return flat


def resume(ds, state, world: int, **kw) -> tuple[list[list[int]], list[int]]:
    """(each step's rows, all ranks', that ``world`` ranks resumed from ``state`` deal; the
    rows left out)."""
    from packtool.train.sampler import PackSampler

    ranks = [PackSampler(ds, rank=r, world_size=world, tokens_per_step=T, **kw)
             for r in range(world)]
    for s in ranks:
        s.load_state_dict(state)
    steps = [list(step) for step in zip(*(list(s.steps()) for s in ranks), strict=True)]
    check_steps(steps, ds.row_lengths())
    return joined(steps), ranks[0].left_out().tolist()


def joined(steps) -> list[list[int]]:
    """Each step's rows, rank 0's then rank 1's ..."""
    return [[i for r in step for i in r] for step in steps]


@pytest.mark.slow
def test_two_gloo_ranks_deal_one_length_t_tokens_no_repeat_and_resume_on_one(gloo_run):
    from packtool.train.sampler import PackSampler

    ds, got = gloo_run
    steps = got["plain"]["steps"]
    assert len(steps) > K
    check_steps(steps, ds.row_lengths())
    alone = [PackSampler(ds, rank=r, world_size=WORLD, tokens_per_step=T) for r in range(WORLD)]
    assert steps == [list(s) for s in zip(*(list(a.steps()) for a in alone), strict=True)]

    states = got["plain"]["states"]
    assert states[0] == states[1]  # every rank saves one state
    after, left = resume(ds, states[0], 1)
    assert after == joined(steps[K:])  # the same steps
    assert sorted(sum(joined(steps[:K]) + after, []) + left) == list(range(len(ds)))


@pytest.mark.slow
def test_batch_sampler_curriculum_and_balance_under_gloo_resume_at_batch_k(gloo_run):
    from packtool.train.sampler import PackSampler

    ds, got = gloo_run
    lengths = ds.row_lengths()
    run = got["curriculum"]
    rows = [[r for r, _ in step] for step in run["steps"]]
    assert run["len"] == len(rows) > K
    flat = check_steps(rows, lengths)
    for step in run["steps"]:  # each rank's rows stacked: the width is the step's slot length
        assert {w for _, w in step} == {int(lengths[step[0][0][0]])}
    kw = {"tokens_per_step": T, "curriculum": "grow-p2", "balance": "attention"}
    alone = PackSampler(ds, rank=0, world_size=WORLD, **kw)
    assert [[r.tolist() for r in s] for s in alone.global_schedule()] == rows
    assert len({int(lengths[step[0][0]]) for step in rows}) > 1  # the curriculum varies L

    state = run["states"][0]  # state_dict() after K batches: resumes at batch K
    assert run["states"] == [state] * WORLD and state == alone.state_dict(step=K)
    before = flat[:sum(map(len, joined(rows[:K])))]
    after, left = resume(ds, state, 1, curriculum="grow-p2")  # without balance, which only
    assert list(map(sorted, after)) == list(map(sorted, joined(rows[K:])))  # orders a step
    assert sorted(before + sum(after, []) + left) == list(range(len(ds)))
    after4, left4 = resume(ds, state, 4)  # another world size and curriculum
    assert sorted(before + sum(after4, []) + left4) == list(range(len(ds)))


@pytest.mark.slow
@pytest.mark.parametrize("saved_at", [T, 2 * T])
def test_a_one_rank_state_resumed_by_the_gloo_group_deals_the_rest(gloo_run, saved_at):
    from packtool.train.sampler import PackSampler

    ds, got = gloo_run
    run = got["elastic"][[T, 2 * T].index(saved_at)]
    rows = [[r for r, _ in step] for step in run["steps"]]
    check_steps(rows, ds.row_lengths())
    one = PackSampler(ds, rank=0, world_size=1, tokens_per_step=saved_at)
    full = list(one.steps())
    group = PackSampler(ds, rank=0, world_size=WORLD, tokens_per_step=T)
    group.load_state_dict(one.state_dict(step=J))
    assert run["len"] == group.n_steps - J == len(rows)
    if saved_at == T:
        assert joined(rows) == full[J:]  # the uninterrupted run's steps
    dealt = sum(full[:J] + joined(rows), [])  # no repeat, no loss
    assert sorted(dealt + group.left_out().tolist()) == list(range(len(ds)))


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
