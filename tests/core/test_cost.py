"""Cost balance (G11): cost plans, cost-arranged windows, token budgets.

Invariants: G1 (every rank the same steps of exactly batch_size rows) and G2 (no row twice, fewer than
W x batch_size left out) hold under cost balancing; the arrangement is a permutation of each window that depends
on the window and key alone (so resume and both backends give the same batches); a token budget is never
exceeded, every rank takes the same steps, and what a window leaves out is within the stated bound.
"""
import json
import os
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import load_plan, plan_shards
from petastorm_balanced.core import balance, shuffle, sorting
from petastorm_balanced.core.cost.arrangement import arrange_max, arrange_sum
from petastorm_balanced.core.cost.budget import arrange_budget, budget_batches
from petastorm_balanced.core.cost.order import cost_order
from petastorm_balanced.reading.batches.batching import WindowBatcher, split_batches
from petastorm_balanced.tools.coverage import coverage_check, steps_check
from tests.support.delivery_contract import planned_ids
from tests.support.jobs import ROOT
from tests.support.reference_orders import v1_max, v1_permutation, v1_sum
from tests.support.resume_contract import check_resume_contract
from tests.support.strategies import shuffle_keys


def write_lengths(path, rows=3000, files=4, row_group=300, seed=0, sources=True):
    """``id`` and lognormal ``length`` (sigma 1); with ``sources`` each file has its own median."""
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(rows), files)):
        median = 16 * 2.0 ** (i % 4) if sources else 32
        length = np.maximum(1, np.round(np.exp(rng.normal(np.log(median), 1.0, len(part))))).astype(np.int64)
        text = pa.array(["x" * int(n) for n in length])
        pq.write_table(pa.table({"id": part.astype(np.int64), "length": length, "text": text}),
                       os.path.join(path, f"part-{i:05d}.parquet"), row_group_size=row_group)
    return str(path)


@pytest.fixture(scope="module")
def lengths(tmp_path_factory):
    return write_lengths(tmp_path_factory.mktemp("lengths") / "ds")


@pytest.fixture(scope="module")
def cost_plan(lengths):
    return plan_shards(lengths, 3, batch_size=8, engine="local", cost="length")


# ------------------------------------------------------------------------------------------------ pure parts

costs_lists = st.lists(st.integers(0, 5000), min_size=1, max_size=400)


@settings(max_examples=100, deadline=None)
@given(costs=costs_lists, batch=st.integers(1, 16), key=st.tuples(*[st.integers(0, 2**32 - 1)] * 5),
       reduce=st.sampled_from(["sum", "max"]))
