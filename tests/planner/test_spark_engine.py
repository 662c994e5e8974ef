"""The Spark planning engine and the spark-submit job.

In-process tests share the session's real SparkSession; the job tests launch real ``spark-submit`` (10-30 s
each) from a folder outside the repository with no PYTHONPATH, so they also show the job needs no pip install.
Ground truth comes from pyarrow + pandas (row positions) and from Spark itself (``where(...).count()``).
"""
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import load_plan, plan_shards
from petastorm_balanced.errors import InvalidWhereError
from petastorm_balanced.planner.engines import spark as spark_engine
from petastorm_balanced.planner.engines.spark import build_catalog
from petastorm_balanced.predicates import in_lambda, in_set
from tests.support.jobs import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

JOB = os.path.join(ROOT, "spark_jobs", "plan_shards.py")
WORLD, BATCH = 3, 16


# ------------------------------------------------------------------------------------------- helpers

def _positions(catalog):
    return {(r.path, r.row_group): r.positions() for r in catalog.row_groups}


def _expected_positions(root, relpaths, mask_fn):
    """(file, row group) -> matching positions, by reading every row group with pyarrow and filtering in pandas."""
    out = {}
    for rel in relpaths:
        parquet = pq.ParquetFile(os.path.join(root, *rel.split("/")))
        for i in range(parquet.num_row_groups):
            frame = parquet.read_row_group(i).to_pandas()
            mask = np.asarray(mask_fn(frame, rel), dtype=bool)
            assert mask.shape == (len(frame),)
            if mask.any():
                out[(rel, i)] = np.flatnonzero(mask)
    return out


def _assert_same_positions(catalog, expected):
    got = _positions(catalog)
    assert sorted(got) == sorted(expected)
    for key, positions in expected.items():
        assert np.array_equal(got[key], positions), key
    assert catalog.total_rows == sum(len(p) for p in expected.values())


def _spark_count(spark, url, where):
    return spark.read.parquet(url).where(where).count()


def _year(rel):
    return int(rel.split("/")[0].split("=")[1])


# ------------------------------------------------------------------------------------------- G8: engines agree

@pytest.mark.parametrize("name", ["plain_dataset", "hive_dataset", "petastorm_dataset"])
def test_spark_and_local_engines_write_the_same_plan_without_filter(spark, request, name):
    info = request.getfixturevalue(name)
    local = plan_shards(info.url, WORLD, batch_size=BATCH, engine="local")
    on_spark = plan_shards(info.url, WORLD, batch_size=BATCH, engine="spark", spark=spark)
    assert on_spark.catalog == local.catalog
    assert on_spark.checksum == local.checksum
    assert on_spark.total_rows == info.num_rows == spark.read.parquet(info.url).count()
    # The path that scales: footers read inside Spark tasks give the very same catalog.
    assert build_catalog(info.url, spark=spark, footers_in_tasks=True) == local.catalog


@pytest.mark.parametrize("name, predicate", [
    ("plain_dataset", in_lambda(["lang", "value"], lambda lang, value: (lang == "en") & (value > 4))),
    ("hive_dataset", in_lambda(["year"], lambda year: year == 2021)),  # an int, as the loader delivers it (G13)
    ("petastorm_dataset", in_set({"en"}, "lang")),
], ids=["plain-frame", "hive-partition", "petastorm-rows"])
def test_spark_and_local_engines_agree_with_a_petastorm_predicate(spark, request, name, predicate):
    info = request.getfixturevalue(name)
    local = plan_shards(info.url, WORLD, batch_size=BATCH, engine="local", predicate=predicate)
    on_spark = plan_shards(info.url, WORLD, batch_size=BATCH, engine="spark", spark=spark, predicate=predicate)
    assert 0 < on_spark.total_rows < info.num_rows
    assert on_spark.catalog == local.catalog
    assert on_spark.checksum == local.checksum


def test_active_session_is_reused(spark):
    assert spark_engine.get_session() is spark
    with pytest.raises(TypeError, match="spark="):
        spark_engine.get_session("local[2]")


