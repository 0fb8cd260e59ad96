"""PackSampler: every epoch's packs split disjointly over ranks, equal steps, deterministic,
resumable batch-for-batch (through a real torch DataLoader, also when num_workers changes),
attention-balanced; pad_example / PackedReader.get padding; model_inputs keys."""

import itertools
from pathlib import Path

import numpy as np
import pytest

from packtool.batching import collate_numpy, pad_example
from packtool.errors import PacktoolError
from packtool.sampler import PackSampler, attention_costs, balance_steps

ROOT = Path(__file__).resolve().parent.parent


def all_ranks(n, world, **kw):
    return [list(PackSampler(n, rank=r, world_size=world, **kw).steps()) for r in range(world)]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    import packtool
    from packtool.formats.packed import open_packed

    d = tmp_path_factory.mktemp("sampler")
    fx = ROOT / "fixtures"
    packtool.tokenize_files([str(fx / "corpus" / "part-0.jsonl")], fx / "tokenizer", d / "c",
                            packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
    packtool.pack_corpus([d / "c"], d / "p", 256, "bfd")
    return open_packed(d / "p")


@pytest.mark.parametrize("n,world,batch", [(10, 3, 1), (37, 4, 2), (64, 8, 4), (5, 1, 5)])
@pytest.mark.parametrize("balance", [False, True])
def test_epoch_disjoint_covering_equal_steps(n, world, batch, balance):
    costs = np.random.default_rng(n).lognormal(0, 2, n) if balance else None
    g = world * batch
    for drop_last in (True, False):
        ranks = all_ranks(n, world, batch_size=batch, drop_last=drop_last, balance=costs)
        steps = n // g if drop_last else -(-n // g)
        assert all(len(r) == steps for r in ranks)  # no rank waits in a collective
        assert all(len(b) == batch for r in ranks for b in r)
        flat = [i for r in ranks for b in r for i in b]
        assert all(0 <= i < n for i in flat)
        if drop_last:
            assert len(set(flat)) == len(flat) == steps * g  # disjoint; only n % g dropped
        else:
            assert set(flat) == set(range(n))  # every pack, the first ones repeated to fill
            counts = np.bincount(flat, minlength=n)
            assert counts.max() - counts.min() <= 1 and len(flat) == steps * g
        # every global step holds the same packs whichever way they are dealt to ranks
        plain = all_ranks(n, world, batch_size=batch, drop_last=drop_last)
        for s in range(steps):
            assert sorted(i for r in ranks for i in r[s]) == sorted(i for r in plain for i in r[s])


def test_deterministic_and_set_epoch():
    a = PackSampler(50, rank=1, world_size=2, seed=3)
    b = PackSampler(50, rank=1, world_size=2, seed=3)
    e0 = list(a)
    assert e0 == list(b) == list(a)  # same seed, same order, every time
    a.set_epoch(1)
    e1 = list(a)
    assert e1 != e0
    a.set_epoch(0)
    assert list(a) == e0
    assert list(PackSampler(50, rank=1, world_size=2, seed=4)) != e0
    # ranks of one epoch together are a permutation of range(n)
    both = list(PackSampler(50, rank=0, world_size=2, seed=3)) + e0
    assert sorted(both) == list(range(50))


@pytest.mark.parametrize("balance", [None, "costs"])
def test_resume_every_step(balance):
    n, kw = 45, dict(rank=2, world_size=3, batch_size=2, seed=7, drop_last=False)
    costs = np.arange(n, dtype=float) ** 2 if balance else None
    full = PackSampler(n, balance=costs, **kw)
    epochs = []
    for e in range(2):
        full.set_epoch(e)
        epochs.append(list(full.steps()))
    for k in range(full.n_steps + 1):
        s = PackSampler(n, balance=costs, **kw)
        state = s.state_dict(k)
        t = PackSampler(n, balance=costs, **kw)
        t.load_state_dict(state)
        t.set_epoch(state["epoch"])  # what a training loop does at the top of the epoch
        got = list(t.steps())
        assert got == (epochs[0][k:] if k < full.n_steps else epochs[1])
        t.set_epoch(state["epoch"] + 1)  # later epochs start at their step 0
        assert len(list(t.steps())) == full.n_steps


def test_state_refused_for_another_schedule():
    s = PackSampler(40, rank=0, world_size=2, batch_size=2)
    state = s.state_dict(3)
    for change in (dict(seed=1), dict(world_size=4), dict(batch_size=4), dict(drop_last=False)):
        kw = dict(rank=0, world_size=2, batch_size=2) | change
        with pytest.raises(PacktoolError, match=next(iter(change))):
            PackSampler(40, **kw).load_state_dict(state)
    with pytest.raises(PacktoolError, match="n_packs"):
        PackSampler(41, rank=0, world_size=2, batch_size=2).load_state_dict(state)
    with pytest.raises(PacktoolError, match="step must be 0..10"):
        s.state_dict(11)


def test_bad_arguments():
    with pytest.raises(PacktoolError, match="rank must be in 0..3"):
        PackSampler(10, rank=4, world_size=4)
    with pytest.raises(PacktoolError, match="drop_last=False"):
        PackSampler(10, rank=0, world_size=4, batch_size=4)
    with pytest.raises(PacktoolError, match="balance must be"):
        PackSampler(10, rank=0, world_size=2, balance="tokens")
    with pytest.raises(PacktoolError, match="open_packed"):
        PackSampler(10, rank=0, world_size=2, balance="attention")
    with pytest.raises(PacktoolError, match="10 finite numbers"):
        PackSampler(10, rank=0, world_size=2, balance=np.ones(9))


def test_attention_costs_match_cu_seqlens(packed):
    naive = [float((np.diff(packed[i]["cu_seqlens"]).astype(np.int64) ** 2).sum())
             for i in range(len(packed))]
    assert np.array_equal(attention_costs(packed), naive)
    s = PackSampler(packed, rank=0, world_size=2, batch_size=2, balance="attention")
    assert np.array_equal(s.costs, naive)


def test_balance_optimal_on_two_by_two_and_better_than_shuffled():
    rng = np.random.default_rng(0)
    costs = rng.lognormal(0, 1.5, (300, 4))
    slots = balance_steps(costs, world_size=2, batch_size=2)
    for c, sl in zip(costs, slots, strict=True):
        assert sorted(sl.ravel()) == [0, 1, 2, 3]
        best = min(max(c[list(p)].sum(), c.sum() - c[list(p)].sum())
                   for p in itertools.combinations(range(4), 2))
        assert c[sl].sum(axis=1).max() == pytest.approx(best)
    # real-shaped: bfd packs of lognormal lengths, world size 8, 4 packs per rank
    from packtool.packers import assign_packs

    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 200_000), 1, 4096).astype(np.int64)
    pack = assign_packs(lengths, 4096, "bfd")
    cost = np.bincount(pack, weights=lengths.astype(float) ** 2)

    def ratio(balance):
        s = PackSampler(len(cost), rank=0, world_size=8, batch_size=4, balance=balance)
        per_rank = cost[s.global_schedule()].sum(axis=2)
        return float((per_rank.max(axis=1) / per_rank.mean(axis=1)).mean())

    shuffled, balanced = ratio(None), ratio(cost)
    assert balanced < 1.08 < 1.5 < shuffled, (shuffled, balanced)