def test_cost_arrangement_is_a_permutation_of_whole_batches(costs, batch, key, reduce):
    costs = np.array(costs[:len(costs) // batch * batch] or [1] * batch)
    arrange = arrange_sum if reduce == "sum" else arrange_max
    order = arrange(costs, batch, key)
    assert sorted(order.tolist()) == list(range(len(costs)))
    assert np.array_equal(order, arrange(costs.copy(), batch, key)), "a function of the costs and key alone"


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.integers(4, 60), batch=st.integers(2, 16))
def test_sum_arrangement_evens_batches(seed, k, batch):
    """Batches of a window cost about the mean: off by at most the largest row (the LPT bound)."""
    rng = np.random.default_rng(seed)
    costs = rng.integers(1, 100, size=k * batch)
    order = arrange_sum(costs, batch, (seed, 0, 0, 0, 0))
    sums = costs[order].reshape(k, batch).sum(axis=1)
    assert sums.max() - sums.min() <= costs.max()


@settings(max_examples=150, deadline=None)
@given(data=st.data(), k=st.integers(0, 40), batch=st.integers(1, 64), key=shuffle_keys,
       top=st.sampled_from([3, 2**16 - 1, 2**16, 2**16 + 1, 10**12, 2**62]))
def test_arrangements_stay_what_v1_delivered(data, k, batch, key, top):
    """The registry's "round-lpt" v1 and "sorted-buckets" v1 deliver the same rows, bit for bit, as their plain
    first form: a version's rows never move (a state records the version it was saved under; the v1 helpers also
    order mixtures' pieces and token budgets). Costs from ties to 2**62 (16-bit fast paths, 64-bit sums), keys
    past 32 bits."""
    costs = np.array(data.draw(st.lists(st.integers(0, top), min_size=k * batch, max_size=k * batch)), dtype=np.int64)
    n = k * batch
    for vector_sort in (False, True):  # the radix passes and the one sort of unique keys, on any NumPy
        with mock.patch.object(sorting, "VECTOR_SORT", vector_sort):
            assert np.array_equal(arrange_sum(costs, batch, key), v1_sum(costs, batch, key))
            assert np.array_equal(arrange_max(costs, batch, key), v1_max(costs, batch, key))
            assert np.array_equal(shuffle.window_permutation(n, key), v1_permutation(n, key))


def test_max_arrangement_serves_the_same_quantile_on_every_rank():
    """The step order of padded buckets is drawn without the rank: equal windows give equal steps."""
    rng = np.random.default_rng(0)
    costs = rng.integers(1, 1000, size=64)
    a = costs[arrange_max(costs, 8, (1, 2, 0, 0, 3))].reshape(8, 8).max(axis=1)
    b = costs[arrange_max(costs, 8, (1, 2, 5, 0, 3))].reshape(8, 8).max(axis=1)
    assert np.array_equal(a, b)


@settings(max_examples=150, deadline=None)
@given(costs=st.lists(st.integers(0, 300), min_size=1, max_size=300), extra=st.integers(0, 400),
       key=st.tuples(*[st.integers(0, 2**32 - 1)] * 5))
def test_budget_bound(costs, extra, key):
    """Every batch within the budget and non-empty, no row twice, and the cost left out of a window within
    max(0, window cost - k x (C - largest row))."""
    costs = np.array(costs)
    budget = int(costs.max()) + extra or 1
    k = budget_batches(len(costs), costs.mean(), budget)
    order, lengths = arrange_budget(costs, k, budget, key)
    assert len(lengths) == k and (lengths >= 1).all()
    assert len(set(order.tolist())) == len(order)
    ends = np.cumsum(lengths)
    assert all(costs[order[e - n:e]].sum() <= budget for e, n in zip(ends, lengths, strict=True))
    left = int(costs.sum() - costs[order].sum())
    assert left <= max(0, int(costs.sum()) - k * (budget - int(costs.max())))


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(1, 500), min_size=1, max_size=60), density=st.data(),
       world=st.integers(1, 8), batch=st.integers(1, 16), policy=st.sampled_from(["drop", "pad"]),
       seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 100))
def test_cost_order_keeps_g1_g2(counts, density, world, batch, policy, seed, epoch):
    """The cost-dealt order is a permutation, and the same cuts give every rank equal rows with none twice."""
    counts = np.array(counts)
    sums = counts * np.array(density.draw(st.lists(st.integers(0, 1000), min_size=len(counts),
                                                   max_size=len(counts))))
    order = cost_order(counts, sums, seed=seed, epoch=epoch)
    assert sorted(order.tolist()) == list(range(len(counts)))
    if counts.sum() < world * batch:
        return
    pieces = balance.assign(counts, world_size=world, batch_size=batch, policy=policy, seed=seed, epoch=epoch,
                            order=order)
    rows = [pieces.rows_of_rank(r) for r in range(world)]
    assert len(set(rows)) == 1 and rows[0] == pieces.steps_per_rank * batch  # G1
    width = int(counts.max())  # matching row i of catalog row c is id c * width + i

    def ids(mask):
        return np.concatenate([c * width + np.arange(s, e) for c, s, e in zip(
            pieces.catalog_row[mask], pieces.start[mask], pieces.stop[mask], strict=True)] or [np.zeros(0, np.int64)])
    real, padded = ids(~pieces.padding), ids(pieces.padding)
    expected = np.concatenate([c * width + np.arange(n) for c, n in enumerate(counts)])
    check = coverage_check([real, padded], [np.zeros(len(real), bool), np.ones(len(padded), bool)],
                           expected=expected, policy=policy, global_batch=world * batch, name="G2")
    assert check.ok, check.detail


