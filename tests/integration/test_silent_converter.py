"""The converter's cache key covers what decides the copy: a DataFrame whose rows depend on the run (the time,
rand(), uuid()) is never reused by a later run, an explicitly set SQL conf that changes values is in the key, and an
input rewritten with its size and modification time kept is told by its Parquet footer."""
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import spark as converter_module
from petastorm_balanced.spark import make_spark_converter

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]


def a_later_run():
    """What a new process knows: nothing of this one's in-process reuse."""
    converter_module._in_process.clear()


@pytest.mark.parametrize("column", ["current_timestamp()", "current_date()", "rand()", "uuid()"])
def test_a_dataframe_of_the_run_is_never_reused_by_a_later_run(spark, tmp_path, column):
    parent = str(tmp_path / "cache")
    frame = lambda: spark.range(8).selectExpr("id", f"CAST({column} AS STRING) AS v")  # noqa: E731
    first = make_spark_converter(frame(), parent_cache_dir_url=parent)
    a_later_run()
    second = make_spark_converter(frame(), parent_cache_dir_url=parent)
    assert second.dataset_url != first.dataset_url


def test_a_dataframe_of_the_run_gets_its_rows_of_now_in_the_same_process(spark, tmp_path):
    """current_timestamp() converted again two seconds later serves that later time, not the first copy; reuse=True
    asks for an earlier reuse=True copy (Petastorm's behaviour), reuse=False for a fresh copy of any DataFrame."""
    parent = str(tmp_path / "cache")
    frame = lambda: spark.range(4).selectExpr("id", "current_timestamp() AS t")  # noqa: E731

    def times(converter):
        table = pads.dataset(converter.dataset_url[len("file://"):]).to_table()
        return set(table.column("t").to_pylist())
    first = make_spark_converter(frame(), parent_cache_dir_url=parent)
    time.sleep(2)
    started = frame().collect()[0]["t"]
    second = make_spark_converter(frame(), parent_cache_dir_url=parent)
    assert second.dataset_url != first.dataset_url
    (t1,), (t2,) = times(first), times(second)
    assert t2 >= started.replace(tzinfo=t2.tzinfo) and (t2 - t1).total_seconds() >= 2
    kept = make_spark_converter(frame(), parent_cache_dir_url=parent, reuse=True)
    assert make_spark_converter(frame(), parent_cache_dir_url=parent, reuse=True).dataset_url == kept.dataset_url
    plain = lambda: spark.range(4).selectExpr("id", "id * 3 AS v")  # noqa: E731
    kept = make_spark_converter(plain(), parent_cache_dir_url=parent)
    assert make_spark_converter(plain(), parent_cache_dir_url=parent).dataset_url == kept.dataset_url
    assert make_spark_converter(plain(), parent_cache_dir_url=parent, reuse=False).dataset_url != kept.dataset_url


def test_a_plain_dataframe_is_still_reused_by_a_later_run(spark, tmp_path):
    parent = str(tmp_path / "cache")
    first = make_spark_converter(spark.range(8).selectExpr("id", "id * 2 AS v"), parent_cache_dir_url=parent)
    a_later_run()
    assert make_spark_converter(spark.range(8).selectExpr("id", "id * 2 AS v"),
                                parent_cache_dir_url=parent).dataset_url == first.dataset_url


def test_a_set_conf_that_changes_values_is_in_the_key(spark, tmp_path):
    parent = str(tmp_path / "cache")
    conf = "spark.sql.legacy.castComplexTypesToString.enabled"
    frame = lambda: spark.range(1).selectExpr("CAST(array(0, NULL) AS STRING) AS s")  # noqa: E731
    values = {}
    try:
        for setting in ("true", "false"):
            spark.conf.set(conf, setting)
            converter = make_spark_converter(frame(), parent_cache_dir_url=parent)
            got = pads.dataset(converter.dataset_url[len("file://"):]).to_table().column("s").to_pylist()
            values[setting] = (converter.dataset_url, got, frame().collect()[0]["s"])
    finally:
        spark.conf.unset(conf)
    assert values["true"][0] != values["false"][0]
    for _, got, spark_gives in values.values():
        assert got == [spark_gives]


def test_an_input_rewritten_with_its_size_and_mtime_kept_is_a_new_dataframe(spark, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    path = source / "part-0.parquet"
    plain = {"compression": "NONE", "use_dictionary": False}
    pq.write_table(pa.table({"id": np.arange(100, dtype=np.int64)}), path, **plain)
    stat = path.stat()
    parent = str(tmp_path / "cache")
    first = make_spark_converter(spark.read.parquet(str(source)), parent_cache_dir_url=parent)
    pq.write_table(pa.table({"id": np.arange(1000, 1100, dtype=np.int64)}), path, **plain)  # cp -p, rsync -t
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    a_later_run()
    spark.catalog.clearCache()
    second = make_spark_converter(spark.read.parquet(str(source)), parent_cache_dir_url=parent)
    assert second.dataset_url != first.dataset_url
    ids = pads.dataset(second.dataset_url[len("file://"):]).to_table().column("id").to_pylist()
    assert sorted(ids) == list(range(1000, 1100))


def test_an_input_rewritten_keeping_size_footer_and_mtime_is_new_with_the_digest(spark, tmp_path, monkeypatch):
    """Other values, no statistics, PLAIN, uncompressed: the same size and footer bytes, the time restored; the
    content digest (``PETASTORM_BALANCED_CONTENT_DIGEST=1``) puts every byte in the key."""
    monkeypatch.setenv("PETASTORM_BALANCED_CONTENT_DIGEST", "1")
    source = tmp_path / "source"
    source.mkdir()
    path = source / "part-0.parquet"
    bare = {"compression": "NONE", "use_dictionary": False, "write_statistics": False}
    pq.write_table(pa.table({"id": np.arange(100, dtype=np.int64)}), path, **bare)
    stat, before = path.stat(), path.read_bytes()
    parent = str(tmp_path / "cache")
    first = make_spark_converter(spark.read.parquet(str(source)), parent_cache_dir_url=parent)
    pq.write_table(pa.table({"id": np.arange(1000, 1100, dtype=np.int64)}), path, **bare)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = path.read_bytes()
    tail = lambda data: data[-8 - int.from_bytes(data[-8:-4], "little"):]  # noqa: E731
    assert len(after) == len(before) and tail(after) == tail(before) and path.stat().st_mtime_ns == stat.st_mtime_ns
    a_later_run()
    spark.catalog.clearCache()
    second = make_spark_converter(spark.read.parquet(str(source)), parent_cache_dir_url=parent)
    assert second.dataset_url != first.dataset_url
    ids = pads.dataset(second.dataset_url[len("file://"):]).to_table().column("id").to_pylist()
    assert sorted(ids) == list(range(1000, 1100))
