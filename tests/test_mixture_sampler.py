"""MixtureSampler: every source's cumulative rows within one row of its scheduled share from
each schedule point on, a ledger that agrees with what was yielded, each source's rows in its
own epoch order with none repeated or skipped (also across a resume under another schedule,
world size or batch size), which step takes which row, and refusals by name."""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import PacktoolError
from packtool.train import MixtureSampler
from packtool.train.schedule import check_schedule, deal

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"web": 500, "code": 230, "books": 41}
CHANGE = [(0, {"web": 0.7, "code": 0.3}), (20, {"web": 0.25, "code": 0.45, "books": 0.3})]


def every_rank(sizes, schedule, world, batch, until, start_state=None, **kw):
    """Global steps [(source, row), ...] of all ranks, rank 0's slots first."""
    ranks = []
    for r in range(world):
        s = MixtureSampler(sizes, schedule, rank=r, world_size=world, batch_size=batch, **kw)
        if start_state is not None:
            s.load_state_dict(start_state)
        ranks.append(list(s.steps(until=until)))
    return [sum((ranks[r][k] for r in range(world)), []) for k in range(len(ranks[0]))]


def bound_holds(steps, schedule, first_step=0):
    """Every source within one row of weight x rows since the schedule point in effect."""
    points = [p for p in schedule]
    worst = 0.0
    for k, (start, weights) in enumerate(points):
        end = points[k + 1][0] if k + 1 < len(points) else None
        total = sum(weights.values())
        counts, rows = {}, 0
        for step in steps[max(start, first_step) - first_step:
                          None if end is None else end - first_step]:
            rows += len(step)
            for src, _ in step:
                counts[src] = counts.get(src, 0) + 1
            for src in SIZES:
                dev = abs(counts.get(src, 0) - Fraction(weights.get(src, 0)) / total * rows)
                worst = max(worst, float(dev))
    return worst


def test_schedule_change_at_step_20_keeps_every_source_within_one_row():
    steps = every_rank(SIZES, CHANGE, world=3, batch=4, until=60)
    assert len(steps) == 60 and all(len(s) == 12 for s in steps)
    worst = bound_holds(steps, CHANGE)
    assert 0 < worst < 1, worst
    assert {src for src, _ in sum(steps[:20], [])} == {"web", "code"}  # books: weight 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=5).filter(any),
       st.integers(1, 37), st.integers(1, 40))
def test_deadline_order_is_within_quota_after_every_row(shares, g, steps):
    """floor(w T) <= c(T) <= ceil(w T) after every row T, counts never going back (what
    Hamilton's method, re-run on each total, cannot promise)."""
    names = [f"s{i}" for i in range(len(shares))]
    seg = check_schedule([(0, dict(zip(names, shares, strict=True)))], names)[0]
    counts, t = [0] * len(shares), 0
    for _ in range(steps):
        for src in deal(seg, t, counts, g):
            t += 1
            assert seg.shares[src] > 0
        for i, a in enumerate(shares):
            target = Fraction(a * t, sum(shares))
            assert target - 1 < counts[i] < target + 1
            assert counts[i] >= int(target)  # floor ... ceil
    assert sum(counts) == t == steps * g


