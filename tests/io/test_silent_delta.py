"""Delta tables as deltalake reads them: a table reset in place is read anew in the same process, a version past
the latest is refused at once naming the latest, and a schema that evolved between files is refused with a fix
for the table (not "all files must share one schema")."""
import shutil
import time

import numpy as np
import pyarrow as pa
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError

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


def test_schema_evolution_is_refused_with_a_fix_for_the_table(tmp_path):
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, rows(0, 10))
    more = rows(10, 20).append_column("y", pa.array(np.arange(10, dtype=np.int64)))
    deltalake.write_deltalake(path, more, mode="append", schema_mode="merge")
    with pytest.raises(InvalidValueError, match=r"Delta table .* version 1; columns \['y'\] are in some files only.*"
                                                r"rewrite the table under its current schema.*table_version=N"):
        plan_shards(path, 1, engine="local", batch_size=5)
    assert delivered(plan_shards(path, 1, engine="local", batch_size=5, table_version=0)) == list(range(10))


def test_string_partitions_that_read_the_same_are_served(tmp_path):
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, pa.table({"id": np.arange(4, dtype=np.int64), "p": ["a", "b", "007", "c"]}),
                              partition_by=["p"])
    plan = plan_shards(path, 1, engine="local", batch_size=2)
    got = sorted((int(i), p) for b in make_loader(0, 1, plan=plan, batch_size=2, workers_count=1)
                 for i, p in zip(b["id"].tolist(), b["p"], strict=True))
    assert got == [(0, "a"), (1, "b"), (2, "007"), (3, "c")]