def test_cost_order_spreads_dense_row_groups():
    """Every rank's stretch gets about the mean cost per row when row groups differ in density."""
    counts = np.full(64, 100)
    sums = np.repeat([100, 400], 32) * 10
    pieces = balance.assign(counts, world_size=8, batch_size=10, policy="drop", seed=3, epoch=0,
                            order=cost_order(counts, sums, seed=3, epoch=0))
    per_rank = np.bincount(pieces.rank, weights=(sums / counts)[pieces.catalog_row] * pieces.num_rows)
    assert per_rank.max() / per_rank.mean() < 1.1
    plain = balance.assign(counts, world_size=8, batch_size=10, policy="drop", seed=3, epoch=0)
    plain_rank = np.bincount(plain.rank, weights=(sums / counts)[plain.catalog_row] * plain.num_rows)
    assert per_rank.max() / per_rank.mean() < plain_rank.max() / plain_rank.mean()


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.integers(1, 40), min_size=1, max_size=10), batch=st.integers(1, 6),
       windows=st.integers(1, 4), reduce=st.sampled_from(["sum", "max"]), data=st.data())
def test_cost_windows_resume_at_any_batch(rows, batch, windows, reduce, data):
    """WindowBatcher with a cost arrangement: whole batches, every row once, and a start at batch k (the window
    re-read from its first row) gives the suffix."""
    from petastorm_balanced.reading.batches.batching import start_point
    total = sum(rows) // batch * batch
    if total == 0:
        return
    ends = np.minimum(np.cumsum(rows), total)  # the drawn fragments, the last ones cut to whole batches
    fragments = np.diff(np.concatenate(([0], ends)))
    cost_of = np.random.default_rng(len(rows)).integers(0, 50, size=sum(rows))
    size = windows * batch
    arrange = arrange_sum if reduce == "sum" else arrange_max

    def run(done):
        start = start_point(fragments, batch_size=batch, window_rows=size, batches_done=done, shuffle=True)
        batcher = WindowBatcher(total_rows=total, batch_size=batch, window_rows=size, start=start, key=(1, 2, 3, 0),
                                arrange=lambda w, key: (arrange(w["c"], batch, key), None))
        out = []
        for f in range(start.fragment, len(fragments)):  # fragment by fragment, as the loaders push them
            ids = np.arange(ends[f] - fragments[f] + (start.offset if f == start.fragment else 0), ends[f])
            out += [b["id"].tolist() for r in batcher.push({"id": ids, "c": cost_of[ids]})
                    for b in split_batches(r, batch)]
        batcher.finish()
        return out

    full = run(0)
    assert all(len(b) == batch for b in full) and sorted(sum(full, [])) == list(range(total))
    done = data.draw(st.integers(0, len(full)))
    assert run(done) == full[done:]


# ------------------------------------------------------------------------------------------------ plans

def test_cost_plan_round_trip_and_format(cost_plan, tmp_path):
    url = cost_plan.save(str(tmp_path / "plan"))
    loaded = load_plan(url)
    assert loaded.checksum == cost_plan.checksum and loaded.cost == "length"
    document = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert document["cost"]["text"] == "length" and document["cost"]["kind"] == "column"
    table = pq.read_table(tmp_path / "plan" / "catalog.parquet")
    assert table.column_names[-2:] == ["cost_sum", "cost_max"]
    truth = pq.read_table(cost_plan.dataset_url.replace("file://", ""), columns=["length"]).column(0).to_numpy()
    assert document["totals"]["total_cost"] == int(truth.sum())
    assert document["totals"]["max_row_cost"] == loaded.max_row_cost == int(truth.max())


def test_cost_changes_checksum_and_plain_plan_does_not(lengths):
    plain = plan_shards(lengths, 3, batch_size=8, engine="local")
    assert plain.cost is None and plain.max_row_cost is None
    costly = plan_shards(lengths, 3, batch_size=8, engine="local", cost="length")
    assert costly.checksum != plain.checksum
    assert plan_shards(lengths, 3, batch_size=8, engine="local", cost="length(text)").checksum != costly.checksum


def test_length_of_text_equals_the_length_column(lengths):
    """length(text) counts characters: the data's text is 'x' * length, so the statistics agree."""
    by_column = plan_shards(lengths, 3, batch_size=8, engine="local", cost="length")
    by_text = plan_shards(lengths, 3, batch_size=8, engine="local", cost="length(text)")
    assert by_column.catalog.cost_sums().tolist() == by_text.catalog.cost_sums().tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text() | st.text(alphabet="ab"), max_size=40), st.booleans(), st.integers(0, 5), st.integers(0, 40))
