"""Token-budget steps under a real 2-process ``torch.distributed`` group (gloo, CPU).

The test starts this file once per rank as a worker (``python tests/test_budget_distributed.py
WORKDIR``): each rank builds ``PackSampler(ds, rank, world_size, tokens_per_step=8192)`` over a
real ``pack --vsl 256:2048`` dataset from its process group, feeds a DataLoader with it, and
all-gathers the rows it was dealt each step; both save the state after step K. Checked: every
global step one slot length and exactly T token slots, dealt evenly, no row twice in the
epoch; the ranks' steps are those one process computes for both; every rank saves the same
state; and one rank resuming from it deals exactly the rows the epoch has left.
"""

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORLD, T, K = 2, 8192, 5


def worker(workdir: Path) -> None:
    import torch
    import torch.distributed as dist

    from packtool.torch import TorchPackedDataset
    from packtool.train.sampler import PackSampler

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
        everyone = [None] * world
        dist.all_gather_object(everyone, mine[k])
        steps.append(everyone)
    states = [None] * world
    dist.all_gather_object(states, s.state_dict(step=K))
    (workdir / f"rank-{rank}.json").write_text(json.dumps({"steps": steps, "states": states}))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads torn down at finalization abort now and then (pytorch#179291)


def launch(workdir: Path) -> list[dict]:
    from conftest import launch_ranks

    launch_ranks(Path(__file__), [workdir], WORLD)
    return [json.loads((workdir / f"rank-{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow
def test_two_gloo_ranks_deal_one_length_t_tokens_no_repeat_and_resume_on_one(tmp_path):
    pytest.importorskip("torch")
    import packtool
    from packtool.train.sampler import PackSampler

    fx = ROOT / "fixtures"
    packtool.tokenize_files(sorted(str(f) for f in (fx / "corpus").glob("part-*")),
                            fx / "tokenizer", tmp_path / "all",
                            packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
    packtool.pack_corpus([tmp_path / "all"], tmp_path / "v", 2048, "bfd", vsl="256:2048")
    ds = packtool.open_packed(tmp_path / "v")
    lengths = ds.row_lengths()
    results = launch(tmp_path)
    steps = results[0]["steps"]
    assert steps == results[1]["steps"] and len(steps) > K  # every rank saw the same steps
    for step in steps:
        rows = [i for r in step for i in r]
        assert len({int(lengths[i]) for i in rows}) == 1  # one slot length
        assert int(lengths[rows].sum()) == T  # exactly T token slots
        assert len(step[0]) == len(step[1])  # dealt evenly
    flat = [i for step in steps for r in step for i in r]
    assert len(flat) == len(set(flat))  # no row twice in the epoch
    alone = [PackSampler(ds, rank=r, world_size=WORLD, tokens_per_step=T) for r in range(WORLD)]
    assert steps == [list(s) for s in zip(*(list(a.steps()) for a in alone), strict=True)]

    states = results[0]["states"]
    assert states[0] == states[1] == results[1]["states"][0]  # every rank saves one state
    one = PackSampler(ds, rank=0, world_size=1, tokens_per_step=T)
    one.load_state_dict(states[0])
    after = [i for b in one.steps() for i in b]
    before = [i for step in steps[:K] for r in step for i in r]
    assert after == [i for step in steps[K:] for r in step for i in r]  # the same steps
    assert sorted(before + after + one.left_out().tolist()) == list(range(len(ds)))


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
