"""Shuffle windows on local disk (``shuffle_spill_dir``) and a memory budget that holds (G16): the rows a window
cannot keep in memory wait in files, the batches are those of the same window in memory, no file stays after the
epoch or ``close()``, a crashed process's folder is swept, and peak anonymous memory stays within the budget plus
the documented constant where rows are larger than their footers say."""
import gc
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.core.quality import Quality
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.reading.windows import spill
from tests.support.jobs import ROOT
from tests.support.resume_contract import check_resume_contract
from tests.support.stacks import HAVE_PETASTORM, petastorm_only

pytestmark = pytest.mark.filterwarnings("ignore::petastorm_balanced.errors.ShuffleQualityWarning")

ROWS, CLASSES, BATCH = 12_000, 40, 64
BACKENDS = ["arrow"] + (["petastorm"] if HAVE_PETASTORM else [])


@pytest.fixture(scope="module")
def sorted_data(tmp_path_factory):
    """Sorted by label, with numbers of two widths, a fixed-shape tensor-like pair and text (every kind a window
    holds: a row-major matrix, a column of its own, an Arrow column)."""
    path = tmp_path_factory.mktemp("spill") / "ds"
    path.mkdir()
    rng = np.random.default_rng(0)
    for i, ids in enumerate(np.array_split(np.arange(ROWS, dtype=np.int64), 3)):
        table = pa.table({"id": ids, "label": (ids * CLASSES // ROWS).astype(np.int32), "x": rng.random(len(ids)),
                          "y": rng.random(len(ids)).astype(np.float32),
                          "text": pa.array([f"row {v} " + "x" * int(v % 50) for v in ids])})
        pq.write_table(table, path / f"part-{i}.parquet", row_group_size=500)
    return str(path)


def batches(loader):
    with loader:
        return [{k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in b.items()} for b in loader]


def files_under(folder) -> list:
    return [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_with_a_spill_folder_equal_an_in_memory_window(sorted_data, tmp_path, backend, monkeypatch):
    plan = plan_shards(sorted_data, 2, batch_size=BATCH, engine="local")
    made = []
    real = spill.SpillFolder.file
    monkeypatch.setattr(spill.SpillFolder, "file", lambda self, suffix: made.append(suffix) or real(self, suffix))
    for rank in range(2):
        for epoch in (0, 1):
            common = dict(epoch=epoch, backend=backend, batch_format="numpy", shuffle_window=3_200)
            memory = batches(make_loader(rank, 2, plan=plan, shuffle_budget="1GiB", shuffle_spill_dir=False,
                                         **common))
            on_disk = batches(make_loader(rank, 2, plan=plan, shuffle_budget="64KiB",
                                          shuffle_spill_dir=str(tmp_path), **common))
            assert memory == on_disk and len(memory) == plan.steps_per_epoch(2, BATCH)
    assert ".bin" in made and ".arrow" in made  # numbers and text both went to disk
    assert files_under(tmp_path) == []


def test_a_spill_folder_holds_a_ranks_share_and_batches_are_as_random_as_a_permutation(sorted_data, tmp_path):
    reference = ds.dataset(sorted_data).to_table(columns=["label"])["label"].to_numpy()
    plan = plan_shards(sorted_data, 1, batch_size=BATCH, engine="local")
    small = make_loader(0, 1, plan=plan, shuffle_budget="256KiB", backend="arrow", epoch=1)
    spilled = make_loader(0, 1, plan=plan, shuffle_budget="256KiB", shuffle_spill_dir=str(tmp_path),
                          backend="arrow", epoch=1)
    assert small.shuffle_window < ROWS // 4 and spilled.shuffle_window >= ROWS - BATCH
    assert spilled.shuffle_spill_dir == str(tmp_path) and spilled.shuffle_spill_budget == 64 * 2**30
    with small:
        before = Quality.of([b["label"].numpy() for b in small], reference)
    with spilled:
        after = Quality.of([b["label"].numpy() for b in spilled], reference)
    assert before.ratio > 2.0, before  # the measure can fail: the memory window's batches are far from i.i.d.
    assert after.ratio <= 1.15, after
    assert files_under(tmp_path) == []  # the epoch ended: nothing left


def test_no_spill_file_outlives_close_or_a_broken_loop(sorted_data, tmp_path):
    plan = plan_shards(sorted_data, 1, batch_size=BATCH, engine="local")
    loader = make_loader(0, 1, plan=plan, shuffle_budget="64KiB", shuffle_spill_dir=str(tmp_path), backend="arrow")
    iterator = iter(loader)
    next(iterator)
    assert [f for f in files_under(tmp_path) if not f.endswith(spill.LOCK)]  # the window is on disk now
    loader.close()
    assert files_under(tmp_path) == [] and os.listdir(tmp_path) == []


def test_a_crashed_process_folder_is_swept_at_the_next_start(sorted_data, tmp_path):
    code = ("import os, sys; from petastorm_balanced.reading.windows.spill import SpillFolder; "
            "f = SpillFolder(sys.argv[1]); open(f.file('.bin'), 'w').write('x'); os._exit(1)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": ROOT})
    left = os.listdir(tmp_path)
    assert len(left) == 1 and left[0].startswith(spill.PREFIX)
    alive = spill.SpillFolder(str(tmp_path))  # a live owner's folder is never swept
    alive.file(".bin")
    plan = plan_shards(sorted_data, 1, batch_size=BATCH, engine="local")
    with make_loader(0, 1, plan=plan, shuffle_budget="64KiB", shuffle_spill_dir=str(tmp_path),
                     backend="arrow") as loader:
        next(iter(loader))
        names = os.listdir(tmp_path)
        assert left[0] not in names and os.path.basename(alive.path) in names
    alive.remove()
    assert os.listdir(tmp_path) == []


def test_resume_is_exact_with_windows_on_disk(sorted_data, tmp_path):
    plan = plan_shards(sorted_data, 2, batch_size=BATCH, engine="local")

    def make():
        return make_loader(1, 2, plan=plan, backend="arrow", shuffle_budget="64KiB", shuffle_window=2_048,
                           shuffle_spill_dir=str(tmp_path))
    check_resume_contract(make, iter, epochs=3)
    gc.collect()  # the contract leaves loaders mid-epoch without close(): collected, they leave nothing either
    assert files_under(tmp_path) == []


def test_spill_settings_are_checked_for_one_plan_and_a_mixture(sorted_data, tmp_path):
    plan = plan_shards(sorted_data, 1, batch_size=BATCH, engine="local")
    # the parameter, the value and what is wrong with it (a bare name would match any error about the folder)
    not_local = r"shuffle_spill_dir='s3://bucket/tmp' must be a folder on local disk .* not a URL"
    not_bytes = r"shuffle_spill_budget='lots' is not a byte count"
    with pytest.raises(InvalidValueError, match=not_local):
        make_loader(0, 1, plan=plan, shuffle_spill_dir="s3://bucket/tmp")
    with pytest.raises(InvalidValueError, match=not_bytes):
        make_loader(0, 1, plan=plan, shuffle_spill_dir=str(tmp_path), shuffle_spill_budget="lots")
    with pytest.raises(InvalidValueError, match=not_local):  # a mixture takes a local folder only
        make_loader(0, 1, plan=[plan, plan], weights=[0.5, 0.5], shuffle_spill_dir="s3://bucket/tmp")
    with pytest.raises(InvalidValueError, match=not_bytes):
        make_loader(0, 1, plan=[plan, plan], weights=[0.5, 0.5], shuffle_spill_dir=str(tmp_path),
                    shuffle_spill_budget="lots")


# --- the budget tells the truth: rows larger than their footers say -------------------------------------------

STRING = 4096
# Peak anonymous memory above the loader's own at rest (docs/shuffle.md, "The bound"): the budget, plus per bundle
# the read-ahead may hold (2 x workers_count + 4 of them: queued, and being read and converted) 1.5 x 4 MiB of
# measured bytes and one row group (4 MB decoded here), plus a fixed part (the allocator's pools among them)
PER_BUNDLE, FIXED = 10 * 2**20, 32 * 2**20


def dictionary_strings(path, rows=24_000):
    """4 KB strings drawn from 8 values: dictionary-encoded, a few bytes a row in the footers."""
    path.mkdir()
    values = [chr(65 + i) * STRING for i in range(8)]
    for f, ids in enumerate(np.array_split(np.arange(rows), 4)):
        pq.write_table(pa.table({"id": ids, "text": pa.array([values[i % 8] for i in ids])}),
                       path / f"part-{f:03d}.parquet", row_group_size=1_000)
    return str(path)


def late_long_strings(path, files=32, rows=1_000, *, short_files=16, row_group_size=500, seed=0):
    """Short strings in the first ``short_files`` files (16: the footers once sampled), unique 4 KB ones in every
    file after."""
    path.mkdir()
    rng = np.random.default_rng(seed)
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows)
        if f < short_files:
            text = [f"r{i}" for i in ids]
        else:
            blob = rng.integers(65, 90, STRING + rows, dtype=np.uint8).tobytes().decode()
            text = [blob[i:i + STRING] for i in range(rows)]
        pq.write_table(pa.table({"id": ids, "text": pa.array(text)}), path / f"part-{f:03d}.parquet",
                       row_group_size=row_group_size)
    return str(path)


