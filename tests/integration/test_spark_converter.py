"""petastorm_balanced.spark.make_spark_converter on a real SparkSession: the delivered values are the DataFrame's,
every rank takes the same steps with no row twice, the same DataFrame reuses its copy and plan (in this process,
another process and under torchrun), anything else gets a new folder, and array columns are delivered by the
loader's list_format."""
import functools
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pytest

from petastorm_balanced.errors import InvalidTypeError, InvalidValueError
from petastorm_balanced.spark import PARENT_CACHE_DIR_URL_CONF, make_spark_converter
from petastorm_balanced.tools.coverage import coverage_check, steps_check
from tests.support.jobs import ROOT, job_env, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]
BATCH = 16
WHERE = "id % 7 != 3"
SMALL_ROW_GROUPS = 16 * 1024  # several row groups in the big partition's file


def skewed_frame(spark, big: int = 6000):
    """A skewed DataFrame: one partition of ``big`` rows, three of 100, one of 10 (so five very uneven files), a
    double column (written as float32, Petastorm's default precision) and a 2-element array column."""
    from pyspark.sql import functions as F
    parts = [spark.range(0, big, 1, 1), spark.range(big, big + 300, 1, 3), spark.range(big + 300, big + 310, 1, 1)]
    df = functools.reduce(lambda a, b: a.union(b), parts)
    return (df.withColumn("x", F.col("id") * 0.25)
            .withColumn("arr", F.array(F.col("id").cast("double"), (F.col("id") * -1.5).cast("double"))))


def expected_ids(big: int = 6000):
    """The ids of ``skewed_frame(spark, big)`` that match ``WHERE`` (id % 7 != 3)."""
    ids = np.arange(big + 310, dtype=np.int64)
    return ids[ids % 7 != 3]


def deliver(converter, world, epochs=1, **kwargs):
    """Per epoch, per rank: (ids, batch sizes) read in this process."""
    out = []
    for epoch in range(epochs):
        ranks = []
        for rank in range(world):
            with converter.make_torch_dataloader(rank, world, batch_size=BATCH, epoch=epoch, **kwargs) as loader:
                batches = list(loader)
            ranks.append(batches)
        out.append(ranks)
    return out


@pytest.mark.stack
def test_converter_delivers_the_dataframes_rows_with_equal_steps(spark, tmp_path):
    df = skewed_frame(spark)
    converter = make_spark_converter(df, parent_cache_dir_url=str(tmp_path), where=WHERE,
                                     parquet_row_group_size_bytes=SMALL_ROW_GROUPS)
    matching = expected_ids()
    assert len(converter) == len(matching) and converter.plan.total_rows == len(matching)
    copy = pads.dataset(converter.dataset_url[len("file://"):], format="parquet").to_table()
    assert copy.schema.field("x").type == "float" and copy.schema.field("arr").type.value_type == "float"
    assert len(list(Path(converter.dataset_url[len("file://"):]).glob("*.parquet"))) == 5  # as skewed as the df
    (batches,) = deliver(converter, 3)
    steps = converter.plan.steps_per_epoch(world_size=3, batch_size=BATCH)
    check = steps_check([[len(b["id"]) for b in rank] for rank in batches], steps=steps, batch_size=BATCH, name="G1")
    assert check.ok, check.detail
    ids = [np.concatenate([b["id"].numpy() for b in rank]) for rank in batches]
    check = coverage_check(ids, [np.zeros(len(i), bool) for i in ids], expected=matching, policy="drop",
                           global_batch=3 * BATCH, name="G2")
    assert check.ok, check.detail
    copy_ids = copy.column("id").to_numpy()
    by_id = np.empty(copy_ids.max() + 1, np.int64)
    by_id[copy_ids] = np.arange(len(copy_ids))  # id -> its row in the copy
    x, arr = copy.column("x").to_numpy(), np.stack(copy.column("arr").to_numpy(zero_copy_only=False))
    for rank in batches:
        for b in rank:
            rows = by_id[b["id"].numpy()]
            assert b["x"].dtype.is_floating_point and b["arr"].shape == (BATCH, 2)
            np.testing.assert_array_equal(b["x"].numpy(), x[rows])  # the copy's values (pyarrow.dataset)
            np.testing.assert_array_equal(b["arr"].numpy(), arr[rows])
            ids32 = b["id"].numpy().astype(np.float32)
            np.testing.assert_array_equal(b["x"].numpy(), ids32 * np.float32(0.25))  # and the DataFrame's
            np.testing.assert_array_equal(b["arr"].numpy()[:, 1], (b["id"].numpy() * -1.5).astype(np.float32))


