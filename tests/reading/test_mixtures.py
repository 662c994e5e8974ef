"""Mixtures (G17): the schedule's arithmetic (pure, Hypothesis), and real loaders over three differently sized
Parquet datasets: exact per-batch counts, the pass rule, equal steps on every rank, exact resume, a changed mixture,
DataLoader workers, one schema, and the refusals."""
import json
import re
from fractions import Fraction
from itertools import islice
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import datagen, plan_shards
from petastorm_balanced.core.mixture import MAX_PERIOD, Mixture, Point, Schedule, make_schedule, parse_weights

torch = pytest.importorskip("torch")

from petastorm_balanced import BalancedIterableDataset, make_loader  # noqa: E402
from petastorm_balanced.errors import InvalidValueError  # noqa: E402
from petastorm_balanced.reading.state import flat, nest  # noqa: E402
from tests.support.resume_contract import check_resume_contract  # noqa: E402

SIZES = (1500, 640, 310)  # three differently sized sources
SEEDS = (3, 4, 5)

weights_st = st.lists(st.integers(1, 12), min_size=2, max_size=5)


# ---------------------------------------------------------------- the schedule (pure)

@settings(max_examples=300, deadline=None)
@given(weights=weights_st, batch_size=st.integers(1, 70), start=st.integers(0, 500))
def test_every_batch_holds_floor_or_ceil_and_the_running_count_stays_within_one_row(weights, batch_size, start):
    schedule = make_schedule(parse_weights(weights, len(weights)), batch_size)
    shares = np.array([float(s) for s in schedule.shares])
    batches = 3 * schedule.period + 7
    counts = schedule.counts(start, start + batches)  # (batches, sources)
    assert (counts.sum(axis=1) == batch_size).all()
    assert ((counts == np.floor(shares)) | (counts == np.ceil(shares))).all()
    running = np.cumsum(schedule.counts(0, start + batches), axis=0)  # from the schedule's origin
    ideal = np.arange(1, start + batches + 1)[:, None] * shares
    assert (np.abs(running - ideal) < 1 - 1e-9).all(), "the running count is within one row of the weights"
    window = counts.sum(axis=0)
    assert (np.abs(window - shares * batches) < 2).all(), "any run of batches is within two rows"
    assert (schedule.consumed(start + batches) - schedule.consumed(start) == window).all()


def test_weights_are_read_as_small_fractions():
    assert parse_weights([0.7, 0.3], 2) == (Fraction(7, 10), Fraction(3, 10))
    assert parse_weights([1, 1, 2], 3) == (Fraction(1, 4), Fraction(1, 4), Fraction(1, 2))
    for bad, message in (([0.5], "one weight per plan"), ([1, 0], "positive"), ([1, -2], "positive"),
                         ([1, float("nan")], "positive"), ("0.5,0.5", "list")):
        with pytest.raises((ValueError, TypeError), match=message):
            parse_weights(bad, 2)
    with pytest.raises(ValueError, match="small common denominator"):
        make_schedule(parse_weights([1 / 9973, 1 / 9967, 1 / 9949], 3), 7)
    assert MAX_PERIOD >= 1 << 20