def test_utf8_lengths_count_what_arrow_counts(values, large, head, size):
    """The buffer-level character count equals pyarrow's utf8_length, ASCII or not, on slices of either string
    type; it is what planning's statistics and the loader's per-row costs are computed with."""
    import pyarrow.compute as pc

    from petastorm_balanced.core.cost.spec import utf8_lengths
    array = pa.array(values, type=pa.large_string() if large else pa.string()).slice(head, size)
    assert utf8_lengths(array).tolist() == pc.utf8_length(array).to_numpy(zero_copy_only=False).tolist()


@pytest.mark.parametrize("values, pattern", [([1, -2, 3], "negative"), ([1, None, 3], "NULL"),
                                             ([1.0, 2.5, 3.0], "not an integer")])
def test_bad_costs_name_file_and_row_group(tmp_path, values, pattern):
    pq.write_table(pa.table({"id": [0, 1, 2], "c": values}), tmp_path / "part-0.parquet")
    with pytest.raises(ValueError, match=rf"{pattern}.*part-0.parquet' row group 0|part-0.parquet' row group 0.*"):
        plan_shards(str(tmp_path), 1, batch_size=1, engine="local", cost="c")


def test_bad_cost_arguments(lengths):
    with pytest.raises(ValueError, match="needs engine='spark'"):
        plan_shards(lengths, 3, batch_size=8, engine="local", cost="length * 2")
    with pytest.raises(ValueError, match="no column 'nope'"):
        plan_shards(lengths, 3, batch_size=8, engine="local", cost="nope")
    with pytest.raises(ValueError, match="not numeric"):
        plan_shards(lengths, 3, batch_size=8, engine="local", cost="text")
    with pytest.raises(ValueError, match="cost=''"):
        plan_shards(lengths, 3, batch_size=8, engine="local", cost="")


# ------------------------------------------------------------------------------------------------ loaders

def epoch(plan, world, **kwargs):
    from petastorm_balanced import make_loader
    out = []
    for rank in range(world):
        loader = make_loader(rank, world, plan=plan, backend=kwargs.pop("backend", "arrow"), shuffle_window=96,
                             workers_count=2, **kwargs)
        out.append(([b["id"].numpy() for b in loader], loader))
    return out


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_cost_loader_g1_g2_and_cost_column(cost_plan, reduce):
    ranks = epoch(cost_plan, 3, cost_reduce=reduce, batch_size=8)
    ids = [np.concatenate(batches) for batches, _ in ranks]
    checks = [steps_check([[len(b) for b in batches] for batches, _ in ranks], steps=cost_plan.steps_per_epoch(3, 8),
                          batch_size=8, name="G1"),
              coverage_check(ids, [np.zeros(len(i), bool) for i in ids], policy="drop", global_batch=3 * 8,
                             expected=pq.read_table(cost_plan.dataset_url.replace("file://", ""), columns=["id"])
                             .column(0).to_numpy(), name="G2")]
    assert all(c.ok for c in checks), "; ".join(c.line() for c in checks)
    from petastorm_balanced import make_loader
    batch = next(iter(make_loader(0, 3, plan=cost_plan, backend="arrow", schema_fields=["id"])))
    assert set(batch) == {"id", "_cost"} and batch["_cost"].dtype.is_floating_point is False


def test_cost_balance_evens_steps_against_rows(tmp_path):
    """The cost arrangement lowers the straggler ratio well below random batches on the same plan (lengths drawn
    alike in every file: what is left to balance is inside the windows)."""
    path = write_lengths(tmp_path / "iid", rows=4800, sources=False)
    plan = plan_shards(path, 3, batch_size=8, engine="local", cost="length")
    from petastorm_balanced import make_loader

    def ratio(balance):
        costs = []
        for rank in range(3):
            loader = make_loader(rank, 3, plan=plan, backend="arrow", balance=balance, schema_fields=["length"],
                                 shuffle_window=400)
            costs.append([int(b["length"].sum()) for b in loader])
        costs = np.array(costs, dtype=float)
        return float(np.mean(costs.max(axis=0) / costs.mean(axis=0)))

    assert ratio("cost") < 1.15 < ratio("rows")


