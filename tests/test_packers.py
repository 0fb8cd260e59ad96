"""Every registered packer: shared invariants, slow references, property tests."""

import naive
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import check_assignment

from packtool import PacktoolError
from packtool.packers import PACKERS, assign_packs
from packtool.seeds import rng

ALGOS = list(PACKERS)
# NNLS time grows fast with the strategy count: keep the grid small in the shared tests
FAST = {"nnlshp": {"max_strategies": 600}}


def run(lengths, capacity, algo, seed=0):
    return assign_packs(lengths, capacity, algo, seed=seed, **FAST.get(algo, {}))


def lognormal(n, capacity, seed=0, median=None):
    rng = np.random.default_rng(seed)
    median = median or capacity / 8
    return np.clip(rng.lognormal(np.log(median), 1.0, n), 1, capacity).astype(np.int64)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("capacity", [1, 7, 64, 512, 4096])
def test_invariants_and_determinism(algo, capacity):
    lengths = lognormal(3000, capacity, seed=capacity)
    lengths[::97] = 0
    packs = run(lengths, capacity, algo, seed=5)
    n = check_assignment(lengths, packs, capacity)
    assert n >= -(-lengths.sum() // capacity)
    assert np.array_equal(packs, run(lengths, capacity, algo, seed=5))


@pytest.mark.parametrize("algo", ALGOS)
def test_edge_inputs(algo):
    assert run(np.empty(0, np.int64), 8, algo).size == 0
    assert run([0, 0], 8, algo).tolist() == [-1, -1]
    assert run([8], 8, algo).tolist() == [0]
    check_assignment([8] * 5 + [1] * 9, run([8] * 5 + [1] * 9, 8, algo), 8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), capacity=st.integers(1, 300), algo=st.sampled_from(ALGOS))
def test_property_random_lengths(data, capacity, algo):
    lengths = data.draw(st.lists(st.integers(0, capacity), max_size=200))
    seed = data.draw(st.integers(0, 2**31))
    packs = run(np.array(lengths, np.int64), capacity, algo, seed=seed)
    check_assignment(lengths, packs, capacity)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 100), max_size=150), capacity=st.integers(100, 160))
def test_ffd_equals_reference(lengths, capacity):
    got = assign_packs(lengths, capacity, "ffd")
    assert got.tolist() == naive.first_fit_decreasing(lengths, capacity)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 100), max_size=150), capacity=st.integers(100, 160))
def test_bfd_equals_reference(lengths, capacity):
    packs = assign_packs(lengths, capacity, "bfd")
    lengths = np.array(lengths, np.int64)
    m = lengths > 0
    sizes = (sorted(np.bincount(packs[m], weights=lengths[m]).astype(int).tolist())
             if m.any() else [])
    assert sizes == naive.best_fit_decreasing_sizes(lengths.tolist(), capacity)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 100), max_size=150), capacity=st.integers(100, 160))
def test_bfd_count_from_histogram(lengths, capacity):
    from packtool.packers.bfd import bfd_count

    packs = assign_packs(lengths, capacity, "bfd")
    n = int(packs.max()) + 1 if len(lengths) and packs.max() >= 0 else 0
    hist = np.bincount(np.array(lengths, np.int64), minlength=capacity + 1)
    assert bfd_count(hist, capacity) == n


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 60), max_size=150), capacity=st.integers(60, 120),
       depth=st.integers(1, 6), strict=st.booleans())
def test_spfhp_equals_reference(lengths, capacity, depth, strict):
    packs = assign_packs(lengths, capacity, "spfhp", max_depth=depth, strict=strict)
    lengths = np.array(lengths, np.int64)
    m = lengths > 0
    sizes = (sorted(np.bincount(packs[m], weights=lengths[m]).astype(int).tolist())
             if m.any() else [])
    assert sizes == naive.spfhp_sizes(lengths.tolist(), capacity, depth, strict)
    if m.any():
        assert np.bincount(packs[m]).max() <= depth


@pytest.mark.parametrize("algo", ["sequential", "random", "sorted"])
def test_next_fit_packers_equal_reference(algo):
    lengths = lognormal(500, 64, seed=1)
    lengths[3] = 0
    order = {
        "sequential": list(range(len(lengths))),
        "random": rng(9, "packer.random").permutation(len(lengths)).tolist(),
        "sorted": sorted(range(len(lengths)), key=lambda i: -lengths[i]),
    }[algo]
    expected = naive.next_fit(lengths.tolist(), order, 64)
    assert assign_packs(lengths, 64, algo, seed=9).tolist() == expected


def test_nnlshp_depth_and_quality():
    lengths = lognormal(4000, 128, seed=2, median=40)
    packs = assign_packs(lengths, 128, "nnlshp")
    check_assignment(lengths, packs, 128)
    assert np.bincount(packs).max() <= 3
    # depth 3 at median 40/128 tokens cannot beat 3 * mean tokens per pack, but must be close
    eff = lengths.sum() / ((packs.max() + 1) * 128)
    assert eff > 0.8 * min(1.0, 3 * lengths.mean() / 128)


def test_nnlshp_depth_one():
    lengths = np.array([3, 5, 8, 1, 0])
    packs = assign_packs(lengths, 8, "nnlshp", max_depth=1)
    assert check_assignment(lengths, packs, 8) == 4


