"""Elastic resume of a mixture (G10): a state saved at world W continues at W' (and W'') mid-epoch, every source in
its pass: no row of a source twice in a pass, fewer than the last world's size left out of a whole pass, equal steps
on every rank, each batch the scheduled shares, deterministic; and the state's format (old ``[pass, row]`` entries
load, malformed stages are refused)."""
from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import datagen, plan_shards

torch = pytest.importorskip("torch")

from petastorm_balanced import BalancedIterableDataset, make_loader  # noqa: E402
from petastorm_balanced.reading.state import flat, nest  # noqa: E402

SIZES = (900, 400, 230)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture_elastic")
    urls = [datagen.make_plain_dataset(root / f"s{i}", num_files=3, total_rows=n, seed=11 + i, min_row_group_rows=16,
                                       max_row_group_rows=120).url for i, n in enumerate(SIZES)]
    return [plan_shards(url, 2, batch_size=16, seed=3 + i, engine="local") for i, url in enumerate(urls)]


def make(plans, rank, world, **kwargs):
    return make_loader(rank, world, plan=plans, backend="arrow", workers_count=1, **kwargs)


def take(loader, count):
    """``count`` batches (across epochs: an ended epoch's next ``iter()`` serves the next epoch)."""
    out = []
    while len(out) < count:
        before = len(out)
        out += [list(zip(b["_source"].tolist(), b["id"].tolist(), strict=True))
                for b in islice(iter(loader), count - len(out))]
        if len(out) == before:  # an empty epoch rest (drop after an elastic resume): go on
            continue
    return out


def run_worlds(plans, worlds, cuts, kwargs):
    """Train ``cuts[k]`` batches at ``worlds[k]`` (saving rank 0's state and loading it into the next world), the
    last world to the end of its epoch and one more. Returns, per segment: the loaders' start counters and rows
    per pass, and every rank's batches."""
    segments, state = [], None
    for k, world in enumerate(worlds):
        ranks = [make(plans, r, world, **kwargs) for r in range(world)]
        if state is not None:
            for loader in ranks:
                loader.load_state_dict(state)
        lengths = {len(loader) for loader in ranks}
        assert len(lengths) == 1, "every rank has the same steps"
        position = ranks[0]._position
        start = position.point()
        segment = dict(world=world, counters=start.counters, phase=start.phase, heads=position.heads,
                       rows=ranks[0]._settings.mixture.rows_per_pass, batches=[])
        if k < len(worlds) - 1:
            segment["batches"] = [take(loader, cuts[k]) for loader in ranks]
        else:
            steps = lengths.pop()
            batches = [take(loader, steps) for loader in ranks]
            steps_next = {len(loader) for loader in ranks}
            assert len(steps_next) == 1
            more = steps_next.pop()
            segment["batches"] = [b + take(loader, more) for b, loader in zip(batches, ranks, strict=True)]
        assert len({len(b) for b in segment["batches"]}) == 1, "every rank took the same steps"
        states = [loader.state_dict() for loader in ranks]
        assert all(s == states[0] for s in states), "every rank saves the same state"
        state = states[0]
        segments.append(segment)
    return segments


