"""How many requests a remote epoch makes, counted by the proxy in front of a real S3 server (slow tier, G18).

An object store charges a round trip per request, so the Arrow backend must open each file once per process (an
open is a HEAD; the open file is kept and shared by threads, loaders and epochs), take its modification time (G15)
from one listing per folder per epoch (not a HEAD per file) and its ETag once per epoch (a HEAD in flight beside
the reads), read each footer once per epoch (the loader's schema
pass and the first epoch's G15 check share one read; every later epoch reads and checks them again), and read each
row group's columns in one coalesced request. The ids are the local loader's.
"""
import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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
def test_one_open_per_file_and_one_footer_read_per_file_per_epoch(remote, plain_dataset, columns):
    for epoch, counts, (files, folders, groups) in counted_epochs(remote, plain_dataset, 3, schema_fields=columns):
        # one open per file, whatever the threads, loaders and epochs (the first epoch also locates the dataset root,
        # once); the modification times (G15: a rewrite that keeps the footer's bytes) from one listing per folder;
        # and each file's ETag once per epoch (G15: a re-upload within the same second keeps size, time and footer)
        # (the first epoch also samples row sizes through a reader of its own, which checks its files' ETags)
        assert counts.get("HEAD", 0) == files if epoch else 2 * files <= counts.get("HEAD", 0) <= 3 * files + 1, \
            counts
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
    """cache_type='local-disk': the first epoch stores each row group it reads; the next one still reads and checks
    every footer (G15), and reads no row group from the storage; the ids are the local ones."""
    cache = {"cache_type": "local-disk", "cache_location": str(tmp_path / "cache"), "cache_size_limit": "256MiB"}
    for epoch, counts, (files, folders, _) in counted_epochs(remote, plain_dataset, 3, **cache):
        assert counts.get("HEAD", 0) == files if epoch else 2 * files <= counts.get("HEAD", 0) <= 3 * files + 1, \
            counts  # an open per file once, and its ETag once per epoch
        if epoch:  # the footers, checked again, and the listing of modification times; no row group
            assert counts.get("GET", 0) - counts.get("list", 0) == files, counts
            assert counts.get("list", 0) == folders, counts


def waves(log, delay_s: float) -> list[list]:
    """The proxy's requests grouped into waves: requests that arrived within ``delay_s / 2`` of the previous one.
    A request sent after another's answer arrives at least ``delay_s`` later, so with a delay far above the
    loader's own pauses, the number of waves is the number of round trips in series."""
    groups: list[list] = []
    for entry in sorted(log):
        if groups and entry[0] - groups[-1][-1][0] < delay_s / 2:
            groups[-1].append(entry)
        else:
            groups.append([entry])
    return groups


def test_an_epoch_costs_three_round_trips_in_series_and_a_later_one_two(remote, plain_dataset):
    """Round trips in series, from make_loader to the end of an epoch of a dataset read in one read-ahead (each
    one adds a full latency): the opens (HEAD), the footers, then the row groups, with the folder's listing in
    flight beside the footers or the reads (the modification times and ETags, G15, checked before any row is handed
    on), not a round trip of its own. A later epoch of the same loader reads and checks every footer again, through the
    files kept open: two.
    Columns stored side by side (id, lang): pyarrow fetches a row group's far-apart column chunks one after the
    other (its pre-buffer cache is lazy)."""
    delay = 0.25
    url = remote.prefix.upload(plain_dataset.path, "plain")
    plan = plan_shards(url, 1, batch_size=32, engine="local")
    remote.proxy.configure(delay_s=delay)
    loader = make_loader(0, 1, plan=plan, backend="arrow", schema_fields=["id", "lang"])
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sum(len(b["id"]) for b in loader) == len(loader) * 32
        kinds = [sorted({entry[3] for entry in wave}) for wave in waves(remote.proxy.log, delay)]
        # the listing and the ETags (G15) ride along (with the footers or the reads), never a round trip of their own
        opens = [["head"]] if epoch == 0 else []
        rides = [[k for k in wave if k not in ("list", "head")] for wave in kinds[len(opens):]]
        assert kinds[:len(opens)] == opens and rides == [["get-range"], ["get-range"]], kinds
        assert sum("list" in wave for wave in kinds) == 1, kinds
        remote.proxy.configure(delay_s=delay)


