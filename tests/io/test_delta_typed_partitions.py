"""Delta partition columns typed as the table's schema types them, compared row by row with deltalake's own read.

A string partition column holding ``'007'``, ``'01'`` and ``'1'`` delivers those strings (never 7 and 1, never
merged); long, int, date, timestamp, boolean, decimal and double partitions deliver deltalake's values; nulls
(``__HIVE_DEFAULT_PARTITION__``) and special characters included. Predicates over partition columns see the same
typed values in planning.
"""
import datetime
import decimal

import numpy as np
import pyarrow as pa
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.predicates import in_lambda
from tests.support.delta import delivered_rows, delta_rows, same

deltalake = pytest.importorskip("deltalake", reason="Delta tests need deltalake (pip install "
                                "'petastorm-balanced[delta]')")

D = datetime.date
T = datetime.datetime
DEC = decimal.Decimal
ROWS = pa.table({
    "id": pa.array(range(8), pa.int64()),
    "s": pa.array(["007", "01", "1", "a/b%c", None, "x y=z", "é#?", "1"]),
    "i": pa.array([1, 2, None, 3, 4, 5, -6, 2], pa.int64()),
    "i32": pa.array([1, 2, 3, None, 5, 6, 7, 7], pa.int32()),
    "d": pa.array([D(2021, 1, 1)] * 3 + [None, D(2020, 2, 29), D(1999, 12, 31), D(1970, 1, 1), D(2021, 1, 1)],
                  pa.date32()),
    "ts": pa.array([T(2021, 1, 1, 12, 30, 1, 500)] * 2 + [None] + [T(2020, 1, 1)] * 4 + [T(1969, 12, 31, 23, 59)],
                   pa.timestamp("us", tz="UTC")),
    "b": pa.array([True, False, None, True, True, False, True, False]),
    # delta-rs writes a negative decimal partition value it cannot read back ('-2.-25'): non-negative only
    "dec": pa.array([DEC("1.50"), None, DEC("12.25"), DEC("1.50"), DEC("0.00"), DEC("3.10"), DEC("3.1"), DEC("7")],
                    pa.decimal128(5, 2)),
    "f": pa.array([1.5, None, 2.0, -0.0, 1e10, 3.25, 0.1, 2.0]),
    "x": pa.array(np.arange(8, dtype=np.float64) * 10),
})


@pytest.mark.parametrize("partition_by", [["s"], ["i", "d"], ["ts"], ["b", "dec"], ["f"], ["i32", "s"]],
                         ids=lambda cols: "-".join(cols))
def test_partitions_deliver_deltalakes_values_row_by_row(tmp_path, partition_by):
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, ROWS, partition_by=partition_by)
    columns = partition_by + ["x"]
    want, schema = delta_rows(path, columns)
    got = delivered_rows(plan_shards(path, 2, engine="local", batch_size=3, policy="pad"), columns, schema)
    assert sorted(got) == sorted(want) == list(range(8))
    for i in want:
        for c in columns:
            assert same(got[i][c], want[i][c]), f"id {i} column {c}: delivered {got[i][c]!r}, deltalake {want[i][c]!r}"



def deltalake_ids(path: str, where: str) -> list:
    """The ids deltalake's own SQL (DataFusion) selects with ``where``: the oracle for typed partition values."""
    query = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(path))
    reader = query.execute(f"select id from t where {where}")
    want = sorted(pa.RecordBatchReader._import_from_c_capsule(reader.__arrow_c_stream__()).read_all()
                  .column("id").to_pylist())
    assert want, "the oracle selects no row: the test would not tell types apart"
    return want

@pytest.mark.parametrize(("column", "test", "oracle"), [
    ("s", lambda v: v == "01", "s = '01'"),
    ("s", lambda v: v is None, "s IS NULL"),
    ("d", lambda v: v is not None and v >= D(2020, 1, 1), "d >= '2020-01-01'"),
    ("ts", lambda v: v is not None and v.year == 2020, "ts >= '2020-01-01T00:00:00Z' AND ts < '2021-01-01T00:00:00Z'"),
    ("dec", lambda v: v is not None and v > DEC("2"), "dec > 2"),
    ("b", lambda v: v is False, "b = false"),
])
def test_a_predicate_over_a_partition_column_sees_the_typed_value(tmp_path, column, test, oracle):
    """Planning evaluates the predicate over the value the loader delivers; deltalake's SQL filter is the oracle."""
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, ROWS, partition_by=[column])
    want = deltalake_ids(path, oracle)
    plan = plan_shards(path, 1, engine="local", batch_size=1, predicate=in_lambda([column], test))
    got = sorted(int(i) for b in make_loader(0, 1, plan=plan, batch_size=1, workers_count=1) for i in b["id"])
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize(("column", "where"), [
    ("s", "s = '01'"),
    ("s", "s IS NULL"),
    ("d", "d >= '2020-01-01'"),
    ("ts", "ts >= '2020-01-01T00:00:00Z' AND ts < '2021-01-01T00:00:00Z'"),
    ("dec", "dec > 2"),
    ("b", "b = false"),
    ("f", "f > 1.75"),
])
def test_a_spark_where_over_a_partition_column_sees_the_typed_value(tmp_path, spark, column, where):
    """The Spark engine reads the snapshot's files with the declared types (a UTC timestamp read as UTC in any
    session time zone); the same SQL in deltalake's DataFusion is the oracle."""
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, ROWS, partition_by=[column])
    want = deltalake_ids(path, where)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        plan = plan_shards(path, 1, engine="spark", spark=spark, batch_size=1, where=where)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    got = sorted(int(i) for b in make_loader(0, 1, plan=plan, batch_size=1, workers_count=1) for i in b["id"])
    assert got == want
