"""make_loader's local-disk row group cache (backend="arrow", cache_type="local-disk"): later epochs read the
cache, every value is what pyarrow.dataset reads, a file rewritten since planning is refused as without the cache
(G15), and a plan made anew over rewritten files never gets the old files' rows from the cache."""
import os
import shutil

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import StalePlanError, make_loader, plan_shards
from petastorm_balanced.tools import datagen

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def dataset(tmp_path):
    return datagen.make_plain_dataset(tmp_path / "ds", num_files=4, total_rows=3000, seed=5, max_row_group_rows=300)


def epoch_rows(loader, epoch):
    loader.set_epoch(epoch)
    batches = list(loader)
    return {name: np.concatenate([np.asarray(b[name]) for b in batches]) for name in batches[0]}


def by_id(path):
    table = ds.dataset(str(path), format="parquet").to_table()
    return {name: dict(zip(table.column("id").to_pylist(), table.column(name).to_pylist(), strict=True))
            for name in table.column_names}


def assert_exact(rows, expected):
    for name, values in rows.items():
        want = [expected[name][i] for i in rows["id"].tolist()]
        assert values.tolist() == want, name


def cached_loader(plan, folder, **kwargs):
    return make_loader(0, 1, plan=plan, batch_size=32, backend="arrow", cache_type="local-disk",
                       cache_location=str(folder), cache_size_limit="64MiB", **kwargs)


def test_later_epochs_read_the_cache_and_every_value_is_exact(dataset, tmp_path, monkeypatch):
    plan = plan_shards(dataset.path, 1, batch_size=32, engine="local")
    plain = make_loader(0, 1, plan=plan, batch_size=32, backend="arrow")
    cached = cached_loader(plan, tmp_path / "cache")
    expected = by_id(dataset.path)
    for epoch in (0, 1):
        rows, same = epoch_rows(cached, epoch), epoch_rows(plain, epoch)
        assert rows.keys() == same.keys()
        for name in rows:
            assert np.array_equal(rows[name], same[name]), (epoch, name)
        assert_exact(rows, expected)
    assert len([n for n in os.listdir(tmp_path / "cache") if n.endswith(".arrow")]) == len(plan.catalog.row_groups)

    def no_reads(*args, **kwargs):
        raise AssertionError("a row group was read from the dataset, not the cache")
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", no_reads)
    assert_exact(epoch_rows(cached, 2), expected)
    monkeypatch.undo()
    assert_exact(epoch_rows(plain, 2), expected)


def test_a_file_rewritten_since_planning_is_refused_with_the_cache_warm(dataset, tmp_path):
    plan = plan_shards(dataset.path, 1, batch_size=32, engine="local")
    loader = cached_loader(plan, tmp_path / "cache")
    epoch_rows(loader, 0)
    victim = os.path.join(dataset.path, sorted(g.path for g in plan.catalog.row_groups)[0])
    _rewrite_same_shape(victim)
    loader.set_epoch(1)
    with pytest.raises(StalePlanError):
        list(loader)


def test_a_new_plan_over_rewritten_files_never_gets_the_old_rows_from_the_cache(dataset, tmp_path):
    """The entries are keyed by the files' content fingerprint: the same paths, row groups and columns, rewritten
    with other values, are read anew."""
    copy = tmp_path / "copy"
    shutil.copytree(dataset.path, copy)
    plan = plan_shards(str(copy), 1, batch_size=32, engine="local")
    folder = tmp_path / "cache"
    epoch_rows(cached_loader(plan, folder), 0)
    for name in {g.path for g in plan.catalog.row_groups}:
        _rewrite_same_shape(os.path.join(copy, name))
    replanned = plan_shards(str(copy), 1, batch_size=32, engine="local")
    assert [(g.path, g.row_group, g.total_rows) for g in replanned.catalog.row_groups] == \
        [(g.path, g.row_group, g.total_rows) for g in plan.catalog.row_groups]
    assert_exact(epoch_rows(cached_loader(replanned, folder), 0), by_id(copy))


def _rewrite_same_shape(path):
    """The file with every ``value`` changed, same rows per row group (so only its content tells it apart)."""
    source = pq.ParquetFile(path)
    tables = [source.read_row_group(i) for i in range(source.num_row_groups)]
    schema = source.schema_arrow
    with pq.ParquetWriter(path + ".new", schema) as writer:
        for t in tables:
            writer.write_table(t.set_column(t.schema.get_field_index("value"), "value",
                                            [np.asarray(t.column("value")) + 1000.0]))
    os.replace(path + ".new", path)


@pytest.mark.parametrize("kwargs, message", [
    ({"cache_type": "local-disk"}, "cache_location=None"),
    ({"cache_type": "memory", "cache_location": "x"}, "cache_type='memory'"),
    ({"cache_location": "/tmp/x"}, "cache_location='/tmp/x' is given but cache_type=None"),
    ({"cache_type": "local-disk", "cache_location": "s3://b/c"}, "is a URL"),
    ({"cache_type": "local-disk", "cache_location": "/tmp/x", "cache_size_limit": "lots"}, "cache_size_limit='lots'"),
    ({"cache_type": "local-disk", "cache_location": "/tmp/x", "cache_row_size_estimate": 100},
     "cache_row_size_estimate=100 is not accepted with backend='arrow'"),
])
def test_cache_arguments_are_checked_where_given(dataset, kwargs, message):
    plan = plan_shards(dataset.path, 1, batch_size=32, engine="local")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        make_loader(0, 1, plan=plan, backend="arrow", **kwargs)


def test_make_reader_on_the_arrow_backend_takes_the_cache_too(dataset, tmp_path, monkeypatch):
    from petastorm_balanced import make_reader
    plan = plan_shards(dataset.path, 1, batch_size=32, engine="local")
    kwargs = {"backend": "arrow", "cache_type": "local-disk", "cache_location": str(tmp_path / "cache")}

    def ids():
        with make_reader(0, 1, plan=plan, **kwargs) as reader:
            return np.concatenate([np.asarray(b.id) for b in reader])
    first = ids()

    def no_reads(*args, **kwargs):
        raise AssertionError("a row group was read from the dataset, not the cache")
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", no_reads)
    assert np.array_equal(ids(), first)
