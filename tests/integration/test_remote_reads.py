"""How many requests a remote epoch makes, counted by the proxy in front of a real S3 server (slow tier, G18).

An object store charges a round trip per request, so the Arrow backend must open each file once per epoch (shared
by its threads) and look up its modification time (G15), read each footer once per epoch (the loader's schema pass
and the first epoch's G15 check share one read; every later epoch reads and checks them again), and read each row
group's columns in one coalesced request. The ids are the local loader's.
"""
import numpy as np
import pytest

from petastorm_balanced import make_loader, plan_shards

pytest_plugins = ["tests.support.seaweedfs_server"]  # SeaweedFS behind the fault proxy: fixtures remote, seaweedfs
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]


@pytest.mark.parametrize("columns", [["id", "label"], None])
def test_one_open_and_one_footer_read_per_file_per_epoch(remote, plain_dataset, columns):
    url = remote.prefix.upload(plain_dataset.path, "plain")
    plan = plan_shards(url, 1, batch_size=32, engine="local")
    local = plan_shards(plain_dataset.url, 1, batch_size=32, engine="local")
    files = len({g.path for g in plan.catalog.row_groups})
    groups = len(plan.catalog.row_groups)
    remote.proxy.configure()
    loader = make_loader(0, 1, plan=plan, backend="arrow", schema_fields=columns)
    expected = make_loader(0, 1, plan=local, backend="arrow", schema_fields=columns)
    for epoch in range(2):
        loader.set_epoch(epoch)
        expected.set_epoch(epoch)
        ids = np.concatenate([b["id"].numpy() for b in loader])
        assert np.array_equal(ids, np.concatenate([b["id"].numpy() for b in expected]))
        counts = dict(remote.proxy.counts)
        # per file per epoch one open, whatever the threads, and one look-up of its modification time (G15: a
        # rewrite that keeps the footer's bytes); the first epoch also locates the dataset root (once)
        assert 2 * files <= counts.get("HEAD", 0) <= 2 * files + (epoch == 0), counts
        gets = counts.get("GET", 0)
        # a footer per file, a request per row group (two where the columns lie far apart)
        assert files + groups <= gets <= files + 2 * groups, counts
        remote.proxy.configure()


def test_with_the_local_disk_cache_a_second_epoch_reads_only_footers(remote, plain_dataset, tmp_path):
    """cache_type='local-disk': the first epoch stores each row group it reads; the next one still opens every file
    and reads and checks its footer (G15), and reads no row group from the storage; the ids are the local ones."""
    url = remote.prefix.upload(plain_dataset.path, "plain")
    plan = plan_shards(url, 1, batch_size=32, engine="local")
    local = plan_shards(plain_dataset.url, 1, batch_size=32, engine="local")
    files = len({g.path for g in plan.catalog.row_groups})
    remote.proxy.configure()
    loader = make_loader(0, 1, plan=plan, backend="arrow", cache_type="local-disk",
                         cache_location=str(tmp_path / "cache"), cache_size_limit="256MiB")
    expected = make_loader(0, 1, plan=local, backend="arrow")
    for epoch in range(3):
        loader.set_epoch(epoch)
        expected.set_epoch(epoch)
        ids = np.concatenate([b["id"].numpy() for b in loader])
        assert np.array_equal(ids, np.concatenate([b["id"].numpy() for b in expected]))
        counts = dict(remote.proxy.counts)
        assert 2 * files <= counts.get("HEAD", 0) <= 2 * files + (epoch == 0), counts
        if epoch:
            assert counts.get("GET", 0) == files, counts  # the footers, checked again; no row group
        remote.proxy.configure()
