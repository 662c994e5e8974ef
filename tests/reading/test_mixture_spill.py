"""A mixture with a spill folder (``shuffle_spill_dir``): each source's window holds its whole share of a pass on
local disk, so on sources stored sorted a batch's rows of each source are as random as a permutation of that
source's share; values as pyarrow.dataset reads them, each source's rows once per pass, exact resume, DataLoader
workers, and no file left after ``close()``."""
import gc
import os
from itertools import islice

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import BalancedIterableDataset, make_loader, plan_shards
from petastorm_balanced.reading.state import flat
from petastorm_balanced.reading.windows import spill
from tests.support.resume_contract import check_resume_contract
from tests.support.stacks import HAVE_PETASTORM

pytestmark = pytest.mark.filterwarnings("ignore::petastorm_balanced.errors.ShuffleQualityWarning")

SIZES, CLASSES, BATCH, WEIGHTS = (3000, 1800, 1200), 30, 48, [2, 1, 1]
BUDGET = "64KiB"  # memory windows of a few dozen rows: far smaller than each source's share
BACKENDS = ["arrow"] + (["petastorm"] if HAVE_PETASTORM else [])


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three datasets stored sorted by label (each source its own labels), in row groups of 100 rows."""
    root = tmp_path_factory.mktemp("mixture_spill")
    urls = []
    rng = np.random.default_rng(5)
    for s, rows in enumerate(SIZES):
        path = root / f"s{s}"
        path.mkdir()
        for i, ids in enumerate(np.array_split(np.arange(rows, dtype=np.int64), 2)):
            table = pa.table({"id": ids, "label": (s * CLASSES + ids * CLASSES // rows).astype(np.int32),
                              "x": rng.random(len(ids)), "text": pa.array([f"{s}-{v} " + "y" * int(v % 40)
                                                                          for v in ids])})
            pq.write_table(table, path / f"part-{i}.parquet", row_group_size=100)
        urls.append(str(path))
    return urls


@pytest.fixture(scope="module")
def plans(sources):
    return [plan_shards(url, 2, batch_size=BATCH, seed=3 + i, engine="local") for i, url in enumerate(sources)]


def files_under(folder) -> list:
    return [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]


def loader(plans, folder, rank=0, world=1, **kwargs):
    kwargs = {"weights": WEIGHTS, "batch_size": BATCH, "shuffle_budget": BUDGET, "backend": "arrow", **kwargs}
    return make_loader(rank, world, plan=plans, shuffle_spill_dir=None if folder is None else str(folder), **kwargs)


def distinct_ratio(batches, seed=0) -> float:
    """Mean distinct labels per batch, against batches holding the same rows of each source drawn from a uniform
    permutation of that source's share of the epoch (what each source's window, were it the whole share, gives)."""
    rng = np.random.default_rng(seed)
    got = np.mean([len(np.unique(b["label"])) for b in batches])
    sources = np.concatenate([b["_source"] for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    shuffled = labels.copy()
    for s in np.unique(sources):
        pick = sources == s
        shuffled[pick] = rng.permutation(labels[pick])
    cuts = np.cumsum([len(b["label"]) for b in batches])[:-1]
    uniform = np.mean([len(np.unique(b)) for b in np.split(shuffled, cuts)])
    return float(got / uniform)


def numpy_batches(made):
    with made:
        return [{k: np.asarray(v) if not isinstance(v, list) else v for k, v in b.items()} for b in made]


def test_each_sources_window_holds_its_share_and_batches_are_as_random_as_a_permutation(plans, tmp_path):
    """Fails on a window at the memory budget's size (the mixture's windows without the folder)."""
    with_folder = loader(plans, tmp_path, batch_format="numpy")
    windows = [layout.shuffle_window for layout in with_folder._settings.layouts]
    shares = list(with_folder._settings.mixture.rows_per_pass)  # a rank's rows of each source per pass
    assert windows == shares and shares[0] > 2000, "each source's window is its whole share"
    assert flat(with_folder.state_dict())["shuffle_window"] == shares, "the windows are the state's identity"
    spilled = numpy_batches(with_folder)
    in_memory = numpy_batches(loader(plans, None, batch_format="numpy"))
    assert len(spilled) == len(in_memory) == SIZES[2] // (BATCH // 4)
    with_ratio, without = distinct_ratio(spilled), distinct_ratio(in_memory)
    assert without < 0.6, without  # the measure can fail: memory windows give batches of a few labels
    assert with_ratio >= 0.9, (with_ratio, without)
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_values_are_pyarrows_each_sources_rows_once_per_pass_and_source_is_right(plans, sources, tmp_path,
                                                                                  backend, monkeypatch):
    made = []
    real = spill.SpillFolder.file
    monkeypatch.setattr(spill.SpillFolder, "file", lambda self, suffix: made.append(suffix) or real(self, suffix))
    tables = [pads.dataset(url, format="parquet").to_table().to_pandas().set_index("id") for url in sources]
    delivered: list[list[int]] = [[] for _ in SIZES]
    with loader(plans, tmp_path, backend=backend, batch_format="numpy") as mixture:
        for epoch in range(3):
            mixture.set_epoch(epoch)
            for batch in mixture:
                counts = np.bincount(batch["_source"], minlength=3)
                assert counts.tolist() == [24, 12, 12], "each source's share of the batch"
                for s in range(3):
                    pick = batch["_source"] == s
                    ids = batch["id"][pick]
                    assert np.array_equal(batch["label"][pick], tables[s].loc[ids, "label"].to_numpy())
                    assert np.array_equal(batch["x"][pick], tables[s].loc[ids, "x"].to_numpy())
                    assert [t for t, p in zip(batch["text"], pick.tolist(), strict=True) if p] == \
                        tables[s].loc[ids, "text"].tolist()
                    delivered[s].extend(ids.tolist())
    assert ".bin" in made and ".arrow" in made, "numbers and text of the windows went to disk"
    for s, rows in enumerate(SIZES):
        ids = delivered[s]
        for start in range(0, len(ids), rows):  # each pass: every row once (the last pass partly read)
            one = ids[start:start + rows]
            assert len(set(one)) == len(one) and (len(one) < rows or sorted(one) == list(range(rows)))
        assert len(ids) >= rows, "every source read at least one whole pass"
    assert files_under(tmp_path) == []


def test_resume_is_exact_with_each_sources_window_on_disk(plans, tmp_path):
    def make():
        return loader(plans, tmp_path, rank=1, world=2)
    check_resume_contract(make, iter, epochs=2)
    gc.collect()  # loaders left mid-epoch without close(): collected, they leave nothing either
    assert files_under(tmp_path) == []


def test_no_file_outlives_close_and_a_source_stream_keeps_its_window_across_epochs(plans, tmp_path):
    made = loader(plans, tmp_path, epoch_steps=10)
    first = list(made)
    assert len(first) == 10
    held = [f for f in files_under(tmp_path) if not f.endswith(spill.LOCK)]
    assert held, "each source's window, read less than a pass, waits on disk for the next epoch"
    assert len(os.listdir(tmp_path)) == 3, "a folder per source"
    second = list(islice(iter(made), 3))
    assert len(second) == 3
    made.close()
    assert files_under(tmp_path) == [] and os.listdir(tmp_path) == []


def test_dataloader_workers_read_their_slots_with_windows_on_disk(plans, sources, tmp_path):
    torch = pytest.importorskip("torch")
    del torch
    tables = [pads.dataset(url, format="parquet").to_table().to_pandas().set_index("id") for url in sources]
    kwargs = dict(weights=WEIGHTS, batch_size=BATCH, shuffle_budget=BUDGET, backend="arrow",
                  shuffle_spill_dir=str(tmp_path))
    seen: list[set] = [set() for _ in SIZES]
    for rank in range(2):
        ds = BalancedIterableDataset(plans, rank, 2, **kwargs)
        batches = [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()}
                   for b in ds.dataloader(num_workers=2)]
        slots = [make_loader(rank * 2 + s, 4, plan=plans, workers_count=1, batch_format="numpy", **kwargs)
                 for s in range(2)]
        each = [numpy_batches(slot) for slot in slots]
        expected = [each[b % 2][b // 2] for b in range(len(each[0]) + len(each[1]))]
        assert len(batches) == len(expected)
        assert all(np.array_equal(a["id"], b["id"]) and np.array_equal(a["_source"], b["_source"])
                   for a, b in zip(batches, expected, strict=True)), "the slots' batches, round robin"
        for batch in batches:
            for s in range(3):
                pick = batch["_source"] == s
                ids = batch["id"][pick]
                assert np.array_equal(batch["label"][pick], tables[s].loc[ids, "label"].to_numpy())
                assert not seen[s] & set(ids.tolist()), "no row twice in the epoch over ranks and workers"
                seen[s].update(ids.tolist())
        for slot in range(2):  # a worker's batches against a permutation of its slot's share of each source
            ratio = distinct_ratio(batches[slot::2])
            assert ratio >= 0.9, ratio
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("cost", [None, "octet_length(text)"])
def test_windows_on_disk_give_the_batches_of_the_same_windows_in_memory(sources, tmp_path, cost):
    """Where rows wait never changes a batch: each source's whole share on disk gives the batches of windows that
    hold it in memory, a source balanced by cost keeping its arrangement (its window cut into its batches' pieces)."""
    plans = [plan_shards(url, 2, batch_size=BATCH, seed=3 + i, engine="local", **({"cost": cost} if i == 1 and cost
                                                                                else {}))
             for i, url in enumerate(sources)]

    def run(**kwargs):
        with make_loader(1, 2, plan=plans, weights=WEIGHTS, batch_size=BATCH, backend="arrow", batch_format="numpy",
                         **kwargs) as made:
            assert (made._settings.sources[1].cost is None) == (cost is None)
            out = []
            for epoch in range(2):
                made.set_epoch(epoch)
                out += [(b["_source"].tolist(), b["id"].tolist()) for b in made]
            return out
    on_disk = run(shuffle_budget=BUDGET, shuffle_spill_dir=str(tmp_path))
    in_memory = run(shuffle_budget="1GiB", shuffle_window=10_000, shuffle_spill_dir=False)
    assert len(on_disk) > 50 and on_disk == in_memory
    assert files_under(tmp_path) == []


def test_shuffle_quality_of_a_mixture_says_what_a_spill_folder_buys(plans):
    from petastorm_balanced.tools.shuffle_quality import shuffle_quality
    report = shuffle_quality(plans, "label", world_size=1, batch_size=BATCH, weights=WEIGHTS, shuffle_budget=BUDGET)
    assert report.spill_rank is not None and report.spill_window == max(SIZES)
    assert report.spill_rank.ratio < 0.6 * report.rank.ratio, (report.spill_rank, report.rank)
    assert report.spill_disk_bytes > sum(SIZES) * 8 and "with a spill folder" in report.format()


def test_an_elastic_resume_keeps_the_windows_and_delivers_no_row_twice_in_its_pass(plans, tmp_path):
    """A state saved at world size 2 continues at 3: each source's window is the same number on both (a whole
    share wherever the spill budget holds it), and no row of a source comes twice in its pass."""
    old = [loader(plans, tmp_path, rank=r, world=2, batch_format="numpy") for r in range(2)]
    seen: list[list[int]] = [[] for _ in SIZES]

    def count(batch):
        for s in range(3):
            seen[s].extend(batch["id"][batch["_source"] == s].tolist())
    for made in old:
        for batch in islice(iter(made), 7):
            count(batch)
    state = old[0].state_dict()
    assert flat(state)["shuffle_window"] == [plan.rows_per_rank(1, 1) for plan in plans]
    for made in old:
        made.close()
    for rank in range(3):
        with loader(plans, tmp_path, rank=rank, world=3, batch_format="numpy") as made:
            made.load_state_dict(state)
            for batch in made:
                count(batch)
    for s in (0, 1):  # read less than a pass in the epoch
        assert len(seen[s]) == len(set(seen[s])), f"source {s}: a row twice in its pass"
    assert len(seen[2]) - len(set(seen[2])) <= 12 * 3, "the scarcest source: only its last batch starts a pass"
    assert files_under(tmp_path) == []