def test_ledger_agrees_with_what_was_yielded_epochs_included():
    steps = every_rank(SIZES, CHANGE, world=2, batch=5, until=50, seq_len=128)
    s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=2, batch_size=5, seq_len=128)
    seen = {n: 0 for n in SIZES}
    for k in range(51):
        led = s.ledger(k)
        for name in SIZES:
            assert led[name]["rows"] == seen[name]
            assert led[name]["epochs"] == -(-seen[name] // SIZES[name])
            assert led[name]["tokens"] == 128 * seen[name]
            assert led[name]["tokens_from"] == "rows x seq_len"
        if k < 50:
            for src, _ in steps[k]:
                seen[src] += 1
    assert s.ledger(50)["books"]["epochs"] >= 2  # books (41 rows) used up and begun again


def stream(steps, source):
    return [r for step in steps for src, r in step if src == source]


def epoch_orders(sampler, source, n_rows):
    """The source's rows in its epochs' orders, one epoch after the other, n_rows of them."""
    out, e = [], 0
    while len(out) < n_rows:
        out += sampler.order(source, e).tolist()
        e += 1
    return out[:n_rows]


def test_state_at_step_10_resumes_under_changed_schedule_nothing_repeated():
    a_steps = every_rank(SIZES, CHANGE, world=2, batch=3, until=10)
    a = MixtureSampler(SIZES, CHANGE, rank=1, world_size=2, batch_size=3)
    list(a.steps(until=10))
    state = json.loads(json.dumps(a.state_dict(step=10)))  # plain JSON
    changed = [(0, {"web": 0.1, "code": 0.6, "books": 0.3}), (40, {"web": 1, "code": 1})]
    b_steps = every_rank(SIZES, changed, world=3, batch=2, until=80, start_state=state)
    assert len(b_steps) == 70
    whole = a_steps + b_steps
    for name in SIZES:  # each source's rows: its epochs' orders, none repeated, none skipped
        got = stream(whole, name)
        assert got == epoch_orders(a, name, len(got))
    # the new weights count from the resume step on, and the later point as written
    assert bound_holds(b_steps, [(10, changed[0][1]), changed[1]], first_step=10) < 1


@pytest.mark.parametrize("world,batch", [(2, 3), (1, 6), (4, 1)])
def test_same_schedule_resumes_the_run(world, batch):
    """Under the same schedule the steps after the resume are the uninterrupted run's at the
    same shape; at another, the same rows in the same order up to the next schedule point
    (step 20: another shape reaches it after another number of rows)."""
    whole = every_rank(SIZES, CHANGE, world=2, batch=3, until=40)
    s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=2, batch_size=3)
    state = s.state_dict(step=13)
    rest = every_rank(SIZES, CHANGE, world=world, batch=batch, until=40, start_state=state)
    if world * batch == 6:
        assert rest == whole[13:]
    head = sum(rest[:20 - 13], [])
    assert head == sum(whole[13:], [])[:len(head)]
    assert bound_holds(rest, CHANGE[1:], first_step=13) < 1  # from step 20 on, at any shape
    for name in SIZES:  # and no row of any source repeated or skipped
        got = stream(whole[:13] + rest, name)
        assert got == epoch_orders(s, name, len(got))


def test_resumed_twice_under_another_schedule_goes_on_as_once():
    changed = [(0, {"web": 0.5, "books": 0.5})]
    s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=1, batch_size=4)
    once = MixtureSampler(SIZES, changed, rank=0, world_size=1, batch_size=4)
    once.load_state_dict(s.state_dict(step=5))
    twice = MixtureSampler(SIZES, changed, rank=0, world_size=1, batch_size=4)
    twice.load_state_dict(once.state_dict(step=12))
    assert list(twice.steps(until=30)) == list(once.steps(until=30))[7:]


def test_stop_ends_before_a_source_runs_out():
    sched = [(0, {"web": 0.5, "books": 0.5})]
    s = MixtureSampler(SIZES, sched, rank=0, world_size=1, batch_size=10, exhausted="stop")
    steps = list(s.steps())
    books = stream(steps, "books")
    assert len(books) == len(set(books)) <= 41 < len(books) + 5  # the next step needs 5 more
    assert len(steps) == 8 and s.ledger(8)["books"] == {
        "rows": 40, "epochs": 1, "tokens": None, "tokens_from": None}
    with pytest.raises(PacktoolError, match="stops before step 8 .exhausted='stop'.: books "
                       "has 1 row.s. of its epoch 0 left and the step needs 5"):
        s.which(8)