def one_unsampled_file(path, files=112, long_file=19, long_groups=16):
    """One file of 4 KB strings among 112 of short ones, after the first 16 (whose footers the estimate reads): its
    rows weigh what nothing read before them said."""
    path.mkdir()
    rng = np.random.default_rng(0)
    for f in range(files):
        if f == long_file:
            rows = long_groups * 1_000
            ids = np.arange(10**6, 10**6 + rows)
            blob = rng.integers(65, 90, STRING + rows, dtype=np.uint8).tobytes().decode()
            text = [blob[i:i + STRING] for i in range(rows)]
        else:
            ids = np.arange(f * 500, (f + 1) * 500)
            text = [f"r{i}" for i in ids]
        pq.write_table(pa.table({"id": ids, "text": pa.array(text)}), path / f"part-{f:03d}.parquet",
                       row_group_size=1_000)
    return str(path)


# The Petastorm backend cuts its bundles when it sends them to its workers, from the bytes the bundles before measured;
# where short rows turn long (late_long_strings), a bundle already sent comes back in parts (docs/shuffle.md).
@pytest.mark.parametrize(("make", "backend"), [
    (dictionary_strings, "arrow"), (late_long_strings, "arrow"), (one_unsampled_file, "arrow"),
    pytest.param(dictionary_strings, "petastorm", marks=petastorm_only),
    pytest.param(late_long_strings, "petastorm", marks=petastorm_only),
    pytest.param(one_unsampled_file, "petastorm", marks=petastorm_only)])
