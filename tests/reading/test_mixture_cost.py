"""Cost balance in a mixture (G11 for G17): each source whose plan has a cost arranges its shuffle windows into the
pieces its batches take (``core/cost/pieces.py``). The arrangement (pure, Hypothesis), and real loaders: the
scheduled shares, no row twice in a pass, exact resume, the slowest rank's batch cost near the mean as with one
plan, and the refusals (a changed mixture, another balance, an elastic resume mid-pass of a cost source)."""
import os
from itertools import islice

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import plan_shards
from petastorm_balanced.core.cost.pieces import arrange_pieces, window_pieces
from petastorm_balanced.core.mixture import make_schedule, parse_weights

torch = pytest.importorskip("torch")

from petastorm_balanced import BalancedIterableDataset, make_loader  # noqa: E402

SIZES = (6000, 3000, 2000)
WORLD, BATCH = 4, 16


@settings(max_examples=200, deadline=None)
@given(costs=st.lists(st.integers(0, 5000), min_size=1, max_size=300), data=st.data(),
       reduce=st.sampled_from(["sum", "max"]), rank=st.integers(0, 7))
def test_pieces_are_a_permutation_with_the_given_sizes(costs, data, reduce, rank):
    n = len(costs)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=20))) - {n})
    sizes = np.diff([0, *cuts, n])
    costs = np.array(costs)
    order = arrange_pieces(costs, sizes, reduce, (1, 2, rank, 0, 3))
    assert sorted(order.tolist()) == list(range(n))
    parts = np.split(costs[order], np.cumsum(sizes)[:-1])
    assert [len(p) for p in parts] == sizes.tolist()
    if reduce == "max":  # consecutive runs of the sorted costs, in an order every rank draws alike
        runs = sorted((p.min(), p.max()) for p in parts if len(p))
        assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:], strict=False))
    again = arrange_pieces(costs, sizes, reduce, (1, 2, rank, 0, 3))
    assert (order == again).all(), "a function of the window, the sizes and the key alone"


@settings(max_examples=100, deadline=None)
@given(weights=st.lists(st.integers(1, 9), min_size=2, max_size=4), batch=st.integers(1, 40), data=st.data())
def test_window_pieces_are_the_parts_of_the_scheduled_batches(weights, batch, data):
    schedule = make_schedule(parse_weights(weights, len(weights)), batch)
    source = data.draw(st.integers(0, len(weights) - 1))
    phase, counter = data.draw(st.integers(0, schedule.period - 1)), data.draw(st.integers(0, 500))
    origin = schedule.origin(source, phase, counter)
    steps = 3 * schedule.period + 5
    bounds = counter + schedule.consumed(phase + np.arange(steps + 1))[:, source] - schedule.consumed(phase)[source]
    lo = data.draw(st.integers(counter, int(bounds[-1])))
    hi = data.draw(st.integers(lo, int(bounds[-1])))
    sizes = window_pieces(lo, hi, schedule.cuts(source, origin, lo, hi))
    inside = sorted({lo, hi, *[int(b) for b in bounds if lo < b < hi]})
    assert sizes.tolist() == np.diff(inside).tolist()
    assert (sizes > 0).all()


@pytest.fixture(scope="module")
def cost_plans(tmp_path_factory):
    """Three datasets with lognormal ``length`` (medians 16, 64, 256: sources of different costs)."""
    root = tmp_path_factory.mktemp("mixture_cost")
    plans = []
    for i, n in enumerate(SIZES):
        rng = np.random.default_rng(i)
        length = np.maximum(1, np.round(np.exp(rng.normal(np.log(16 * 4 ** i), 1.0, n)))).astype(np.int64)
        folder = root / f"s{i}"
        os.makedirs(folder)
        for f, part in enumerate(np.array_split(np.arange(n), 3)):
            pq.write_table(pa.table({"id": part, "length": length[part]}), folder / f"part-{f}.parquet",
                           row_group_size=500)
        plans.append(plan_shards(f"file://{folder}", WORLD, batch_size=BATCH, cost="length", seed=i,
                                 engine="local"))
    return plans


def batches(loader, count=None):
    return [list(zip(b["_source"].tolist(), b["id"].tolist(), b["length"].tolist(), strict=True))
            for b in islice(iter(loader), count)]


def straggler(plan, reduce, **kwargs):
    per_rank = []
    for rank in range(WORLD):
        loader = make_loader(rank, WORLD, plan=plan, batch_size=BATCH, backend="arrow", workers_count=1,
                             cost_reduce=reduce, schema_fields=["id", "length"], **kwargs)
        loader.set_epoch(1)
        per_rank.append([float(b["length"].sum()) if reduce == "sum" else float(len(b["length"]) * b["length"].max())
                         for b in loader])
    costs = np.array(per_rank)
    return float(np.mean(costs.max(axis=0) / costs.mean(axis=0)))


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_the_slowest_ranks_batch_cost_is_near_the_mean_as_with_one_plan(cost_plans, reduce):
    weights = dict(weights=[5, 3, 2])
    rows = straggler(cost_plans, reduce, balance="rows", **weights)
    mixed = straggler(cost_plans, reduce, **weights)
    single = straggler(cost_plans[1], reduce)
    assert mixed < 1 + (rows - 1) / 3, f"cost balance removes most of the rows straggle: {mixed:.3f} vs {rows:.3f}"
    assert mixed < single + 0.05, f"about one plan's cost balance: {mixed:.3f} vs {single:.3f}"


