"""``transform_spec`` on a mixture: each source binds the spec to its own columns and transforms its rows where they
are decoded, as one plan does, so a delivered row's values are the function applied to ``pyarrow.dataset``'s row of
that source (found by ``_source`` and ``id``); the mixture's columns are the transform's outputs, which must agree
across the sources. Two sources written with pyarrow in row groups of uneven sizes: ``label`` has nulls in source 0
only (a mask for every source, all True in source 1), ``cut`` is int32 in one and int64 in the other (a mixture
refuses it unless the transform drops or declares it)."""
import multiprocessing

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import TransformSpec, plan_shards
from petastorm_balanced.errors import InvalidValueError
from tests.support.stacks import petastorm_only
from tests.support.transform_funcs import cut_as_float, mixed

torch = pytest.importorskip("torch")

from petastorm_balanced import BalancedIterableDataset, make_loader  # noqa: E402

BACKENDS = ["arrow", pytest.param("petastorm", marks=petastorm_only)]
SIZES = (150, 90)
WEIGHTS = [2, 1]
BATCH = 9
SPEC = dict(edit_fields=[("score", np.float32, (), False), ("value", np.float32, (), False)], removed_fields=["cut"])


def spec():
    return TransformSpec(mixed, **SPEC)


def write(root, index, n):
    rng = np.random.default_rng(index)
    first = 1000 * index
    table = pa.table({
        "id": np.arange(first, first + n, dtype=np.int64),
        "label": pa.array([None if index == 0 and i % 7 == 3 else int(v) for i, v in
                           enumerate(rng.integers(0, 50, n))], pa.int64()),
        "value": rng.normal(size=n),
        "text": [f"row-{first + i}-{'x' * (i % 5)}" for i in range(n)],
        "vec": pa.array([[float(i), i + 0.5, -float(i)] for i in range(n)], pa.list_(pa.float32())),
        "cut": pa.array(np.arange(n) % 11, pa.int32() if index == 0 else pa.int64()),
        "tok": pa.array([list(range(i % (4 + 3 * index) + 1 + index)) for i in range(n)], pa.list_(pa.int64())),
    })
    root.mkdir()
    half = n // 2 + 7  # files, and row groups, of uneven sizes
    pq.write_table(table.slice(0, half), root / "part-0.parquet", row_group_size=13 + 4 * index)
    pq.write_table(table.slice(half), root / "part-1.parquet", row_group_size=29 - 6 * index)
    return str(root)


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture_transform")
    return [write(root / f"s{i}", i, n) for i, n in enumerate(SIZES)]


@pytest.fixture(scope="module")
def plans(urls):
    return [plan_shards(url, 2, batch_size=BATCH, seed=5 + i, engine="local") for i, url in enumerate(urls)]


def expected(urls, func=mixed):
    """Each source's rows through ``func``, by id, from pyarrow.dataset."""
    return [func(pads.dataset(url, format="parquet").to_table().to_pandas()).set_index("id") for url in urls]


def as_numpy(value):
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def check_values(batches, tables):
    """Every delivered row's values are its source's row through the function; returns the (source, id) rows."""
    rows = []
    for batch in batches:
        sources, ids = as_numpy(batch["_source"]), as_numpy(batch["id"])
        rows += list(zip(sources.tolist(), ids.tolist(), strict=True))
        for s, table in enumerate(tables):
            pick = sources == s
            want = table.loc[ids[pick]]
            assert np.array_equal(as_numpy(batch["score"])[pick], want["score"].to_numpy(np.float32))
            assert np.array_equal(as_numpy(batch["value"])[pick], want["value"].to_numpy(np.float32))
            assert [t for t, p in zip(batch["text"], pick.tolist(), strict=True) if p] == want["text"].tolist()
            assert np.array_equal(as_numpy(batch["vec"])[pick], np.stack(want["vec"].to_numpy()))
            valid = as_numpy(batch["label__valid"])[pick]
            assert np.array_equal(valid, want["label"].notna().to_numpy())  # source 1: all True (added)
            assert np.array_equal(as_numpy(batch["label"])[pick][valid], want["label"].dropna().to_numpy(np.int64))
            assert "cut" not in batch
    return rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_row_is_its_sources_row_through_the_function_and_no_row_moves(plans, urls, backend):
    tables = expected(urls)
    assert any(t["label"].isna().any() for t in tables) and not tables[1]["label"].isna().any()
    for rank in range(2):
        kwargs = dict(weights=WEIGHTS, backend=backend, batch_format="numpy", shuffle_window=20)
        batches = list(make_loader(rank, 2, plan=plans, transform_spec=spec(), **kwargs))
        rows = check_values(batches, tables)
        # the same rows in the same order as the mixture without a transform (which refuses ``cut``: left out)
        plain = make_loader(rank, 2, plan=plans, schema_fields=["id", "label"], **kwargs)
        assert len(batches) == len(plain) > 0
        assert rows == [r for b in plain for r in zip(b["_source"].tolist(), b["id"].tolist(), strict=True)]