def test_which_and_where_agree_with_iteration():
    s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=3, batch_size=2, seed=5)
    ranks = [list(MixtureSampler(SIZES, CHANGE, rank=r, world_size=3, batch_size=2,
                                 seed=5).steps(until=45)) for r in range(3)]
    taken = {n: 0 for n in SIZES}  # rows of each source so far: its place in its stream
    for k in range(45):
        assert s.which(k) == [ranks[r][k] for r in range(3)]
        for r in range(3):  # rank 0's slots come first in a step
            for src, row in ranks[r][k]:
                assert s.where(row, src, taken[src] // SIZES[src]) == [(k, r)]
                taken[src] += 1
    assert taken["books"] > SIZES["books"]  # a second epoch of books was asked about too
    later = MixtureSampler(SIZES, [(0, {"web": 1}), (3, {"code": 1})], rank=0, world_size=1)
    assert later.where(int(later.order("web", 0)[10]), "web") == []  # weight 0 on


def test_packed_sources_tokens_and_identity(tmp_path):
    import packtool
    from packtool.formats.packed import open_packed

    fx = ROOT / "fixtures"
    packtool.tokenize_files([str(fx / "corpus" / "part-0.jsonl")], fx / "tokenizer",
                            tmp_path / "c", packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
    for L in (256, 512):
        packtool.pack_corpus([tmp_path / "c"], tmp_path / f"p{L}", L, "bfd")
    a, b = open_packed(tmp_path / "p256"), open_packed(tmp_path / "p512")
    s = MixtureSampler({"a": a, "b": b}, {"a": 1, "b": 3}, rank=0, world_size=1,
                       batch_size=8)
    steps = list(s.steps(until=30))
    led = s.ledger(30)
    for name, ds in (("a", a), ("b", b)):
        want = sum(int(ds.segments(r)[2].sum()) for r in stream(steps, name))
        assert led[name]["tokens"] == want and led[name]["tokens_from"] == "pack lengths"
    state = s.state_dict(step=30)
    assert state["sources"]["a"]["index_sha256"] == a.index["index_sha256"]
    swapped = MixtureSampler({"a": b, "b": a}, {"a": 1, "b": 3}, rank=0, world_size=1)
    with pytest.raises(PacktoolError, match="source a with index_sha256=.*another dataset"):
        swapped.load_state_dict(state)


def test_a_wrapped_sources_state_keeps_its_identity_and_loads():
    """A source that wraps a packed dataset (TorchPackedDataset: ``.packed``, no ``.index``)
    is named by its row count in a mixture state, as states saved before were: such a state
    loads into a sampler over the same wrapper (named by its index it was refused)."""
    from types import SimpleNamespace

    class Wrapped:
        packed = SimpleNamespace(index={"index_sha256": "ab" * 32})

        def __len__(self):
            return 30

    kw = dict(schedule={"a": 0.5, "b": 0.5}, rank=0, world_size=1, batch_size=2)
    saved = MixtureSampler({"a": 30, "b": 20}, **kw)
    list(saved.steps(until=7))
    s = MixtureSampler({"a": Wrapped(), "b": 20}, **kw)
    s.load_state_dict(saved.state_dict(step=7))
    assert list(s.steps(until=12)) == list(saved.steps(until=12))[7:]


@pytest.mark.parametrize("schedule,match", [
    ([], "non-empty list"),
    ([(1, {"web": 1})], "step 1: it must be 0"),
    ([(0, {"web": 1}), (0, {"code": 1})], "point 1 has step 0: it must be an integer above"),
    ([(0, {"web": 1}), (5.0, {"code": 1})], "point 1 has step 5.0"),
    ([(0, {"web": 1, "news": 1})], "names source.s. news that the sampler does not have"),
    ([(0, {"web": -0.1, "code": 1})], "gives web weight -0.1: a weight must be"),
    ([(0, {"web": float("nan")})], "gives web weight nan"),
    ([(0, {"web": True})], "gives web weight True"),
    ([(0, {"web": 0, "code": 0.0})], "weights summing to 0"),
    ([(0, {})], "non-empty dict"),
    ([(0, 1, 2)], "point 0 is .*: it must be a pair"),
])
def test_bad_schedules_refused_by_name(schedule, match):
    with pytest.raises(PacktoolError, match=match):
        MixtureSampler(SIZES, schedule, rank=0, world_size=1)


def test_bad_arguments_refused():
    for kw, match in (({"rank": 2, "world_size": 2}, "rank must be in 0..1"),
                      ({"batch_size": 0}, "batch_size must be an integer >= 1"),
                      ({"exhausted": "wrap"}, "exhausted must be 'next_epoch'")):
        args = {"rank": 0, "world_size": 1, **kw}
        with pytest.raises(PacktoolError, match=match):
            MixtureSampler(SIZES, CHANGE, **args)
    with pytest.raises(PacktoolError, match="source 'web' has 0 rows"):
        MixtureSampler({**SIZES, "web": 0}, CHANGE, rank=0, world_size=1)
    s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=1)
    with pytest.raises(PacktoolError, match="no source 'news'"):
        s.where(0, "news")
    with pytest.raises(PacktoolError, match="row must be an integer 0..40"):
        s.where(41, "books")


def test_states_of_another_mixture_refused_by_name():
    s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=1, batch_size=2, seed=3)
    state = s.state_dict(step=7)
    cases = [
        (MixtureSampler({"web": 500, "code": 230}, CHANGE[:1], rank=0, world_size=1, seed=3),
         state, "the sampler lacks books"),
        (MixtureSampler({**SIZES, "news": 9}, CHANGE, rank=0, world_size=1, seed=3),
         state, "the state lacks news"),
        (MixtureSampler({**SIZES, "code": 231}, CHANGE, rank=0, world_size=1, seed=3),
         state, "source code with n_rows=230 .* another dataset"),
        (MixtureSampler(SIZES, CHANGE, rank=0, world_size=1, seed=4), state, "seed=3"),
    ]
    for sampler, st_, match in cases:
        with pytest.raises(PacktoolError, match=match):
            sampler.load_state_dict(st_)
    bad = [({**state, "version": 9}, "version 9"),
           ({k: v for k, v in state.items() if k != "segment"}, "lacks segment"),
           ({**state, "step": -1}, "step=-1"),
           ({**state, "sources": {**state["sources"], "books": {
               **state["sources"]["books"], "position": 42}}}, "books.position=42"),
           ({**state, "segment": {**state["segment"], "rows": 3}}, "counts.* must be|sum to"),
           ({**state, "rule": "fixed"}, "fixed-length PackSampler's state"),
           ("state", "must be a dict")]
    for st_, match in bad:
        with pytest.raises(PacktoolError, match=match):
            MixtureSampler(SIZES, CHANGE, rank=0, world_size=1, seed=3).load_state_dict(st_)


