"""Every option for any number of sources: a mixture checks names, formats lists and resumes updated plans with the
one-plan loader's own code, so each case here is compared with (or refused like) one plan alone."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import plan_shards

torch = pytest.importorskip("torch")

from petastorm_balanced import BalancedIterableDataset, make_loader  # noqa: E402


def write(root, table, files=2):
    root.mkdir()
    per = -(-table.num_rows // files)
    for i in range(files):
        pq.write_table(table.slice(i * per, per), root / f"part-{i}.parquet", row_group_size=16)
    return str(root)


def dataset(root, n, **extra):
    return write(root, pa.table({"id": np.arange(n), "n": (np.arange(n) % 7 + 1).astype(np.int64), **extra}))


@pytest.mark.parametrize("column, values, kwargs", [
    ("_source", lambda n: [f"s{i}" for i in range(n)], {}),
    ("_padding", lambda n: [True] * n, {}),
    ("_cost", lambda n: np.arange(n), {"cost": "n"}),
    ("x__valid", lambda n: [True] * n, {"nullable_x": True}),
])
def test_a_column_named_like_what_the_loader_adds_is_refused_naming_it_for_one_plan_and_mixtures(
        tmp_path, column, values, kwargs):
    extra = {column: values(64)}
    if kwargs.get("nullable_x"):
        extra["x"] = pa.array([None if i % 5 == 0 else i for i in range(64)], pa.int64())
    a, b = dataset(tmp_path / "a", 64, **extra), dataset(tmp_path / "b", 64, **extra)
    cost = kwargs.get("cost")
    pa_, pb = (plan_shards(url, 2, batch_size=8, engine="local", cost=cost) for url in (a, b))
    refused = rf"column named '{column}', which is also"
    with pytest.raises(ValueError, match=refused):
        make_loader(0, 2, plan=[pa_, pb], weights=[1, 1], backend="arrow")
    with pytest.raises(ValueError, match=refused):
        BalancedIterableDataset([pa_, pb], 0, 2, weights=[1, 1], batch_size=8, backend="arrow")
    if column == "_source":  # one plan adds no _source: nothing collides, the dataset's values arrive as they are
        batch = next(iter(make_loader(0, 2, plan=pa_, backend="arrow", batch_format="numpy")))
        assert all(v == f"s{i}" for v, i in zip(batch["_source"], batch["id"].tolist(), strict=True))
    else:
        with pytest.raises(ValueError, match=refused):
            make_loader(0, 2, plan=pa_, backend="arrow")


@pytest.fixture(scope="module")
def list_plans(tmp_path_factory):
    """Two sources with the same list columns: ``vec`` always 4 floats, ``tok`` token ids of lengths 1..6 in one
    and 2..9 in the other (the longest padded list is the second source's)."""
    root = tmp_path_factory.mktemp("mixture_lists")
    plans = []
    for s, (n, low, high) in enumerate(((96, 1, 6), (80, 2, 9))):
        rng = np.random.default_rng(s)
        tok = [list(range(i, i + int(rng.integers(low, high + 1)))) for i in range(n)]
        tok[0], tok[1] = list(range(low)), list(range(high))  # both extremes present
        table = pa.table({"id": np.arange(n), "vec": pa.array([[i + 0.5 * k for k in range(4)] for i in range(n)],
                                                                pa.list_(pa.float32())),
                          "tok": pa.array(tok, pa.list_(pa.int64()))})
        plans.append(plan_shards(write(root / f"s{s}", table), 2, batch_size=8, engine="local", seed=s))
    return plans


def by_id(loader, plan_index=None):
    """Every delivered row's values by (source, id), and the batches' keys, dtypes and shapes."""
    rows, forms = {}, set()
    for batch in loader:
        forms.add(tuple((k, str(np.asarray(v).dtype) if isinstance(v, np.ndarray) else type(v).__name__,
                         np.asarray(v).shape[1:] if isinstance(v, np.ndarray) else None)
                        for k, v in batch.items() if k != "_source"))
        sources = batch["_source"] if plan_index is None else [plan_index] * len(batch["id"])
        for j, (s, i) in enumerate(zip(sources, batch["id"], strict=True)):
            rows[(int(s), int(i))] = {k: v[j] for k, v in batch.items() if k not in ("_source", "id")}
    return rows, forms


def same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("options", [dict(list_format="auto"), dict(list_format="padded"),
                                     dict(list_format={"vec": "tensor", "tok": "padded"}),
                                     dict(list_shapes={"vec": (4,)}), dict(list_format="python")])
def test_a_mixture_delivers_lists_as_one_plan_does(list_plans, options):
    kwargs = dict(backend="arrow", batch_format="numpy", workers_count=1, **options)
    mixture = make_loader(0, 2, plan=list_plans, weights=[1, 1], **kwargs)
    mixed, forms = by_id(mixture)
    assert len(forms) == 1, "every batch has the same keys, dtypes and shapes"
    longest = max(len(row["tok"]) for row in mixed.values())
    singles = [make_loader(0, 2, plan=p, **kwargs) for p in list_plans]
    for name in mixture.schema.names:
        if name == "_source":
            continue
        declared = [s.schema[name] for s in singles]
        if name == "tok" and "padded" in str(options):  # padded to the longest list of either source
            assert mixture.schema[name].shape == (max(d.shape[0] for d in declared),) == (9,)
            declared = [d.__class__(**{**d.__dict__, "shape": (9,)}) for d in declared]
        assert mixture.schema[name] in declared, name
    checked = 0
    for s, single in enumerate(singles):
        alone, _ = by_id(single, s)
        for key, row in mixed.items():
            if key not in alone:
                continue
            for name, value in row.items():
                theirs = alone[key][name]
                if name == "tok" and isinstance(value, np.ndarray) and value.ndim == 1 and "padded" in str(options):
                    n = int(row["tok__lengths"])
                    assert value.shape == (longest,) and not value[n:].any()
                    value, theirs = value[:n], theirs[:n]
                assert same(value, theirs), (key, name, value, theirs)
            checked += 1
    assert checked >= 40


def test_padded_lists_as_the_cost_cost_their_lengths_in_a_mixture_as_for_one_plan(tmp_path):
    """Sources whose plans cost size(tok), read with list_format="padded": a row's cost is its list's length (the
    lengths column), as one plan's is, not the padded width, so the cost arrangement delivers the rows in the order
    it gives with Python lists."""
    plans = []
    for s, n in enumerate((96, 80)):
        tok = [list(range((i * (s + 3)) % 7 + 1)) for i in range(n)]
        table = pa.table({"id": np.arange(n), "tok": pa.array(tok, pa.list_(pa.int32()))})
        plans.append(plan_shards(write(tmp_path / f"s{s}", table), 2, batch_size=8, engine="local",
                                 cost="size(tok)", seed=s))
    for plan in (plans[0], plans):
        orders = []
        for list_format in ("python", "padded"):
            loader = make_loader(0, 2, plan=plan, weights=[1, 1] if isinstance(plan, list) else None,
                                 backend="arrow", batch_format="numpy", list_format=list_format)
            orders.append([(int(s), int(i)) for b in loader
                           for s, i in zip(b.get("_source", [0] * len(b["id"])), b["id"], strict=True)])
        assert len(orders[0]) >= 40 and orders[0] == orders[1]


def test_tensor_lists_of_other_lengths_are_refused_for_a_mixture_as_for_one_plan(list_plans):
    for plan in (list_plans[0], list_plans):
        with pytest.raises(ValueError, match=r"list_format='tensor': column 'tok' holds lists of \d+ to \d+ items"):
            make_loader(0, 2, plan=plan, weights=[1, 1] if isinstance(plan, list) else None, backend="arrow",
                        list_format="tensor")
    with pytest.raises(ValueError, match=r"'nope', which is not a list column read"):
        make_loader(0, 2, plan=list_plans, weights=[1, 1], backend="arrow", list_shapes={"nope": (2,)})


def test_an_updated_source_resumes_at_its_pass_start_as_one_plan_does_and_mid_pass_is_refused_naming_it(tmp_path):
    """Source 0 (100 rows, 5 per batch of 10: its pass ends exactly at a batch) is the scarcest, so an epoch
    boundary is its pass start; then it gains a file of 50 rows (``plan_shards(update=)``)."""
    a = tmp_path / "a"
    dataset(a, 100)
    b = dataset(tmp_path / "b", 300)
    old = plan_shards(str(a), 1, batch_size=10, engine="local", seed=1)
    other = plan_shards(b, 1, batch_size=10, engine="local", seed=2)
    kwargs = dict(weights=[1, 1], batch_size=10, backend="arrow", workers_count=1, batch_format="numpy")
    loader = make_loader(0, 1, plan=[old, other], **kwargs)
    assert len(list(loader)) == 20
    boundary = loader.state_dict()
    assert boundary["mixture"]["sources"][0] == [1, 0]
    next(iter(loader))
    inside = loader.state_dict()
    pq.write_table(pa.table({"id": np.arange(100, 150), "n": np.ones(50, np.int64)}), a / "part-9.parquet",
                   row_group_size=16)
    new = plan_shards(str(a), 1, batch_size=10, engine="local", seed=1, update=old)
    assert old.checksum in new.extends
    resumed = make_loader(0, 1, plan=[new, other], **kwargs)
    resumed.load_state_dict(boundary)
    batches = list(resumed)
    assert len(batches) == 30, "the updated source's pass holds its 150 rows, 5 per batch"
    ids = [i for b in batches for s, i in zip(b["_source"], b["id"], strict=True) if s == 0]
    assert sorted(ids) == list(range(150)), "every row of the updated plan once in its pass, the new ones included"
    # the other source continues exactly where it stood, as without the update
    unchanged = make_loader(0, 1, plan=[old, other], **kwargs)
    unchanged.load_state_dict(boundary)
    theirs = [i for b in unchanged for s, i in zip(b["_source"], b["id"], strict=True) if s == 1]
    ours = [i for b in batches for s, i in zip(b["_source"], b["id"], strict=True) if s == 1]
    assert ours[:len(theirs)] == theirs
    with pytest.raises(ValueError, match=r"state\['mixture'\]\['sources'\]\[0\]=\[1, 5\] stands inside a pass .* "
                                         r"= \[2, 0\]"):
        make_loader(0, 1, plan=[new, other], **kwargs).load_state_dict(inside)
    stranger = plan_shards(b, 1, batch_size=10, engine="local", seed=5)
    with pytest.raises(ValueError, match="same plans and settings"):
        make_loader(0, 1, plan=[new, stranger], **kwargs).load_state_dict(boundary)


def test_a_mixture_says_its_shuffle_budget_as_one_plan_does(list_plans):
    for plan, weights in ((list_plans, [1, 1]), (list_plans[0], None)):
        loader = make_loader(0, 2, plan=plan, weights=weights, backend="arrow", shuffle_budget="64MiB")
        assert loader.shuffle_budget == 64 * 2**20