def test_resume_contract_cost_loader(cost_plan):
    from petastorm_balanced import make_loader
    check_resume_contract(lambda: make_loader(1, 3, plan=cost_plan, shuffle_window=40, padding_mask=True,
                                              workers_count=2, backend="arrow", cost_reduce="max"), iter)


def test_resume_contract_token_budget(cost_plan):
    from petastorm_balanced import make_loader
    budget = cost_plan.max_row_cost + 50
    check_resume_contract(lambda: make_loader(0, 3, plan=cost_plan, batch_size=None, max_batch_cost=budget,
                                              shuffle_window=200, backend="arrow"), iter)


def test_token_budget_equal_steps_within_budget(cost_plan):
    budget = max(cost_plan.max_row_cost, 2000)
    ranks = epoch(cost_plan, 3, batch_size=None, max_batch_cost=budget)
    assert len({len(batches) for batches, _ in ranks}) == 1 and len(ranks[0][0]) == len(ranks[0][1])
    ids = np.concatenate([b for batches, _ in ranks for b in batches])
    assert len(ids) == len(np.unique(ids))
    length = dict(zip(*[pq.read_table(cost_plan.dataset_url.replace("file://", ""), columns=[c]).column(0)
                        .to_numpy() for c in ("id", "length")], strict=True))
    fills = [sum(length[i] for i in b) / budget for batches, _ in ranks for b in batches]
    assert max(fills) <= 1.0  # how full they are on average is a benchmark figure (bench_cost.py)


