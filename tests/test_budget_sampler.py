"""Token-budget steps (``PackSampler(..., tokens_per_step=T, curriculum=...)``): every step one
slot length and exactly T tokens, no row twice in an epoch, the curricula's draws, exact and
elastic resume (world size, T), refusals by name, ``packtool which``."""

from pathlib import Path

import numpy as np
import pytest
from conftest import run

import packtool
from packtool.errors import PacktoolError
from packtool.train.by_length import BLOCK, RowsByLength
from packtool.train.curriculum import GROW_CYCLES, grow_odds, sub_cycle
from packtool.train.sampler import PackSampler

ROOT = Path(__file__).resolve().parent.parent
SLOTS = [256, 512, 1024, 2048]


class Varied:
    """A real packed dataset whose rows get varied slot lengths: what ``pack --vsl``'s
    ``row_lengths()`` / ``row_length(i)`` / ``vsl`` give, until that lands."""

    def __init__(self, ds):
        self.ds, self.index = ds, ds.index
        self.lengths = np.random.default_rng(7).choice(SLOTS, len(ds)).astype(np.int64)
        self.vsl = (SLOTS[0], SLOTS[-1])

    def __len__(self):
        return len(self.ds)

    def row_length(self, i):
        return int(self.lengths[i])

    def row_lengths(self):
        return self.lengths


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("budget")
    fx = ROOT / "fixtures"
    packtool.tokenize_files([str(fx / "corpus" / "part-0.jsonl")], fx / "tokenizer", d / "c",
                            packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
    packtool.pack_corpus([d / "c"], d / "p", 256, "bfd")
    return packtool.open_packed(d / "p")


@pytest.fixture(scope="module")
def vsl(packed):
    """The whole fixture corpus packed with ``--vsl 256:2048``: chunk rows of 2**k, remnant
    rows of 256."""
    d = Path(packed.directory).parent
    fx = ROOT / "fixtures"
    packtool.tokenize_files(sorted(str(f) for f in (fx / "corpus").glob("part-*")),
                            fx / "tokenizer", d / "all",
                            packtool.tokenize.TokenizeOptions(eos="<|eos|>"))
    packtool.pack_corpus([d / "all"], d / "v", 2048, "bfd", vsl="256:2048")
    return packtool.open_packed(d / "v")


def ranks(rows, world, **kw):
    return [PackSampler(rows, rank=r, world_size=world, **kw) for r in range(world)]


def steps_of(samplers):
    """Global steps: per step, every rank's rows (the ranks' steps zipped)."""
    return [list(step) for step in zip(*(list(s.steps()) for s in samplers), strict=True)]


@pytest.mark.parametrize("kind", ["vsl", "varied"])
def test_done_when_one_length_8192_tokens_no_repeat_and_2_to_1_rank_resume(packed, vsl, kind):
    """Issue 32.2's check, on a real ``pack --vsl 256:2048`` dataset and on varied lengths."""
    ds = vsl if kind == "vsl" else Varied(packed)
    if kind == "vsl":
        ds.lengths = ds.row_lengths()
        assert set(ds.lengths.tolist()) <= set(SLOTS) and len(set(ds.lengths.tolist())) > 1
        for i in range(0, len(ds), 5):  # a row's tokens fit its slot
            assert len(ds[i]["input_ids"]) <= ds.row_length(i)
    two = ranks(ds, 2, tokens_per_step=8192)
    steps = steps_of(two)
    assert len(steps) == two[0].n_steps == sum(
        int((ds.lengths == v).sum()) // (8192 // v) for v in SLOTS) > 5
    for step in steps:
        rows = [i for r in step for i in r]
        assert len({ds.row_length(i) for i in rows}) == 1  # one length
        assert sum(ds.row_length(i) for i in rows) == 8192  # exactly T token slots
        assert len(step[0]) == len(step[1])  # dealt evenly
    flat = [i for step in steps for r in step for i in r]
    left = two[0].left_out().tolist()
    assert len(flat) == len(set(flat))  # no row twice in the epoch
    assert sorted(flat + left) == list(range(len(ds)))  # the rest left out, named
    for v in SLOTS:  # fewer than a step of each length left over
        assert sum(ds.row_length(i) == v for i in left) < 8192 // v

    state = two[0].state_dict(step=5)
    assert state == two[1].state_dict(step=5)  # every rank saves the same state
    one = PackSampler(ds, rank=0, world_size=1, tokens_per_step=8192)
    one.load_state_dict(state)
    assert one.start_step == 5
    after = [i for b in one.steps() for i in b]
    before = [i for step in steps[:5] for r in step for i in r]
    assert len(before + after) == len(set(before + after))  # nothing repeated
    assert sorted(before + after + one.left_out().tolist()) == list(range(len(ds)))
    assert after == [i for step in steps[5:] for r in step for i in r]  # same steps, one rank


def test_fixed_length_dataset_takes_t_over_seq_len_rows(packed):
    two = ranks(packed, 2, tokens_per_step=1024)  # seq_len 256: 4 rows a step, 2 a rank
    steps = steps_of(two)
    assert len(steps) == len(packed) // 4 and all(len(r) == 2 for s in steps for r in s)
    flat = [i for s in steps for r in s for i in r]
    assert len(set(flat)) == len(flat) == len(packed) - len(packed) % 4
    assert two[0].state_dict(3)["rows"] == {"256": len(packed)}


def test_uniform_draws_in_proportion_to_tokens_left():
    lengths = np.repeat([512, 1024, 4096], [400, 100, 40])  # tokens 204,800 : 102,400 : 163,840
    s = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=8192, seed=3)
    state = s.state_dict(step=20)
    # after 20 steps: craft the counts (320 rows of 512 = 20 steps), tokens left 40,960 :
    # 102,400 : 163,840; as a resume's origin (the draws of steps 0..19 would not give them)
    state["consumed"] = {"512": 320, "1024": 0, "4096": 0}
    state["origin"] = {"step": 20, "tokens": 320 * 512, "consumed": state["consumed"]}
    n, counts = 3000, {512: 0, 1024: 0, 4096: 0}
    for e in range(n):
        t = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=8192, seed=3)
        t.load_state_dict({**state, "epoch": e})
        counts[int(lengths[t.which(20, e)[0][0]])] += 1
    left = np.array([40960, 102400, 163840], float)
    for (length, got), p in zip(counts.items(), left / left.sum(), strict=True):
        assert abs(got - n * p) < 4 * np.sqrt(n * p * (1 - p)), (length, got, n * p)