def loader_batches(ds, sampler, workers, stop=None):
    import torch

    from packtool.torch import PackBatchSampler, collate_tensors

    kw = dict(batch_sampler=sampler) if isinstance(sampler, PackBatchSampler) else dict(
        sampler=sampler, batch_size=sampler.batch_size)
    loader = torch.utils.data.DataLoader(ds, collate_fn=collate_tensors, num_workers=workers,
                                         **kw)
    out = []
    for step, batch in enumerate(loader, start=sampler.start_step):
        if step == stop:
            return out, sampler.state_dict(step)  # the loop finished `step` steps
        out.append(batch["input_ids"])
    return out, None


@pytest.mark.parametrize("kind", ["sampler", "batch_sampler"])
@pytest.mark.parametrize("workers", [(0, 2), (2, 0)])
def test_resume_through_dataloader(packed, kind, workers):
    pytest.importorskip("torch")
    from packtool.torch import PackBatchSampler, PackSampler, TorchPackedDataset

    cls = PackBatchSampler if kind == "batch_sampler" else PackSampler
    ds = TorchPackedDataset(packed.directory)

    def make():
        s = cls(ds.packed, rank=1, world_size=2, batch_size=3, balance="attention", seed=5)
        s.set_epoch(2)
        return s

    full, _ = loader_batches(ds, make(), workers[0])
    k = 4
    head, state = loader_batches(ds, make(), workers[0], stop=k)
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(state["epoch"])
    tail, _ = loader_batches(ds, resumed, workers[1])
    assert len(full) == make().n_steps and len(head) == k
    assert len(tail) == len(full) - k
    assert all(a.equal(b) for a, b in zip(head + tail, full, strict=True))