def test_cost_loader_arguments_are_checked(cost_plan, lengths):
    from petastorm_balanced import make_loader
    plain = plan_shards(lengths, 3, batch_size=8, engine="local")
    cases = [
        (dict(plan=plain, balance="cost"), "needs a plan made with a cost"),
        (dict(plan=cost_plan, balance="fair"), "balance='fair'"),
        (dict(plan=cost_plan, cost_reduce="mean"), "cost_reduce='mean'"),
        (dict(plan=cost_plan, batch_size=8, max_batch_cost=10_000), "pass batch_size=None"),
        (dict(plan=cost_plan, batch_size=None, max_batch_cost=1), "below the plan's largest row cost"),
        (dict(plan=cost_plan, batch_size=None, max_batch_cost=0), "max_batch_cost=0"),
        (dict(plan=cost_plan, batch_size=None, max_batch_cost=10_000, shuffle=False), "needs shuffle=True"),
        (dict(plan=plain, batch_size=None, max_batch_cost=10_000), "needs balance='cost' .or 'auto'. and a plan"),
        (dict(plan=cost_plan, batch_size=None, max_batch_cost=10_000, cost_reduce="max"), "cost_reduce='sum'"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            make_loader(0, 3, backend="arrow", **kwargs)
    # a plan without cost reads as before (rows, no cost column)
    assert "_cost" not in next(iter(make_loader(0, 3, plan=plain, backend="arrow")))


def rank_ids(plan, rank, balance_by):
    """The ids of rank ``rank``'s epoch-0 fragments, in plan order, read with pyarrow."""
    return planned_ids(plan.dataset_url.replace("file://", ""),
                       plan.assignment(rank, world_size=3, batch_size=8, balance_by=balance_by))


def test_one_auto_rule_for_every_reader(cost_plan):
    """``balance="auto"`` is the plan's rule (``ShardPlan.resolve_balance``): a cost plan is read in its cost-dealt
    order by make_loader, BalancedIterableDataset, make_reader and verify alike, shuffling or not."""
    from petastorm_balanced import BalancedIterableDataset, make_loader
    from petastorm_balanced.reading.backends import petastorm_importable
    from petastorm_balanced.tools.verify import ReadCheck
    assert cost_plan.resolve_balance("auto") == "cost" and cost_plan.resolve_balance("rows") == "rows"
    for rank in range(3):
        by_cost, by_rows = rank_ids(cost_plan, rank, "cost"), rank_ids(cost_plan, rank, "rows")
        assert not np.array_equal(by_cost, by_rows), "the cost order must differ from the row order here"
        readers = {
            "make_loader": lambda rank=rank: make_loader(rank, 3, plan=cost_plan, batch_size=8, shuffle=False,
                                                         backend="arrow"),
            "BalancedIterableDataset": lambda rank=rank: BalancedIterableDataset(cost_plan, rank, 3, batch_size=8,
                                                                       shuffle=False, backend="arrow"),
        }
        for name, make in readers.items():
            batches = list(make())
            assert all("_cost" in b for b in batches), f"{name}: a cost-balanced loader's batches carry _cost"
            got = np.concatenate([b["id"].numpy() for b in batches])
            assert np.array_equal(got, by_cost), name
        shuffled = np.concatenate([b["id"].numpy() for b in make_loader(rank, 3, plan=cost_plan, batch_size=8,
                                                                         backend="arrow", shuffle_window=96)])
        assert sorted(shuffled.tolist()) == sorted(by_cost.tolist()), "shuffling arranges the same rows"
        if petastorm_importable():
            from petastorm_balanced import make_reader
            with make_reader(rank, 3, plan=cost_plan, batch_size=8) as reader:
                got = np.concatenate([np.atleast_1d(b.id) for b in reader])
            assert np.array_equal(got, by_cost), "make_reader"
        check = ReadCheck(cost_plan, batch_size=8)
        keys, _, _ = check._rank_rows(rank, 0)  # what verify --read reads for the rank
        frags = cost_plan.assignment(rank, batch_size=8, balance_by="cost")
        assert np.array_equal(keys, np.concatenate([check.rows.keys(f) for f in frags])), "verify"


@pytest.mark.slow  # six Petastorm readers: about 7 s (the Unischema test below checks agreement quickly)
def test_backends_agree_under_cost_balance(cost_plan):
    pytest.importorskip("petastorm")
    from petastorm_balanced import make_loader
    cases = [(dict(cost_reduce="sum"), None), (dict(cost_reduce="max"), ["id"]),  # ["id"]: the cost's source
             (dict(batch_size=None, max_batch_cost=cost_plan.max_row_cost + 100), ["id"])]  # is read, then dropped
    for kwargs, fields in cases:
        a = [(b["id"].tolist(), b["_cost"].tolist(), sorted(b)) for b in make_loader(
            2, 3, plan=cost_plan, backend="arrow", shuffle_window=64, schema_fields=fields, **kwargs)]
        b = [(b["id"].tolist(), b["_cost"].tolist(), sorted(b)) for b in make_loader(
            2, 3, plan=cost_plan, backend="petastorm", shuffle_window=64, schema_fields=fields, **kwargs)]
        assert a == b, kwargs
        assert fields is None or a[0][2] == ["_cost", "id"]


def test_iterable_dataset_with_workers_balances_cost(cost_plan):
    """DataLoader workers: the rank's steps and rows are the same as the loader's, each batch of batch_size."""
    from petastorm_balanced import BalancedIterableDataset
    loader = BalancedIterableDataset(cost_plan, 1, 3, batch_size=8, shuffle_window=64).dataloader(num_workers=2)
    batches = [b["id"].numpy() for b in loader]
    assert len(batches) == cost_plan.steps_per_epoch(3, 8) and all(len(b) == 8 for b in batches)
    assert len(np.unique(np.concatenate(batches))) == len(batches) * 8


# ------------------------------------------------------------------------------------------------ Spark (G8)

@pytest.mark.slow
def test_spark_and_local_cost_plans_agree(spark, lengths):
    for cost in ("length", "length(text)"):
        ours = plan_shards(lengths, 3, batch_size=8, engine="local", cost=cost)
        theirs = plan_shards(lengths, 3, batch_size=8, engine="spark", spark=spark, cost=cost)
        assert theirs.checksum == ours.checksum  # G8
    filtered = plan_shards(lengths, 3, batch_size=8, engine="spark", spark=spark, cost="length(text)",
                           where="length > 20")
    truth = {}  # (file, row group) -> (sum, max) of the lengths above 20, read with pyarrow
    for name in sorted(os.listdir(lengths)):
        parquet = pq.ParquetFile(os.path.join(lengths, name))
        for i in range(parquet.num_row_groups):
            values = parquet.read_row_group(i, columns=["length"]).column(0).to_numpy()
            if (values > 20).any():
                truth[(name, i)] = (int(values[values > 20].sum()), int(values[values > 20].max()))
    assert {(r.path, r.row_group): (r.cost_sum, r.cost_max) for r in filtered.catalog.row_groups} == truth
    expression = plan_shards(lengths, 3, batch_size=8, engine="spark", spark=spark, cost="length * 2 + 1")
    assert expression.catalog.cost_sums().sum() == 2 * ours_total(lengths) + expression.total_rows
    from petastorm_balanced import make_loader
    with pytest.raises(ValueError, match="Spark SQL expression the loader cannot evaluate"):
        make_loader(0, 3, plan=expression, backend="arrow")
    with pytest.raises(ValueError, match="negative"):
        plan_shards(lengths, 3, batch_size=8, engine="spark", spark=spark, cost="length - 40")


def ours_total(path):
    return int(pq.read_table(path, columns=["length"]).column(0).to_numpy().sum())


# ------------------------------------------------------------------------------------------------ tools

def test_inspect_and_compare_show_the_cost_side(cost_plan, lengths):
    from petastorm_balanced.tools.report import compare_report, format_compare, format_inspect, inspect_report
    report = inspect_report(cost_plan, plan_url="x")
    cost = report["cost"]
    assert cost["total_cost"] == int(cost_plan.catalog.cost_sums().sum()) == sum(cost["petastorm_rank_costs"])
    assert abs(sum(cost["rank_costs"]) - cost["total_cost"]) <= cost["total_cost"] * 0.05  # drop leaves < W x B
    assert cost["straggler_ratio"] >= 1.0 and "max/mean" in format_inspect(report)
    assert "cost 'length'" in format_compare(compare_report(cost_plan))
    assert "cost" not in inspect_report(plan_shards(lengths, 3, batch_size=8, engine="local"), plan_url="x")


def test_verify_rechecks_cost_statistics(cost_plan):
    from dataclasses import replace

    from petastorm_balanced.core.catalog import Catalog
    from petastorm_balanced.tools.verify import cost_check
    assert cost_check(cost_plan).ok
    groups = list(cost_plan.catalog.row_groups)
    groups[2] = replace(groups[2], cost_sum=groups[2].cost_sum + 1)
    catalog = cost_plan.catalog
    edited = replace(cost_plan, catalog=Catalog(catalog.files, tuple(groups), catalog.kind,
                                                catalog.partition_columns, catalog.cost))
    check = cost_check(edited)
    assert not check.ok and f"row group {groups[2].row_group}" in check.detail


@pytest.mark.slow
def test_cli_plans_inspects_and_verifies_a_cost_plan(lengths, tmp_path):
    """The real command: plan --cost, inspect --json shows the cost side, verify --read re-checks it."""
    import subprocess
    import sys
    repo = str(ROOT)

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "petastorm_balanced", *map(str, args)], cwd=repo,
                              env=dict(os.environ, PYTHONPATH=repo), capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, (done.stdout, done.stderr)
        return done.stdout

    out = tmp_path / "plan"
    cli("plan", lengths, "--world-size", 3, "--batch-size", 8, "--engine", "local", "--cost", "length(text)",
        "--output", out)
    report = json.loads(cli("inspect", out, "--json"))
    assert report["cost"]["text"] == "length(text)" and report["cost"]["max_row_cost"] == load_plan(
        str(out)).max_row_cost
    assert "ok    cost statistics (read)" in cli("verify", out, "--read")


def test_petastorm_dataset_cost_by_a_unischema_field(petastorm_dataset):
    """A Unischema dataset: cost from a scalar field and from length(lang); both backends, same batches."""
    pytest.importorskip("petastorm")
    from petastorm_balanced import make_loader
    for cost in ("label", "length(lang)"):
        plan = plan_shards(petastorm_dataset.path, 2, batch_size=16, engine="local", cost=cost)
        runs = {backend: [(b["id"].tolist(), b["_cost"].tolist()) for b in make_loader(
            1, 2, plan=plan, backend=backend, shuffle_window=256, schema_fields=["id", "image"])]
            for backend in ("arrow", "petastorm")}
        assert runs["arrow"] == runs["petastorm"] and len(runs["arrow"]) == plan.steps_per_epoch()
