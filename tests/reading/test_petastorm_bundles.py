"""The Petastorm backend's bundles (consecutive fragments sent to its workers as one item) cut from the decoded bytes
the bundles before them measured, as the Arrow backend's (``reading/rows/read_ahead.py``): 4 KB strings no longer
travel 8,192 rows at a time, and the batches are those of one fragment per bundle."""
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.reading.rows import fragments
from tests.reading.test_spill import late_long_strings
from tests.support.stacks import petastorm_only

pytestmark = petastorm_only
STRING, TARGET, GROUP = 4096, 1 << 20, 100


@pytest.fixture(scope="module")
def long_rows(tmp_path_factory):
    """4 KB strings (dictionary-encoded: 8 values, a few bytes a row in the footers) and unique 4 KB ones, in row
    groups of 100 rows (400 KB decoded)."""
    path = tmp_path_factory.mktemp("long") / "ds"
    path.mkdir()
    rng = np.random.default_rng(0)
    for f in range(8):
        ids = np.arange(f * 1_000, (f + 1) * 1_000)
        if f % 2:
            blob = rng.integers(65, 90, STRING + len(ids), dtype=np.uint8).tobytes().decode()
            text = [blob[i:i + STRING] for i in range(len(ids))]
        else:
            text = [chr(65 + i % 8) * STRING for i in ids]
        pq.write_table(pa.table({"id": ids, "text": pa.array(text)}), path / f"part-{f:03d}.parquet",
                       row_group_size=GROUP)
    return str(path)


def read(plan, **options):
    with make_loader(0, 1, plan=plan, backend="petastorm", batch_format="numpy", workers_count=2, **options) as loader:
        return [{"id": b["id"].tolist(), "text": list(b["text"])} for b in loader]


def read_recording(plan, **options):
    """The batches of ``read`` at a bundle target of ``TARGET`` bytes, and (rows, decoded bytes) of each bundle a
    worker read."""
    sent: list[tuple[int, int]] = []
    real = fragments.concat_tables

    def concat_tables(tables):
        table = real(tables)
        sent.append((table.num_rows, table.get_total_buffer_size()))
        return table
    with mock.patch.object(fragments, "BUNDLE_BYTES", TARGET), mock.patch.object(fragments, "concat_tables",
                                                                                 concat_tables):
        return read(plan, **options), sent


@pytest.mark.parametrize("shuffle", [True, False])
def test_bundles_hold_about_their_target_of_measured_bytes_and_give_the_same_batches(long_rows, shuffle):
    plan = plan_shards(long_rows, 1, batch_size=50, engine="local")
    options = dict(shuffle=shuffle, shuffle_window=400)
    delivered, sent = read_recording(plan, **options)
    # one fragment a bundle until the first measure, then about TARGET bytes: never past it by more than a fragment
    assert all(nbytes <= TARGET + GROUP * (STRING + 64) for _, nbytes in sent), sent
    assert max(rows for rows, _ in sent) > GROUP  # several fragments a bundle where rows are short
    assert sum(rows for rows, _ in sent) == 8_000
    with mock.patch.multiple(fragments, BUNDLE_BYTES=0, BUNDLE_ROWS=1):  # one fragment a bundle
        one_by_one = read(plan, **options)
    assert delivered == one_by_one
    table = ds.dataset(long_rows).to_table()
    expected = dict(zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True))
    pairs = [(i, t) for b in delivered for i, t in zip(b["id"], b["text"], strict=True)]
    assert sorted(i for i, _ in pairs) == sorted(expected) and all(expected[i] == t for i, t in pairs)


@pytest.fixture(scope="module")
def late_long_rows(tmp_path_factory):
    """Short strings in the first 16 files, unique 4 KB ones in the 8 after: bundles cut while rows were short
    (BUNDLE_ROWS rows each) reach the long ones."""
    return late_long_strings(tmp_path_factory.mktemp("late") / "ds", files=24, rows=500, row_group_size=GROUP,
                             seed=1)


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_bundle_sent_while_rows_were_short_comes_back_in_parts(late_long_rows, shuffle):
    """A worker stops a bundle once its Arrow bytes pass ``LIMIT_FACTOR x`` the target, hands that part over, and
    reads the rest once the consumer took it: the batches and values are those of one fragment per bundle."""
    from petastorm_balanced.reading.rows.read_ahead import LIMIT_FACTOR
    plan = plan_shards(late_long_rows, 1, batch_size=50, engine="local")
    options = dict(shuffle=shuffle, shuffle_window=400)
    delivered, sent = read_recording(plan, **options)
    assert max(rows for rows, _ in sent) > 1_000  # bundles of many short rows were sent
    assert all(nbytes <= LIMIT_FACTOR * TARGET + GROUP * (STRING + 64) for _, nbytes in sent), sent
    assert sum(rows for rows, _ in sent) == 12_000
    with mock.patch.multiple(fragments, BUNDLE_BYTES=0, BUNDLE_ROWS=1):
        assert delivered == read(plan, **options)
    table = ds.dataset(late_long_rows).to_table()
    expected = dict(zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True))
    pairs = [(i, t) for b in delivered for i, t in zip(b["id"], b["text"], strict=True)]
    assert sorted(i for i, _ in pairs) == sorted(expected) and all(expected[i] == t for i, t in pairs)


def test_closing_while_a_worker_waits_for_its_turn_ends_it(late_long_rows):
    """A worker holding the rest of a cut bundle waits on the consumer; close() mid-epoch wakes and ends it."""
    import threading
    plan = plan_shards(late_long_rows, 1, batch_size=50, engine="local")
    before = threading.active_count()
    with mock.patch.object(fragments, "BUNDLE_BYTES", TARGET):
        for taken in (1, 120, 200):
            loader = make_loader(0, 1, plan=plan, backend="petastorm", batch_format="numpy", workers_count=2,
                                 shuffle=False)
            batches = iter(loader)
            for _ in range(taken):
                next(batches)
            loader.close()
    assert threading.active_count() <= before


@pytest.mark.parametrize("pool", [dict(workers_count=1, results_queue_size=1),
                                  dict(workers_count=4, results_queue_size=1),
                                  dict(reader_pool_type="process", workers_count=2), dict(reader_pool_type="dummy")])
def test_parts_give_the_same_batches_whatever_the_pool(late_long_rows, pool):
    """One worker waiting for its turn with a results queue of one, four, and the pools that do not cut (a process
    pool's workers cannot wait on the consumer; the dummy pool runs in its thread): the batches are the same."""
    plan = plan_shards(late_long_rows, 1, batch_size=50, engine="local")

    def ids(**options):
        with mock.patch.object(fragments, "BUNDLE_BYTES", TARGET), \
                make_loader(0, 1, plan=plan, backend="petastorm", batch_format="numpy", shuffle_window=400,
                            **options) as loader:
            return [b["id"].tolist() for b in loader]
    assert ids(**pool) == ids(workers_count=2)