def test_peak_memory_stays_within_the_budget_plus_the_constant(make, backend, tmp_path):
    """Rows far larger than the footers say: the read-ahead's bundles and the window's runs are sized from the bytes
    measured on this slot's reads, the window's bytes beyond its share wait on disk."""
    data = make(tmp_path / "ds")
    url = str(tmp_path / "plan")
    plan_shards(data, 1, batch_size=BATCH, engine="local", output_url=url)
    budget, workers = 8 * 2**20, 2
    temp = tmp_path / "tmp"  # the system temp folder of the child: where rows beyond the budget go by default
    temp.mkdir()
    out = subprocess.run([sys.executable, "-W", "ignore", "-m", "tests.support.peak_memory", url,
                          "--budget", str(budget), "--workers", str(workers), "--backend", backend],
                         capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, "TMPDIR": str(temp)}, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["rows"] > 0
    assert measured["peak_anon"] <= budget + (2 * workers + 4) * PER_BUNDLE + FIXED, measured
    assert files_under(temp) == []


def test_the_warning_and_inspect_say_what_a_spill_folder_buys(sorted_data, tmp_path, monkeypatch):
    from petastorm_balanced.errors import ShuffleQualityWarning
    from petastorm_balanced.reading.source import settings
    from petastorm_balanced.tools.shuffle_quality import shuffle_quality
    plan = plan_shards(sorted_data, 1, batch_size=BATCH, engine="local")
    with pytest.warns(ShuffleQualityWarning, match='shuffle_budget="[0-9]+MiB" to hold them in one'):
        make_loader(0, 1, plan=plan, shuffle_budget="256KiB", backend="arrow").close()
    monkeypatch.setattr(settings, "MEMORY_ADVICE", 0)  # as if a window of a rank's rows were past memory
    said = r"shuffle_spill_dir=<local disk> to hold them in one there \(about [0-9]+ MiB for this rank\)"
    with pytest.warns(ShuffleQualityWarning, match=said):
        make_loader(0, 1, plan=plan, shuffle_budget="256KiB", backend="arrow").close()
    report = shuffle_quality(plan, "label", shuffle_budget="256KiB", epoch=1)
    assert report.windows_per_rank > 1 and report.rank.ratio > 2.0
    assert report.spill_window >= ROWS - BATCH and report.spill_rank.ratio <= 1.15
    row = 8 + 4 + 8 + 4  # id, label, x, y; the text column's bytes on top
    assert ROWS * row < report.spill_disk_bytes < ROWS * (row + 100)
    assert "with a spill folder" in report.format() and report.as_dict()["spill_rank"]["ratio"] <= 1.15
    assert shuffle_quality(plan, "label", epoch=1).spill_window is None  # one window already: nothing to add


