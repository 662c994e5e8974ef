"""Delta tables as deltalake reads them: a table reset in place is read anew in the same process, a version past
the latest is refused at once naming the latest, and a schema that evolved between files (added columns) is
served as deltalake reads it."""
import shutil
import time

import numpy as np
import pyarrow as pa
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.predicates import in_lambda
from tests.support.delta import delivered_rows, delta_rows, same

deltalake = pytest.importorskip("deltalake", reason="Delta tests need deltalake (pip install "
                                "'petastorm-balanced[delta]')")


def rows(start, stop):
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 2})


def delivered(plan):
    return sorted(int(i) for b in make_loader(0, 1, plan=plan, batch_size=5, workers_count=1)
                  for i in b["id"].tolist())


def test_a_table_reset_in_place_is_read_anew_in_the_same_process(tmp_path):
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, rows(0, 10))
    assert delivered(plan_shards(path, 1, engine="local", batch_size=5)) == list(range(10))
    shutil.rmtree(path)
    time.sleep(0.01)
    deltalake.write_deltalake(path, rows(100, 120))  # version 0 again, other files
    assert deltalake.DeltaTable(path).version() == 0
    assert delivered(plan_shards(path, 1, engine="local", batch_size=5)) == list(range(100, 120))


@pytest.mark.parametrize("version", [5, 2 ** 31, 2 ** 63 - 1])
def test_a_version_past_the_latest_is_refused_at_once_naming_the_latest(tmp_path, version):
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, rows(0, 10))
    deltalake.write_deltalake(path, rows(10, 20), mode="append")
    start = time.monotonic()
    with pytest.raises(InvalidValueError, match=f"table_version={version} is past the latest version 1"):
        plan_shards(path, 1, engine="local", table_version=version)
    assert time.monotonic() - start < 10


def evolved_table(path):
    """v0 (id, x); v1 appends files with a string column y (some nulls); v2 appends files with y and an int z;
    v3 deletes some rows (rewriting files of both schemas); partitioned by p, so files of each schema share folders."""
    first = rows(0, 10).append_column("p", pa.array(["a", "b"] * 5))
    deltalake.write_deltalake(path, first, partition_by=["p"])
    second = rows(10, 20).append_column("p", pa.array(["a", "b"] * 5)).append_column(
        "y", pa.array([None if i % 3 == 0 else f"v{i}" for i in range(10, 20)]))
    deltalake.write_deltalake(path, second, mode="append", schema_mode="merge", partition_by=["p"])
    third = second.set_column(0, "id", pa.array(np.arange(20, 30, dtype=np.int64))).append_column(
        "z", pa.array([i if i % 4 else None for i in range(10)], pa.int32()))
    deltalake.write_deltalake(path, third, mode="append", schema_mode="merge", partition_by=["p"])
    deltalake.DeltaTable(path).delete("id % 7 = 3")


@pytest.mark.parametrize("version", [1, 2, 3])
def test_added_columns_are_served_as_deltalake_reads_them(tmp_path, version):
    """Files written before a column was added give nulls of the table's type, row by row as deltalake reads."""
    if version == 3 and int(pa.__version__.split(".")[0]) < 16:
        pytest.skip("delta-rs rewrites files with string views on a delete, which pyarrow < 16 cannot read")
    path = str(tmp_path / "table")
    evolved_table(path)
    columns = ["p", "x", "y"] + (["z"] if version >= 2 else [])
    want, schema = delta_rows(path, columns, version)
    plan = plan_shards(path, 2, engine="local", batch_size=3, policy="pad", table_version=version)
    got = delivered_rows(plan, columns, schema)
    assert sorted(got) == sorted(want) and len(want) >= 20
    for i in want:
        for c in columns:
            assert same(got[i][c], want[i][c]), f"id {i} column {c}: delivered {got[i][c]!r}, deltalake {want[i][c]!r}"
    assert delivered(plan_shards(path, 1, engine="local", batch_size=5, table_version=0)) == list(range(10))


def test_a_predicate_over_an_added_column_sees_nulls_in_older_files(tmp_path):
    path = str(tmp_path / "table")
    evolved_table(path)
    want = sorted(i for i, r in delta_rows(path, ["y"], 2)[0].items() if r["y"] is None)
    plan = plan_shards(path, 1, engine="local", batch_size=1, predicate=in_lambda(["y"], lambda y: y is None),
                       table_version=2)
    got = sorted(int(i) for b in make_loader(0, 1, plan=plan, batch_size=1, workers_count=1) for i in b["id"])
    assert got == want and 0 in want


@pytest.mark.parametrize("values", [["a", "b", "007", "c"], ["007", "01", "1", "1"]])
def test_string_partitions_stay_the_strings_written(tmp_path, values):
    """'007', '01' and '1' in a string partition column are those strings (not 7 and 1, never merged)."""
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, pa.table({"id": np.arange(4, dtype=np.int64), "p": values}), partition_by=["p"])
    plan = plan_shards(path, 1, engine="local", batch_size=2)
    got = sorted((int(i), p) for b in make_loader(0, 1, plan=plan, batch_size=2, workers_count=1)
                 for i, p in zip(b["id"].tolist(), b["p"], strict=True))
    assert got == list(enumerate(values))


@pytest.mark.slow
def test_a_spark_where_over_an_added_column_sees_nulls_in_older_files(tmp_path, spark):
    """Spark reads the snapshot's files with their schemas merged, whichever file it would have taken the schema of."""
    path = str(tmp_path / "table")
    evolved_table(path)
    rows_now = delta_rows(path, ["y", "z"], 2)[0]
    for where, test in [("y IS NULL", lambda r: r["y"] is None), ("z IS NULL", lambda r: r["z"] is None),
                        ("z > 3", lambda r: r["z"] is not None and r["z"] > 3)]:
        want = sorted(i for i, r in rows_now.items() if test(r))
        plan = plan_shards(path, 1, engine="spark", spark=spark, batch_size=1, where=where, table_version=2)
        got = sorted(int(i) for b in make_loader(0, 1, plan=plan, batch_size=1, workers_count=1) for i in b["id"])
        assert got == want and want, where


def test_column_mapping_is_refused_naming_the_table_and_each_stored_field(tmp_path):
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, rows(0, 10), configuration={"delta.columnMapping.mode": "name"})
    with pytest.raises(InvalidValueError, match=r"Delta table .*table version 0 uses column mapping .*'name'.*"
                                                r"'id' as 'col-[0-9a-f-]+', 'x' as 'col-.*rewrite the table"):
        plan_shards(path, 1, engine="local", batch_size=5)
