"""G12: the Arrow and Petastorm backends give identical batches, and the Arrow backend alone keeps the delivery
contract (G1, G2, G4) on any stack.

"Identical" means every column of every batch, in order, for every rank: the backends share the fragment reader,
the bundling and the batcher and differ only in who schedules the reads. On the modern stack (no Petastorm) the
Petastorm side skips and the Arrow backend is compared across its own pool settings and with
``BalancedIterableDataset``.
"""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import BalancedIterableDataset, make_loader, plan_shards
from tests.support.delivery_contract import check_delivery, matching_ids
from tests.support.stacks import HAVE_PETASTORM, petastorm_only

BATCH = 32


def as_values(batch) -> dict:
    """A batch as plain Python values, every column, so equality means the same rows and the same values."""
    return {name: (values.tolist() if hasattr(values, "tolist") else list(values)) for name, values in batch.items()}


def epoch_batches(plan, rank, world, epoch, **options):
    return [as_values(b) for b in make_loader(rank, world, plan=plan, epoch=epoch, **options)]


SETTINGS = [
    dict(shuffle=True, padding_mask=True, workers_count=3),
    dict(shuffle=False, padding_mask=False, workers_count=1, schema_fields=["id", "lang"]),
    dict(shuffle=True, shuffle_window=100, padding_mask=True, workers_count=2, reshuffle="fixed"),
]


@pytest.mark.parametrize("case", ["plain-drop", "plain-in-set", "hive"])
@pytest.mark.parametrize("setting", range(len(SETTINGS)))
def test_backends_and_pools_give_identical_batches(plans, case, setting):
    plan, options = plans[case][0], SETTINGS[setting]
    world = plan.world_size
    for rank in range(world):
        reference = epoch_batches(plan, rank, world, 2, backend="arrow", reader_pool_type="dummy", **options)
        assert len(reference) == plan.steps_per_epoch(world)
        assert epoch_batches(plan, rank, world, 2, backend="arrow", **options) == reference
        if HAVE_PETASTORM:
            assert epoch_batches(plan, rank, world, 2, backend="petastorm", **options) == reference
            assert epoch_batches(plan, rank, world, 2, backend="auto", **options) == reference


@pytest.mark.parametrize("backend", ["arrow", pytest.param("petastorm", marks=petastorm_only)])
@pytest.mark.parametrize("case", ["plain-drop", "hive"])
def test_row_major_windows_give_the_same_batches(plans, case, backend):
    """A window large enough to be held row-major (``batching.Filling``, gathered a run of batches at a time) gives
    every batch of the column-by-column window, every column, on either backend: forced here on small windows."""
    from unittest import mock

    from petastorm_balanced.reading.batches import batching
    plan = plans[case][0]
    options = dict(shuffle=True, padding_mask=True, backend=backend, shuffle_window=5 * BATCH)
    reference = epoch_batches(plan, 0, plan.world_size, 1, **options)
    with mock.patch.multiple(batching, ROW_MAJOR_BYTES=0, RUN_ROWS=2 * BATCH):
        assert epoch_batches(plan, 0, plan.world_size, 1, **options) == reference


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("case", ["plain-drop", "plain-in-set", "hive"])
def test_bundle_sizes_give_the_same_batches(plans, case, shuffle):
    """The Arrow backend's threads read bundles of ``fragments.BUNDLE_BYTES`` measured bytes (a whole small dataset
    in one, once measured) or, with it off and ``BUNDLE_ROWS=1``, one fragment per bundle: the batches are the same,
    every column, every rank."""
    from unittest import mock

    from petastorm_balanced.reading.rows import fragments, read_ahead
    plan = plans[case][0]
    options = dict(shuffle=shuffle, shuffle_window=3 * BATCH, padding_mask=True, backend="arrow", workers_count=2)
    real, counts = read_ahead.BundleSizes.bundles, []

    def counted(self, todo):
        counts.append(0)
        for bundle in real(self, todo):
            counts[-1] += 1
            yield bundle
    with mock.patch.object(read_ahead.BundleSizes, "bundles", counted):
        for rank in range(plan.world_size):
            reference = epoch_batches(plan, rank, plan.world_size, 1, **options)
            large = counts[-1]
            with mock.patch.multiple(fragments, BUNDLE_BYTES=0, BUNDLE_ROWS=1):
                assert epoch_batches(plan, rank, plan.world_size, 1, **options) == reference
            assert counts[-1] > large  # the two epochs were read in other bundles


