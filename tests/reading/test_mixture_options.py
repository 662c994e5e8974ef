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
