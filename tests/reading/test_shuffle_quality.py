"""G16 random order: batches from data stored sorted are as random as a uniform permutation's when a rank's rows
fit its shuffle budget; the budget sizes the window; sorted storage is detected and said; quality is measurable
before training. Every quality figure is a ratio to batches cut from a uniform permutation of the same rows."""
import json
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.core.quality import Quality, clustered_columns, mean_tv, uniform_batches
from petastorm_balanced.core.shuffle import EXTRA_ROW_BYTES, WINDOW_COPIES, budget_window
from petastorm_balanced.errors import InvalidTypeError, InvalidValueError, ShuffleQualityWarning
from petastorm_balanced.tools.cli import main as cli_main
from petastorm_balanced.tools.shuffle_quality import shuffle_quality
from tests.support.resume_contract import check_resume_contract, take

pytestmark = pytest.mark.filterwarnings("ignore::petastorm_balanced.errors.ShuffleQualityWarning")

ROWS, CLASSES, BATCH = 24_000, 40, 64


def write(path, *, row_group, sort=True, files=3, seed=0):
    """``id``, ``label`` (``id * CLASSES // ROWS``) and two float features; stored sorted by label, or shuffled."""
    rng = np.random.default_rng(seed)
    ids = np.arange(ROWS, dtype=np.int64)
    if not sort:
        ids = rng.permutation(ids)
    os.makedirs(path, exist_ok=True)
    for i, part in enumerate(np.array_split(ids, files)):
        table = pa.table({"id": part, "label": part * CLASSES // ROWS, "x": rng.random(len(part)),
                          "y": rng.random(len(part)).astype(np.float32)})
        pq.write_table(table, os.path.join(path, f"part-{i}.parquet"), row_group_size=row_group)
    return str(path)


@pytest.fixture(scope="module")
def sorted_small_groups(tmp_path_factory):
    return write(tmp_path_factory.mktemp("sorted") / "ds", row_group=600)


@pytest.fixture(scope="module")
def sorted_large_groups(tmp_path_factory):
    return write(tmp_path_factory.mktemp("sorted_large") / "ds", row_group=8_000)


def labels(plan, world, **kwargs):
    """Per rank, the label arrays of its batches in epoch 1."""
    out = []
    for rank in range(world):
        with make_loader(rank, world, plan=plan, epoch=1, backend="arrow", **kwargs) as loader:
            out.append([b["label"].numpy() for b in loader])
    return out


def qualities(per_rank, reference):
    rank = Quality.of([b for batches in per_rank for b in batches], reference)
    step = Quality.of([np.concatenate(s) for s in zip(*per_rank, strict=True)], reference)
    return rank, step


@pytest.mark.parametrize("data", ["sorted_small_groups", "sorted_large_groups"])
def test_sorted_data_gives_batches_as_random_as_a_uniform_permutation(data, request):
    path = request.getfixturevalue(data)
    reference = ds.dataset(path).to_table(columns=["label"])["label"].to_numpy()
    plan = plan_shards(path, 1, batch_size=BATCH, engine="local")
    rank, _ = qualities(labels(plan, 1), reference)
    assert rank.ratio <= 1.15, rank
    # the same measure tells a small window's batches apart: it can fail
    small, _ = qualities(labels(plan, 1, shuffle_window=1_000), reference)
    assert small.ratio > 2.0, small

    plan = plan_shards(path, 3, batch_size=BATCH, engine="local")
    rank, step = qualities(labels(plan, 3), reference)
    assert step.ratio <= 1.10, step  # the global batch: what a DDP gradient averages over
    _, small_step = qualities(labels(plan, 3, shuffle_window=1_000), reference)
    assert small_step.ratio > 2.0, small_step


def test_window_is_what_the_budget_holds(sorted_small_groups):
    plan = plan_shards(sorted_small_groups, 1, batch_size=BATCH, engine="local")
    row = 8 + 8 + 8 + 4 + EXTRA_ROW_BYTES  # id, label, x, y (fixed widths) and the batcher's own columns
    for budget in (2**20, "1MiB", "3 MB", 5 * 2**20):
        with make_loader(0, 1, plan=plan, shuffle_budget=budget, backend="arrow") as loader:
            window = loader.shuffle_window
            assert window == budget_window(loader.shuffle_budget, row, BATCH)
            assert window % BATCH == 0 and window * row * WINDOW_COPIES <= loader.shuffle_budget
    with make_loader(0, 1, plan=plan, shuffle_budget="1MiB", schema_fields=["id"], backend="arrow") as loader:
        assert loader.shuffle_budget == 2**20  # fewer columns read: more rows per window
        assert loader.shuffle_window == budget_window(2**20, 8 + EXTRA_ROW_BYTES, BATCH)
    with make_loader(0, 1, plan=plan, shuffle_window=1_000, backend="arrow") as loader:
        assert loader.shuffle_window == 1_000  # set in rows, as before


