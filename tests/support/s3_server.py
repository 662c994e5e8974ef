"""A real S3 protocol server for the tests: moto's ``moto_server`` on 127.0.0.1, started once per test run.

Register with ``pytest_plugins = ["tests.support.s3_server"]`` in conftest.py (or import the fixtures in a test module).

- ``s3_server`` (session): the running server; ``.endpoint`` is ``http://127.0.0.1:PORT``, ``.bucket`` exists.
- ``s3`` (function): sets AWS credentials, region and ``AWS_ENDPOINT_URL`` for the test, and gives a fresh
  prefix ``s3://BUCKET/<test>-<uuid>`` so tests never see each other's objects.

The server is a subprocess, not moto's in-process mock, so pyarrow's C++ S3 client, s3fs and Petastorm's
worker processes all talk real HTTP to it, as they would to S3.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

from tests.support.jobs import free_port

BUCKET = "petastorm-balanced-tests"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
START_TIMEOUT_S = 30


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str
    process: subprocess.Popen

    @property
    def host_port(self) -> str:
        return self.endpoint.split("://", 1)[1]

    def env(self) -> dict:
        """The environment a subprocess needs to reach this server as its S3."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")


@dataclass(frozen=True)
class S3Prefix:
    """A fresh ``s3://bucket/prefix`` for one test, with the server it lives on."""

    server: S3Server
    url: str

    def join(self, *parts: str) -> str:
        return "/".join([self.url, *parts])

    def upload(self, local_dir, under: str) -> str:
        """Copy a local folder to ``url/under`` with one PUT per file (boto3: works on every stack, and avoids the
        multipart uploads some S3 servers mishandle); returns its ``s3://`` URL."""
        client, prefix = self.server.client(), self.url.split("/", 3)[3] + "/" + under
        for folder, _, names in os.walk(os.fspath(local_dir)):
            for name in sorted(names):
                local = os.path.join(folder, name)
                key = prefix + "/" + os.path.relpath(local, local_dir).replace(os.sep, "/")
                with open(local, "rb") as handle:
                    client.put_object(Bucket=self.server.bucket, Key=key, Body=handle.read())
        return self.join(under)

    def keys(self, under: str = "") -> list:
        """Every object key below ``url/under`` (listing straight from the server, no cache)."""
        prefix = self.url.split("/", 3)[3] + ("/" + under if under else "")
        pages = self.server.client().get_paginator("list_objects_v2").paginate(Bucket=self.server.bucket,
                                                                               Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _moto_server_command() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "moto_server")
    return beside if os.path.exists(beside) else (shutil.which("moto_server") or "")


def start_server() -> S3Server:
    command = _moto_server_command()
    if not command:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([command, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with code {process.returncode} before answering on {endpoint}")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError as error:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto_server did not answer on {endpoint} within {START_TIMEOUT_S} s") from error
            time.sleep(0.05)
    server = S3Server(endpoint, BUCKET, process)
    server.client().create_bucket(Bucket=BUCKET)
    return server


def stop_server(server: S3Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="session")
def s3_server():
    """moto_server on a free port of 127.0.0.1 (about 2 s to start), stopped at the end of the run."""
    server = start_server()
    yield server
    stop_server(server)


@pytest.fixture
def s3(s3_server, monkeypatch, request):
    """Credentials and endpoint in the environment, and a prefix of the bucket that only this test uses."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return S3Prefix(s3_server, f"s3://{s3_server.bucket}/{name}-{uuid.uuid4().hex[:8]}")
