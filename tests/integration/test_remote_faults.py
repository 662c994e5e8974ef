"""Remote reading against a real S3 server (SeaweedFS) behind a latency-and-fault proxy (slow tier, G18).

Each fault (connection resets, bodies cut mid-response, ``503 SlowDown``) is injected at rates far above a cloud
store's, on every request of planning and reading; the epoch must deliver exactly the rows, in the order, of the
same loader on the local copy. A persistent outage must fail with ``StorageUnavailableError`` naming the URL and
the attempts, never with "corrupt", within the policy's bound, and with no cycle in its chain. The endpoint given
in the URL query must get the same retries as ``AWS_ENDPOINT_URL``.
"""
import time

import numpy as np
import pytest

from petastorm_balanced import StorageUnavailableError, make_loader, plan_shards
from petastorm_balanced.io import retry
from tests.reading.test_storage_errors import chain

pytest_plugins = ["tests.support.seaweedfs_server"]  # SeaweedFS behind the fault proxy: fixtures remote, seaweedfs
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]

BATCH = 64
FAULTS = {"resets": {"reset": 0.03}, "cut bodies": {"cut": 0.03}, "503 SlowDown": {"slowdown": 0.05},
          "all at once": {"reset": 0.02, "cut": 0.02, "slowdown": 0.03}}


def _ids(url, **kw):
    plan = plan_shards(url, 1, batch_size=BATCH, engine="local")
    return np.concatenate([b["id"].numpy() for b in make_loader(0, 1, plan=plan, backend="arrow", **kw)])


@pytest.fixture
def on_remote(remote, plain_dataset, monkeypatch):
    monkeypatch.setenv(retry.ENV, "attempts=8,base_s=0.05,max_s=0.5")
    return remote.prefix.upload(plain_dataset.path, "plain")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_row_exactly_once_under_faults(remote, on_remote, plain_dataset, fault):
    expected = _ids(plain_dataset.url)
    assert len(expected) == len(set(expected.tolist()))
    remote.proxy.configure(**FAULTS[fault], seed=7)
    got = _ids(on_remote)
    assert np.array_equal(got, expected)
    injected = sum(v for k, v in remote.proxy.counts.items() if k.startswith("fault:") and k != "fault:ok")
    assert injected > 0, remote.proxy.counts


def test_the_local_disk_cache_under_faults_stores_only_whole_row_groups(remote, on_remote, plain_dataset, tmp_path):
    """Every fault at once while the first epoch fills the cache: a read that failed stores nothing, so both
    epochs deliver the local loader's rows exactly."""
    local = plan_shards(plain_dataset.url, 1, batch_size=BATCH, engine="local")
    plan = plan_shards(on_remote, 1, batch_size=BATCH, engine="local")
    expected = make_loader(0, 1, plan=local, backend="arrow")
    loader = make_loader(0, 1, plan=plan, backend="arrow", cache_type="local-disk",
                         cache_location=str(tmp_path / "cache"))
    remote.proxy.configure(**FAULTS["all at once"], seed=13)
    for epoch in range(2):
        loader.set_epoch(epoch)
        expected.set_epoch(epoch)
        for got, want in zip(loader, expected, strict=True):  # every column's values
            assert got.keys() == want.keys()
            for name in got:
                assert np.array_equal(np.asarray(got[name]), np.asarray(want[name])), (epoch, name)
    assert sum(v for k, v in remote.proxy.counts.items() if k.startswith("fault:") and k != "fault:ok") > 0


def test_endpoint_in_the_url_gets_the_same_retries(remote, on_remote, plain_dataset, monkeypatch):
    expected = _ids(plain_dataset.url)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    remote.proxy.configure(**FAULTS["all at once"], seed=11)
    got = _ids(on_remote + f"?endpoint_override={remote.proxy.endpoint.split('://')[1]}&scheme=http")
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("when", ["planning", "reading"])
def test_a_persistent_outage_fails_truthfully(remote, on_remote, monkeypatch, when):
    monkeypatch.setenv(retry.ENV, "attempts=3,base_s=0.05,max_s=0.2,request_attempts=2")
    plan = None
    if when == "reading":
        plan = plan_shards(on_remote, 1, batch_size=BATCH, engine="local")
    remote.proxy.configure(outage=True)
    start = time.monotonic()
    with pytest.raises(StorageUnavailableError) as caught:
        if plan is None:
            plan_shards(on_remote, 1, batch_size=BATCH, engine="local")
        else:
            list(make_loader(0, 1, plan=plan, backend="arrow"))
    elapsed = time.monotonic() - start
    text = str(caught.value)
    assert on_remote in text and "3 time(s)" in text and "unreachable or throttling" in text, text
    assert "corrupt" not in text and "rename" not in text, text
    assert elapsed < 60, elapsed
    chain(caught.value)


def test_a_plan_read_during_an_outage_is_not_called_incomplete(remote, on_remote, monkeypatch):
    from petastorm_balanced import load_plan
    monkeypatch.setenv(retry.ENV, "attempts=2,base_s=0.05,max_s=0.1,request_attempts=1")
    plan_url = remote.prefix.join("plan")
    plan_shards(on_remote, 1, batch_size=BATCH, engine="local", output_url=plan_url)
    remote.proxy.configure(outage=True)
    with pytest.raises(StorageUnavailableError) as caught:
        load_plan(plan_url)
    assert plan_url in str(caught.value) and "re-run planning" not in str(caught.value)
    chain(caught.value)
    monkeypatch.setenv(retry.ENV, "attempts=8,base_s=0.02,max_s=0.1,request_attempts=1")
    remote.proxy.configure(slowdown=0.3, seed=3)  # throttled, then through: the same plan
    loaded = load_plan(plan_url)
    assert remote.proxy.counts["fault:slowdown"] > 0
    remote.proxy.configure()
    assert loaded.checksum == load_plan(plan_url).checksum