def test_the_schema_and_tensors_are_what_one_plan_gives(plans):
    mixture = make_loader(0, 2, plan=plans, weights=WEIGHTS, backend="arrow", transform_spec=spec())
    columns = [c for c in mixture.schema.columns if c.name != "_source"]
    names = [c.name for c in columns]
    assert names == ["id", "label", "label__valid", "text", "vec", "tok", "score", "value"]  # edited last, cut gone
    one = [make_loader(0, 2, plan=p, backend="arrow", transform_spec=spec()) for p in plans]
    assert tuple(columns) == one[0].schema.columns  # source 0 has label's nulls: its schema is the mixture's
    loose = {"label", "label__valid"}  # source 1 alone: label without nulls, so no mask
    assert [c for c in columns if c.name not in loose] == [c for c in one[1].schema.columns if c.name not in loose]
    batch, single = next(iter(mixture)), next(iter(one[0]))
    assert set(batch) == {*names, "_source"} and set(single) == set(names)
    for name in names:
        if isinstance(single[name], torch.Tensor):
            assert (batch[name].dtype, batch[name].shape[1:]) == (single[name].dtype, single[name].shape[1:]), name
        else:
            assert type(batch[name]) is type(single[name]), name
    assert batch["value"].dtype == torch.float32 and batch["vec"].shape[1:] == (3,)


def test_schema_fields_pick_what_the_function_reads(plans, urls):
    picked = TransformSpec(mixed, edit_fields=SPEC["edit_fields"])
    loader = make_loader(1, 2, plan=plans, weights=WEIGHTS, backend="arrow", batch_format="numpy",
                         schema_fields=["id", "value", "text"], transform_spec=picked)
    assert loader.schema.names == ("id", "text", "score", "value", "_source")
    tables = expected(urls)
    for batch in loader:
        for s, table in enumerate(tables):
            pick = batch["_source"] == s
            assert np.array_equal(batch["score"][pick], table.loc[batch["id"][pick], "score"].to_numpy(np.float32))


def test_outputs_that_disagree_across_sources_are_refused_naming_the_column(plans, urls):
    kept = TransformSpec(mixed, edit_fields=SPEC["edit_fields"])  # cut passes through: int32 here, int64 there
    with pytest.raises(InvalidValueError, match=r"column 'cut' is int64 .* in source 1 .* but int32 .* in source 0: "
                                                r"declare the column's type in transform_spec's edit_fields"):
        make_loader(0, 2, plan=plans, weights=WEIGHTS, backend="arrow", transform_spec=kept)
    with pytest.raises(InvalidValueError, match=r"column 'cut' is int64"):
        BalancedIterableDataset(plans, 0, 2, weights=WEIGHTS, backend="arrow", transform_spec=kept)
    # declared in edit_fields, every source delivers one type
    declared = TransformSpec(cut_as_float, edit_fields=[("cut", np.float64, (), False)])
    loader = make_loader(0, 2, plan=plans, weights=WEIGHTS, backend="arrow", batch_format="numpy",
                         transform_spec=declared)
    assert loader.schema["cut"].dtype == "float64"
    tables = expected(urls, cut_as_float)
    for batch in loader:
        for s, table in enumerate(tables):
            pick = batch["_source"] == s
            assert np.array_equal(batch["cut"][pick], table.loc[batch["id"][pick], "cut"].to_numpy())


