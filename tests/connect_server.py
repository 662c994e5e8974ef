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

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

START_TIMEOUT_S = 120
READY = "Spark Connect server started at"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory):
    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (grpcio, grpcio-status, "
                                       "googleapis-common-protos)")
    import pyspark
    from pyspark.sql import SparkSession
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
        session = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        yield session
        session.stop()
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # our own process group (start_new_session)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
