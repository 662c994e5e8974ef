"""Storage faults told apart from bad data, retried under one policy, and raised without cycles (G18).

Faults are injected in this process, on a local dataset, where the reading path reads footers and row groups:
briefly (the policy's retries absorb them; every row still comes once), persistently (``StorageUnavailableError``
naming the URL, the attempts and the last error) and as a non-transient failure that has passed by the time the
reader looks again. Every raised exception's ``__cause__``/``__context__`` chain is walked: no exception is its own
cause, directly or through others. The same faults against a real S3 server behind a fault proxy are in
``tests/integration/test_remote_faults.py`` (slow tier).
"""
import os
import sys
import threading

import numpy as np
import pytest

from petastorm_balanced import StorageUnavailableError, datagen, make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.io import footer as footer_io
from petastorm_balanced.io import retry
from petastorm_balanced.reading.rows import fragments

TRANSIENT = "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 56, Failure when receiving data"
THROTTLED = "AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate."


def chain(exc: BaseException) -> list[BaseException]:
    """Every exception reachable through ``__cause__`` and ``__context__``; fails on a cycle."""
    seen: list[BaseException] = []

    def walk(node, path):
        assert all(node is not p for p in path), f"cycle through {type(node).__name__}: {node}"
        if not any(node is s for s in seen):
            seen.append(node)
        for nxt in (node.__cause__, node.__context__):
            if nxt is not None:
                walk(nxt, path + [node])
    walk(exc, [])
    return seen


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    info = datagen.make_plain_dataset(tmp_path_factory.mktemp("faults") / "ds", num_files=4, total_rows=2000, seed=3)
    plan = plan_shards(info.url, 1, batch_size=16, engine="local")
    return info, plan


@pytest.fixture(autouse=True)
def quick_policy(monkeypatch):
    monkeypatch.setenv(retry.ENV, "attempts=4,base_s=0,max_s=0")


def _ids(plan, **kw):
    return np.concatenate([b["id"].numpy() for b in make_loader(0, 1, plan=plan, backend="arrow", shuffle=False,
                                                                  **kw)])


class Faulty:
    """Wraps a function: raises ``OSError(message)`` on the calls numbered in ``fail`` (``None``: every call),
    counting only calls made from a function defined in ``within`` (a file name; None: every call)."""

    def __init__(self, function, message, fail=None, within=None):
        self.function, self.message, self.fail, self.calls, self.within = function, message, fail, 0, within
        self._lock = threading.Lock()  # footers are read by several threads: each call gets its own number

    def __call__(self, *args, **kwargs):
        if self.within is None or _called_from(self.within):
            with self._lock:
                self.calls += 1
                call = self.calls
            if self.fail is None or call in self.fail:
                raise OSError(self.message)
        return self.function(*args, **kwargs)


def _called_from(file_name: str) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if os.path.basename(frame.f_code.co_filename) == file_name:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("message", [TRANSIENT, THROTTLED])
@pytest.mark.parametrize("where", ["footer", "row group"])
def test_brief_faults_are_retried_and_every_row_comes_once(dataset, monkeypatch, where, message):
    _, plan = dataset
    expected = _ids(plan)
    assert sorted(expected.tolist()) == sorted(set(expected.tolist()))
    if where == "footer":
        fault = Faulty(footer_io.read_footer, message, fail={1, 2, 5})
        monkeypatch.setattr(footer_io, "read_footer", fault)
    else:
        fault = Faulty(fragments.read_fragment, message, fail={1, 3, 4})
        monkeypatch.setattr(fragments, "read_fragment", fault)
    assert np.array_equal(_ids(plan), expected)
    assert fault.calls > 3


@pytest.mark.parametrize("where", ["footer", "row group"])
def test_a_persistent_outage_is_storage_unavailable_naming_url_and_attempts(dataset, monkeypatch, where):
    info, plan = dataset
    target = (footer_io, "read_footer") if where == "footer" else (fragments, "read_fragment")
    monkeypatch.setattr(*target, Faulty(getattr(*target), THROTTLED))
    with pytest.raises(StorageUnavailableError) as caught:
        _ids(plan)
    text = str(caught.value)
    assert info.url in text and "4 time(s)" in text and "SLOW_DOWN" in text, text
    assert "unreachable or throttling" in text and "corrupt" not in text, text
    assert caught.value.attempts == 4 and isinstance(caught.value.last_error, OSError)
    assert isinstance(caught.value, OSError)  # still what callers catching OSError expect
    chain(caught.value)


