"""The optimal packer and the lower bounds, against brute force on tiny inputs."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from invariants import check_assignment

from packtool.bounds import l1_bound, l2_bound
from packtool.lengths import load_histogram_csv, reference_histogram
from packtool.packers import assign_packs
from packtool.packers.optimal import lp_bound, solve


def brute_force_opt(lengths, capacity):
    """Fewest packs by exhaustive search (fine for <= 9 items)."""
    items = sorted((n for n in lengths if n), reverse=True)
    best = [len(items)]

    def place(i, bins):
        if len(bins) >= best[0]:
            return
        if i == len(items):
            best[0] = len(bins)
            return
        seen = set()
        for b in range(len(bins)):
            if bins[b] + items[i] <= capacity and bins[b] not in seen:
                seen.add(bins[b])
                bins[b] += items[i]
                place(i + 1, bins)
                bins[b] -= items[i]
        bins.append(items[i])
        place(i + 1, bins)
        bins.pop()

    place(0, [])
    return best[0] if items else 0


@pytest.mark.parametrize("lengths,capacity,l1,l2,opt", [
    ([6, 6, 6], 10, 2, 3, 3),                 # all > L/2: one pack each
    ([4, 4, 4, 3, 3, 3], 10, 3, 3, 3),
    ([7, 7, 3, 3, 3, 3], 10, 3, 3, 3),
    ([5, 5, 5, 5, 5], 10, 3, 3, 3),
    ([60, 60, 60, 50, 50, 30, 30, 30], 120, 4, 4, 4),
    ([99, 51, 51, 51, 50, 49], 100, 4, 5, 5),  # L2 beats L1
])
def test_bounds_hand_computed(lengths, capacity, l1, l2, opt):
    assert l1_bound(lengths, capacity) == l1
    assert l2_bound(lengths, capacity) == l2
    assert brute_force_opt(lengths, capacity) == opt
    lp, converged = lp_bound(lengths, capacity)
    assert converged and max(l1, l2) <= lp <= opt
    packs = assign_packs(lengths, capacity, "optimal")
    assert check_assignment(lengths, packs, capacity) == opt


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=9), capacity=st.integers(40, 70))
def test_bounds_never_exceed_brute_force(lengths, capacity):
    opt = brute_force_opt(lengths, capacity)
    assert l1_bound(lengths, capacity) <= l2_bound(lengths, capacity) <= opt
    lp, _ = lp_bound(lengths, capacity)
    assert lp <= opt
    n = check_assignment(lengths, assign_packs(lengths, capacity, "optimal"), capacity)
    assert opt <= n <= check_assignment(lengths, assign_packs(lengths, capacity, "bfd"), capacity)


def test_reference_bounds_match_published():
    for name, L, l1, l2 in [("squad11-384", 384, 39_713, 39_775),
                            ("wikipedia-512", 512, 8_134_368, 8_135_727)]:
        lengths = load_histogram_csv(reference_histogram(name))
        assert (l1_bound(lengths, L), l2_bound(lengths, L)) == (l1, l2)


def test_squad_reaches_the_lp_bound():
    """BFD leaves ~1.1% above the LP bound on squad11-384; optimal must be within 2 packs."""
    lengths = load_histogram_csv(reference_histogram("squad11-384"))
    packs, info = solve(lengths, 384)
    n = check_assignment(lengths, packs, 384)
    assert info["converged"] and info["used"] == "lp"
    assert n <= info["lp_bound"] + 2 < info["bfd_packs"]
    assert np.array_equal(packs, solve(lengths, 384)[0])  # deterministic


@pytest.mark.slow
def test_never_worse_than_bfd_and_work_limit_zero():
    rng = np.random.default_rng(4)
    lengths = rng.integers(100, 700, 3000)
    packs, info = solve(lengths, 1000, work_limit=0)
    n = check_assignment(lengths, packs, 1000)
    assert n <= info["bfd_packs"] and not info["converged"]
    packs, info = solve(lengths, 1000)
    assert check_assignment(lengths, packs, 1000) <= info["bfd_packs"]


@pytest.mark.slow
def test_work_limit_makes_a_cut_short_solve_reproducible():
    """A solve stopped by its work budget stops at the same column every run (issue 10.9:
    a wall-clock limit gave 4 different outputs in 4 runs)."""
    rng = np.random.default_rng(8)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 50_000), 1, 4096).astype(np.int64)
    runs = [solve(lengths, 4096, work_limit=300_000_000) for _ in range(2)]
    assert runs[0][1]["converged"] is False
    assert runs[0][1]["work"] == runs[1][1]["work"] >= 300_000_000
    assert runs[0][1]["lp_bound"] == runs[1][1]["lp_bound"]
    assert np.array_equal(runs[0][0], runs[1][0])


@pytest.mark.slow
@pytest.mark.parametrize("capacity", [8192, 131_072])
def test_large_capacity_stays_tractable(capacity):
    """Past MAX_DP_CELLS the pricing runs on a coarser grid and still packs, within budget."""
    from packtool.packers._lp import MAX_DP_CELLS
    from packtool.packers._lp import histogram_problem as _histogram_problem

    rng = np.random.default_rng(5)
    lengths = np.clip(rng.lognormal(np.log(capacity / 3), 0.8, 2000), 1, capacity).astype(np.int64)
    packs, info = solve(lengths, capacity, work_limit=2_000_000_000)
    n = check_assignment(lengths, packs, capacity)
    assert n <= info["bfd_packs"]
    step = _histogram_problem(lengths, capacity, MAX_DP_CELLS)[0]
    assert info["grid_step"] == step
    # the budget is checked between pricing calls: at most one call (<= cells) beyond it
    assert info["work"] <= 2_000_000_000 + MAX_DP_CELLS


def test_bounds_take_integer_lengths_and_none():
    """An empty array (of any dtype) bounds 0 packs; float lengths are refused, never cut
    down to integers (3.7 tokens bounded as 3)."""
    from packtool.metrics import pack_metrics

    assert l2_bound(np.array([]), 10) == 0 and pack_metrics([], 10, 0)["l2_bound_packs"] == 0
    with pytest.raises(TypeError):
        l2_bound(np.array([3.7, 5.2]), 10)
    with pytest.raises(TypeError):
        pack_metrics(np.array([3.7, 5.2]), 10, 1)