@pytest.mark.parametrize("budget, error", [("lots", InvalidValueError), (0, InvalidValueError),
                                           ("-3MiB", InvalidValueError), (2.5, InvalidTypeError),
                                           ("2 parsecs", InvalidValueError)])
def test_a_bad_budget_is_refused_naming_it(sorted_small_groups, budget, error):
    plan = plan_shards(sorted_small_groups, 1, batch_size=BATCH, engine="local")
    with pytest.raises(error, match="shuffle_budget"):
        make_loader(0, 1, plan=plan, shuffle_budget=budget)


def test_resume_is_exact_inside_a_budget_window(sorted_small_groups):
    plan = plan_shards(sorted_small_groups, 2, batch_size=BATCH, engine="local")

    def make():
        return make_loader(1, 2, plan=plan, backend="arrow", shuffle_budget="2MiB")
    assert make().shuffle_window > 3 * BATCH  # several batches per window: resumes cut windows
    check_resume_contract(make, iter, epochs=3)


def test_a_state_saved_with_another_window_is_refused_with_the_fix(sorted_small_groups):
    plan = plan_shards(sorted_small_groups, 1, batch_size=BATCH, engine="local")
    old = make_loader(0, 1, plan=plan, shuffle_window=10_000, backend="arrow")
    head = take(iter(old), 5)
    state = old.state_dict()
    rest = take(iter(old))
    assert head and rest
    with pytest.raises(InvalidValueError, match="pass shuffle_window=10000"):
        make_loader(0, 1, plan=plan, backend="arrow").load_state_dict(state)
    resumed = make_loader(0, 1, plan=plan, backend="arrow", shuffle_window=10_000)
    resumed.load_state_dict(state)
    assert take(iter(resumed)) == rest


def shuffle_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, ShuffleQualityWarning)]


def test_sorted_storage_is_stated_once_where_it_changes_the_batches(sorted_small_groups, tmp_path, monkeypatch,
                                                                    capsys):
    """Planning warns only when a rank's rows at the plan's world size need more than one default shuffle window
    (else the batches are a uniform permutation's: nothing to act on), once, with the budget that fixes it; the
    loader warns on rank 0 only, where its own window is too small; ``inspect`` states the finding either way."""
    from petastorm_balanced.planner import stored_order
    with warnings.catch_warnings(record=True) as caught:  # 24,000 rows fit one default window: nothing to say
        warnings.simplefilter("always")
        plan = plan_shards(sorted_small_groups, 1, batch_size=BATCH, engine="local", output_url=str(tmp_path / "p"))
    assert shuffle_warnings(caught) == []
    assert cli_main(["inspect", str(tmp_path / "p")]) == 0
    assert "stored sorted by 'label'" in capsys.readouterr().out  # the finding, stated without a warning

    monkeypatch.setattr(stored_order, "DEFAULT_BUDGET", 256 * 2**10)  # a default window of a few hundred rows
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan_shards(sorted_small_groups, 1, batch_size=BATCH, engine="local")
    said = shuffle_warnings(caught)
    assert len(said) == 1 and "'label'" in said[0] and "shuffle_budget=" in said[0], said
    shuffled = write(tmp_path / "shuffled", row_group=600, sort=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan_shards(shuffled, 1, batch_size=BATCH, engine="local")
    assert shuffle_warnings(caught) == []

    with warnings.catch_warnings(record=True) as caught:  # the rank's rows fit one window: nothing to say
        warnings.simplefilter("always")
        make_loader(0, 1, plan=plan, backend="arrow").close()
        make_loader(1, 2, plan=plan, backend="arrow", shuffle_budget="64KiB").close()  # rank 1: rank 0 says it
        make_loader(0, 1, plan=plan, backend="arrow", shuffle_window=2_688).close()  # the window asked for
    assert shuffle_warnings(caught) == []
    with pytest.warns(ShuffleQualityWarning, match='need [0-9]+ shuffle windows.*shuffle_budget="[0-9]+MiB"') as w:
        small = make_loader(0, 1, plan=plan, backend="arrow", shuffle_budget="64KiB")
    small.close()
    # the figures are the loader's: the rank's rows (world 1: every row pyarrow.dataset counts) over its window; and
    # the budget the warning names is the fewest MiB whose window holds them all
    said = shuffle_warnings(w)[0]
    rows, window = ds.dataset(sorted_small_groups).count_rows(), small.shuffle_window
    assert f"{rows:,} rows need {-(-rows // window)} shuffle windows of {window:,} rows" in said, said
    mib = int(said.split('shuffle_budget="')[1].split("MiB")[0])
    for budget, holds in ((mib, True), (mib - 1, False)):
        with make_loader(0, 1, plan=plan, backend="arrow", shuffle_budget=f"{budget}MiB") as advised:
            assert (advised.shuffle_window >= rows) == holds, (budget, advised.shuffle_window, rows)


def test_statistics_are_read_only_when_a_warning_may_be_due(sorted_small_groups, monkeypatch):
    """Which columns are stored in order is worked out from every sampled row group's statistics only for a loader
    that may warn (shuffled, a rank's rows over one window); the others never read them, and the warning still
    comes where it is due."""
    from petastorm_balanced.reading.fields import dataset_schema
    plan = plan_shards(sorted_small_groups, 1, batch_size=BATCH, engine="local")
    calls = []
    real = dataset_schema.value_ranges
    monkeypatch.setattr(dataset_schema, "value_ranges", lambda footers: calls.append(1) or real(footers))
    make_loader(0, 1, plan=plan, backend="arrow", shuffle=False, shuffle_budget="64KiB").close()
    make_loader(0, 1, plan=plan, backend="arrow").close()  # the rank's rows fit one window
    assert calls == []
    with pytest.warns(ShuffleQualityWarning, match="'label'"):
        make_loader(0, 1, plan=plan, backend="arrow", shuffle_budget="64KiB").close()
    assert calls == [1]


def test_hive_partitions_count_as_clustered(tmp_path):
    root = tmp_path / "hive"
    for day in range(4):
        folder = root / f"day=2026-01-0{day + 1}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": np.arange(day * 1000, (day + 1) * 1000)}), folder / "part.parquet")
    plan = plan_shards(str(root), 1, batch_size=16, engine="local")
    with pytest.warns(ShuffleQualityWarning, match="'day'"):
        make_loader(0, 1, plan=plan, backend="arrow", shuffle_budget="16KiB").close()