def test_a_footer_failure_that_passed_is_a_new_error_not_its_own_cause(dataset, monkeypatch):
    """A non-transient footer failure in the schema pass that is gone when the reader looks again: the reader used to
    raise the original exception from itself (``exc.__cause__ is exc``)."""
    info, plan = dataset
    # the schema pass's first read fails (the reader's own footer checks may run beside it, and a check that fails
    # once is asked again: only the schema pass's failure is what this test is about)
    monkeypatch.setattr(footer_io, "read_footer", Faulty(footer_io.read_footer, "boom", fail={1},
                                                         within="dataset_schema.py"))
    with pytest.raises(OSError) as caught:
        _ids(plan)
    assert caught.value.__cause__ is not caught.value
    assert "every planned file reads now" in str(caught.value) and info.url in str(caught.value)
    assert any(str(e) == "boom" for e in chain(caught.value))


def test_a_corrupt_footer_is_still_called_corrupt(dataset, monkeypatch, tmp_path):
    info = datagen.make_plain_dataset(tmp_path / "ds", num_files=2, total_rows=200, seed=5)
    plan = plan_shards(info.url, 1, batch_size=8, engine="local")
    victim = plan.catalog.files[0]
    path = tmp_path / "ds" / victim.path
    before = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-40:-8] = b"\xab" * 32
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # bit rot: the listing cannot see it
    with pytest.raises(OSError) as caught:
        _ids(plan)
    assert "not a readable Parquet file" in str(caught.value), str(caught.value)
    assert not isinstance(caught.value, StorageUnavailableError)
    chain(caught.value)


def test_retry_policy_default_parse_and_storage_options():
    policy = retry.RetryPolicy()
    assert (policy.attempts, policy.base_s, policy.max_s) == (6, 0.2, 5.0)
    waits = [policy.wait_s(k) for k in range(8) for _ in range(50)]
    assert min(waits) >= 0 and max(waits) <= policy.max_s
    assert max(policy.wait_s(0) for _ in range(200)) <= 0.2
    assert retry.RetryPolicy.parse("attempts=9, max_s=1") == retry.RetryPolicy(attempts=9, max_s=1.0)
    with pytest.raises(InvalidValueError, match="tries"):
        retry.RetryPolicy.parse("tries=3")
    policy, rest = retry.split_options({"retry_attempts": 2, "anon": True})
    assert policy.attempts == 2 and rest == {"anon": True}
    with pytest.raises(InvalidValueError, match="retry_wait"):
        retry.split_options({"retry_wait": 2})


def test_storage_options_retry_attempts_reach_the_arrow_reader(dataset, monkeypatch):
    _, plan = dataset
    fault = Faulty(fragments.read_fragment, TRANSIENT)
    monkeypatch.setattr(fragments, "read_fragment", fault)
    with pytest.raises(StorageUnavailableError, match="2 time"):
        _ids(plan, storage_options={"retry_attempts": 2})
    with pytest.raises(InvalidValueError, match="storage_options"):
        _ids(plan, storage_options={"anon": True})


@pytest.mark.parametrize("text,transient", [
    (TRANSIENT, True), (THROTTLED, True), ("AWS Error UNKNOWN (HTTP status 503) during HeadObject", True),
    ("Couldn't deserialize thrift: TProtocolException: Invalid data", False),
    ("Parquet magic bytes not found in footer", False),
    ("AWS Error ACCESS_DENIED during GetObject operation: Access Denied", False),
    ("AWS Error SERVICE_UNAVAILABLE during GetObject operation", True), ("[Errno 110] Connection timed out", True),
    ("reading 'part-500.parquet' failed: Couldn't deserialize thrift", False),
    ("reading 'timeout/part-0.parquet': Unexpected end of file", False),
    ("Unexpected end of stream: Page was smaller (10) than expected (20)", False),
])
def test_is_transient(text, transient):
    assert retry.is_transient(OSError(text)) is transient
    assert not retry.is_transient(FileNotFoundError(text))


def test_s3_locations_share_one_client_per_endpoint_and_refuse_unknown_query_keys(monkeypatch):
    from petastorm_balanced.io import fs as fsutil
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    by_env, path = fsutil.resolve("s3://bucket/a/b")
    assert path == "bucket/a/b" and fsutil.resolve("s3://bucket/c")[0] is by_env  # one client, one pool
    by_query, _ = fsutil.resolve("s3://bucket/a?endpoint_override=127.0.0.1:9&scheme=http")
    assert by_query is by_env  # the same endpoint however it was given: the same client and retry strategy
    with pytest.raises(InvalidValueError, match="'color'"):
        fsutil.resolve("s3://bucket/a?color=blue")