def test_a_rewrite_is_refused_before_any_of_its_rows_while_its_listing_is_late(remote, tmp_path, monkeypatch):
    """G15 with the listing in flight beside the reads: a file rewritten between epochs (keeping its footer's
    bytes, so only its modification time tells) has its row groups read before its folder's listing answers (2 s
    late here), yet none of its rows reaches a batch: the epoch stops with StalePlanError first."""
    from petastorm_balanced import StalePlanError
    from petastorm_balanced.reading.rows import fragments
    from tests.io.test_silent_g15 import HALF, reorder_keeping_the_footer, write_files
    monkeypatch.setattr(fragments, "BUNDLE_ROWS", 1)  # a bundle per fragment: batches stream, fragment by fragment
    local = write_files(tmp_path / "ds", files=3)
    url = remote.prefix.upload(local, "ds")
    plan = plan_shards(url, 1, batch_size=10, predicate=HALF, engine="local")
    loader = make_loader(0, 1, plan=plan, batch_size=10, backend="arrow", workers_count=1, shuffle=False)
    assert sorted(int(i) for b in loader for i in b["id"]) == [i for i in range(900) if i % 100 < 50]
    time.sleep(1.1)  # S3 modification times count seconds
    reorder_keeping_the_footer(f"{local}/part-1.parquet")  # ids 300-599
    os.makedirs(tmp_path / "rewritten")
    shutil.copy(f"{local}/part-1.parquet", tmp_path / "rewritten")
    remote.prefix.upload(tmp_path / "rewritten", "ds")  # that file alone: the others keep their times
    remote.proxy.configure(list_delay_s=2.0)
    loader.set_epoch(1)
    served = []
    with pytest.raises(StalePlanError, match="'part-1.parquet'.*modified since planning"):
        for batch in loader:
            served.extend(int(i) for i in batch["id"])
    assert not [i for i in served if 300 <= i < 600], "rows of the rewritten file were served"
    log = remote.proxy.log
    answered = min(t for t, _, _, kind in log if kind == "list") + 2.0
    assert any(t < answered and target.endswith("part-1.parquet") and kind == "get-range"
               for t, _, target, kind in log), log  # read while the listing was pending


def test_a_file_kept_open_never_decides_with_its_old_size(remote, tmp_path):
    """Files stay open from loader to loader and epoch to epoch (no HEAD), knowing the size they had when opened:
    a file rewritten to another size is refused by the next epoch (G15), and a plan made again after the rewrite
    reads the new rows, since a footer that does not read or check through a kept file is read again through a
    fresh open."""
    from petastorm_balanced import StalePlanError
    from tests.io.test_silent_g15 import PLAIN, write_files
    local = write_files(tmp_path / "ds")
    url = remote.prefix.upload(local, "ds")
    loader = make_loader(0, 1, plan=plan_shards(url, 1, batch_size=10, engine="local"), batch_size=10,
                         backend="arrow")
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(600))
    ids = np.arange(300, 1000, dtype=np.int64)  # part-1 rewritten longer
    pq.write_table(pa.table({"id": ids, "x": ids * 2}), f"{local}/part-1.parquet", **PLAIN)
    os.makedirs(tmp_path / "rewritten")
    shutil.copy(f"{local}/part-1.parquet", tmp_path / "rewritten")
    remote.prefix.upload(tmp_path / "rewritten", "ds")
    loader.set_epoch(1)
    with pytest.raises(StalePlanError, match="part-1.parquet"):
        list(loader)
    again = make_loader(0, 1, plan=plan_shards(url, 1, batch_size=10, engine="local"), batch_size=10,
                        backend="arrow")
    assert sorted(int(i) for b in again for i in b["id"]) == list(range(1000))