def test_nnlshp_coarse_grid_and_refusal():
    from packtool.packers.nnlshp import choose_step, count_strategies

    assert count_strategies(10, 3) == 14  # partitions of 10 into <= 3 parts
    assert choose_step(512, 3) == 1 and choose_step(4096, 3) == 8
    lengths = lognormal(2000, 4096, seed=3, median=1500)
    packs = assign_packs(lengths, 4096, "nnlshp", max_strategies=800)  # coarse grid
    check_assignment(lengths, packs, 4096)
    with pytest.raises(PacktoolError, match="lower --max-depth"):
        assign_packs(lengths, 4096, "nnlshp", max_depth=12)


@pytest.mark.slow
def test_spfhp_matches_paper_on_wikipedia_histogram():
    """The paper reports 99.604% for SPFHP at depth 12 on wikipedia-512 (strict = its rule);
    the default opens multi-document packs and does better."""
    from packtool.lengths import load_histogram_csv, reference_histogram

    lengths = load_histogram_csv(reference_histogram("wikipedia-512"))
    eff = {}
    for strict in (True, False):
        packs = assign_packs(lengths, 512, "spfhp", strict=strict)
        eff[strict] = lengths.sum() / ((packs.max() + 1) * 512)
    assert round(100 * eff[True], 3) == 99.604
    assert eff[False] > eff[True]


def test_spfhp_equal_lengths_share_packs():
    assert assign_packs([100] * 1000, 4096, "spfhp").max() + 1 == 84   # depth 12
    assert assign_packs([100] * 1000, 4096, "spfhp", max_depth=40).max() + 1 == 25
    assert assign_packs([100] * 1000, 4096, "spfhp", strict=True).max() + 1 == 1000


def test_assign_packs_overflow_is_a_library_way_out():
    """Issue 18.6: the README's assign_packs(corpus.lengths, 4096) raised on any corpus with
    a longer document, and its error named a CLI option the function lacked."""
    with pytest.raises(PacktoolError, match=r"overflow='truncate' or 'drop' to assign_packs"):
        assign_packs([1, 9], 8)
    assert assign_packs([3, 9, 2, 6], 8, overflow="drop").tolist() == [1, -1, 0, 0]
    trunc = assign_packs([3, 9, 2, 6], 8, overflow="truncate")
    assert trunc[1] not in trunc[[0, 2, 3]]  # the long one fills a pack of its own
    assert np.array_equal(trunc, assign_packs([3, 8, 2, 6], 8))
    assert assign_packs([3, 9], 8, overflow="truncate", balance="attention").min() == 0
    with pytest.raises(PacktoolError, match="choose error, truncate or drop.*make_segments"):
        assign_packs([1, 9], 8, overflow="split")
    with pytest.raises(PacktoolError, match="negative"):
        assign_packs([1, -1], 8, overflow="truncate")


def test_wrapper_errors():
    with pytest.raises(PacktoolError, match="unknown packer"):
        assign_packs([1], 8, "nope")
    with pytest.raises(PacktoolError, match=r"document 1 has 9 tokens > seq_len 8.*--overflow"):
        assign_packs([1, 9], 8)
    with pytest.raises(PacktoolError, match="negative"):
        assign_packs([1, -1], 8)
    with pytest.raises(PacktoolError, match="--algo bfd takes no --max-depth"):
        assign_packs([1], 8, "bfd", max_depth=3)
    with pytest.raises(PacktoolError, match="takes no --max-depth, --time-limit"):
        assign_packs([1], 8, "ffd", max_depth=3, time_limit=1.0)
    with pytest.raises(PacktoolError, match="unknown packer option"):
        assign_packs([1], 8, "bfd", depth=3)
    for algo, opts in (("spfhp", {"max_depth": 0}), ("nnlshp", {"max_depth": 0})):
        with pytest.raises(PacktoolError, match="--max-depth must be >= 1"):  # not ValueError
            assign_packs([1, 2], 8, algo, **opts)


def test_every_packer_returns_a_report():
    from packtool.packers import PackerOptions, run_packer

    lengths = np.array([3, 5, 2, 6, 0, 8], np.int64)
    for algo in ALGOS:
        packing = run_packer(lengths, 8, algo, PackerOptions(seed=1, **FAST.get(algo, {})))
        rep = packing.report
        assert rep.algo == algo and rep.n_packs == packing.packs.max() + 1
        assert rep.options["seed"] == 1 and rep.to_json()["n_packs"] == rep.n_packs


def test_depth_capped_packers_warn_on_short_documents():
    """Prose-like lengths (mean ~90) at L=2048: depth 12 cannot fill a pack; say so."""
    from packtool.packers import PackerOptions, run_packer

    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(80), 0.5, 4000), 1, 2048)
    packing = run_packer(lengths.astype(np.int64), 2048, "spfhp")
    (warning,) = packing.report.warnings
    assert "raise --max-depth to" in warning and "bfd or optimal" in warning
    assert not run_packer(lengths.astype(np.int64), 2048, "spfhp",
                          PackerOptions(max_depth=64)).report.warnings
    assert not run_packer(lengths.astype(np.int64), 2048, "bfd").report.warnings