# ------------------------------------------------------------------------------------------- where: row level

@pytest.fixture(params=["rows", "words"])
def transfer(request, monkeypatch):
    """Both ways matching rows reach the driver: an int64 each (small datasets) and 64-row words (large ones)."""
    if request.param == "words":
        monkeypatch.setattr(spark_engine, "ROWS_TO_DRIVER_MAX", 0)
    return request.param


def test_where_matches_exactly_the_rows_pandas_selects(spark, plain_dataset, transfer):
    where = "lang = 'en' AND value > 3.5 AND label <> 7"
    catalog = build_catalog(plain_dataset.url, where=where, spark=spark)
    expected = _expected_positions(plain_dataset.path, plain_dataset.files,
                                   lambda f, _: (f["lang"] == "en") & (f["value"] > 3.5) & (f["label"] != 7))
    _assert_same_positions(catalog, expected)
    assert catalog.total_rows == _spark_count(spark, plain_dataset.url, where)
    assert catalog.files == build_catalog(plain_dataset.url, spark=spark).files  # every file, matching or not
    assert any(r.selection for r in catalog.row_groups) and 0 < catalog.total_rows < plain_dataset.num_rows


def test_where_on_hive_partition_column(spark, hive_dataset, transfer):
    where = "year = 2021 OR (year = 2022 AND label < 3)"
    catalog = build_catalog(hive_dataset.url, where=where, spark=spark)
    expected = _expected_positions(hive_dataset.path, hive_dataset.files,
                                   lambda f, rel: np.full(len(f), _year(rel) == 2021) |
                                   ((_year(rel) == 2022) & (f["label"] < 3)))
    _assert_same_positions(catalog, expected)
    assert catalog.partition_columns == ("year",)
    assert catalog.total_rows == _spark_count(spark, hive_dataset.url, where)
    # Whole partition matched: its row groups carry the empty "all rows" selection.
    assert all(r.selection == b"" for r in catalog.row_groups if r.path.startswith("year=2021/"))


@pytest.mark.parametrize("where", ["year = 2021", "year IN (2020, 2022) OR year IS NULL", "year + 1 > 2022"])
def test_where_on_partition_columns_alone_keeps_whole_files(spark, hive_dataset, where, monkeypatch):
    """Decided per file (only the files cross to the driver), and the same catalog as row by row."""
    frame = spark.read.parquet(hive_dataset.url)
    assert spark_engine._decided_per_file(frame, where, ("year",))
    catalog = build_catalog(hive_dataset.url, where=where, spark=spark)
    years = {2021} if where == "year = 2021" else {2020, 2022} if "IN" in where else {2022}
    _assert_same_positions(catalog, _expected_positions(hive_dataset.path, hive_dataset.files,
                                                        lambda f, rel: np.full(len(f), _year(rel) in years)))
    assert catalog.total_rows == _spark_count(spark, hive_dataset.url, where)
    monkeypatch.setattr(spark_engine, "_decided_per_file", lambda *args: False)
    assert build_catalog(hive_dataset.url, where=where, spark=spark) == catalog


@pytest.mark.parametrize("where", ["rand(7) < 0.5", "year = 2021 AND rand(7) < 0.5", "year = 2021 AND label < 3",
                                   "_metadata.file_name LIKE 'part-0000%'"])
def test_where_that_is_not_one_answer_per_file_stays_row_by_row(spark, hive_dataset, where):
    """Non-deterministic, or reading a data column or file metadata: never decided per file."""
    assert not spark_engine._decided_per_file(spark.read.parquet(hive_dataset.url), where, ("year",))
    if "rand" in where:  # row by row, so rows of one file differ: some row group keeps only part of its rows
        catalog = build_catalog(hive_dataset.url, where=where, spark=spark)
        assert any(r.selection for r in catalog.row_groups)


