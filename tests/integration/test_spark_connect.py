"""Spark Connect (Databricks serverless and shared clusters): a real Connect server on 127.0.0.1 (``connect``
in tests/support/connect_server.py), no sparkContext, no RDDs. Planning with where= and cost= gives the classic
session's plan (G8), a Petastorm predicate is refused with the alternatives, and the converter works and reuses its
copy."""
import numpy as np
import pyarrow.dataset as pads
import pytest

from petastorm_balanced import plan_shards
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.planner.engines import spark as spark_engine
from petastorm_balanced.predicates import in_set
from petastorm_balanced.spark import make_spark_converter
from tests.support.connect_server import classic_mode

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]


def test_the_session_is_connect(connect):
    assert spark_engine.is_connect(connect)
    with pytest.raises(Exception, match="sparkContext"):
        connect.sparkContext  # noqa: B018 - what Databricks serverless gives: no SparkContext


@pytest.mark.parametrize("where", ["lang = 'en' AND value > 3.5", None])
def test_plan_on_connect_equals_the_classic_plan(spark, connect, plain_dataset, where):
    kwargs = {"where": where, "batch_size": 8, "engine": "spark"}
    on_connect = plan_shards(plain_dataset.url, 3, spark=connect, **kwargs)
    with classic_mode():
        classic = plan_shards(plain_dataset.url, 3, spark=spark, **kwargs)
    assert on_connect.checksum == classic.checksum
    if where:
        count = connect.read.parquet(plain_dataset.url).where(where).count()
        assert on_connect.total_rows == count < plain_dataset.num_rows


def test_where_on_hive_partitions_on_connect(spark, connect, hive_dataset):
    """The per-file shortcut needs the JVM plan (py4j); on Connect the row-level path gives the same plan."""
    where = "year = 2021 OR (year = 2022 AND label < 3)"
    on_connect = plan_shards(hive_dataset.url, 2, where=where, spark=connect)
    with classic_mode():
        assert on_connect.checksum == plan_shards(hive_dataset.url, 2, where=where, spark=spark).checksum


def test_cost_on_connect_ships_the_package_as_an_artifact(spark, connect, plain_dataset):
    """The cost job runs Python on the server's workers, whose path has no checkout: addArtifacts ships it."""
    kwargs = {"where": "lang = 'en'", "cost": "label + 1", "batch_size": 8}
    on_connect = plan_shards(plain_dataset.url, 2, spark=connect, **kwargs)
    with classic_mode():
        assert on_connect.checksum == plan_shards(plain_dataset.url, 2, spark=spark, **kwargs).checksum


def test_a_petastorm_predicate_is_refused_on_connect(connect, plain_dataset):
    with pytest.raises(InvalidValueError, match="Spark Connect.*where=.*engine='local'"):
        plan_shards(plain_dataset.url, 2, predicate=in_set(["en"], "lang"), spark=connect)


def test_converter_on_connect(connect, tmp_path):
    from pyspark.sql import functions as F
    df = (connect.range(0, 3000, 1, 3).withColumn("x", F.col("id") * 0.5)
          .withColumn("arr", F.array(F.col("id"), F.col("id") + 1)))
    converter = make_spark_converter(df, parent_cache_dir_url=str(tmp_path), where="id % 4 != 0", batch_size=8)
    assert len(converter) == 2250
    rebuilt = (connect.range(0, 3000, 1, 3).withColumn("x", F.col("id") * 0.5)
               .withColumn("arr", F.array(F.col("id"), F.col("id") + 1)))
    again = make_spark_converter(rebuilt, parent_cache_dir_url=str(tmp_path), where="id % 4 != 0", batch_size=8)
    assert again.dataset_url == converter.dataset_url and again.plan.checksum == converter.plan.checksum
    other = make_spark_converter(df.where("id < 100"), parent_cache_dir_url=str(tmp_path))
    assert other.dataset_url != converter.dataset_url and len(other) == 100
    local = make_spark_converter(connect.createDataFrame([(i, -i) for i in range(40)], "id long, y long"),
                                 parent_cache_dir_url=str(tmp_path))
    negative = make_spark_converter(connect.createDataFrame([(i, i) for i in range(40)], "id long, y long"),
                                    parent_cache_dir_url=str(tmp_path))
    assert local.dataset_url != negative.dataset_url  # literal rows are part of a Connect plan
    with converter.make_torch_dataloader(1, 2) as loader:
        batches = list(loader)
    assert len(batches) == len(loader) == converter.plan.steps_per_epoch(world_size=2)
    for batch in batches:
        ids = batch["id"].numpy()
        assert (ids % 4 != 0).all() and batch["arr"].shape == (8, 2)
        np.testing.assert_array_equal(batch["x"].numpy(), (ids * 0.5).astype(np.float32))
    copy = pads.dataset(converter.dataset_url[len("file://"):], format="parquet").to_table()
    assert sorted(copy.column("id").to_numpy()) == list(range(3000))