def test_the_same_dataframe_reuses_its_copy_and_plan_and_others_get_new_folders(spark, tmp_path):
    parent = str(tmp_path / "cache")
    df = skewed_frame(spark, big=2000)
    first = make_spark_converter(df, parent_cache_dir_url=parent, batch_size=BATCH)
    written = {p: p.stat().st_mtime_ns for p in Path(first.dataset_url[len("file://"):]).glob("*.parquet")}
    again = make_spark_converter(skewed_frame(spark, big=2000), parent_cache_dir_url=parent, batch_size=BATCH)
    assert again.dataset_url == first.dataset_url and again.plan.checksum == first.plan.checksum
    assert {p: p.stat().st_mtime_ns for p in written} == written  # not rewritten
    others = [make_spark_converter(skewed_frame(spark, big=2001), parent_cache_dir_url=parent),
              make_spark_converter(df.where("id > 5"), parent_cache_dir_url=parent),
              make_spark_converter(df.selectExpr("try_add(id, 1) AS id"), parent_cache_dir_url=parent),
              make_spark_converter(df, parent_cache_dir_url=parent, dtype="float64"),
              make_spark_converter(df, parent_cache_dir_url=parent, compression_codec="snappy")]
    urls = {first.dataset_url} | {o.dataset_url for o in others}
    assert len(urls) == 1 + len(others)
    assert others[3].plan.total_rows == first.plan.total_rows
    # A new plan for new planning parameters, beside the same copy.
    replanned = make_spark_converter(df, parent_cache_dir_url=parent, batch_size=BATCH, where="x > 10")
    assert replanned.dataset_url == first.dataset_url and replanned.plan.checksum != first.plan.checksum
    assert len(list(Path(first.dataset_url[len("file://"):] + "-plans").iterdir())) == 2  # beside, never inside


def test_a_rewritten_input_file_is_a_new_dataframe(spark, tmp_path):
    source = str(tmp_path / "source")
    spark.range(100).write.parquet(source)
    first = make_spark_converter(spark.read.parquet(source), parent_cache_dir_url=str(tmp_path / "cache"))
    spark.range(50, 150).write.mode("overwrite").parquet(source)
    second = make_spark_converter(spark.read.parquet(source), parent_cache_dir_url=str(tmp_path / "cache"))
    assert second.dataset_url != first.dataset_url
    ids = pads.dataset(second.dataset_url[len("file://"):]).to_table().column("id").to_numpy()
    assert sorted(ids) == list(range(50, 150))


def test_local_rows_and_udfs_are_reused_within_the_process_only(spark, tmp_path):
    """Classic Spark's plan text shows neither an RDD's rows nor a UDF's code: Petastorm's in-process rule
    (``sameResult``) decides, so two frames of the same schema but other rows never share a copy."""
    from pyspark.sql import functions as F
    parent = str(tmp_path)
    a = spark.createDataFrame([(i, float(i)) for i in range(64)], "id long, x double")
    b = spark.createDataFrame([(i, float(-i)) for i in range(64)], "id long, x double")
    first, second = (make_spark_converter(d, parent_cache_dir_url=parent) for d in (a, b))
    assert first.dataset_url != second.dataset_url
    assert make_spark_converter(a, parent_cache_dir_url=parent).dataset_url == first.dataset_url
    minus = pads.dataset(second.dataset_url[len("file://"):]).to_table().column("x").to_numpy()
    assert sorted(minus) == sorted(-np.arange(64, dtype=np.float32))
    plus, minus = F.udf(lambda v: v + 1, "long"), F.udf(lambda v: v - 1, "long")
    u1 = make_spark_converter(spark.range(64).select(plus("id").alias("id")), parent_cache_dir_url=parent)
    u2 = make_spark_converter(spark.range(64).select(minus("id").alias("id")), parent_cache_dir_url=parent)
    assert u1.dataset_url != u2.dataset_url
    # What decides: whether the plan's text shows all of its content (else a per-process suffix on the key).
    from petastorm_balanced.spark import _plan_text
    assert [_plan_text(spark, d)[1] for d in (a, spark.range(64).select(plus("id")), skewed_frame(spark, 10),
                                              spark.range(5).selectExpr("try_add(id, 1)"))] == \
        [False, False, True, True]


