"""``loader.stats()`` over a real S3 server behind the latency proxy: reads slowed 10x name the read stage."""
import pytest

from petastorm_balanced import make_loader, plan_shards

pytest_plugins = ["tests.support.seaweedfs_server"]  # SeaweedFS behind the fault proxy: fixtures remote, seaweedfs
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]


def test_slow_storage_is_the_read_stage(remote, plain_dataset):
    url = remote.prefix.upload(plain_dataset.path, "plain")
    plan = plan_shards(url, 2, batch_size=64, engine="local")
    remote.proxy.configure(delay_s=0.25)  # a round trip of 250 ms: 10x a cloud region's
    loader = make_loader(0, 2, plan=plan, batch_format="numpy", workers_count=2)
    assert sum(1 for _ in loader) == len(loader)
    s = loader.stats()
    assert s["limit"] == "read", s
    assert s["requests"] >= 1 and s["evidence"]["stage_share"]["read"] > 0.5, s