def olmo_odds(bucket, k):
    """OLMo-core's VSLGrowP2Curriculum._get_bucket_odds_for_cycle, as it reads."""
    out, start = [], k - bucket
    for cycle in range(k):
        exp = start + cycle if start + cycle <= k else start - ((start + cycle) % k)
        out.append(2 ** (exp - 1))
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_grow_p2_odds_are_olmo_cores(k):
    assert grow_odds(k).T.tolist() == [olmo_odds(b, k) for b in range(k)]


def test_grow_p2_cycles_from_short_to_long():
    lengths = np.repeat([256, 512, 1024], [24000, 12000, 6000])  # equal tokens each
    s = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=4096, curriculum="grow-p2")
    drawn = s.step_lengths()
    assert len(drawn) == s.n_steps
    done = np.concatenate([[0], np.cumsum(np.full(len(drawn), 4096))[:-1]])
    where = [sub_cycle(int(d), int(lengths.sum()), 3) for d in done]
    for c in range(GROW_CYCLES - 1):  # the last cycle runs out of what the draws took
        favourite = []
        for j in range(3):
            got = drawn[[w == (c, j) for w in where]]
            favourite.append(int(np.bincount(got).argmax()))
        assert favourite == [256, 512, 1024], (c, favourite)
    uniform = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=4096).step_lengths()
    first = uniform[[w == (0, 0) for w in where]]
    assert (first == 256).mean() < 0.5 < (drawn[[w == (0, 0) for w in where]] == 256).mean()


def test_callable_curriculum_weights_and_refusals():
    lengths = np.repeat([512, 1024], [200, 100])
    s = PackSampler(lengths, rank=0, world_size=2, tokens_per_step=8192,
                    curriculum=lambda step: {512: 1, 1024: 0} if step < 5 else [0, 1])
    got = []
    with pytest.raises(PacktoolError, match="weight 0 for every length that can still fill"):
        for rows in s.steps():  # 512 still fills 7 steps, but has weight 0 from step 5 on
            got.append(int(lengths[rows[0]]))
    assert got == [512] * 5 + [1024] * 12
    bad = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=8192,
                      curriculum=lambda step: {4096: 1})
    with pytest.raises(PacktoolError, match="weighs length 4096, which no row has"):
        bad.step_lengths()
    neg = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=8192,
                      curriculum=lambda step: [1, -1])
    with pytest.raises(PacktoolError, match="finite number >= 0"):
        neg.step_lengths()


