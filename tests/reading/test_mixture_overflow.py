"""A mixture without a spill folder keeps its memory budget as one plan does: each source's window is the memory
budget's (sized from the footers, so the batches are unchanged), and the rows a source's window holds beyond its
part of the window memory (rows larger than the footers said) wait in the system temp folder, removed when the
window is served and at ``close()``. Values as pyarrow.dataset reads them, exact resume, nothing left on disk."""
import gc
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.reading.windows import spill
from tests.reading.test_spill import FIXED, PER_BUNDLE, dictionary_strings, late_long_strings
from tests.support.jobs import ROOT
from tests.support.resume_contract import check_resume_contract
from tests.support.stacks import petastorm_only

pytestmark = pytest.mark.filterwarnings("ignore::petastorm_balanced.errors.ShuffleQualityWarning")

SIZES, CLASSES, BATCH, STRING = (2000, 1200), 20, 40, 2048


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two datasets stored sorted by label, with 2 KB strings drawn from 8 values: dictionary-encoded, a few bytes a
    row in the footers, so the memory budget's windows hold far more bytes than they were sized for."""
    root = tmp_path_factory.mktemp("mixture_overflow")
    urls = []
    values = [chr(65 + i) * STRING for i in range(8)]
    for s, rows in enumerate(SIZES):
        path = root / f"s{s}"
        path.mkdir()
        for i, ids in enumerate(np.array_split(np.arange(rows, dtype=np.int64), 2)):
            table = pa.table({"id": ids, "label": (s * CLASSES + ids * CLASSES // rows).astype(np.int32),
                              "text": pa.array([values[(v + s) % 8] for v in ids])})
            pq.write_table(table, path / f"part-{i}.parquet", row_group_size=500)
        urls.append(str(path))
    return urls


@pytest.fixture(scope="module")
def plans(sources):
    return [plan_shards(url, 2, batch_size=BATCH, seed=7 + i, engine="local") for i, url in enumerate(sources)]


@pytest.fixture
def temp(tmp_path, monkeypatch):
    """The system temp folder, as the loader finds it (``tempfile.gettempdir()``)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def files_under(folder) -> list:
    return [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]


def mixture(plans, rank=0, world=1, **kwargs):
    kwargs = {"weights": [0.5, 0.5], "batch_size": BATCH, "shuffle_budget": "1MiB", "backend": "arrow",
              "batch_format": "numpy", **kwargs}
    return make_loader(rank, world, plan=plans, **kwargs)


def distinct_ratio(batches, seed=0) -> float:
    """Mean distinct labels per batch against batches of the same sources' rows drawn from a uniform permutation of
    each source's share of the epoch."""
    rng = np.random.default_rng(seed)
    got = np.mean([len(np.unique(b["label"])) for b in batches])
    sources, labels = (np.concatenate([b[k] for b in batches]) for k in ("_source", "label"))
    shuffled = labels.copy()
    for s in np.unique(sources):
        shuffled[sources == s] = rng.permutation(labels[sources == s])
    cuts = np.cumsum([len(b["label"]) for b in batches])[:-1]
    return float(got / np.mean([len(np.unique(b)) for b in np.split(shuffled, cuts)]))


def test_rows_beyond_a_sources_memory_go_to_the_temp_folder_and_change_no_batch(plans, sources, temp, monkeypatch):
    """Fails where a mixture's windows stay wholly in memory (no file is ever made)."""
    made = []
    real = spill.SpillFolder.file
    monkeypatch.setattr(spill.SpillFolder, "file", lambda self, suffix: made.append(suffix) or real(self, suffix))
    tables = [pads.dataset(url, format="parquet").to_table().to_pandas().set_index("id") for url in sources]
    held = []  # files in the temp folder while batches are served
    with mixture(plans) as loader:
        windows = [layout.shuffle_window for layout in loader._settings.layouts]
        assert min(windows) * STRING > 2**20, windows  # sized from rows that look short: past the whole budget
        overflowed = []
        for batch in loader:
            held.append(len(files_under(temp)))
            overflowed.append(batch)
    assert ".arrow" in made and max(held) > 0, "the text beyond each source's memory waited on disk"
    assert files_under(temp) == []
    in_memory = list(mixture(plans, shuffle_spill_dir=False))
    assert len(overflowed) == len(in_memory) > 10
    for a, b in zip(overflowed, in_memory, strict=True):  # the same batches: the windows and order are unchanged
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a if k != "text")
        assert list(a["text"]) == list(b["text"])
    for batch in overflowed:
        assert np.bincount(batch["_source"], minlength=2).tolist() == [BATCH // 2] * 2
        for s, table in enumerate(tables):
            pick = batch["_source"] == s
            ids = batch["id"][pick]
            assert np.array_equal(batch["label"][pick], table.loc[ids, "label"].to_numpy())
            assert [t for t, p in zip(batch["text"], pick.tolist(), strict=True) if p] == \
                table.loc[ids, "text"].tolist()
    # quality is the memory windows' (the order is theirs), printed as the ShuffleQualityWarning says
    assert distinct_ratio(overflowed) == distinct_ratio(in_memory) < 0.9


def test_close_mid_epoch_leaves_no_file_and_resume_is_exact(plans, temp):
    loader = mixture(plans)
    batches = iter(loader)
    next(batches)
    assert files_under(temp), "the first windows' overflow is on disk while they are served"
    loader.close()
    assert files_under(temp) == []

    def make():
        return mixture(plans, rank=1, world=2)
    check_resume_contract(make, iter, epochs=2)
    gc.collect()  # loaders left mid-epoch without close(): collected, they leave nothing either
    assert files_under(temp) == []


def test_without_disk_a_mixture_keeps_its_windows_in_memory(plans, temp):
    """``shuffle_spill_dir=False`` never writes, as for one plan."""
    with mixture(plans, shuffle_spill_dir=False) as loader:
        for _ in loader:
            assert files_under(temp) == []


# Each source of a mixture has its read-ahead (its own reader): the bound counts its bundles once per source.
@pytest.mark.parametrize(("make", "backend"), [
    (dictionary_strings, "arrow"), (late_long_strings, "arrow"),
    pytest.param(dictionary_strings, "petastorm", marks=petastorm_only),
    pytest.param(late_long_strings, "petastorm", marks=petastorm_only)])
def test_a_mixtures_peak_memory_stays_within_the_budget_plus_the_constant(make, backend, tmp_path):
    data = make(tmp_path / "ds")
    url = str(tmp_path / "plan")
    plan_shards(data, 1, batch_size=40, engine="local", output_url=url)
    budget, workers, sources = 8 * 2**20, 2, 2
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = subprocess.run([sys.executable, "-W", "ignore", "-m", "tests.support.peak_memory", url,
                          "--budget", str(budget), "--workers", str(workers), "--backend", backend,
                          "--sources", str(sources)], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, "TMPDIR": str(temp)}, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["rows"] > 0
    assert measured["peak_anon"] <= budget + sources * (2 * workers + 4) * PER_BUNDLE + FIXED, measured
    assert files_under(temp) == []