def test_inspect_measures_what_the_loader_delivers(sorted_large_groups, tmp_path, capsys):
    url = str(tmp_path / "plan")
    plan = plan_shards(sorted_large_groups, 2, batch_size=BATCH, engine="local", output_url=url)
    report = shuffle_quality(plan, "label", epoch=1)
    per_rank = labels(plan, 2)
    rank, step = qualities(per_rank, np.concatenate([b for batches in per_rank for b in batches]))  # the epoch's rows
    assert report.rank.tv == pytest.approx(rank.tv) and report.global_batch.tv == pytest.approx(step.tv)
    assert report.global_batch.ratio <= 1.10 and report.windows_per_rank == 1 and "label" in report.clustered

    assert cli_main(["inspect", url, "--shuffle-quality", "label", "--shuffle-budget", "256KiB", "--json"]) == 0
    small = json.loads(capsys.readouterr().out)["shuffle_quality"]
    assert small["windows_per_rank"] > 1 and small["global_batch"]["ratio"] > 2.0
    assert cli_main(["inspect", url, "--shuffle-quality", "label"]) == 0
    assert "global batch" in capsys.readouterr().out
    assert cli_main(["inspect", url, "--shuffle-quality", "nope"]) == 2


@given(st.integers(4, 30), st.integers(16, 24), st.integers(16, 64), st.integers(0, 2**32 - 1))
def test_quality_of_a_uniform_permutation_is_its_own_baseline(classes, repeat, batch, seed):
    values = np.repeat(np.arange(classes), repeat * batch)  # stored sorted
    sorted_batches = list(values.reshape(-1, batch))
    permuted = uniform_batches(values, batch, seed=seed + 1)
    baseline = mean_tv(uniform_batches(values, batch, seed=seed), values)
    assert mean_tv(permuted, values) <= mean_tv(sorted_batches, values)
    assert mean_tv(sorted_batches, values) == pytest.approx(1 - 1 / classes)  # one label per batch
    assert abs(mean_tv(permuted, values) - baseline) <= 0.1  # two permutations: the same up to sampling noise


def test_clustered_columns_from_statistics():
    rows = np.full(8, 100)
    lows = np.arange(8) * 10.0
    assert clustered_columns({"t": (lows, lows + 9, rows)}) == {"t": pytest.approx(9 / 79, abs=1e-4)}
    spread = (np.zeros(8), np.full(8, 79.0), rows)  # every row group spans the range: random order
    assert clustered_columns({"t": spread}) == {}
    assert clustered_columns({"c": (np.ones(3), np.ones(3), np.ones(3))}) == {}  # a constant says nothing
