"""A real 2-process data-parallel run (torch.distributed, gloo, CPU) on the bundled corpus.

The tests start this file once per rank as a worker (``python tests/test_distributed.py``):
1. ``full``: DDP-trains a tiny Llama (built from a config, no downloads) for STEPS steps with
   PackBatchSampler(balance="attention") and DataLoader(num_workers=0), saving sampler, model and
   optimizer state after step K as it goes (steps K..STEPS-1 are then lost, as in a crash);
2. ``resume``: fresh processes load that checkpoint and train steps K..STEPS with num_workers=1;
3. ``elastic-W-B``: W fresh processes (3 or 1) with B packs per rank (1 or 4) load rank 0's
   checkpoint and train to the end of the epoch.
Checked: the ranks' epoch schedules are disjoint and cover the epoch (all but the n % 4 packs
drop_last drops), both ranks take the same number of steps, the packs trained are the
schedule's, the resumed run's per-step losses equal the uninterrupted run's exactly, and after
an elastic resume the packs of the K finished steps plus those the new ranks train are the
epoch's packs, each exactly once, less the left-out tail (< W x B packs).
"""

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORLD, BATCH, STEPS, K = 2, 2, 6, 3


def indexed(ds):
    """The dataset's items with their pack index, so the test sees which packs were trained."""
    import torch

    class Indexed(torch.utils.data.Dataset):
        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            return {**ds[i], "index": i}

    return Indexed()


def collate_with_index(examples):
    from packtool.torch import collate_tensors

    return collate_tensors(examples), [int(e["index"]) for e in examples]


