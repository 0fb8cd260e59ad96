"""``pack --balance attention`` / ``assign_packs(balance="attention")``: the same packs, in
blocks of like attention cost, so one pack per rank per step is even (issue 23.4)."""

import json

import numpy as np
from click.testing import CliRunner
from synth import lognormal_lengths, write_token_corpus

from packtool.cli import cli
from packtool.formats.packed.balance import cost_classes, like_cost_order
from packtool.options import PackOptions
from packtool.pack.meta import imbalance
from packtool.pack.plan import plan_pack
from packtool.packers import assign_packs


def heavy_tail(n=60_000):
    return lognormal_lengths(n, median=300, sigma=1.0, cap=4096, seed=1)


def members(packs):
    """The documents of each pack, as a set of frozensets (pack numbering left out)."""
    order = np.argsort(packs, kind="stable")
    ids = packs[order]
    cuts = np.flatnonzero(np.diff(ids)) + 1
    return {frozenset(g.tolist()) for g in np.split(order, cuts) if ids[g[0]] >= 0}


def test_assign_packs_balance_keeps_the_packs_and_evens_each_block():
    lengths = heavy_tail()
    plain = assign_packs(lengths, 4096)
    balanced = assign_packs(lengths, 4096, balance="attention", balance_ranks=8)
    assert members(plain) == members(balanced)  # the same packs, numbered otherwise
    costs = np.bincount(balanced, weights=lengths.astype(float) ** 2)
    blocks = costs[:costs.size // 8 * 8].reshape(-1, 8)
    ratio = (blocks.max(axis=1) / blocks.mean(axis=1)).mean()
    shuffled = np.random.default_rng(0).permutation(
        np.bincount(plain, weights=lengths.astype(float) ** 2))  # the packs in pack's order
    pb = shuffled[:shuffled.size // 8 * 8].reshape(-1, 8)
    assert ratio <= 1.10 < (pb.max(axis=1) / pb.mean(axis=1)).mean()


def test_plan_balance_orders_blocks_and_the_index_says_so(tmp_path):
    lengths = heavy_tail(60_000)
    plain = plan_pack(lengths, PackOptions(4096))
    bal = plan_pack(lengths, PackOptions(4096, balance="attention", balance_ranks=4))
    assert bal.n_packs == plain.n_packs
    assert imbalance(bal, 4) <= 1.10 < imbalance(plain, 4)
    write_token_corpus(tmp_path / "c", lengths[:3000], vocab_size=1000)
    for name, extra in (("p", ["--balance", "attention"]), ("q", [])):
        r = CliRunner().invoke(cli, ["pack", str(tmp_path / "c"), "-L", "4096", "-o",
                                     str(tmp_path / name), "--balance-ranks", "4", "-q",
                                     *extra])
        assert r.exit_code == 0, r.output
    idx = json.loads((tmp_path / "p" / "index.json").read_text())
    plain_idx = json.loads((tmp_path / "q" / "index.json").read_text())
    assert idx["balance"] == {"objective": "attention", "ranks": 4}
    assert plain_idx["balance"] is None and idx["n_packs"] == plain_idx["n_packs"]
    assert idx["attention_imbalance"] < 0.75 * plain_idx["attention_imbalance"]
    r = CliRunner().invoke(cli, ["verify", str(tmp_path / "p"), "--source", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output


def test_like_cost_order_is_a_permutation_with_blocks_of_one_class():
    rng = np.random.default_rng(0)
    costs = rng.choice([1.0, 1.05, 5.0, 5.2, 20.0], size=500)
    order = like_cost_order(np.arange(500), costs, 4)
    assert sorted(order.tolist()) == list(range(500))
    cls = cost_classes(costs)
    full = order[:(500 // 4) * 4].reshape(-1, 4)
    same = (cls[full] == cls[full][:, :1]).all(axis=1)
    assert same[:-5].all()  # every block is one class until the leftovers at the end


def test_one_pack_per_rank_dealt_as_lpt_deals_it():
    """With one pack per rank the dealing is the LPT loop's (the j-th costliest slot to rank
    j), in linear time: 100,000 ranks deal in 0.01 s (the loop took 10 s)."""
    import time

    import naive

    from packtool.formats.packed.balance import balance_steps

    rng = np.random.default_rng(3)
    for world in (1, 2, 5, 8):
        costs = rng.lognormal(0, 1, (6, world)).round(1)  # ties too
        got = balance_steps(costs, world, 1)
        for s in range(len(costs)):
            assert got[s].tolist() == naive.lpt(costs[s].tolist(), world, 1)
    big = rng.lognormal(0, 1, (1, 100_000))
    t = time.perf_counter()
    got = balance_steps(big, 100_000, 1)
    assert time.perf_counter() - t < 1.0
    assert (big[0][got[0, :, 0]] == np.sort(big[0])[::-1]).all()
