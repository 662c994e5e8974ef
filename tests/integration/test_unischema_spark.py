"""Unischema datasets written with Spark: by real Petastorm's ``materialize_dataset`` (the oracle,
petastorm stack) and by ours (any stack, no Petastorm), read by Petastorm's ``make_reader`` and by our readers and
loaders, every field of every row compared. Cross-stack directions are in tests/integration/test_stacks.py."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import BalancedIterableDataset, make_loader, plan_shards
from petastorm_balanced.reading.front.reader import make_reader
from petastorm_balanced.unischema import pickling
from tests.support import unischema_data as ud
from tests.support.stacks import HAVE_PETASTORM, petastorm_only

pytestmark = [pytest.mark.slow, pytest.mark.stack]


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory):
    """{writer: dataset path}: ours always, Petastorm's where it imports."""
    out = {}
    for writer in ["ours"] + (["petastorm"] if HAVE_PETASTORM else []):
        path = tmp_path_factory.mktemp(writer) / "ds"
        ud.write(spark, str(path), writer)
        out[writer] = str(path)
    return out


def cells(batch, name):
    values = batch[name]
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.to_pylist()
    return list(values.numpy() if hasattr(values, "numpy") else values)  # torch tensors: their numpy view


def loader_rows(batches):
    """Loader batches (column arrays) back to rows by id."""
    rows = {}
    for batch in batches:
        columns = {k: cells(batch, k) for k in batch}
        for i, ident in enumerate(columns["id"]):
            rows[int(ident)] = {k: v[i] for k, v in columns.items()}
    return rows


def value_equal(a, b):
    """A loader cell ``a`` holds the reader's value ``b`` (dates arrive as days since the epoch in tensors)."""
    if isinstance(b, np.datetime64) and not isinstance(a, np.datetime64):
        return int(a) == b.astype("datetime64[D]").astype(np.int64)
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if b is None or (isinstance(b, float) and b != b):
        return a is None or (isinstance(a, float) and a != a)
    return a == b


def test_our_writer_stores_the_inputs_and_petastorms_metadata_keys(written):
    """Independent oracle: the rows given to dict_to_spark_row come back (PNG and ndarrays exactly)."""
    path = written["ours"]
    meta = pq.read_schema(os.path.join(path, "_common_metadata")).metadata
    assert {b"dataset-toolkit.unischema.v1", b"dataset-toolkit.num_row_groups_per_file.v1"} <= set(meta)
    assert str(pickling.loads(meta[b"dataset-toolkit.unischema.v1"])) == str(ud.schema("ours"))
    plan = plan_shards(path, 1, batch_size=1, engine="local")
    with make_reader(0, 1, plan=plan, backend="arrow") as reader:
        rows = {int(r.id): r for r in reader}
    assert sorted(rows) == list(range(ud.ROWS))
    for i, got in rows.items():
        want = ud.row(i)
        for name in ("vec", "mat", "png", "gray"):
            assert np.array_equal(getattr(got, name), want[name]) and getattr(got, name).dtype == want[name].dtype
        assert np.abs(got.jpg.astype(int) - want["jpg"].astype(int)).mean() < 8  # JPEG: lossy
        assert got.name == want["name"] and got.price == want["price"] and got.i16 == want["i16"]
        assert (np.isnan(got.f64) if want["f64"] is None else got.f64 == want["f64"])
        assert got.day == np.datetime64(want["day"]) and bool(got.flag) == want["flag"]
    for what, batches in {"loader": make_loader(0, 1, plan=plan, backend="arrow", shuffle=False, batch_size=4),
                          "iterable": BalancedIterableDataset(plan, 0, 1, shuffle=False, batch_size=4)}.items():
        delivered = loader_rows(batches)  # the loaders' column arrays hold make_reader's values
        assert sorted(delivered) == sorted(rows), what
        for i, row in delivered.items():
            for name, value in rows[i]._asdict().items():
                assert value_equal(row[name], value), (what, i, name, row[name], value)


@petastorm_only
@pytest.mark.parametrize("writer", ["petastorm", "ours"])
def test_every_field_equals_petastorms_make_reader(written, writer):
    """Petastorm 0.12.1 reads both datasets; our make_reader (Arrow) gives the same values and types, and our
    loaders (both backends) and BalancedIterableDataset the same values."""
    from petastorm import make_reader as petastorm_make_reader
    url = "file://" + written[writer]
    with petastorm_make_reader(url, reader_pool_type="dummy", num_epochs=1) as reader:
        theirs = list(reader)
    expected = ud.row_digests(theirs)
    assert len(expected) == ud.ROWS
    plan = plan_shards(url, 1, batch_size=4, engine="local")
    with make_reader(0, 1, plan=plan, backend="arrow") as reader:
        assert ud.row_digests(reader) == expected
    by_id = {int(r.id): r._asdict() for r in theirs}
    sources = {f"loader-{b}": make_loader(0, 1, plan=plan, backend=b, shuffle=False) for b in ("arrow", "petastorm")}
    sources["iterable"] = BalancedIterableDataset(plan, 0, 1, shuffle=False)
    for what, batches in sources.items():
        rows = loader_rows(batches)
        assert sorted(rows) == sorted(by_id), what
        for i, row in rows.items():
            for name, value in by_id[i].items():
                assert value_equal(row[name], value), (what, i, name, row[name], value)
