"""How many requests a remote epoch makes, counted by the proxy in front of a real S3 server (slow tier, G18).

An object store charges a round trip per request, so the Arrow backend must open each file once per epoch (shared
by its threads) and take its modification time (G15) from one listing per folder per epoch (not a HEAD per file),
read each footer once per epoch (the loader's schema pass
and the first epoch's G15 check share one read; every later epoch reads and checks them again), and read each row
group's columns in one coalesced request. The ids are the local loader's.
"""
import time

import numpy as np
import pytest

from petastorm_balanced import make_loader, plan_shards

pytest_plugins = ["tests.support.seaweedfs_server"]  # SeaweedFS behind the fault proxy: fixtures remote, seaweedfs
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]


def counted_epochs(remote, dataset, epochs: int, **options):
    """``(epoch, requests, (files, folders, row groups))`` of each epoch of a loader over ``dataset`` uploaded to S3,
    its ids checked first against the same loader's over the local copy."""
    url = remote.prefix.upload(dataset.path, "plain")
    plan = plan_shards(url, 1, batch_size=32, engine="local")
    local = plan_shards(dataset.url, 1, batch_size=32, engine="local")
    shape = (len({g.path for g in plan.catalog.row_groups}),
             len({g.path.rpartition("/")[0] for g in plan.catalog.row_groups}), len(plan.catalog.row_groups))
    remote.proxy.configure()
    loader = make_loader(0, 1, plan=plan, backend="arrow", **options)
    expected = make_loader(0, 1, plan=local, backend="arrow", schema_fields=options.get("schema_fields"))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        expected.set_epoch(epoch)
        ids = np.concatenate([b["id"].numpy() for b in loader])
        assert np.array_equal(ids, np.concatenate([b["id"].numpy() for b in expected]))
        yield epoch, dict(remote.proxy.counts), shape
        remote.proxy.configure()


@pytest.mark.parametrize("columns", [["id", "label"], None])
def test_one_open_and_one_footer_read_per_file_per_epoch(remote, plain_dataset, columns):
    for epoch, counts, (files, folders, groups) in counted_epochs(remote, plain_dataset, 2, schema_fields=columns):
        # per file per epoch one open, whatever the threads, and the first epoch also locates the dataset root
        # (once); the modification times (G15: a rewrite that keeps the footer's bytes) from one listing per folder
        assert files <= counts.get("HEAD", 0) <= files + (epoch == 0), counts
        assert counts.get("list", 0) == folders, counts
        gets = counts.get("GET", 0) - counts.get("list", 0)
        # a footer per file, a request per row group (two where the columns lie far apart)
        assert files + groups <= gets <= files + 2 * groups, counts


def test_a_rewrite_that_keeps_the_footer_is_refused_by_the_next_epoch(remote, tmp_path):
    """The listing's modification times still tell a rewrite that keeps the file's size and footer bytes (G15)."""
    from petastorm_balanced import StalePlanError
    from tests.io.test_silent_g15 import HALF, reorder_keeping_the_footer, write_files
    local = write_files(tmp_path / "ds")
    url = remote.prefix.upload(local, "ds")
    plan = plan_shards(url, 1, batch_size=10, predicate=HALF, engine="local")
    loader = make_loader(0, 1, plan=plan, batch_size=10, backend="arrow", workers_count=1)
    assert sorted(int(i) for b in loader for i in b["id"]) == [i for i in range(600) if i % 100 < 50]
    time.sleep(1.1)  # S3 modification times count seconds
    reorder_keeping_the_footer(f"{local}/part-1.parquet")
    remote.prefix.upload(local, "ds")
    loader.set_epoch(1)
    with pytest.raises(StalePlanError, match="'part-1.parquet'.*modified since planning"):
        list(loader)


def test_with_the_local_disk_cache_a_second_epoch_reads_only_footers(remote, plain_dataset, tmp_path):
    """cache_type='local-disk': the first epoch stores each row group it reads; the next one still opens every file
    and reads and checks its footer (G15), and reads no row group from the storage; the ids are the local ones."""
    cache = {"cache_type": "local-disk", "cache_location": str(tmp_path / "cache"), "cache_size_limit": "256MiB"}
    for epoch, counts, (files, folders, _) in counted_epochs(remote, plain_dataset, 3, **cache):
        assert files <= counts.get("HEAD", 0) <= files + (epoch == 0), counts
        if epoch:  # the footers, checked again, and the listing of modification times; no row group
            assert counts.get("GET", 0) - counts.get("list", 0) == files, counts
            assert counts.get("list", 0) == folders, counts