def test_elastic_resume_into_another_t_and_world_size():
    lengths = np.random.default_rng(1).choice([256, 1024, 4096], 3000).astype(np.int64)
    two = ranks(lengths, 2, tokens_per_step=8192, seed=5)
    steps = steps_of(two)
    state = two[1].state_dict(step=7)
    for world, t in ((1, 16384), (4, 32768), (2, 8192)):
        new = ranks(lengths, world, tokens_per_step=t, seed=5)
        for s in new:
            s.load_state_dict(state)
        rest = steps_of(new)
        for step in rest:
            rows = [i for r in step for i in r]
            assert len(set(lengths[rows])) == 1 and int(lengths[rows].sum()) == t
        before = [i for step in steps[:7] for r in step for i in r]
        after = [i for step in rest for r in step for i in r]
        assert len(before + after) == len(set(before + after))
        assert sorted(before + after + new[0].left_out().tolist()) == list(range(3000))
        assert new[0].start_step == 7 and len(rest) == new[0].n_steps - 7
        if t == 8192:  # the same shape: the uninterrupted run's steps
            assert rest == steps[7:]


def test_resume_every_step_and_handed_out_state_deterministic():
    lengths = np.repeat([512, 1024, 2048], [96, 64, 40])
    a = PackSampler(lengths, rank=1, world_size=2, tokens_per_step=4096, seed=9,
                    curriculum="grow-p2")
    a.set_epoch(2)
    full = list(a.steps())
    again = PackSampler(lengths, rank=1, world_size=2, tokens_per_step=4096, seed=9,
                        curriculum="grow-p2")
    again.set_epoch(2)
    assert list(again.steps()) == full  # deterministic
    other = PackSampler(lengths, rank=1, world_size=2, tokens_per_step=4096, seed=10,
                        curriculum="grow-p2")
    other.set_epoch(2)
    assert list(other.steps()) != full
    again.set_epoch(3)
    third = list(again.steps())
    assert third != full
    for s in range(len(full) + 1):
        t = PackSampler(lengths, rank=1, world_size=2, tokens_per_step=4096, seed=9,
                        curriculum="grow-p2")
        t.load_state_dict(a.state_dict(step=s))
        # at the end the state points at step 0 of epoch 3
        assert list(t.steps()) == (full[s:] if s < len(full) else third)
    b = PackSampler(lengths, rank=1, world_size=2, tokens_per_step=4096, seed=9,
                    curriculum="grow-p2")
    b.set_epoch(2)
    it = b.steps()
    next(it), next(it)
    handed = b.state_dict()  # torchdata's protocol: what steps() handed out
    assert handed["step"] == 2 and handed == a.state_dict(step=2)


def test_places_and_left_out_match_the_schedule():
    lengths = np.random.default_rng(2).choice([256, 512, 2048], 2 * BLOCK + 77).astype(np.int64)
    s = PackSampler(lengths, rank=0, world_size=2, tokens_per_step=4096, seed=4)
    s.set_epoch(1)
    where = {}
    for step, row in enumerate(s.global_schedule(), start=0):
        for rank, rows in enumerate(row.tolist()):
            for i in rows:
                where[i] = [(step, rank)]
    for i in np.random.default_rng(0).choice(len(lengths), 40, replace=False).tolist():
        assert s.where(i) == where.get(i, []), i
    assert set(s.left_out().tolist()) == set(range(len(lengths))) - set(where)


def test_rows_by_length_select_and_locate_equal_naive():
    rng = np.random.default_rng(3)
    lengths = np.concatenate([np.full(BLOCK + 5, 512), rng.choice([256, 512, 8192], 3 * BLOCK)])
    index = RowsByLength(lengths.astype(np.int64))
    assert index.values.tolist() == [256, 512, 8192]
    for k, v in enumerate(index.values.tolist()):
        members = np.flatnonzero(lengths == v)
        assert index.sizes[k] == len(members)
        pos = np.concatenate([[0, len(members) - 1], rng.integers(0, len(members), 200)])
        assert index.select(k, pos).tolist() == members[pos].tolist()
        for p in pos[:40].tolist():
            assert index.locate(int(members[p])) == (k, p)