def test_pad_example_row_and_segments():
    ex = {"input_ids": np.arange(1, 8), "labels": np.array([-100, 2, 3, -100, 5, 6, 7]),
          "position_ids": np.array([0, 1, 2, 0, 1, 2, 3]),
          "doc_ids": np.array([0, 0, 0, 1, 1, 1, 1]),
          "cu_seqlens": np.array([0, 3, 7], np.int32), "max_seqlen": 4}
    row = pad_example(ex, multiple=4, pad_id=9)
    assert row["cu_seqlens"].tolist() == [0, 3, 7, 8] and row["input_ids"].tolist()[-1] == 9
    assert row["labels"][-1] == -100 and row["doc_ids"][-1] == -1 and row["position_ids"][-1] == 0
    seg = pad_example(ex, multiple=4, per_segment=True, pad_id=9)
    assert seg["cu_seqlens"].tolist() == [0, 4, 8]
    assert seg["input_ids"].tolist() == [1, 2, 3, 9, 4, 5, 6, 7]
    assert seg["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert seg["labels"].tolist() == [-100, 2, 3, -100, -100, 5, 6, 7]
    assert seg["doc_ids"].tolist() == [0, 0, 0, -1, 1, 1, 1, 1]
    both = pad_example(ex, pad_to=12, multiple=4, per_segment=True)
    assert both["cu_seqlens"].tolist() == [0, 4, 8, 12] and both["max_seqlen"] == 4
    assert pad_example(ex, pad_to=12)["position_ids"][7:].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(PacktoolError, match="use pad_to=12"):
        pad_example(ex, pad_to=10, multiple=4)
    with pytest.raises(PacktoolError, match="after per-segment padding"):
        pad_example(ex, pad_to=4, multiple=4, per_segment=True)
    with pytest.raises(PacktoolError, match="pad_multiple=k"):
        pad_example(ex, per_segment=True)
    flat = collate_numpy([ex, ex], pad_multiple=4, per_segment=True)
    assert flat["cu_seq_lens_q"].tolist() == [0, 4, 8, 12, 16]
    flat = collate_numpy([ex, ex], pad_multiple=16)
    assert flat["cu_seq_lens_q"].tolist() == [0, 3, 7, 10, 14, 16]


def test_get_pad_multiple(packed):
    for i in range(5):
        plain = packed[i]
        assert np.array_equal(packed.get(i)["input_ids"][:len(plain["input_ids"])],
                              plain["input_ids"])
        ex = packed.get(i, pad_multiple=8, per_segment=True)
        lens = np.diff(ex["cu_seqlens"])
        assert (lens % 8 == 0).all() and len(lens) == len(plain["cu_seqlens"]) - 1
        real = ex["doc_ids"] != -1
        assert np.array_equal(ex["input_ids"][real], plain["input_ids"])
        assert (ex["labels"][~real] == -100).all()
    with pytest.raises(PacktoolError, match="pack 0: pad_to 100"):
        packed.get(0, pad_to=100)


def test_per_segment_padding_keeps_logits_and_loss(packed):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from packtool.torch import collate_tensors, model_inputs

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("sdpa")
    exs = [{k: torch.from_numpy(np.asarray(v)) for k, v in packed[i].items()} for i in range(3)]
    plain = collate_tensors(exs)
    padded = collate_tensors(exs, pad_multiple=8, per_segment=True)
    inputs = model_inputs(padded)
    assert set(inputs) >= {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
    assert model_inputs(plain, position_ids_start=2)["position_ids"].equal(
        plain["position_ids"] + 2)
    with torch.no_grad():
        a = model(**model_inputs(plain), use_cache=False)
        b = model(**inputs, use_cache=False)
    # the real tokens sit where doc_ids != -1; compare their logits in order
    doc = np.concatenate([pad_example({k: v.numpy() for k, v in e.items()}, multiple=8,
                                      per_segment=True)["doc_ids"] for e in exs])
    sel = torch.from_numpy(doc != -1)
    assert (a.logits[0] - b.logits[0][sel]).abs().max().item() < 1e-4
    assert padded["input_ids"].shape[1] > plain["input_ids"].shape[1]  # pads were added
    assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-5)