def test_partition_where_keys_files_of_equal_size_by_path(spark, tmp_path, hive_dataset):
    root = tmp_path / "ds"
    shutil.copytree(hive_dataset.path, root)
    first = sorted((root / "year=2021").iterdir())[0]
    shutil.copy(first, root / "year=2022" / first.name.replace("part-", "copy-"))  # same size in another year
    catalog = build_catalog(str(root), where="year = 2022", spark=spark)
    listed = {f.path: f for f in catalog.files}
    expected = {(p, i) for p, f in listed.items() if p.startswith("year=2022/") for i, n in
                enumerate(f.row_group_rows) if n}
    assert {(r.path, r.row_group) for r in catalog.row_groups} == expected
    assert all(r.selection == b"" for r in catalog.row_groups)


@pytest.fixture(scope="module")
def nulls_dataset(tmp_path_factory):
    """Two files with NULLs, a folder name needing URL encoding, and names Spark and pyarrow both skip."""
    root = tmp_path_factory.mktemp("nulls") / "ds with space"
    root.mkdir()
    rng = np.random.default_rng(7)
    for name, n in (("a.parquet", 700), ("b.parquet", 450)):
        x = pa.array(np.where(rng.random(n) < 0.3, None, rng.integers(0, 6, n)).tolist(), type=pa.int64())
        s = pa.array(np.where(rng.random(n) < 0.2, None, rng.choice(["p", "q"], n)).tolist(), type=pa.string())
        pq.write_table(pa.table({"x": x, "s": s}), root / name, row_group_size=200)
    shutil.copy(root / "a.parquet", root / ".hidden.parquet")
    (root / "_tmp").mkdir()
    shutil.copy(root / "b.parquet", root / "_tmp" / "b.parquet")
    (root / "_SUCCESS").touch()
    return root


@pytest.mark.parametrize("where, mask", [
    ("x > 2", lambda f: f["x"].notna() & (f["x"] > 2)),
    ("NOT (x > 2)", lambda f: f["x"].notna() & ~(f["x"] > 2)),
    ("s IS NULL OR x = 0", lambda f: f["s"].isna() | (f["x"] == 0)),
])
def test_where_null_means_no_match_and_skipped_names_agree(spark, nulls_dataset, where, mask, transfer):
    catalog = build_catalog(str(nulls_dataset), where=where, spark=spark)
    assert [f.path for f in catalog.files] == ["a.parquet", "b.parquet"]
    _assert_same_positions(catalog, _expected_positions(str(nulls_dataset), ["a.parquet", "b.parquet"],
                                                        lambda f, _: mask(f)))
    assert catalog.total_rows == _spark_count(spark, "file://" + str(nulls_dataset), where)


def test_files_of_equal_size_are_told_apart_by_path(spark, tmp_path, nulls_dataset):
    root = tmp_path / "ds"
    shutil.copytree(nulls_dataset, root)
    shutil.copy(root / "a.parquet", root / "c.parquet")  # same size as a.parquet: the file key falls back to paths
    catalog = build_catalog(str(root), where="x > 2", spark=spark)
    names = ["a.parquet", "b.parquet", "c.parquet"]
    _assert_same_positions(catalog, _expected_positions(str(root), names, lambda f, _: f["x"] > 2))
    assert {r.path for r in catalog.row_groups} == set(names)