def test_balance_within_a_step_deals_the_same_rows_more_evenly():
    lengths = np.repeat([256, 1024], [512, 128])
    costs = np.random.default_rng(5).lognormal(0, 1.5, len(lengths))
    plain = PackSampler(lengths, rank=0, world_size=4, tokens_per_step=8192, seed=1)
    even = PackSampler(lengths, rank=0, world_size=4, tokens_per_step=8192, seed=1,
                       balance=costs)
    worse = 0
    for a, b in zip(plain.global_schedule(), even.global_schedule(), strict=True):
        assert sorted(a.ravel().tolist()) == sorted(b.ravel().tolist())
        assert costs[b].sum(axis=1).max() <= costs[a].sum(axis=1).max() + 1e-9
        worse += costs[b].sum(axis=1).max() < costs[a].sum(axis=1).max()
    assert worse > 0
    plain_resumed = PackSampler(lengths, rank=0, world_size=4, tokens_per_step=8192, seed=1)
    plain_resumed.load_state_dict(even.state_dict(step=2))  # balance consumes nothing
    assert [x.tolist() for x in plain_resumed.global_schedule()] == \
        [x.tolist() for x in plain.global_schedule()[2:]]


def test_refusals_by_name(packed):
    lengths = np.repeat([512, 1536], [64, 64])
    with pytest.raises(PacktoolError, match="not a multiple of slot length 1,536"):
        PackSampler(lengths, rank=0, world_size=1, tokens_per_step=8192)
    with pytest.raises(PacktoolError, match="which 4 ranks cannot share evenly"):
        PackSampler(np.repeat([512, 2048], 8), rank=0, world_size=4, tokens_per_step=4096)
    for kw, what in (({"batch_size": 2}, "batch_size"), ({"drop_last": False}, "drop_last")):
        with pytest.raises(PacktoolError, match=f"{what} does not apply with tokens_per_step"):
            PackSampler(lengths, rank=0, world_size=1, tokens_per_step=3072, **kw)
    with pytest.raises(PacktoolError, match="give tokens_per_step=T too"):
        PackSampler(100, rank=0, world_size=1, curriculum="grow-p2")
    with pytest.raises(PacktoolError, match="'grow' is not one of uniform, grow-p2"):
        PackSampler(lengths, rank=0, world_size=1, tokens_per_step=3072, curriculum="grow")
    with pytest.raises(PacktoolError, match="int gives none"):
        PackSampler(100, rank=0, world_size=1, tokens_per_step=3072)

    budget = PackSampler(Varied(packed), rank=0, world_size=2, tokens_per_step=8192)
    fixed = PackSampler(packed, rank=0, world_size=2, batch_size=2)
    with pytest.raises(PacktoolError, match="fixed-length PackSampler's state"):
        budget.load_state_dict(fixed.state_dict(step=1))
    with pytest.raises(PacktoolError, match="token-budget sampler's state"):
        fixed.load_state_dict(budget.state_dict(step=1))
    good = budget.state_dict(step=3)
    for change, what in (({"seed": 1}, "seed=1"), ({"step": 4}, "step=4 but consumed"),
                         ({"rows": {"256": 1}}, "for lengths"), ({"version": 2}, "version 2"),
                         ({"dataset": "x" * 64}, "another packed dataset"),
                         ({"origin": {"step": 0}}, "origin="), ({"epoch": -1}, "epoch=-1")):
        with pytest.raises(PacktoolError, match=what):
            budget.load_state_dict({**good, **change})
    with pytest.raises(PacktoolError, match="lacks tokens_per_step"):
        budget.load_state_dict({k: v for k, v in good.items() if k != "tokens_per_step"})


