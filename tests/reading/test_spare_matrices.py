"""Window matrices filled again by the next shuffle window (``reading/batches/spare_matrices.py``): the loader's
batches are those of fresh matrices, batches handed out keep their values while later windows (of the epoch and of
the next) fill the same matrix, a window left before its last run gives nothing back, and a slot never holds a
spare beside a new matrix."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.reading.batches import batching
from petastorm_balanced.reading.batches.batching import WindowBatcher, start_point
from petastorm_balanced.reading.batches.spare_matrices import SpareMatrices


@pytest.fixture
def row_major(monkeypatch):
    """Every window row-major, however small (the rule's threshold is 16 MiB of number columns)."""
    monkeypatch.setattr(batching, "ROW_MAJOR_BYTES", 1)


def test_a_spare_of_the_same_shape_is_taken_and_one_of_another_shape_is_dropped():
    spares = SpareMatrices()
    first = spares.take((10, 2), "u8")
    spares.give([first])
    assert spares.take((10, 2), "u8") is first and len(spares) == 0
    spares.give([first])
    other = spares.take((20, 2), "u8")
    assert other is not first and other.shape == (20, 2) and other.dtype == np.dtype("u8")
    assert len(spares) == 0  # the other shape's spare is not held beside the new matrix


def test_a_window_left_before_its_last_run_gives_nothing_back(row_major):
    spares = SpareMatrices()
    start = start_point(np.array([96]), batch_size=4, window_rows=32, batches_done=0, shuffle=True)
    batcher = WindowBatcher(total_rows=96, batch_size=4, window_rows=32, start=start, key=(1, 0, 0, 0),
                            spares=spares)
    runs = batcher.push({"a": np.arange(96), "b": np.arange(96) * 2})
    run = next(runs)
    assert np.array_equal(run["b"], run["a"] * 2)
    runs.close()
    assert len(spares) == 0
    whole = WindowBatcher(total_rows=96, batch_size=4, window_rows=32, start=start, key=(1, 0, 0, 0), spares=spares)
    out = [run for run in whole.push({"a": np.arange(96), "b": np.arange(96) * 2})]
    assert len(out) == 3 and len(spares) == 1  # the three windows filled one matrix, kept for the next
    assert sorted(np.concatenate([run["a"] for run in out]).tolist()) == list(range(96))


class Unkept(SpareMatrices):
    """Keeps nothing: every window takes a new matrix."""

    def give(self, matrices):
        pass


def write_dataset(folder, rows=6000):
    folder.mkdir()
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table({"id": ids, "v": ids * 3 - 7, "x": (ids % 97).astype(np.float32) / 4})
    pq.write_table(table.slice(0, rows // 2), folder / "part-0.parquet", row_group_size=700)
    pq.write_table(table.slice(rows // 2), folder / "part-1.parquet", row_group_size=700)
    return str(folder)


@pytest.mark.parametrize("batch_format", ["numpy", "torch"])
def test_batches_are_those_of_fresh_matrices_and_keep_their_values(tmp_path, row_major, batch_format):
    if batch_format == "torch":
        pytest.importorskip("torch")
    plan = plan_shards(write_dataset(tmp_path / "ds"), 1, batch_size=50, engine="local")
    options = dict(plan=plan, batch_size=50, shuffle_window=1000, workers_count=1, batch_format=batch_format)
    loader, fresh = make_loader(0, 1, **options), make_loader(0, 1, **options)
    fresh._reads.spares = Unkept()  # every window in a matrix of its own, as before spares
    kept, copies, expected, matrices = [], [], [], []
    for epoch in range(2):
        loader.set_epoch(epoch)
        fresh.set_epoch(epoch)
        for batch in loader:
            kept.append(batch)
            copies.append({name: np.array(values, copy=True) for name, values in batch.items()})
        expected += [{name: np.array(values, copy=True) for name, values in b.items()} for b in fresh]
        matrices.append([id(m) for m in loader._reads.spares._spare])
    assert len(kept) == len(expected) == 2 * 6000 // 50
    for batch, copy, want in zip(kept, copies, expected, strict=True):
        assert np.array_equal(batch["v"], batch["id"] * 3 - 7)
        for name in ("id", "v", "x"):  # still as handed out, after every later window filled the same matrix
            assert np.array_equal(np.asarray(batch[name]), copy[name]) and np.array_equal(copy[name], want[name])
    assert matrices[0] == matrices[1] and len(matrices[0]) == 1  # one matrix, filled by every window of both epochs


def test_a_closed_loader_holds_no_window_matrix(tmp_path, row_major):
    plan = plan_shards(write_dataset(tmp_path / "ds"), 1, batch_size=50, engine="local")
    loader = make_loader(0, 1, plan=plan, batch_size=50, shuffle_window=1000, workers_count=1, batch_format="numpy")
    assert len(list(loader)) == 6000 // 50 and len(loader._reads.spares) == 1
    loader.close()
    assert len(loader._reads.spares) == 0