def check_passes(plans, segments, schedule, sizes=SIZES):
    """Each batch holds the scheduled shares; per source and pass, no row twice across worlds, and a pass every
    rank of its last world finished left out fewer rows than that world's size."""
    seen: dict[tuple[int, int], list[int]] = {}
    finished: dict[tuple[int, int], int] = {}  # (source, pass) -> world size of the segment that finished it
    for seg in segments:
        for batches in seg["batches"]:
            expected = schedule.counts(seg["phase"], seg["phase"] + len(batches))
            for b, batch in enumerate(batches):
                counts = np.bincount([s for s, _ in batch], minlength=len(plans))
                assert counts.tolist() == expected[b].tolist(), "each source's scheduled share, on every rank"
        for s in range(len(plans)):
            rows = seg["rows"][s]
            for batches in seg["batches"]:
                mine = [i for batch in batches for src, i in batch if src == s]
                for j, row_id in enumerate(mine):
                    seen.setdefault((s, (seg["counters"][s] + j) // rows), []).append(row_id)
            done = seg["counters"][s] + sum(1 for batch in seg["batches"][0] for src, _ in batch if src == s)
            for p in range(seg["counters"][s] // rows, done // rows):
                finished[(s, p)] = seg["world"]
    for (s, p), ids in seen.items():
        assert len(set(ids)) == len(ids), f"source {s}: a row twice in pass {p}"
        assert set(ids) <= set(range(sizes[s]))
        if (s, p) in finished:
            assert sizes[s] - len(ids) < finished[(s, p)], f"source {s} pass {p}: rows lost beyond drop's allowance"
    return seen


@settings(max_examples=8, deadline=None)
@given(weights=st.sampled_from([[5, 3, 2], [1, 1, 1], [0.6, 0.25, 0.15], [2, 7, 1]]),
       worlds=st.lists(st.integers(1, 4), min_size=2, max_size=3),
       cuts=st.lists(st.integers(0, 90), min_size=2, max_size=2),
       batch_size=st.integers(4, 14), window=st.sampled_from([1, 30, 10_000]),
       epoch_steps=st.none() | st.integers(3, 25))
def test_an_elastic_resume_continues_every_source_in_its_pass_with_equal_steps(plans, weights, worlds, cuts,
                                                                               batch_size, window, epoch_steps):
    kwargs = dict(weights=weights, batch_size=batch_size, shuffle_window=window, epoch_steps=epoch_steps)
    try:
        for world in set(worlds):
            make(plans, 0, world, **kwargs)
    except ValueError as exc:
        assert "fewer than its share of one batch" in str(exc)
        return
    segments = run_worlds(plans, worlds, cuts, kwargs)
    schedule = make(plans, 0, worlds[0], **kwargs)._settings.mixture.schedule
    check_passes(plans, segments, schedule)


def test_elastic_resume_is_deterministic_and_resumes_exactly_again(plans):
    kwargs = dict(weights=[5, 3, 2], batch_size=10, shuffle_window=30)
    old = [make(plans, r, 2, **kwargs) for r in range(2)]
    for loader in old:
        take(loader, 17)
    state = old[0].state_dict()
    first, second = make(plans, 1, 3, **kwargs), make(plans, 1, 3, **kwargs)
    first.load_state_dict(state)
    second.load_state_dict(state)
    a = take(first, 40)
    assert a == take(second, 40), "the same state gives the same batches"
    # a state saved inside the elastic rest resumes exactly at the same world ...
    again = make(plans, 1, 3, **kwargs)
    again.load_state_dict(state)
    head = take(again, 11)
    saved = again.state_dict()
    assert any(len(entry) == 3 for entry in saved["mixture"]["sources"]), "the rest's stages are in the state"
    resumed = make(plans, 1, 3, **kwargs)
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved
    assert head + take(resumed, 29) == a
    # ... and BalancedIterableDataset with two DataLoader workers: the slots of world 3 x 2, each resumed there
    ds = BalancedIterableDataset(plans, 1, 3, backend="arrow", **kwargs)
    ds.load_state_dict({**state, "workers": {"num_workers": 1}})
    got = [list(zip(b["_source"].tolist(), b["id"].tolist(), strict=True))
           for b in islice(ds.dataloader(num_workers=2), 40)]
    at_three = make(plans, 1, 3, **kwargs)
    at_three.load_state_dict(state)
    slots = [make(plans, 2 + s, 6, **kwargs) for s in range(2)]
    for slot in slots:
        slot.load_state_dict(at_three.state_dict())
    slot_batches = [take(slot, 20) for slot in slots]
    assert got == [slot_batches[b % 2][b // 2] for b in range(len(got))]


def test_old_entries_load_and_malformed_stages_are_refused(plans):
    kwargs = dict(weights=[5, 3, 2], batch_size=10, shuffle_window=30)
    loader = make(plans, 0, 2, **kwargs)
    take(loader, 9)
    state = loader.state_dict()
    assert all(len(e) == 2 for e in state["mixture"]["sources"]), "no world change: plain [pass, row]"
    resumed = make(plans, 0, 2, **kwargs)
    resumed.load_state_dict(state)  # a state saved before elastic mixtures has this very shape
    assert resumed.state_dict() == state
    values = flat(state)
    for bad, message in (([0, 1, []], "non-empty list"), ([0, 1, [[2, 2, 0, 5]]], r"\[world_size, 1, 0, rows\]"),
                         ([0, 1, [[2, 1]]], "4 ints"), ([0, 1, 2, 3], r"\[pass, row\] or \[pass, row, stages\]"),
                         ([0, 10 ** 6, [[3, 1, 0, 4]]], "row")):
        broken = nest({**values, "sources": [bad, *values["sources"][1:]]})
        with pytest.raises(ValueError, match=message):
            make(plans, 0, 2, **kwargs).load_state_dict(broken)


@settings(max_examples=6, deadline=None)
@given(worlds=st.lists(st.integers(1, 3), min_size=2, max_size=3), cuts=st.lists(st.integers(0, 60), min_size=2,
       max_size=2), window=st.sampled_from([30, 10_000]), reshuffle=st.sampled_from(["epoch", "fixed"]))
def test_the_same_plan_twice_reads_two_independent_orders_each_exact_across_resumes(plans, worlds, cuts, window,
                                                                                      reshuffle):
    twice = [plans[1], plans[1], plans[2]]
    kwargs = dict(weights=[1, 1, 1], batch_size=12, shuffle_window=window, reshuffle=reshuffle)
    segments = run_worlds(twice, worlds, cuts, kwargs)
    check_passes(twice, segments, make(twice, 0, worlds[0], **kwargs)._settings.mixture.schedule,
                 sizes=(SIZES[1], SIZES[1], SIZES[2]))  # each place on its own: no row twice in its pass
    same = total = 0
    for seg in segments:
        for batches in seg["batches"]:
            for batch in batches:
                total += 1
                same += [i for s, i in batch if s == 0] == [i for s, i in batch if s == 1]
    assert same <= total // 20, f"{same} of {total} batches hold the same rows at both places"


def test_the_same_plan_twice_without_shuffling_is_refused_naming_it(plans):
    with pytest.raises(ValueError, match=r"plan\[2\] is plan\[0\] again .* shuffle=False"):
        make([plans[0], plans[1], plans[0]], 0, 2, weights=[1, 1, 1], batch_size=12, shuffle=False)
    make([plans[0], plans[1]], 0, 2, weights=[1, 1], batch_size=12, shuffle=False)  # distinct plans: fine


def test_a_state_from_before_place_keyed_orders_loads_only_where_every_source_starts_a_pass(plans):
    kwargs = dict(weights=[5, 3, 2], batch_size=10, shuffle_window=30)
    loader = make(plans, 0, 2, **kwargs)
    take(loader, 9)
    values = flat(loader.state_dict())
    assert values["source_order"] == 3
    old = {k: v for k, v in values.items() if k != "source_order"}  # as saved before the key existed
    with pytest.raises(ValueError, match=r"has no 'source_order'.*source 0 stands inside a pass"):
        make(plans, 0, 2, **kwargs).load_state_dict(nest(old))
    with pytest.raises(ValueError, match=r"'source_order'\]=7 is not an order"):
        make(plans, 0, 2, **kwargs).load_state_dict(nest({**values, "source_order": 7}))
    starts = {**old, "sources": [[1, 0], [0, 0], [2, 0]], "batches": 0}
    fresh = make(plans, 0, 2, **kwargs)
    fresh.load_state_dict(nest(starts))  # every source at a pass start: the orders of both releases begin there
    assert flat(fresh.state_dict())["sources"] == [[1, 0], [0, 0], [2, 0]]
    one = make(plans[:1], 0, 2, weights=[1], batch_size=10, shuffle_window=30)
    take(one, 5)
    single = {k: v for k, v in flat(one.state_dict()).items() if k != "source_order"}
    again = make(plans[:1], 0, 2, weights=[1], batch_size=10, shuffle_window=30)
    again.load_state_dict(nest(single))  # one source: pass p was plan epoch p before and after
    assert take(again, 3) == take(one, 3)