@pytest.mark.parametrize("in_tasks", [False, True], ids=["driver", "tasks"])
def test_a_file_that_is_not_parquet_is_named(spark, tmp_path, nulls_dataset, in_tasks):
    root = tmp_path / "ds"
    shutil.copytree(nulls_dataset, root)
    (root / "notes.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"'notes\.parquet'.*not a readable Parquet file"):
        build_catalog(str(root), spark=spark, footers_in_tasks=in_tasks)


def test_file_spark_would_skip_but_we_read_is_refused(spark, tmp_path, nulls_dataset):
    root = tmp_path / "ds"
    shutil.copytree(nulls_dataset, root)
    shutil.copy(root / "a.parquet", root / "c.parquet._COPYING_")  # Spark skips in-flight copies
    with pytest.raises(ValueError, match=r"c\.parquet\._COPYING_.*Spark skips it"):
        build_catalog(str(root), where="x > 2", spark=spark)


# ------------------------------------------------------------------------------------------- where: errors

@pytest.mark.parametrize("where, needle", [
    ("lang === 'en'", "PARSE_SYNTAX_ERROR"),
    ("no_such_column = 1", "no_such_column"),
    ("value + 1", "not a boolean"),
])
def test_invalid_where_is_a_clear_value_error(spark, plain_dataset, where, needle):
    with pytest.raises(InvalidWhereError) as caught:
        plan_shards(plain_dataset.url, WORLD, where=where, engine="spark", spark=spark)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError) and "\n" not in message
    assert repr(where) in message and needle in message and "lang" in message  # names the columns too


def test_where_matching_nothing_is_a_value_error(spark, plain_dataset, tmp_path):
    with pytest.raises(ValueError, match="matches no row"):
        plan_shards(plain_dataset.url, WORLD, where="lang = 'xx'", engine="spark", spark=spark,
                    output_url=str(tmp_path / "plan"))
    assert not (tmp_path / "plan").exists()


def _load_job():
    spec = importlib.util.spec_from_file_location("plan_shards_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("where", ["lang = 'xx'", "missing_col > 1", "cast(text AS int) > 0"],
                         ids=["matches-nothing", "missing-column", "fails-halfway-on-data"])
def test_job_main_exits_2_with_one_line_and_keeps_the_session(spark, plain_dataset, tmp_path, capsys, where):
    code = _load_job().main([plain_dataset.url, "--world-size", "2", "--output", str(tmp_path / "plan"),
                             "--where", where])
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and where in errors[0]
    assert not (tmp_path / "plan" / "plan.json").exists()
    assert spark.range(3).count() == 3  # the active session was borrowed, not stopped


def test_package_zip_is_importable_alone(tmp_path):
    path = spark_engine.package_zip()
    assert path == spark_engine.package_zip()  # same content, same zip
    names = zipfile.ZipFile(path).namelist()
    assert "petastorm_balanced/planner/engines/spark.py" in names and "petastorm_balanced/__init__.py" in names
    code = ("import petastorm_balanced.planner.engines.spark as s, sys; "
            "assert s.__file__.startswith(sys.argv[1]), s.__file__")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, sys.argv[1]); {code}", path],
                   cwd=tmp_path, env=env, check=True, timeout=120)


# ------------------------------------------------------------------------------------------- spark-submit

HIVE_WHERE, BAD_WHERE = "year = 2021 AND lang = 'en'", "lang === 'en'"


class _Job:
    """One spark-submit run, like a user's: plain spark-submit, no --master (so local[*]), started outside the
    repository with no PYTHONPATH, so the package is not importable unless the job makes it so."""

    def __init__(self, folder, *args, confs=()):
        spark_submit = shutil.which("spark-submit") or os.path.join(os.path.dirname(sys.executable),
                                                                    "spark-submit")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_SUBMIT_ARGS")}
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   SPARK_LOCAL_IP="127.0.0.1")
        self.plan = folder / "plan"
        command = [spark_submit, "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
                   *[word for conf in confs for word in ("--conf", conf)], JOB, *args, "--output", str(self.plan)]
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        self.returncode, self.output = done.returncode, done.stdout + done.stderr
        # spark-submit prints the Python driver's stdout and stderr on its stdout, Spark's logging on stderr.
        self.ours = [line for line in self.output.splitlines() if line.startswith("plan_shards:")]

    def plan_written(self):
        assert self.returncode == 0, self.output[-3000:]
        assert any(" scanning " in line for line in self.ours) and any(" wrote " in line for line in self.ours)
        return load_plan(str(self.plan))