@pytest.mark.parametrize("backend", ["arrow", pytest.param("petastorm", marks=petastorm_only)])
@pytest.mark.parametrize("case", ["plain-drop", "plain-in-set", "hive"])
def test_delivery_contract_per_backend(plans, plain_dataset, hive_dataset, case, backend):
    plan = plans[case][0]
    dataset = hive_dataset if case == "hive" else plain_dataset
    expected = matching_ids(dataset.path, "en" if case == "plain-in-set" else None)

    def read(rank, world, epoch):
        return make_loader(rank, world, plan=plan, epoch=epoch, padding_mask=True, backend=backend,
                           workers_count=2, schema_fields=["id"])
    check_delivery(plan, expected, read, worlds=(1, 2, 3, 5), epochs=(0, 1))


def test_iterable_dataset_matches_the_arrow_loader(plans):
    plan = plans["plain-in-set"][0]
    for rank in range(plan.world_size):
        loader = epoch_batches(plan, rank, plan.world_size, 1, backend="arrow", padding_mask=True)
        dataset = BalancedIterableDataset(plan, rank, plan.world_size, epoch=1, padding_mask=True, backend="arrow")
        assert [as_values(b) for b in dataset] == loader


def test_arrow_worker_fault_names_file_and_row_group(tmp_path):
    """A row group that fails to decode surfaces as an error naming the file and row group, not a hang."""
    root = tmp_path / "ds"
    root.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"id": np.arange(i * 100, (i + 1) * 100)}), root / f"part-{i}.parquet",
                       row_group_size=50)
    plan = plan_shards(str(root), 1, batch_size=10, engine="local")
    target = root / "part-1.parquet"
    data, stat = bytearray(target.read_bytes()), target.stat()
    data[8:200] = b"\x00" * 192  # the first row group's pages, same size: the plan still loads
    target.write_bytes(bytes(data))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime: G15 cannot tell, decoding fails
    with pytest.raises(OSError, match=r"row group \d of 'part-1.parquet'"):
        for _ in make_loader(0, 1, plan=plan, backend="arrow", workers_count=2, shuffle=False):
            pass


