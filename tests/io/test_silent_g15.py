"""G15 wherever rows are read: a file rewritten after planning is refused by every reader (both backends,
``make_reader``, the iterable dataset), for a plan made in memory by ``plan_shards`` as for a loaded one, at every
epoch, even when the rewrite keeps the file's size and its footer's very bytes (only its modification time tells).
"""
import importlib.util
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import StalePlanError, make_loader, make_reader, plan_shards
from petastorm_balanced.predicates import in_lambda

PLAIN = {"compression": "NONE", "use_dictionary": False, "row_group_size": 100}  # a rewrite keeps sizes and stats
HALF = in_lambda(["id"], lambda i: i % 100 < 50)  # the first half of every row group, chosen by position
BACKENDS = ["arrow"] + (["petastorm"] if importlib.util.find_spec("petastorm") else [])


def write_files(folder, files=2, rows=300):
    os.makedirs(folder, exist_ok=True)
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 2}), os.path.join(folder, f"part-{i}.parquet"), **PLAIN)
    return str(folder)


def reorder_keeping_the_footer(path):
    """Rewrite ``path`` with the rows of its first row group reversed: the same size, the same footer bytes (min,
    max, offsets), a new modification time; the rows the plan selected by position are other rows now."""
    before = open(path, "rb").read()
    ids = pq.read_table(path).column("id").to_numpy()
    moved = np.concatenate([ids[:100][::-1], ids[100:]])
    pq.write_table(pa.table({"id": moved, "x": moved * 2}), path, **PLAIN)
    after = open(path, "rb").read()
    footer = lambda data: data[-8 - int.from_bytes(data[-8:-4], "little"):]  # noqa: E731
    assert len(after) == len(before) and footer(after) == footer(before) and after != before
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a clock tick the test can count on


def ids_of(batches):
    return sorted(int(i) for b in batches for i in np.asarray(b["id"]).tolist())


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_in_memory_plan_refuses_a_rewrite_that_keeps_the_footer(tmp_path, backend):
    target = write_files(tmp_path / "ds")
    plan = plan_shards(target, 1, batch_size=10, predicate=HALF, engine="local")    # no plan file, no load_plan
    reorder_keeping_the_footer(os.path.join(target, "part-0.parquet"))
    with pytest.raises(StalePlanError, match="'part-0.parquet'.*modified since planning"):
        ids_of(make_loader(0, 1, plan=plan, batch_size=10, backend=backend, workers_count=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_same_loader_refuses_a_rewrite_between_epochs(tmp_path, backend):
    target = write_files(tmp_path / "ds")
    plan = plan_shards(target, 1, batch_size=10, predicate=HALF, engine="local")
    loader = make_loader(0, 1, plan=plan, batch_size=10, backend=backend, workers_count=1)
    expected = [i for i in range(600) if i % 100 < 50]
    assert ids_of(loader) == expected
    reorder_keeping_the_footer(os.path.join(target, "part-1.parquet"))
    loader.set_epoch(1)
    with pytest.raises(StalePlanError, match="'part-1.parquet'.*modified since planning"):
        ids_of(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_make_reader_refuses_a_rewrite_that_keeps_the_footer(tmp_path, backend):
    target = write_files(tmp_path / "ds")
    plan = plan_shards(target, 1, batch_size=10, predicate=HALF, engine="local")
    reorder_keeping_the_footer(os.path.join(target, "part-0.parquet"))
    with pytest.raises(StalePlanError, match="'part-0.parquet'.*modified since planning"):
        with make_reader(0, 1, plan=plan, backend=backend, reader_pool_type="dummy") as reader:
            for _ in reader:
                pass


def test_the_iterable_dataset_refuses_a_rewrite_that_keeps_the_footer(tmp_path):
    from petastorm_balanced import BalancedIterableDataset
    target = write_files(tmp_path / "ds")
    plan = plan_shards(target, 1, batch_size=10, predicate=HALF, engine="local")
    dataset = BalancedIterableDataset(plan, 0, 1, batch_size=10)
    assert ids_of(dataset) == [i for i in range(600) if i % 100 < 50]
    reorder_keeping_the_footer(os.path.join(target, "part-0.parquet"))
    dataset.set_epoch(1)
    with pytest.raises(StalePlanError, match="'part-0.parquet'.*modified since planning"):
        ids_of(dataset)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_untouched_dataset_reads_every_epoch(tmp_path, backend):
    """The check refuses nothing that did not change: two epochs of the same loader deliver the planned rows."""
    target = write_files(tmp_path / "ds")
    plan = plan_shards(target, 1, batch_size=10, predicate=HALF, engine="local")
    loader = make_loader(0, 1, plan=plan, batch_size=10, backend=backend, workers_count=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert ids_of(loader) == [i for i in range(600) if i % 100 < 50]