def _check_schedule(schedule, weights, batches):
    """Every batch floor or ceil of its share, and the running count within one row of the weights as given."""
    total = sum(weights)
    shares = [Fraction(schedule.batch_size) * w / total for w in weights]
    counts = schedule.counts(0, batches)
    assert (counts.sum(axis=1) == schedule.batch_size).all()
    for i, share in enumerate(shares):
        assert set(counts[:, i].tolist()) <= {share.numerator // share.denominator,
                                              -(-share.numerator // share.denominator)}
        running = np.cumsum(counts[:, i])
        ideal = [share * t for t in range(1, batches + 1)]
        assert all(abs(int(r) - q) < 1 for r, q in zip(running.tolist(), ideal, strict=True))


@settings(max_examples=60, deadline=None)
@given(digits=st.lists(st.tuples(st.integers(1, 9), st.integers(-7, 2)), min_size=2, max_size=3),
       batch_size=st.integers(1, 64))
def test_any_positive_finite_weights_are_honoured_as_given_or_refused_naming_the_weight(digits, batch_size):
    weights = [m * 10.0 ** e for m, e in digits]  # what users type: 4e-05, 0.7, 300.0
    parsed = parse_weights(weights, len(weights))
    assert sum(parsed) == 1
    assert all(abs(float(p / parsed[0]) - w / weights[0]) <= 1e-12 * w / weights[0]
               for p, w in zip(parsed, weights, strict=True)), "the shares are the weights given, not rounded ones"
    try:
        schedule = make_schedule(parsed, batch_size)
    except ValueError as exc:
        assert re.search(r"weights\[\d\] is .* repeats only every", str(exc)), exc
        return
    _check_schedule(schedule, [Fraction(str(w)) for w in weights], min(3 * schedule.period, 3000))


def test_tiny_and_equal_tiny_weights_and_refusals_name_the_weight():
    for weights in ([4e-5, 1], [1e-6, 1e-6], [1e-6, 3e-6], [1 / 3, 1 / 3, 1 / 3]):
        parsed = parse_weights(weights, len(weights))
        _check_schedule(make_schedule(parsed, 16), parsed, 2000)
    assert parse_weights([4e-5, 1], 2) == (Fraction(1, 25001), Fraction(25000, 25001))
    for bad in (0, -1.5, float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match=r"weights\[1\]=.* must be a positive finite number"):
            parse_weights([1, bad], 2)


@settings(max_examples=200, deadline=None)
@given(weights=weights_st, batch_size=st.integers(1, 40), data=st.data())
def test_default_epochs_follow_the_scarcest_source_and_start_agrees_with_walking(weights, batch_size, data):
    schedule = make_schedule(parse_weights(weights, len(weights)), batch_size)
    rows = tuple(data.draw(st.integers(int(-(-s // 1)), 400)) for s in schedule.shares)
    steps = data.draw(st.none() | st.integers(1, 50))
    mixture = Mixture(schedule, rows, steps)
    point = mixture.start(0)
    s = mixture.scarcest
    for epoch in range(1, 6):
        point = mixture.next_epoch(point)
        assert point == mixture.start(epoch), "a fresh loader's epoch e is where e epochs of walking lead"
        if steps is None:  # epoch e starts just after the scarcest source's pass e ends, inside one batch
            assert epoch * rows[s] <= point.counters[s] < epoch * rows[s] + -(-schedule.shares[s] // 1)
        else:
            assert mixture.steps_of(point) == steps
        # a point inside the epoch says the same end
        length = mixture.steps_of(point)
        middle = mixture.advance(point, length // 2)
        assert mixture.steps_of(middle) == length


@settings(max_examples=200, deadline=None)
@given(weights=weights_st, batch_size=st.integers(1, 40), data=st.data())
def test_jumping_epochs_is_arithmetic_and_agrees_with_walking_from_any_point(weights, batch_size, data):
    schedule = make_schedule(parse_weights(weights, len(weights)), batch_size)
    rows = tuple(data.draw(st.integers(int(-(-s // 1)), 300)) for s in schedule.shares)
    mixture = Mixture(schedule, rows, data.draw(st.none() | st.integers(1, 40)))
    # any point: counters where a resume with other weights or at another world size may leave them
    counters = tuple(data.draw(st.integers(0, 5 * r)) for r in rows)
    point = Point(data.draw(st.integers(0, 9)), 0, data.draw(st.integers(0, schedule.period - 1)), counters)
    point = mixture.advance(point, data.draw(st.integers(0, max(mixture.remaining(point) - 1, 0))))
    walked = point
    for epochs in range(1, 7):
        walked = mixture.next_epoch(walked)
        assert mixture.next_epoch(point, epochs) == walked


# ---------------------------------------------------------------- real loaders

@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three plain datasets of different sizes; ids are unique inside each."""
    root = tmp_path_factory.mktemp("mixture")
    infos = [datagen.make_plain_dataset(root / f"s{i}", num_files=3, total_rows=n, seed=seed, min_row_group_rows=16,
                                        max_row_group_rows=200)
             for i, (n, seed) in enumerate(zip(SIZES, SEEDS, strict=True))]
    return [info.url for info in infos]


@pytest.fixture(scope="module")
def plans(sources):
    return [plan_shards(url, 2, batch_size=16, seed=7 + i, engine="local") for i, url in enumerate(sources)]


def loaders(plans, world, **kwargs):
    kwargs.setdefault("weights", [5, 3, 2])
    kwargs.setdefault("shuffle_window", 64)
    return [make_loader(rank, world, plan=plans, backend="arrow", workers_count=1, **kwargs) for rank in range(world)]


def rows_of(batch):
    return list(zip(batch["_source"].tolist(), batch["id"].tolist(), strict=True))


def read_epoch(loader, count=None):
    return [rows_of(b) for b in islice(iter(loader), count)]


@settings(max_examples=12, deadline=None)
@given(weights=st.lists(st.integers(1, 9), min_size=3, max_size=3), world=st.integers(1, 3),
       batch_size=st.integers(3, 24), window=st.sampled_from([1, 50, 10_000]), epochs=st.integers(1, 3),
       epoch_steps=st.none() | st.integers(2, 30))
def test_each_batch_holds_its_shares_ranks_take_equal_steps_and_no_row_repeats_in_its_pass(
        plans, weights, world, batch_size, window, epochs, epoch_steps):
    try:
        ranks = loaders(plans, world, weights=weights, batch_size=batch_size, shuffle_window=window,
                        epoch_steps=epoch_steps)
    except ValueError as exc:  # a source with fewer rows per rank than its share of a batch: refused, said so
        assert "fewer than its share of one batch" in str(exc)
        return
    schedule = ranks[0]._settings.mixture.schedule
    per_pass = ranks[0]._settings.mixture.rows_per_pass
    delivered = {r: [] for r in range(world)}  # rank -> rows in delivery order
    done = 0
    for _ in range(epochs):
        lengths = {len(loader) for loader in ranks}
        assert len(lengths) == 1, "every rank has the same steps"
        epoch = [read_epoch(loader) for loader in ranks]
        assert {len(e) for e in epoch} == lengths, "each rank takes len(loader) batches"
        if epoch_steps is not None:
            assert lengths == {epoch_steps}
        expected = schedule.counts(done, done + lengths.pop())
        for r, batches in enumerate(epoch):
            for b, batch in enumerate(batches):
                assert len(batch) == batch_size
                counts = np.bincount([s for s, _ in batch], minlength=3)
                assert counts.tolist() == expected[b].tolist(), "each source's share, as scheduled, on every rank"
            delivered[r] += [row for batch in batches for row in batch]
        done += len(epoch[0])
    for s, (n, rows) in enumerate(zip(SIZES, per_pass, strict=True)):
        mine = {r: [i for src, i in delivered[r] if src == s] for r in range(world)}
        for p in range(max(len(m) for m in mine.values()) // rows + 1):
            this_pass = [i for r in range(world) for i in mine[r][p * rows:(p + 1) * rows]]
            assert len(set(this_pass)) == len(this_pass), f"source {s}: a row twice in pass {p}"
            assert set(this_pass) <= set(range(n))
            if all(len(m) >= (p + 1) * rows for m in mine.values()):  # a whole pass: every row but < world
                assert n - len(this_pass) < world


@settings(max_examples=8, deadline=None)
@given(cut=st.integers(0, 80), weights=st.sampled_from([[5, 3, 2], [1, 1, 1], [0.6, 0.25, 0.15]]),
       epoch_steps=st.none() | st.integers(5, 20))
def test_resume_at_any_batch_gives_exactly_the_batches_that_would_have_come(plans, cut, weights, epoch_steps):
    def make():
        return make_loader(1, 2, plan=plans, weights=weights, batch_size=10, shuffle_window=40, backend="arrow",
                           workers_count=1, epoch_steps=epoch_steps)
    reference, loader = make(), make()
    ref = read_epoch(reference) + read_epoch(reference) + read_epoch(reference)
    head = []
    while len(head) < min(cut, len(ref) - 1):
        head += read_epoch(loader, min(cut, len(ref) - 1) - len(head))
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    rest = []
    while len(head) + len(rest) < len(ref):
        rest += read_epoch(resumed)
    assert head + rest == ref


def test_resume_contract(plans):
    def make():
        return make_loader(0, 2, plan=plans, weights=[5, 3, 2], batch_size=10, shuffle_window=40, backend="arrow",
                           workers_count=1, epoch_steps=12)

    check_resume_contract(make, iter, epochs=3)


def test_resume_contract_of_the_dataset(plans):
    def make():
        return BalancedIterableDataset(plans, 1, 2, weights=[5, 3, 2], batch_size=10, shuffle_window=40,
                                       backend="arrow", epoch_steps=12)

    check_resume_contract(make, iter, epochs=3, cuts=[1, 5, -1, 0])


def test_the_state_names_each_source_and_a_changed_mixture_continues_each_source_where_it_stood(plans):
    before = make_loader(0, 1, plan=plans, weights=[5, 3, 2], batch_size=10, shuffle_window=40, backend="arrow",
                         workers_count=1)
    rows = before._settings.mixture.rows_per_pass
    head = read_epoch(before, 37)
    state = before.state_dict()
    taken = [sum(1 for b in head for s, _ in b if s == i) for i in range(3)]
    assert state["mixture"]["sources"] == [list(divmod(t, r)) for t, r in zip(taken, rows, strict=True)]
    assert state["mixture"]["weights"] == ["1/2", "3/10", "1/5"]
    after = make_loader(0, 1, plan=plans, weights=[1, 1, 8], batch_size=10, shuffle_window=40, backend="arrow",
                        workers_count=1)
    after.load_state_dict(state)
    assert after.epoch == state["epoch"]
    tail = []
    for _ in range(3):
        tail += read_epoch(after)
    assert {tuple(np.bincount([s for s, _ in b], minlength=3)) for b in tail} == {(1, 1, 8)}
    # every source continues at its counter: its rows are those an unchanged loader would deliver there
    solo = make_loader(0, 1, plan=plans, weights=[5, 3, 2], batch_size=10, shuffle_window=40, backend="arrow",
                       workers_count=1)
    reference = []
    for _ in range(25):
        reference += read_epoch(solo)
    for i in range(3):
        theirs = [r for b in reference for s, r in b if s == i]
        ours = [r for b in head + tail for s, r in b if s == i]
        assert ours == theirs[:len(ours)], f"source {i} continues where it stood, in its pass's order"
        for p in range(len(ours) // rows[i] + 1):
            one = ours[p * rows[i]:(p + 1) * rows[i]]
            assert len(set(one)) == len(one), f"source {i}: no row twice in pass {p}"


def test_one_schema_for_every_source_and_batch(plans):
    loader = make_loader(0, 2, plan=plans, weights=[1, 1, 1], batch_size=12, backend="arrow", padding_mask=True,
                         schema_fields=["id", "value", "text"])
    assert loader.schema.names == ("id", "value", "text", "_padding", "_source")
    for batch in islice(iter(loader), 5):
        loader.schema.check(batch)
        assert not batch["_padding"].any()
    assert len(loader.plan) == 3


def test_a_mixture_is_read_by_the_one_loader_class_and_one_plan_has_the_weight_one(plans):
    """``make_loader`` gives a ``BalancedLoader`` for any number of plans (its documented return type), a mixture's
    batches counted into the same ``state_dict`` the loop saves; one plan reads as a mixture of one, weight 1."""
    import petastorm_balanced as pb

    mixture = make_loader(0, 2, plan=plans[:2], weights=[3, 1], batch_size=8, backend="arrow", batch_format="numpy")
    one = make_loader(0, 2, plan=plans[0], batch_size=8, backend="arrow", batch_format="numpy")
    assert isinstance(mixture, pb.BalancedLoader) and isinstance(one, pb.BalancedLoader)
    assert mixture.weights == (Fraction(3, 4), Fraction(1, 4)) and one.weights == (Fraction(1),)
    taken = list(islice(iter(mixture), 3))
    assert [int((b["_source"] == 0).sum()) for b in taken] == [6, 6, 6]
    assert flat(mixture.state_dict())["batches"] == 3
    with pytest.raises(InvalidValueError, match="steps_of"):
        mixture.steps_of(0)
    assert one.steps_of(0) == len(one)


@pytest.fixture(scope="module")
def odd_sources(tmp_path_factory):
    """A dataset whose ``label`` is int64 (the others' is int32) and which has an extra column."""
    root = tmp_path_factory.mktemp("odd")
    n = 400
    table = pa.table({"id": pa.array(np.arange(n), pa.int64()), "label": pa.array(np.arange(n) % 10, pa.int64()),
                      "extra": pa.array(np.ones(n))})
    pq.write_table(table, root / "part-0.parquet", row_group_size=100)
    return "file://" + str(root)


def test_columns_are_the_shared_ones_and_types_must_agree(plans, odd_sources):
    odd = plan_shards(odd_sources, 2, batch_size=16, engine="local")
    with pytest.raises(ValueError, match=r"column 'label' is int64 .* in source 1 .* cast one of the datasets"):
        make_loader(0, 2, plan=[plans[0], odd], weights=[1, 1], backend="arrow")
    loader = make_loader(0, 2, plan=[plans[0], odd], weights=[1, 1], backend="arrow", schema_fields=["id"])
    assert loader.schema.names == ("id", "_source")
    with pytest.raises(ValueError, match="source 1 .*matches no column"):
        make_loader(0, 2, plan=[plans[0], odd], weights=[1, 1], backend="arrow", schema_fields=["lang"])


def test_refusals_name_the_parameter_and_the_fix(plans):
    base = dict(weights=[1, 1, 1], batch_size=10, backend="arrow")
    cases = [
        (dict(weights=None), "needs weights="),
        (dict(weights=[1, 1]), "one weight per plan"),
        (dict(partition_epoch=2), "pass epoch_steps= instead"),
        (dict(balance="cost"), r"source 0 .*balance='cost' needs a plan made with a cost"),
        (dict(max_batch_cost=100, batch_size=None), "decided by the weights"),
        (dict(epoch_steps=0), "epoch_steps=0 must be >= 1"),
        (dict(batch_size=2000), "fewer than its share of one batch"),
    ]
    for change, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            make_loader(0, 2, plan=plans, **{**base, **change})
    with pytest.raises(ValueError, match="apply to a mixture"):
        make_loader(0, 2, plan=plans[0], weights=[1], batch_size=10)
    with pytest.raises(ValueError, match="apply to a mixture"):
        BalancedIterableDataset(plans[0], 0, 2, batch_size=10, epoch_steps=3)
    state = make_loader(0, 2, plan=plans, **base).state_dict()
    with pytest.raises(ValueError, match="saved by a loader of one plan"):
        make_loader(0, 2, plan=plans, **base).load_state_dict(make_loader(0, 2, plan=plans[0], batch_size=10,
                                                                          backend="arrow").state_dict())
    values = flat(state)
    with pytest.raises(ValueError, match="row"):
        make_loader(0, 2, plan=plans, **base).load_state_dict(nest({**values, "sources": [[0, 10**6]] * 3}))
    with pytest.raises(KeyError, match="phase"):
        broken = nest({k: v for k, v in values.items() if k != "phase"})
        make_loader(0, 2, plan=plans, **base).load_state_dict(broken)


def test_inspect_shows_steps_rows_and_passes_of_each_source(plans, tmp_path, capsys):
    from petastorm_balanced.tools.cli import main
    urls = [plan.save(str(tmp_path / f"plan{i}")) for i, plan in enumerate(plans)]
    assert main(["inspect", *urls, "--weights", "0.5,0.3,0.2", "--world-size", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    loader = make_loader(0, 2, plan=plans, weights=[0.5, 0.3, 0.2], backend="arrow", workers_count=1)
    assert report["epochs"][0]["steps"] == len(loader)
    taken = np.zeros(3, dtype=np.int64)
    for batch in loader:
        taken += np.bincount(batch["_source"].numpy(), minlength=3)
    assert [s["rows_per_rank"] for s in report["epochs"][0]["sources"]] == taken.tolist()
    assert report["epochs"][1]["sources"][0]["start"] == loader.state_dict()["mixture"]["sources"][0]
    assert main(["inspect", *urls, "--weights", "1,1,1", "--world-size", "2"]) == 0
    assert "scarcest" in capsys.readouterr().out
    assert main(["inspect", *urls]) == 2
    assert "--weights" in capsys.readouterr().err


def test_inspect_measures_a_mixtures_shuffle_quality_and_says_what_workers_read(plans, tmp_path, capsys):
    from petastorm_balanced.core.quality import Quality
    from petastorm_balanced.tools.cli import main
    from petastorm_balanced.tools.shuffle_quality import _binner
    urls = [plan.save(str(tmp_path / f"plan{i}")) for i, plan in enumerate(plans)]
    args = ["inspect", *urls, "--weights", "0.5,0.3,0.2", "--world-size", "2", "--shuffle-quality", "id"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    quality = report["shuffle_quality"]
    assert (quality["world_size"], quality["batch_size"], quality["column"]) == (2, 16, "id")
    # the mixture loader's own batches, measured the same way
    per_rank = [[b["id"].numpy() for b in make_loader(r, 2, plan=plans, weights=[0.5, 0.3, 0.2], backend="arrow")]
                for r in range(2)]
    reference = np.concatenate([b for batches in per_rank for b in batches])
    binned = _binner(reference)
    step = Quality.of([binned(np.concatenate(s)) for s in zip(*per_rank, strict=True)], binned(reference), 0)
    assert quality["global_batch"]["tv"] == pytest.approx(step.tv)
    assert main(args) == 0
    assert "shuffle quality of 'id'" in capsys.readouterr().out
    assert main([*args[:-2], "--workers", "4", "--json"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert four["workers"] == 4
    assert all(s["read_per_rank"] == s["rows_per_rank"] for e in four["epochs"] for s in e["sources"]), "each row once"
    assert main([*args[:-2], "--workers", "4"]) == 0
    assert "4 DataLoader workers per rank" in capsys.readouterr().out
    # with workers, the quality of their batches: each rank's slots of world 2 x 2, round robin
    assert main([*args, "--workers", "2", "--json"]) == 0
    two = json.loads(capsys.readouterr().out)["shuffle_quality"]
    slots = [[b["id"].numpy() for b in make_loader(s, 4, plan=plans, weights=[0.5, 0.3, 0.2], backend="arrow")]
             for s in range(4)]
    per_rank = [[slots[2 * r + b % 2][b // 2] for b in range(2 * len(slots[2 * r]))] for r in range(2)]
    reference = np.concatenate([b for batches in per_rank for b in batches])  # the workers' epoch, as measured
    binned = _binner(reference)
    step = Quality.of([binned(np.concatenate(s)) for s in zip(*per_rank, strict=True)], binned(reference), 0)
    assert two["global_batch"]["tv"] == pytest.approx(step.tv, abs=1e-4)  # (reported to 4 places)


def test_a_pad_source_delivers_every_row_of_each_pass_and_flags_its_repeats(sources):
    plans = [plan_shards(url, 3, batch_size=16, policy=policy, seed=2, engine="local")
             for url, policy in zip(sources, ("drop", "pad", "pad"), strict=True)]  # 640 and 310 rows: 3 ranks pad
    ranks = [make_loader(r, 3, plan=plans, weights=[1, 1, 1], batch_size=12, padding_mask=True, backend="arrow",
                         workers_count=1, epoch_steps=60) for r in range(3)]
    per_pass = ranks[0]._settings.mixture.rows_per_pass
    rows = {r: [] for r in range(3)}
    for r, loader in enumerate(ranks):
        for batch in loader:
            rows[r] += list(zip(batch["_source"].tolist(), batch["id"].tolist(), batch["_padding"].tolist(),
                                strict=True))
    for s in (1, 2):
        first = [row for r in range(3) for row in [(i, p) for src, i, p in rows[r] if src == s][:per_pass[s]]]
        real = [i for i, p in first if not p]
        assert sorted(real) == list(range(SIZES[s])), f"source {s}: its pass delivers every row once"
        assert 0 < sum(p for _, p in first) < 3, "fewer than world_size rows repeated, flagged"


def test_set_epoch_far_ahead_costs_what_a_near_one_does_and_gives_the_walked_batches(plans):
    def moved(loader):  # mid-epoch, then other weights: a timeline that start(epoch) does not give
        next(iter(loader))
        state = loader.state_dict()
        again = make_loader(0, 2, plan=plans, weights=[1, 1, 3], shuffle_window=64, backend="arrow",
                            workers_count=1)
        again.load_state_dict(state)
        return again

    jumped, walked = (moved(loaders(plans, 2)[0]) for _ in range(2))
    jumped.set_epoch(4)
    for epoch in range(1, 5):
        walked.set_epoch(epoch)
    assert jumped.state_dict() == walked.state_dict()
    assert read_epoch(jumped, 3) == read_epoch(walked, 3)
    # the cost, counted rather than timed (a loaded machine cannot flip it): every way to move along the timeline
    # goes through ``Schedule.consumed``; a jump is a binary search per epoch boundary, so its calls grow with the
    # epoch's bits, where walking would make thousands (the count stops such a walk at once instead of hanging)
    real, calls = Schedule.consumed, []

    def counted(self, batches):
        calls.append(1)
        assert len(calls) <= limit, f"set_epoch walked the timeline: over {limit} calls of Schedule.consumed"
        return real(self, batches)

    def cost(epoch):
        loader = moved(loaders(plans, 2)[0])
        calls.clear()
        with mock.patch.object(Schedule, "consumed", counted):
            loader.set_epoch(epoch)
        return loader, len(calls)

    limit = 10**4
    _, near = cost(1)
    for epoch in (10**5, 10**9):
        far, count = cost(epoch)
        assert count <= near + 4 * epoch.bit_length(), (epoch, count, near)
        assert flat(far.state_dict())["epoch"] == epoch
        assert len(read_epoch(far, 2)) == 2


def test_the_same_plan_twice_resumes_exactly(plans):
    twice = [plans[0], plans[0]]
    check_resume_contract(lambda: make_loader(0, 2, plan=twice, weights=[1, 1], batch_size=16, shuffle_window=64,
                                              backend="arrow", workers_count=1), iter, epochs=2)
