"""A real Spark Connect server for the tests: ``SparkConnectServer`` on 127.0.0.1, started once per test run.

Registered in conftest.py's ``pytest_plugins``. ``spark_connect`` (session) is a Spark Connect session
(``pyspark.sql.connect.session.SparkSession``: no ``sparkContext``, no RDDs) talking gRPC to a separate server
process, as on Databricks serverless and shared clusters. The pip wheel of pyspark has no
``sbin/start-connect-server.sh``; that script only runs ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, which is what this does (the connect jar ships in
``pyspark/jars``). The server's environment has no PYTHONPATH pointing at the checkout, so its Python workers
import petastorm_balanced only from what the client ships (``spark.addArtifacts``).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.jobs import free_port

START_TIMEOUT_S = 120
READY = "Spark Connect server started at"


MODE = "SPARK_CONNECT_MODE_ENABLED"  # pyspark.sql.functions build Connect columns while this is set


@contextlib.contextmanager
def classic_mode():
    """Inside a ``connect`` test: build classic DataFrames and columns (pyspark decides by this variable)."""
    before = os.environ.pop(MODE, None)
    try:
        yield
    finally:
        if before is not None:
            os.environ[MODE] = before


@pytest.fixture
def connect(spark_connect):
    """The Connect session, with pyspark in Connect mode for the test (a process that has used Connect builds
    Connect columns; classic and Connect DataFrames cannot be mixed in one call): ``classic_mode()`` switches back."""
    before = os.environ.get(MODE)
    os.environ[MODE] = "1"
    try:
        yield spark_connect
    finally:
        if before is None:
            os.environ.pop(MODE, None)


@pytest.fixture(scope="session")
def spark_connect(spark, tmp_path_factory):
    """Needs the classic session first: pyspark refuses a classic session in a process once Connect is used."""
    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (grpcio, grpcio-status, "
                                       "googleapis-common-protos)")
    import pyspark
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession
    home = Path(pyspark.__file__).parent
    if not list((home / "jars").glob("spark-connect_*.jar")):
        pytest.skip("this pyspark has no spark-connect jar")
    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(home))
    cmd = [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
           "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.sql.session.timeZone=UTC", "spark-internal"]
    with open(log, "w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY not in log.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Spark Connect server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        before = os.environ.get(MODE)
        session = RemoteSparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()
        if before is None:  # pyspark marks the process as Connect-only; subprocesses and later tests are classic
            os.environ.pop(MODE, None)
        yield session
        session.stop()
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # our own process group (start_new_session)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