def test_orders_are_per_source_and_seed():
    s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=1, seed=1)
    t = MixtureSampler({"web": 500}, {"web": 1}, rank=0, world_size=1, seed=1)
    assert np.array_equal(s.order("web", 0), t.order("web", 0))  # other sources leave it
    assert sorted(s.order("web", 1).tolist()) == list(range(500))
    assert not np.array_equal(s.order("web", 0), s.order("web", 1))


def _forged(state, **change):
    """``state`` with segment/source fields changed (``code_position=...``, ``counts=...``)."""
    out = json.loads(json.dumps(state))
    for key, v in change.items():
        if key.endswith("_position"):
            out["sources"][key[:-9]]["position"] = v
        elif key == "counts":
            out["segment"]["counts"] = v
        else:
            out[key] = v
    return out


def test_forged_mixture_states_are_refused():
    """A step far past the positions, a source moved back one row (a row repeated) and counts
    skewed within the segment: each disagrees with what the schedule computes from the others
    (issue 38), and each was accepted."""
    s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=2, batch_size=3, seed=3)
    state = s.state_dict(step=60)
    src, seg = state["sources"], state["segment"]
    cases = [
        (_forged(state, step=10**12), "step"),
        (_forged(state, code_position=src["code"]["position"] - 1), "position"),
        (_forged(state, web_position=src["web"]["position"] + 1,
                 code_position=src["code"]["position"] - 1), "position"),
        (_forged(state, counts={**seg["counts"], "web": seg["counts"]["web"] + 1,
                                "code": seg["counts"]["code"] - 1}), "counts"),
    ]
    for forged, field in cases:
        with pytest.raises(PacktoolError, match=field):
            MixtureSampler(SIZES, CHANGE, rank=0, world_size=1, seed=3).load_state_dict(forged)
    t = MixtureSampler(SIZES, CHANGE, rank=0, world_size=1, seed=3)
    t.load_state_dict(state)  # the true state still loads, and so does one saved after it
    list(t.steps(until=70))
    MixtureSampler(SIZES, CHANGE, rank=0, world_size=4, seed=3).load_state_dict(
        t.state_dict(step=70))