def test_vectors_become_fixed_shape_tensors_and_dtype_keeps_its_name(spark, tmp_path):
    from pyspark.ml.linalg import Vectors
    df = spark.createDataFrame([(i, Vectors.dense([i, i / 2.0, -i]), float(i)) for i in range(96)],
                               ["id", "features", "y"])
    for dtype, torch_name in (("float32", "float32"), ("float64", "float64")):
        converter = make_spark_converter(df, parent_cache_dir_url=str(tmp_path), dtype=dtype)
        with converter.make_torch_dataloader(0, 2, batch_size=8) as loader:
            batch = next(iter(loader))
        assert batch["features"].shape == (8, 3) and str(batch["features"].dtype) == f"torch.{torch_name}"
        assert str(batch["y"].dtype) == f"torch.{torch_name}"
        ids = batch["id"].numpy()
        np.testing.assert_array_equal(batch["features"].numpy(), np.stack([ids, ids / 2.0, -ids], 1).astype(dtype))
    dataset = converter.make_dataset(1, 2, batch_size=8)  # for torch's DataLoader: the same steps
    batches = list(dataset.dataloader(num_workers=0))
    assert len(batches) == converter.plan.steps_per_epoch(world_size=2, batch_size=8) == 6
    assert all(b["features"].shape == (8, 3) for b in batches)
    untouched = make_spark_converter(df.select("id", "y"), parent_cache_dir_url=str(tmp_path), dtype=None)
    assert str(pads.dataset(untouched.dataset_url[len("file://"):]).schema.field("y").type) == "double"


def test_arrays_of_any_length_and_nulls_are_delivered_by_list_format(spark, tmp_path):
    """Arrays stay Parquet lists: equal lengths are (batch, k) tensors, varying ones padded (with lengths) or
    lists, null arrays masked, a null element of an integer array kept as lists by 'auto' and refused by
    'tensor', every value the DataFrame's."""
    df = spark.range(12).selectExpr("id", "array(id, -id) AS fixed", "sequence(0L, id % 4) AS ragged",
                                    "IF(id = 3, NULL, array(id, id)) AS nulls",
                                    "array(id, IF(id = 3, NULL, id)) AS holes")
    converter = make_spark_converter(df, parent_cache_dir_url=str(tmp_path), batch_size=4)
    expected = {r["id"]: r for r in df.collect()}
    with converter.make_torch_dataloader(0, 1, list_format={"ragged": "padded"}) as loader:
        schema = loader.schema
        assert (schema["fixed"].shape, schema["ragged"].shape, schema["nulls"].mask, schema["holes"].kind) == \
            ((2,), (4,), "nulls__valid", "list")
        seen = 0
        for batch in loader:
            for i, row in enumerate(batch["id"].tolist()):
                want = expected[row]
                assert batch["fixed"][i].tolist() == list(want["fixed"])
                length = batch["ragged__lengths"][i]
                assert batch["ragged"][i, :length].tolist() == list(want["ragged"])
                assert batch["nulls__valid"][i] == (want["nulls"] is not None)
                assert batch["nulls"][i].tolist() == (list(want["nulls"]) if want["nulls"] else [0, 0])
                assert batch["holes"][i] == list(want["holes"])
                seen += 1
        assert seen == 12
    with pytest.raises(InvalidValueError, match="column 'holes' holds null items"):
        converter.make_dataset(0, 1, list_format={"holes": "tensor"})