def test_which_names_a_token_budget_steps_rows(packed):
    from packtool.train.which import which_step

    path = packed.directory
    s = PackSampler(packed, rank=0, world_size=2, tokens_per_step=1024, seed=2)
    res = which_step(path, 0, 3, world_size=2, seed=2, tokens_per_step=1024)
    assert sorted({g.pack for g in res.segments}) == sorted(np.ravel(s.which(3, 0)).tolist())
    r = run("which", path, "--step", 3, "--world-size", 2, "--seed", 2, "--tokens-per-step",
            1024, "--json")
    assert r.exit_code == 0, r.output
    r = run("which", path, "--step", 0, "--world-size", 3, "--tokens-per-step", 1024)
    assert r.exit_code != 0 and "which 3 ranks cannot share evenly" in r.output


def test_consumed_moved_between_lengths_is_refused():
    """Rows moved between lengths with the same token total (2 rows of 512 for 1 of 1024) agree
    with the step's token count but not with the draws that made them: the sampler would repeat
    and skip rows (issue 38). Refused, also for a state saved after an elastic resume."""
    lengths = np.repeat([512, 1024, 4096], [300, 120, 30])
    s = PackSampler(lengths, rank=0, world_size=2, tokens_per_step=8192, seed=1)
    state = s.state_dict(step=7)
    c = state["consumed"]
    assert c["512"] >= 2
    forged = {**state, "consumed": {**c, "512": c["512"] - 2, "1024": c["1024"] + 1}}
    with pytest.raises(PacktoolError, match="consumed"):
        PackSampler(lengths, rank=0, world_size=2, tokens_per_step=8192,
                    seed=1).load_state_dict(forged)
    t = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=16384, seed=1)
    t.load_state_dict(state)
    later = t.state_dict(step=12)
    c = later["consumed"]
    forged = {**later, "consumed": {**c, "512": c["512"] + 2, "1024": c["1024"] - 1}}
    with pytest.raises(PacktoolError, match="consumed"):
        PackSampler(lengths, rank=0, world_size=2, tokens_per_step=8192,
                    seed=1).load_state_dict(forged)
    PackSampler(lengths, rank=0, world_size=2, tokens_per_step=8192,
                seed=1).load_state_dict(later)


@pytest.mark.parametrize("curriculum", ["uniform", "grow-p2"])
def test_the_draw_kernel_equals_the_draw_step_by_step(curriculum):
    """An epoch's lengths come from one kernel pass (curriculum.draw_steps); the reference is
    curriculum.draw, one step at a time, from the epoch's start and from a step inside it."""
    rng = np.random.default_rng(3)
    for trial in range(4):
        lengths = rng.choice([256, 512, 1024, 2048], int(rng.integers(50, 3000))).astype(np.int64)
        s = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=4096, seed=trial,
                        curriculum=curriculum)
        c, want, at = np.zeros(len(s.lengths), np.int64), [], []
        while (k := s._next(0, len(want), c)) is not None:
            at.append(c.copy())
            want.append(k)
            c[k] += s.per_step[k]
        assert s.step_lengths().tolist() == s.lengths[want].tolist()
        mid = len(want) // 2
        ks, stop = s.draws(0, mid, at[mid], until=mid + 7)
        assert ks.tolist() == want[mid:mid + 7] and stop is None


def test_mulhi_is_the_high_half_of_the_product():
    from packtool.train.curriculum import _mulhi

    rng = np.random.default_rng(0)
    edge = [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
    pairs = [(a, b) for a in edge for b in edge] + [
        (int(a), int(b)) for a, b in rng.integers(0, 2**64, (200, 2), dtype=np.uint64)]
    for a, b in pairs:
        assert int(_mulhi(np.uint64(a), np.uint64(b))) == (a * b) >> 64, (a, b)


def test_which_and_where_look_steps_up_without_drawing_again():
    """Issue 38: which(step) and where(row) replayed the draws from the last remembered step
    (every 256; from 0 before); now an epoch's draws are made once and a question is a binary
    search: asking late steps again calls the curriculum no more."""
    calls = []

    def curriculum(step):
        calls.append(step)
        return [1, 2]

    lengths = np.repeat([512, 1024], [4000, 2000])
    s = PackSampler(lengths, rank=0, world_size=1, tokens_per_step=4096, curriculum=curriculum)
    last = s.n_steps - 1
    first = s.which(last)
    drawn = len(calls)
    assert drawn == s.n_steps
    row = first[0][0]
    assert s.which(last) == first and s.where(row) == [(last, 0)]
    assert [s.which(t) for t in (last - 300, 700, 3)] and len(calls) == drawn