def test_job_plain_dataset_equals_local_engine(plain_dataset, tmp_path):
    job = _Job(tmp_path, plain_dataset.url, "--world-size", str(WORLD), "--batch-size", str(BATCH), "--seed", "5",
               "--policy", "pad")
    plan = job.plan_written()
    assert (plan.world_size, plan.batch_size, plan.seed, plan.policy) == (WORLD, BATCH, 5, "pad")
    local = plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, seed=5, policy="pad", engine="local")
    assert plan.checksum == local.checksum  # G8 through the job: another process, the same plan


def test_job_petastorm_dataset_equals_local_engine(petastorm_dataset, tmp_path):
    plan = _Job(tmp_path, petastorm_dataset.path, "--world-size", "4", "--batch-size", "8").plan_written()
    local = plan_shards(petastorm_dataset.url, 4, batch_size=8, engine="local")
    assert plan.catalog.kind == "petastorm" and plan.checksum == local.checksum


def test_job_hive_where_on_partition_column_totals_equal_spark_count(spark, hive_dataset, tmp_path):
    # Executors get a Python that does not exist: a where runs in the JVM alone (docs/spark.md).
    job = _Job(tmp_path, hive_dataset.url, "--world-size", "2", "--where", HIVE_WHERE,
               confs=[f"spark.pyspark.driver.python={sys.executable}", "spark.pyspark.python=/nonexistent/python"])
    plan = job.plan_written()
    assert any(" matches " in line for line in job.ours)
    # one line says where planning's time went, every step named
    (timing,) = [line for line in job.ours if line.startswith("plan_shards: time: ")]
    assert all(f"{step} " in timing for step in ("footers", "where", "encode", "balance", "write", "total"))
    assert plan.total_rows == _spark_count(spark, hive_dataset.url, HIVE_WHERE) > 0
    assert {r.path.split("/")[0] for r in plan.catalog.row_groups} == {"year=2021"}
    again = plan_shards(hive_dataset.url, 2, where=HIVE_WHERE, engine="spark", spark=spark)
    assert again.checksum == plan.checksum  # another process, another session: the same plan


def test_job_invalid_sql_exits_2_and_writes_nothing(plain_dataset, tmp_path):
    job = _Job(tmp_path, plain_dataset.url, "--world-size", "2", "--where", BAD_WHERE)
    assert job.returncode == 2, job.output[-3000:]
    errors = [line for line in job.ours if line.startswith("plan_shards: error:")]
    assert len(errors) == 1 and "--where" in errors[0] and BAD_WHERE in errors[0], job.output[-3000:]
    assert "Traceback" not in job.output
    assert not (job.plan / "plan.json").exists()


# ------------------------------------------------------------------------------------------- where: footer schema

def _typed_table(n: int) -> pa.Table:
    """Columns of the types whose Spark schema inference has rules of its own (unsigned, nanoseconds, zones,
    decimals, nesting, dictionaries)."""
    rng = np.random.default_rng(n)
    ts = pa.array(rng.integers(0, 10**15, n), pa.int64())
    return pa.table({
        "i8": pa.array(rng.integers(-100, 100, n), pa.int8()), "u16": pa.array(rng.integers(0, 60_000, n), pa.uint16()),
        "u32": pa.array(rng.integers(0, 2**32 - 1, n), pa.uint32()),
        "u64": pa.array(rng.integers(0, 2**62, n), pa.uint64()), "f32": pa.array(rng.random(n), pa.float32()),
        "flag": pa.array(rng.random(n) < 0.5),
        "day": pa.array(rng.integers(0, 20_000, n), pa.int32()).cast(pa.date32()),
        "ts_us": ts.cast(pa.timestamp("us")), "ts_tz": ts.cast(pa.timestamp("us", tz="UTC")),
        "ts_ms": pa.array(rng.integers(0, 10**12, n), pa.int64()).cast(pa.timestamp("ms")),
        "dec": pa.array([None if i % 7 == 0 else i for i in range(n)], pa.decimal128(12, 3)),
        "name": pa.array([f"n{i % 13}" for i in range(n)]).dictionary_encode(),
        "blob": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.binary()),
        "ints": pa.array([list(range(i % 4)) for i in range(n)], pa.list_(pa.int32())),
        "pair": pa.array([{"a": i, "b": str(i)} for i in range(n)],
                         pa.struct([("a", pa.int64()), ("b", pa.string())])),
    })