def worker(workdir: Path, mode: str) -> None:
    import torch
    import torch.distributed as dist
    import transformers

    import packtool
    from packtool.torch import PackBatchSampler, TorchPackedDataset, model_inputs

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = TorchPackedDataset(workdir / "packed")
    batch_size, stop = BATCH, STEPS
    if mode.startswith("elastic"):
        batch_size, stop = int(mode.split("-")[2]), None  # to the end of the epoch

    def sampler():
        s = PackBatchSampler(ds.packed, rank=rank, world_size=world, batch_size=batch_size,
                             seed=1, balance="attention")
        s.set_epoch(0)
        return s

    torch.manual_seed(0)
    vocab = packtool.open_tokens(workdir / "corpus").meta["vocab_size"]
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg)
    model.set_attn_implementation("sdpa")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    s = sampler()
    ckpt = workdir / f"ckpt-{rank}.pt"
    if mode != "full":
        state = torch.load(ckpt if mode == "resume" else workdir / "ckpt-0.pt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        s.load_state_dict(state["sampler"])
        s.set_epoch(state["sampler"]["epoch"])
    loader = torch.utils.data.DataLoader(indexed(ds), batch_sampler=s,
                                         collate_fn=collate_with_index,
                                         num_workers=0 if mode == "full" else 1)
    losses, trained = {}, {}
    for step, (batch, idx) in enumerate(loader, start=s.start_step):
        if step == stop:
            break
        loss = ddp(**model_inputs(batch), use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses[step], trained[step] = [loss.item(), mean.item() / world], idx
        if mode == "full" and step + 1 == K:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "sampler": s.state_dict(K)}, ckpt)
    del loader  # its worker process ends before the group does
    schedule = list(sampler().steps())
    everyone = [None] * world
    dist.all_gather_object(everyone, schedule)
    (workdir / f"{mode}-{rank}.json").write_text(json.dumps(
        {"losses": losses, "trained": trained, "schedule": schedule, "all": everyone,
         "left_out": s.left_out().tolist(), "start_step": s.first_step()}))
    # Orderly teardown: no rank leaves while another still talks to it, and DDP (which holds
    # the gloo group alive past destroy_process_group) goes first. Then skip interpreter
    # finalization: gloo's threads torn down there abort the process now and then
    # ("terminate called without an active exception", a torch issue, pytorch#179291),
    # after every result is on disk.
    dist.barrier()
    del ddp
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def launch(workdir: Path, mode: str, world: int = WORLD) -> list[dict]:
    from conftest import launch_ranks

    launch_ranks(Path(__file__), [workdir, mode], world)
    return [json.loads((workdir / f"{mode}-{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The bundled corpus packed at 256 and the uninterrupted 2-rank run (with its checkpoint
    after step K): (workdir, the ranks' results, pack count)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import packtool
    from packtool.formats.packed import open_packed

    tmp_path = tmp_path_factory.mktemp("ddp")
    fx = ROOT / "fixtures"
    packtool.tokenize_files([str(fx / "corpus" / "part-0.jsonl")], fx / "tokenizer",
                            tmp_path / "corpus", packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
    packtool.pack_corpus([tmp_path / "corpus"], tmp_path / "packed", 256, "bfd")
    return tmp_path, launch(tmp_path, "full"), len(open_packed(tmp_path / "packed"))


@pytest.mark.slow
def test_two_rank_training_disjoint_equal_steps_and_exact_resume(full_run):
    tmp_path, full, n = full_run
    sched = [r["schedule"] for r in full]
    assert full[0]["all"] == full[1]["all"] == sched  # each rank computed both schedules alike
    assert len(sched[0]) == len(sched[1]) == n // (WORLD * BATCH) > STEPS  # equal steps
    flat = [i for r in sched for b in r for i in b]
    assert len(flat) == len(set(flat)) == n - n % (WORLD * BATCH)  # disjoint, the epoch covered
    for r in range(WORLD):
        assert [full[r]["trained"][str(s)] for s in range(STEPS)] == sched[r][:STEPS]
        assert len(full[r]["losses"]) == STEPS

    resumed = launch(tmp_path, "resume")
    for r in range(WORLD):
        assert sorted(resumed[r]["losses"], key=int) == [str(s) for s in range(K, STEPS)]
        for s in range(K, STEPS):
            assert resumed[r]["trained"][str(s)] == full[r]["trained"][str(s)]
            assert resumed[r]["losses"][str(s)] == full[r]["losses"][str(s)], (r, s)
    first = [full[0]["losses"][str(s)][1] for s in range(STEPS)]
    print(f"\nmean loss per step (uninterrupted): {[round(x, 4) for x in first]}; "
          f"resumed at step {K}: identical on both ranks")


@pytest.mark.slow
@pytest.mark.parametrize("world,batch", [(3, 1), (1, 4)])
def test_elastic_resume_into_another_world_and_batch_size(full_run, world, batch):
    """2 ranks x 2 packs, checkpoint after step 3 (12 packs), crash after step 6; resumed as
    3 ranks x 1 pack and as 1 rank x 4 packs: every pack of the epoch trained exactly once
    (steps 3-5 of the crashed run again, since their updates were lost), but the tail."""
    import torch

    tmp_path, full, n = full_run
    states = [torch.load(tmp_path / f"ckpt-{r}.pt")["sampler"] for r in range(WORLD)]
    assert states[0] == states[1] and states[0]["remaining"] == n - K * WORLD * BATCH
    resumed = launch(tmp_path, f"elastic-{world}-{batch}", world=world)
    before = [i for r in range(WORLD) for s in range(K) for i in full[r]["trained"][str(s)]]
    after = [i for r in resumed for idx in r["trained"].values() for i in idx]
    left = resumed[0]["left_out"]
    assert len(before + after) == len(set(before + after))  # nothing twice
    assert sorted(before + after + left) == list(range(n))  # nothing skipped but the tail
    assert len(left) == (n - K * WORLD * BATCH) % (world * batch)
    lost = {i for r in range(WORLD) for s in range(K, STEPS) for i in full[r]["trained"][str(s)]}
    assert lost <= set(after)  # the crashed run's unsaved steps are trained again
    steps = {len(r["trained"]) for r in resumed}
    assert steps == {(n - K * WORLD * BATCH) // (world * batch)}  # every rank the same count
    assert resumed[0]["start_step"] == K * WORLD * BATCH // (world * batch)


if __name__ == "__main__":
    worker(Path(sys.argv[1]), sys.argv[2])