def test_numpy_weights_of_every_kind_are_weights():
    for w in (np.int64(7), np.float64(0.7), np.int32(7), np.float32(0.5), Fraction(7, 10)):
        s = MixtureSampler({"a": 10, "b": 10}, {"a": w, "b": 3}, rank=0, world_size=1)
        assert s.segments[0].shares[0] > 0
    for w in (np.bool_(True), True, np.float64("nan"), np.int64(-1)):
        with pytest.raises(PacktoolError, match="weight"):
            MixtureSampler({"a": 10, "b": 10}, {"a": w, "b": 3}, rank=0, world_size=1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=4).filter(any), st.integers(0, 400))
def test_counts_after_equals_dealing_every_row(shares, rows):
    """The period shortcut (:func:`counts_after`) against dealing row by row."""
    from packtool.train.schedule import Segment, counts_after

    seg = Segment(0, tuple(shares), sum(shares))
    counts = [0] * len(shares)
    deal(seg, 0, counts, rows)
    assert counts_after(seg, rows) == tuple(counts)


def test_which_and_ledger_far_out_answer_without_replay_and_agree_after_a_resume():
    """Step 10^12 is computed, not replayed (issue 38: `which --step 1000000` replayed every
    step, 42 s); a resumed sampler and exhausted='stop' answer as their iteration yields."""
    import signal

    def slow(*_):
        raise TimeoutError("replayed from step 0")

    old = signal.signal(signal.SIGALRM, slow)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=4, batch_size=8)
        rows = 32 * (10**12 - 20)  # since the point at step 20: 25% web, 30% books
        ledger = s.ledger(10**12)
        assert ledger["books"]["rows"] == rows * 3 // 10
        assert ledger["web"]["rows"] == 32 * 20 * 7 // 10 + rows // 4
        assert len(s.which(10**12)) == 4
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    state = MixtureSampler(SIZES, CHANGE, rank=0, world_size=2, batch_size=3,
                           seed=2).state_dict(step=15)
    for kw in ({"exhausted": "next_epoch"}, {"exhausted": "stop"}):
        ranks = []
        for r in range(3):
            t = MixtureSampler(SIZES, CHANGE, rank=r, world_size=3, batch_size=2, seed=2, **kw)
            t.load_state_dict(state)
            ranks.append(list(t.steps(until=80)))
        s = MixtureSampler(SIZES, CHANGE, rank=0, world_size=3, batch_size=2, seed=2, **kw)
        s.load_state_dict(state)
        taken = {n: state["sources"][n]["epoch"] * SIZES[n] + state["sources"][n]["position"]
                 for n in SIZES}
        for k in range(len(ranks[0])):
            assert s.which(15 + k) == [ranks[r][k] for r in range(3)]
            for r in range(3):
                for src, row in ranks[r][k]:
                    assert s.where(row, src, taken[src] // SIZES[src]) == [(15 + k, r)]
                    taken[src] += 1
        if kw["exhausted"] == "stop":
            assert len(ranks[0]) < 65
            with pytest.raises(PacktoolError, match="stops before"):
                s.ledger(15 + len(ranks[0]) + 1)
