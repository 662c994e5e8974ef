"""Shared fixtures: one SparkSession per test run, and skewed datasets generated once per run."""
import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from petastorm_balanced import datagen

# Real S3 (moto) and Spark Connect servers on 127.0.0.1, each started once when a test asks.
pytest_plugins = ["tests.support.s3_server", "tests.support.connect_server"]

settings.register_profile("ci", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Nothing goes to the home folder: matplotlib's font cache, Keras' config and the notebook test's IPython profile
# and Jupyter runtime files would (~/.cache/matplotlib, ~/.config/matplotlib, ~/.keras, ~/.ipython,
# ~/.local/share/jupyter). They go to a temporary folder, for the subprocesses too, removed at the end.
_HOME_CACHES = tempfile.mkdtemp(prefix="pb-tests-caches-")
os.environ.setdefault("MPLCONFIGDIR", os.path.join(_HOME_CACHES, "matplotlib"))
os.environ.setdefault("KERAS_HOME", os.path.join(_HOME_CACHES, "keras"))
for _variable, _name in (("IPYTHONDIR", "ipython"), ("JUPYTER_CONFIG_DIR", "jupyter-config"),
                         ("JUPYTER_DATA_DIR", "jupyter-data"), ("JUPYTER_RUNTIME_DIR", "jupyter-runtime")):
    os.environ.setdefault(_variable, os.path.join(_HOME_CACHES, _name))
atexit.register(shutil.rmtree, _HOME_CACHES, ignore_errors=True)


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession, started once (about 5 s) and shared by every test that asks for it."""
    pyspark_sql = pytest.importorskip("pyspark.sql")
    import sys
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (pyspark_sql.SparkSession.builder.master("local[2]").appName("petastorm-balanced-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.host", "127.0.0.1").config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def plain_dataset(tmp_path_factory):
    """Plain Parquet: 12 uneven files, uneven row groups, one empty file, lang mix varying by file."""
    return datagen.make_plain_dataset(tmp_path_factory.mktemp("plain") / "ds", num_files=12, total_rows=20_000,
                                      seed=1, empty_files=1)


@pytest.fixture(scope="session")
def hive_dataset(tmp_path_factory):
    return datagen.make_plain_dataset(tmp_path_factory.mktemp("hive") / "ds", num_files=9, total_rows=8_000,
                                      seed=2, hive=True)


@pytest.fixture(scope="session")
def petastorm_dataset(tmp_path_factory):
    """A Petastorm (Unischema) dataset with codec-encoded array fields (our codecs: any stack)."""
    return datagen.make_petastorm_dataset(tmp_path_factory.mktemp("petastorm") / "ds", num_files=6,
                                          total_rows=3_000, seed=3)