def test_a_source_balanced_by_cost_with_a_transform_is_refused_naming_it(urls, plans):
    costly = plan_shards(urls[1], 2, batch_size=BATCH, cost="label", engine="local")
    refused = (r"source 1 \(.*\): transform_spec with a cost plan balanced by cost: the per-row costs come from the "
               r"columns read, before any transform; pass balance='rows'")
    with pytest.raises(InvalidValueError, match=refused):
        make_loader(0, 2, plan=[plans[0], costly], weights=WEIGHTS, backend="arrow", transform_spec=spec())
    with pytest.raises(InvalidValueError, match=refused):
        BalancedIterableDataset([plans[0], costly], 0, 2, weights=WEIGHTS, backend="arrow", transform_spec=spec())
    loader = make_loader(0, 2, plan=[plans[0], costly], weights=WEIGHTS, backend="arrow", balance="rows",
                         transform_spec=spec())
    assert "score" in next(iter(loader))


def test_list_columns_take_list_format_through_the_transform(plans):
    """``tok`` has 1 to 4 tokens in source 0, 2 to 8 in source 1: padded to the longest of every source."""
    kwargs = dict(weights=WEIGHTS, backend="arrow", batch_format="numpy", list_format="padded", shuffle_window=20)
    through = make_loader(0, 2, plan=plans, transform_spec=TransformSpec(None, removed_fields=["cut"]), **kwargs)
    plain = make_loader(0, 2, plan=plans, schema_fields=["id", "label", "value", "text", "vec", "tok"], **kwargs)
    assert through.schema == plain.schema and through.schema["tok"].shape == (8,)
    batches = list(through)
    assert {n for b in batches for n in b["tok__lengths"].tolist()} == set(range(1, 9))
    equal_batches(batches, list(plain))


def equal_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert set(a) == set(b)
        for key in b:
            if isinstance(b[key], torch.Tensor) or (isinstance(b[key], np.ndarray) and b[key].dtype != object):
                assert np.array_equal(as_numpy(a[key]), as_numpy(b[key])), key
            else:  # one value per row: text, lists
                assert [np.asarray(v).tolist() for v in a[key]] == [np.asarray(v).tolist() for v in b[key]], key


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stop", [1, 7])
def test_a_state_mid_epoch_resumes_with_the_rest_exactly(plans, backend, stop):
    kwargs = dict(weights=WEIGHTS, backend=backend, shuffle_window=20, transform_spec=spec())
    loader = make_loader(1, 2, plan=plans, **kwargs)
    loader.set_epoch(1)
    whole = list(loader)
    loader.set_epoch(1)
    stream = iter(loader)
    first = [next(stream) for _ in range(stop)]
    state = loader.state_dict()
    resumed = make_loader(1, 2, plan=plans, **kwargs)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    equal_batches(first + list(resumed), whole)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: ~20 s
def test_dataloader_workers_deliver_the_same_values(plans, urls, context):
    dataset = BalancedIterableDataset(plans, 0, 2, weights=WEIGHTS, batch_size=BATCH, backend="arrow",
                                      shuffle_window=20, transform_spec=spec())
    loader = dataset.dataloader(num_workers=2, multiprocessing_context=multiprocessing.get_context(context))
    batches = list(loader)
    rows = check_values(batches, expected(urls))
    plain = BalancedIterableDataset(plans, 0, 2, weights=WEIGHTS, batch_size=BATCH, backend="arrow",
                                    shuffle_window=20, schema_fields=["id"]).dataloader(num_workers=2)
    assert rows == [r for b in plain for r in zip(b["_source"].tolist(), b["id"].tolist(), strict=True)]


def test_a_function_that_does_not_pickle_is_refused_for_spawned_workers(plans):
    dataset = BalancedIterableDataset(plans, 0, 2, weights=WEIGHTS, batch_size=BATCH, backend="arrow",
                                      transform_spec=TransformSpec(lambda f: f, removed_fields=["cut"]))
    with pytest.raises(InvalidValueError, match=r"transform_spec.func=<function .*<lambda>.* cannot be pickled"):
        dataset.dataloader(num_workers=2, multiprocessing_context=multiprocessing.get_context("spawn"))