def test_shares_passes_and_exact_resume_with_cost(cost_plans):
    # shares 6, 2.5 and 1.5 rows: pieces of two sizes, and a schedule phase the resume must keep
    kwargs = dict(weights=[0.6, 0.25, 0.15], batch_size=10, shuffle_window=300, backend="arrow", workers_count=1)
    ranks = [make_loader(r, 2, plan=cost_plans, **kwargs) for r in range(2)]
    schedule = ranks[0]._settings.mixture.schedule
    per_pass = ranks[0]._settings.mixture.rows_per_pass
    assert ranks[0].state_dict()["cost"] == {"balance": "cost", "cost_reduce": "sum", "max_batch_cost": None}
    epochs = [batches(loader) + batches(loader) for loader in ranks]
    assert len(epochs[0]) == len(epochs[1])
    expected = schedule.counts(0, len(epochs[0]))
    for rank in epochs:
        assert [np.bincount([s for s, _, _ in b], minlength=3).tolist() for b in rank] == expected.tolist()
    for s, rows in enumerate(per_pass):
        ids = [[i for b in rank for src, i, _ in b if src == s][:rows] for rank in epochs]
        first = ids[0] + ids[1]
        assert len(set(first)) == len(first), f"source {s}: a row twice in pass 0"
        if all(len(i) == rows for i in ids):
            assert SIZES[s] - len(first) < 2
    for cut in (1, 37, 38, len(epochs[1]) // 2 - 1):  # exact resume, also inside a window being arranged
        loader = make_loader(1, 2, plan=cost_plans, **kwargs)
        head = batches(loader, cut)
        resumed = make_loader(1, 2, plan=cost_plans, **kwargs)
        resumed.load_state_dict(loader.state_dict())
        assert head + batches(resumed) + batches(resumed) == epochs[1]


def test_cost_mixture_refusals(cost_plans):
    kwargs = dict(batch_size=10, shuffle_window=300, backend="arrow", workers_count=1)
    loader = make_loader(0, 2, plan=cost_plans, weights=[5, 3, 2], **kwargs)
    batches(loader, 7)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="balances cost: a source's window is arranged"):
        make_loader(0, 2, plan=cost_plans, weights=[1, 1, 1], **kwargs).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state\['balance'\]='cost' but this mixture balances 'rows'"):
        make_loader(0, 2, plan=cost_plans, weights=[5, 3, 2], balance="rows", **kwargs).load_state_dict(state)
    with pytest.raises(ValueError, match="source 0 balances cost .* resume at world_size=2"):
        make_loader(0, 3, plan=cost_plans, weights=[5, 3, 2], **kwargs).load_state_dict(state)
    by_rows = make_loader(0, 2, plan=cost_plans, weights=[5, 3, 2], balance="rows", **kwargs)
    batches(by_rows, 3)
    with pytest.raises(ValueError, match=r"state\['balance'\]='rows' but this mixture balances 'cost'.*balance='rows'"):
        # a state of a mixture read by rows (every mixture state saved before cost balance) in a cost mixture
        make_loader(0, 2, plan=cost_plans, weights=[5, 3, 2], **kwargs).load_state_dict(by_rows.state_dict())
    fresh = make_loader(0, 2, plan=cost_plans, weights=[5, 3, 2], **kwargs).state_dict()
    elastic = make_loader(0, 3, plan=cost_plans, weights=[5, 3, 2], **kwargs)
    elastic.load_state_dict(fresh)  # at every source's pass start: nothing was arranged yet, so it loads
    assert elastic.state_dict()["layout"]["world_size"] == 3
    with pytest.raises(ValueError, match="decided by the weights"):
        make_loader(0, 2, plan=cost_plans, weights=[5, 3, 2], max_batch_cost=1000, backend="arrow",
                    batch_size=None)


def test_dataloader_workers_give_make_loaders_cost_balanced_batches(cost_plans):
    kwargs = dict(weights=[5, 3, 2], batch_size=10, shuffle_window=300, backend="arrow", epoch_steps=30,
                  cost_reduce="max")
    # each worker is a slot of a world of 2 x 2 (``MixtureSettings.slots``), cost-balanced as a rank of it
    slots = [batches(make_loader(2 + s, 4, plan=cost_plans, workers_count=1, **{**kwargs, "epoch_steps": 15}))
             for s in range(2)]
    expected = [slots[b % 2][b // 2] for b in range(30)]
    ds = BalancedIterableDataset(cost_plans, 1, 2, **kwargs)
    got = [list(zip(b["_source"].tolist(), b["id"].tolist(), b["length"].tolist(), strict=True))
           for b in ds.dataloader(num_workers=2)]
    assert got == expected