def test_dataloader_workers_share_the_budget_and_deliver_the_same_batches(sorted_data, tmp_path):
    """Each of K DataLoader workers holds a K-th of the rank's window memory, the rest of its window on disk; the
    batches are those of windows held in memory."""
    from petastorm_balanced import BalancedIterableDataset
    plan = plan_shards(sorted_data, 1, batch_size=BATCH, engine="local")

    def run(**kwargs):
        data = BalancedIterableDataset(plan, 0, 1, batch_size=BATCH, shuffle_window=3_200, batch_format="numpy",
                                       **kwargs)
        return [{k: v.tolist() if hasattr(v, "tolist") else list(v) for k, v in b.items()}
                for b in data.dataloader(num_workers=2)]
    memory = run(shuffle_budget="1GiB", shuffle_spill_dir=False)
    shared = run(shuffle_budget="256KiB", shuffle_spill_dir=str(tmp_path))
    assert memory == shared and len(memory) == plan.steps_per_epoch(1, BATCH)
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("balance", ["rows", "cost"])
def test_elastic_resume_and_cost_balance_are_unchanged_by_a_spill_folder(sorted_data, tmp_path, balance):
    """A state saved at world 2 resumes at world 3 (G10; a cost-balanced loader, which refuses that, at world 2 with
    its costs, G11): the same batches whether the windows wait in memory or on disk."""
    plan = plan_shards(sorted_data, 2, batch_size=BATCH, engine="local", cost="length(text)")

    def epoch_rest(spill_dir, budget):
        common = dict(backend="arrow", batch_format="numpy", shuffle_window=2_048, balance=balance,
                      shuffle_budget=budget, shuffle_spill_dir=spill_dir)
        old = make_loader(0, 2, plan=plan, **common)
        iterator = iter(old)
        for _ in range(5):
            next(iterator)
        state = old.state_dict()
        old.close()
        out, world = [], 3 if balance == "rows" else 2
        for rank in range(world):
            with make_loader(rank, world, plan=plan, **common) as resumed:
                resumed.load_state_dict(state)
                out.append([(b["id"].tolist(), b.get("_cost", np.zeros(0)).tolist()) for b in resumed])
        return out
    assert epoch_rest(False, "1GiB") == epoch_rest(str(tmp_path), "64KiB")
    assert files_under(tmp_path) == []


def test_rows_larger_than_measured_go_to_the_temp_folder_and_change_no_batch(tmp_path, monkeypatch):
    """What the footers miss: the window counts the bytes it holds as it fills and sends the rest to the system
    temp folder (by default), so its memory stays within its share of the budget; the batches are unchanged."""
    import tempfile
    data = one_unsampled_file(tmp_path / "ds", long_groups=4)
    plan = plan_shards(data, 1, batch_size=BATCH, engine="local")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    made = []
    real = spill.SpillFolder.file
    monkeypatch.setattr(spill.SpillFolder, "file", lambda self, suffix: made.append(suffix) or real(self, suffix))
    common = dict(backend="arrow", batch_format="numpy", shuffle_budget="4MiB")
    guarded = make_loader(0, 1, plan=plan, **common)
    assert guarded.shuffle_window * STRING > 10 * 4 * 2**20  # sized from rows that look short
    assert batches(guarded) == batches(make_loader(0, 1, plan=plan, shuffle_spill_dir=False,
                                                   shuffle_window=guarded.shuffle_window, **common))
    assert ".arrow" in made and files_under(temp) == []


def test_a_folder_without_its_lock_is_swept_only_once_old(tmp_path):
    young, old = tmp_path / f"{spill.PREFIX}1-a", tmp_path / f"{spill.PREFIX}2-b"
    young.mkdir()
    old.mkdir()
    (old / "1.npy").write_bytes(b"x")
    os.utime(old, (0, 0))  # made long ago, its owner died before it wrote its lock
    assert spill.sweep(str(tmp_path)) == [str(old)]
    assert os.listdir(tmp_path) == [young.name]  # may be being made right now: left alone


@settings(deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=6), st.integers(0, 2**32 - 1), st.integers(0, 2))
def test_a_column_in_chunks_takes_rows_in_any_order_as_one_array(sizes, seed, dropped):
    """``BlockColumn.take`` (chunk by chunk, no joined copy) gives what Arrow's take on the joined column gives."""
    chunks, start = [], 0
    for n in sizes:
        chunks.append(pa.array([f"v{i}" * (i % 3) for i in range(start, start + n)]))
        start += n
    order = np.random.default_rng(seed).permutation(start)[:max(0, start - dropped)]
    expected = pa.concat_arrays(chunks).take(pa.array(order, type=pa.int64()))
    assert spill.BlockColumn(chunks).take(order).to_pylist() == expected.to_pylist()