def test_footer_schema_is_sparks_inferred_schema(spark, tmp_path):
    """The schema planning computes from one footer on the driver (no inference job) is the one
    ``spark.read.parquet`` infers, type by type, for pyarrow's and Spark's own files; a summary file (which Spark
    reads first) leaves the inference to Spark."""
    folder = tmp_path / "typed"
    folder.mkdir()
    for i in range(2):
        pq.write_table(_typed_table(50 + i), folder / f"part-{i}.parquet", coerce_timestamps="us",
                       allow_truncated_timestamps=True)
    ours = spark_engine._footer_schema(spark, f"file://{folder}", str(folder), "part-1.parquet")
    assert ours is not None and ours == spark.read.parquet(str(folder)).schema
    written = tmp_path / "by_spark"
    spark.read.parquet(str(folder)).selectExpr("*", "named_struct('x', u16, 'y', array(i8)) AS nested",
                                               "map('k', i8) AS kv").write.parquet(str(written))
    first = sorted(p.name for p in written.iterdir() if p.name.endswith(".parquet"))[0]
    ours = spark_engine._footer_schema(spark, f"file://{written}", str(written), first)
    assert ours is not None and ours == spark.read.parquet(str(written)).schema  # required columns too
    assert spark.read.schema(ours).parquet(str(written)).schema == spark.read.parquet(str(written)).schema
    pq.write_metadata(pa.schema([("only", pa.int64())]), folder / "_common_metadata")
    assert spark_engine._footer_schema(spark, f"file://{folder}", str(folder), "part-1.parquet") is None


def test_files_of_different_schemas_leave_the_schema_to_spark(spark, tmp_path):
    """Files whose footers differ (a column stored as int64 in some, int32 in one, as writers with other
    defaults leave it) are not given a schema from one footer: Spark's own inference job runs, as
    ``spark.read.parquet`` would, and the planned rows are the ones Spark's count(where) and the local engine
    find. Files that agree take the footer's schema (one job)."""
    rng = np.random.default_rng(3)
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i in range(3):
        n = 40 + 7 * i
        columns = {"id": np.arange(i * 100, i * 100 + n, dtype=np.int64),
                   "lang": rng.choice(["en", "de", "fr"], n).tolist(),
                   "value": pa.array(rng.integers(0, 10, n), pa.int32() if i == 2 else pa.int64())}
        pq.write_table(pa.table(columns), folder / f"part-{i}.parquet", row_group_size=16)
    url, where = f"file://{folder}", "lang = 'en'"
    tracker = spark.sparkContext.statusTracker()

    def jobs_for(location):
        before = set(tracker.getJobIdsForGroup(None))
        catalog = build_catalog(location, where=where, spark=spark)
        return catalog, len(set(tracker.getJobIdsForGroup(None)) - before)
    catalog, jobs = jobs_for(url)
    assert jobs == 2  # the inference job and the count: no footer's schema stood for the others
    assert catalog.total_rows == _spark_count(spark, url, where)
    local = plan_shards(url, 1, batch_size=1, engine="local", predicate=in_set({"en"}, "lang"))
    assert catalog.total_rows == local.total_rows
    os.remove(folder / "part-2.parquet")
    assert jobs_for(url)[1] == 1  # the int32 file gone: one schema


def test_where_with_a_footer_schema_runs_one_job(spark, plain_dataset):
    """Planning a where runs exactly one Spark job (no schema inference job) and keeps count(where)'s rows."""
    where = "lang = 'en' AND value > 3.5"
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    catalog = build_catalog(plain_dataset.url, where=where, spark=spark)
    assert len(set(tracker.getJobIdsForGroup(None)) - before) == 1
    assert catalog.total_rows == _spark_count(spark, plain_dataset.url, where)