def test_bad_arguments_are_refused(spark, tmp_path):
    df = spark.range(100)
    assert spark.conf.get(PARENT_CACHE_DIR_URL_CONF, None) is None
    with pytest.raises(InvalidValueError, match=PARENT_CACHE_DIR_URL_CONF.replace(".", r"\.")):
        make_spark_converter(df)
    with pytest.raises(InvalidValueError, match="atomic folder rename"):
        make_spark_converter(df, parent_cache_dir_url="s3://bucket/cache")
    with pytest.raises(InvalidValueError, match="compression_codec='bzip2'"):
        make_spark_converter(df, parent_cache_dir_url=str(tmp_path), compression_codec="bzip2")
    with pytest.raises(InvalidValueError, match="dtype='float16'"):
        make_spark_converter(df, parent_cache_dir_url=str(tmp_path), dtype="float16")
    with pytest.raises(ValueError, match="world_size"):
        make_spark_converter(df, parent_cache_dir_url=str(tmp_path), world_size=0)
    with pytest.raises(ValueError, match="policy"):
        make_spark_converter(df, parent_cache_dir_url=str(tmp_path), policy="repeat")
    with pytest.raises(InvalidTypeError, match="not a pyspark.sql.DataFrame"):
        make_spark_converter([1, 2, 3], parent_cache_dir_url=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_the_conf_names_the_cache_folder_and_delete_removes_only_its_own(spark, tmp_path):
    spark.conf.set(PARENT_CACHE_DIR_URL_CONF, (tmp_path / "cache").as_uri())
    try:
        keep = make_spark_converter(spark.range(100))
        doomed = make_spark_converter(spark.range(200))
    finally:
        spark.conf.unset(PARENT_CACHE_DIR_URL_CONF)
    (tmp_path / "cache" / "mine.txt").write_text("not the converter's")
    doomed.delete()
    kept = keep.dataset_url.rsplit("/", 1)[1]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([kept, kept + "-plans", "mine.txt"])
    assert len(keep) == 100


CONVERT = textwrap.dedent("""
    import json
    import sys
    from pyspark.sql import SparkSession
    from petastorm_balanced.spark import make_spark_converter
    from tests.integration.test_spark_converter import skewed_frame
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.sql.session.timeZone", "UTC").getOrCreate())
    for key, value in json.loads(sys.argv[2]).items():  # the other session's SQL confs: they are in the key
        try:
            spark.conf.set(key, value)
        except Exception:  # a static conf, which the key leaves out
            pass
    converter = make_spark_converter(skewed_frame(spark, big=20000), parent_cache_dir_url=sys.argv[1], batch_size=8)
    print("URL", converter.dataset_url, converter.plan.checksum, flush=True)
""")


def test_two_processes_converting_the_same_dataframe_end_with_one_copy(spark, tmp_path):
    """Another process (its own JVM) and this one convert the same DataFrame at once: one key, one copy."""
    env = job_env(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    # the same SQL confs in both sessions (earlier tests may have left some set in the shared one): equal keys
    confs = {row[0]: row[1] for row in spark.sql("SET").collect() if row[0].startswith("spark.sql.")}
    other = subprocess.Popen([sys.executable, "-c", CONVERT, str(tmp_path), json.dumps(confs)], cwd=ROOT, env=env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ours = make_spark_converter(skewed_frame(spark, big=20000), parent_cache_dir_url=str(tmp_path), batch_size=8)
    out, err = other.communicate(timeout=240)
    assert other.returncode == 0, err[-3000:]
    assert f"URL {ours.dataset_url} {ours.plan.checksum}" in out.splitlines()
    name = ours.dataset_url.rsplit("/", 1)[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, name + "-plans"]  # one copy, its plans beside it
    copy = pads.dataset(str(tmp_path / name), format="parquet").to_table()
    assert sorted(copy.column("id").to_numpy()) == list(range(20310))


@pytest.mark.stack
def test_acceptance_torchrun_three_ranks_two_epochs_and_the_cache_is_reused(spark, tmp_path):
    df = skewed_frame(spark)
    converter = make_spark_converter(df, parent_cache_dir_url=str(tmp_path / "cache"), where=WHERE,
                                     batch_size=BATCH, parquet_row_group_size_bytes=SMALL_ROW_GROUPS)
    with open(tmp_path / "converter.pkl", "wb") as handle:
        pickle.dump(converter, handle)
    torchrun(3, ROOT / "tests" / "support" / "converter_train.py", tmp_path / "converter.pkl", tmp_path / "out", 2,
             BATCH, timeout=240)
    matching = expected_ids()
    steps = converter.plan.steps_per_epoch(world_size=3)
    epochs = []
    for epoch in range(2):
        ranks = json.loads((tmp_path / "out" / f"epoch{epoch}.json").read_text())
        assert [r["len"] for r in ranks] == [steps] * 3
        check = steps_check([r["sizes"] for r in ranks], steps=steps, batch_size=BATCH, name="G1")
        assert check.ok, check.detail
        ids = [np.asarray(r["ids"], np.int64) for r in ranks]
        check = coverage_check(ids, [np.zeros(len(i), bool) for i in ids], expected=matching, policy="drop",
                               global_batch=3 * BATCH, name="G2")
        assert check.ok, check.detail
        epochs.append(ids)
    assert any(not np.array_equal(a, b) for a, b in zip(*epochs, strict=True)), "epoch 1 repeated epoch 0's order"
    folder = Path(converter.dataset_url[len("file://"):])
    before = sorted((p.name, p.stat().st_mtime_ns) for p in folder.rglob("*"))
    again = make_spark_converter(skewed_frame(spark), parent_cache_dir_url=str(tmp_path / "cache"), where=WHERE,
                                 batch_size=BATCH, parquet_row_group_size_bytes=SMALL_ROW_GROUPS)
    assert again.dataset_url == converter.dataset_url and again.plan.checksum == converter.plan.checksum
    assert sorted((p.name, p.stat().st_mtime_ns) for p in folder.rglob("*")) == before  # nothing rewritten
    assert len(os.listdir(tmp_path / "cache")) == 2  # the copy and its plans folder