def test_a_column_in_more_chunks_than_a_byte_counts_takes_rows_as_one_array():
    """Past 256 chunks (each row's chunk no longer fits a byte), and with empty chunks, the same rows come."""
    rng = np.random.default_rng(3)
    sizes = rng.integers(0, 4, 700)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    chunks = [pa.array([f"v{i}" for i in range(starts[c], starts[c + 1])], pa.string()) for c in range(len(sizes))]
    column = spill.BlockColumn(chunks)
    for order in (rng.permutation(int(starts[-1])), rng.permutation(int(starts[-1]))[:100]):
        assert column.take(order).to_pylist() == [f"v{i}" for i in order]


@pytest.mark.parametrize("memory", [64 * 2**10, 2**20])
def test_a_spilled_window_is_served_in_runs_its_memory_share_holds(tmp_path, memory):
    """Rows of 1-3 KB, a memory share far below the window: each run gathered from it holds whole batches of at
    most the share's measured bytes (at least one batch), and the batches are those of the window in memory."""
    from petastorm_balanced.reading.batches.batching import WindowBatcher, split_batches, start_point
    from petastorm_balanced.reading.windows.spill_window import filling_for
    rng = np.random.default_rng(0)
    rows, batch, size = 6_016, 32, 4_800  # 188 batches
    text = pa.array(["x" * int(n) for n in rng.integers(1_000, 3_000, rows)])
    chunks = [{"id": np.arange(b, min(b + 1_000, rows)), "text": text.slice(b, 1_000)} for b in range(0, rows, 1_000)]

    def runs(filling):
        start = start_point(np.array([rows]), batch_size=batch, window_rows=size, batches_done=0, shuffle=True)
        batcher = WindowBatcher(total_rows=rows, batch_size=batch, window_rows=size, start=start, key=(0, 1, 0, 0),
                                filling=filling)
        return [run for chunk in chunks for run in batcher.push(dict(chunk))]
    placement = spill.Placement(memory, spill.SpillFolder(str(tmp_path)), 2**30)
    spilled = runs(filling_for(placement))
    row_bytes = 2_000 + 4 + 8  # the mean string, its offset and the id
    assert all(len(r["id"]) % batch == 0 and len(r["id"]) * row_bytes <= max(memory * 1.2, batch * 3_012)
               for r in spilled), str([len(r["id"]) for r in spilled])
    in_memory = runs(None)
    assert [b["id"].tolist() for r in spilled for b in split_batches(r, batch)] == \
        [b["id"].tolist() for r in in_memory for b in split_batches(r, batch)]
    assert [t for r in spilled for t in r["text"].to_pylist()] == [t for r in in_memory for t in r["text"].to_pylist()]
    placement.close()
    assert files_under(tmp_path) == []


@settings(deadline=None, max_examples=30)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=5), st.integers(-1, 900), st.sampled_from([0, 2**20]),
       st.integers(0, 2**32 - 1))
def test_a_flag_column_with_no_true_is_neither_stored_nor_read_and_one_true_stores_it(tmp_path_factory, sizes,
                                                                                     true_at, memory, seed):
    """A boolean column (the padding flags) is kept only from its first True on, the rows before written False; a
    window of no True gathers zeros. Either way the gathered rows are those of ``Filling``'s window."""
    from petastorm_balanced.reading.batches.batching import Filling
    from petastorm_balanced.reading.windows.spill_window import SpillFilling
    rows = sum(sizes)
    flags = np.zeros(rows, dtype=np.bool_)
    if 0 <= true_at < rows:
        flags[true_at:] = np.arange(rows - true_at) % 3 == 0
    x = np.random.default_rng(seed).random((rows, 3))
    columns = {"a": np.arange(rows), "b": np.arange(rows) * 2, "flag": flags, "x0": x[:, 0], "x1": x[:, 1]}
    chunks = np.split(np.arange(rows), np.cumsum(sizes)[:-1])
    folder = tmp_path_factory.mktemp("flags")
    placement = spill.Placement(memory, spill.SpillFolder(str(folder)), 2**30)
    fillings = [SpillFilling(rows, {k: v[chunks[0]] for k, v in columns.items()}, placement),
                Filling(rows, {k: v[chunks[0]] for k, v in columns.items()})]
    for filling in fillings:
        for chunk in chunks:
            filling.add({k: v[chunk] for k, v in columns.items()})
    order = np.random.default_rng(seed).permutation(rows)
    spilled, expected = (f.window().gather(order) for f in fillings)
    assert list(spilled) == list(expected)
    assert all(np.array_equal(spilled[k], expected[k]) and spilled[k].dtype == expected[k].dtype for k in expected)
    assert np.array_equal(spilled["flag"], flags[order])
    placement.close()