@pytest.mark.parametrize("name, value, pattern", [
    ("backend", "spark", "backend='spark' is not one of"),
    ("reader_pool_type", "process", "use backend='petastorm' for Petastorm's process pool"),
    ("cache_extra_settings", {}, "cache_extra_settings={} is not accepted with backend='arrow'"),
    ("storage_options", {"anon": True}, "reads through pyarrow.fs"),
])
def test_arrow_backend_refuses_what_it_cannot_honour(plans, name, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_loader(0, 3, plan=plans["plain-drop"][0], **{"backend": "arrow", name: value})


@pytest.mark.parametrize("arguments, petastorm", [
    ({}, False),
    ({"results_queue_size": 10, "workers_count": 2, "storage_options": {"retry_attempts": 3}}, False),
    ({"cache_type": "local-disk", "cache_location": "CACHE"}, False),
    ({"reader_pool_type": "process"}, True),
    ({"hdfs_driver": "libhdfs"}, True),
    ({"cache_type": "local-disk", "cache_location": "CACHE", "cache_extra_settings": {}}, True),
])
def test_auto_reads_with_arrow_unless_an_argument_needs_petastorm(plans, tmp_path, arguments, petastorm):
    """backend='auto' takes the Arrow backend (the same batches for less CPU, G12) unless the call passes an argument
    only Petastorm's reader honours; without Petastorm that argument is refused with what to do."""
    arguments = {k: (str(tmp_path) if v == "CACHE" else v) for k, v in arguments.items()}
    plan = plans["plain-drop"][0]
    if petastorm and not HAVE_PETASTORM:
        with pytest.raises(ValueError, match="is not accepted with backend='arrow'|use backend='petastorm'"):
            make_loader(0, 3, plan=plan, **arguments)
        return
    loader = make_loader(0, 3, plan=plan, **arguments)
    assert loader.backend == ("petastorm" if petastorm else "arrow")
    if petastorm or arguments:
        return
    assert epoch_batches(plan, 0, 3, 1) == epoch_batches(plan, 0, 3, 1, backend="arrow")
    if HAVE_PETASTORM:
        assert epoch_batches(plan, 0, 3, 1) == epoch_batches(plan, 0, 3, 1, backend="petastorm")


def test_petastorm_backend_missing_says_what_to_do(plans):
    if HAVE_PETASTORM:
        pytest.skip("Petastorm imports on this stack; the refusal is for stacks without it")
    with pytest.raises(ImportError, match="use backend='arrow'"):
        make_loader(0, 3, plan=plans["plain-drop"][0], backend="petastorm")


# The delivery contract on every other thing that delivers planned rows (the loaders of both backends: above).

@pytest.mark.parametrize("case", ["plain-drop", "plain-in-set", "hive"])
def test_delivery_contract_iterable_dataset(plans, plain_dataset, hive_dataset, case):
    """BalancedIterableDataset iterated in the process (what DataLoader(num_workers=0) does)."""
    plan = plans[case][0]
    expected = matching_ids((hive_dataset if case == "hive" else plain_dataset).path,
                            "en" if case == "plain-in-set" else None)

    def read(rank, world, epoch):
        return BalancedIterableDataset(plan, rank, world, epoch=epoch, padding_mask=True, backend="arrow",
                                       schema_fields=["id"])
    check_delivery(plan, expected, read, worlds=(1, 2, 3), epochs=(0, 1))


@pytest.mark.slow  # DataLoader worker processes for every rank of two worlds
def test_delivery_contract_iterable_dataset_in_dataloader_workers(plans, plain_dataset):
    plan = plans["plain-in-set"][0]

    def read(rank, world, epoch):
        return BalancedIterableDataset(plan, rank, world, epoch=epoch, padding_mask=True, backend="arrow",
                                       schema_fields=["id"]).dataloader(num_workers=2)
    check_delivery(plan, matching_ids(plain_dataset.path, "en"), read, worlds=(2, 3), epochs=(0, 1))


@petastorm_only
@pytest.mark.parametrize("case", ["plain-drop", "plain-in-set", "hive"])
def test_delivery_contract_make_reader(plans, plain_dataset, hive_dataset, case):
    """make_reader delivers a rank's rows in plan order (batches of one fragment each, no padding column): its ids
    are cut into the plan's batches, flagged as the rank's planned fragments are."""
    from petastorm_balanced import make_reader
    plan = plans[case][0]
    expected = matching_ids((hive_dataset if case == "hive" else plain_dataset).path,
                            "en" if case == "plain-in-set" else None)

    def read(rank, world, epoch):
        with make_reader(rank, world, plan=plan, epoch=epoch, schema_fields=["id"], workers_count=2) as reader:
            ids = np.concatenate([np.atleast_1d(item.id) for item in reader])
        flags = np.concatenate([np.full(f.num_rows, f.padding) for f in plan.assignment(rank, epoch=epoch,
                                                                                      world_size=world)])
        assert len(ids) == len(flags), f"make_reader delivered {len(ids)} rows of rank {rank}'s {len(flags)}"
        return [{"id": ids[i:i + BATCH], "_padding": flags[i:i + BATCH]} for i in range(0, len(ids), BATCH)]
    check_delivery(plan, expected, read, worlds=(1, 3), epochs=(0, 1))
