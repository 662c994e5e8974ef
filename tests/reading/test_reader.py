"""make_reader: a real Petastorm Reader over exactly one rank's planned rows, in plan order, stale plans refused."""
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("petastorm.reader", reason="make_reader is a Petastorm reader: petastorm stack only")
from petastorm.codecs import NdarrayCodec  # noqa: E402

from petastorm_balanced import StalePlanError, datagen, make_loader, make_reader, plan_shards
from petastorm_balanced.predicates import in_lambda
from petastorm_balanced.reading.backends.reader_arguments import OWNED_ARGUMENTS
from tests.support.delivery_contract import planned_ids
from tests.support.predicate_funcs import english


def reader_ids(reader):
    with reader:
        return np.concatenate([np.atleast_1d(item.id) for item in reader])


def test_plain_reader_gives_the_planned_rows_in_plan_order(plain_dataset):
    plan = plan_shards(plain_dataset.url, 3, batch_size=40, predicate=in_lambda(["lang"], english), engine="local")
    for rank in range(3):
        expected = planned_ids(plain_dataset.path, plan.assignment(rank, epoch=2))
        for pool, workers in (("thread", 3), ("dummy", 1)):
            got = reader_ids(make_reader(rank, 3, plan=plan, epoch=2, reader_pool_type=pool, workers_count=workers))
            assert np.array_equal(got, expected), (rank, pool)


def test_petastorm_reader_decodes_only_delivered_rows(petastorm_dataset, monkeypatch):
    """Rows come decoded like petastorm.make_reader's, and codecs run once per delivered row, not per row read."""
    calls = []
    original = NdarrayCodec.decode

    def counting(self, field, value):
        calls.append(field.name)
        return original(self, field, value)

    monkeypatch.setattr(NdarrayCodec, "decode", counting)
    plan = plan_shards(petastorm_dataset.url, 2, batch_size=16, predicate=in_lambda(["lang"], english),
                       engine="local")
    with make_reader(1, 2, plan=plan, workers_count=2) as reader:
        rows = list(reader)
    assert len(rows) == plan.rows_per_rank(2) and all(r.lang == "en" for r in rows)
    assert rows[0].vec.shape == (4,) and rows[0].image.shape == (8, 8) and rows[0].image.dtype == np.uint8
    assert np.array_equal([r.id for r in rows], planned_ids(petastorm_dataset.path, plan.assignment(1)))
    assert len(calls) == 2 * len(rows), "vec and image decoded exactly once per delivered row"

    calls.clear()
    delivered = sum(len(b["id"]) for b in make_loader(0, 2, plan=plan, workers_count=2, backend="petastorm"))
    assert len(calls) == 2 * delivered < 2 * plan.catalog.scanned_rows / 2


def test_shuffle_rows_transform_spec_and_cache_pass_through(hive_dataset, tmp_path):
    from petastorm.transform import TransformSpec
    plan = plan_shards(hive_dataset.url, 2, batch_size=32, engine="local")
    plain = reader_ids(make_reader(0, 2, plan=plan))
    shuffled = reader_ids(make_reader(0, 2, plan=plan, shuffle_rows=True))
    assert sorted(plain) == sorted(shuffled) and not np.array_equal(plain, shuffled)
    assert np.array_equal(shuffled, reader_ids(make_reader(0, 2, plan=plan, shuffle_rows=True, workers_count=1)))
    cached = reader_ids(make_reader(0, 2, plan=plan, cache_type="local-disk", cache_location=str(tmp_path),
                                    cache_size_limit=10 ** 9, cache_row_size_estimate=100))
    assert np.array_equal(plain, cached)

    spec = TransformSpec(lambda frame: frame.assign(id=frame.id * 2))
    with make_reader(0, 2, plan=plan, transform_spec=spec, schema_fields=["id", "year"]) as reader:
        doubled = np.concatenate([b.id for b in reader])
    assert np.array_equal(doubled, plain * 2)


@pytest.mark.parametrize("name", ["cur_shard", "shard_count", "predicate", "num_epochs", "rowgroup_selector",
                                  "shuffle_row_groups", "shuffle_row_drop_partitions", "shard_seed", "filters"])
def test_owned_arguments_are_refused_with_what_to_do(hive_dataset, name):
    plan = plan_shards(hive_dataset.url, 2, batch_size=32, engine="local")
    with pytest.raises(ValueError, match=name) as error:
        make_reader(0, 2, plan=plan, **{name: 1})
    assert OWNED_ARGUMENTS[name] in str(error.value)
    with pytest.raises(TypeError, match="workers"):
        make_reader(0, 2, plan=plan, workers=2)


@pytest.fixture
def own_dataset(tmp_path):
    """A private dataset the test may damage."""
    return datagen.make_plain_dataset(tmp_path / "ds", num_files=4, total_rows=3000, seed=11)


def rewrite(info, relpath, row_group_rows):
    """Rewrite one file with the same rows cut into other row groups."""
    path = os.path.join(info.path, relpath)
    table = pq.read_table(path)
    with pq.ParquetWriter(path, table.schema) as writer:
        offset = 0
        for size in row_group_rows:
            writer.write_table(table.slice(offset, size), row_group_size=size)
            offset += size


def file_with_row_groups(info, at_least=2):
    return next((path, groups) for path, groups in ((f, [n for q, _, n in info.row_groups if q == f])
                                                     for f in info.files) if len(groups) >= at_least)


def test_fewer_row_groups_are_refused(own_dataset):
    plan = plan_shards(own_dataset.url, 1, batch_size=10, engine="local")
    path, groups = file_with_row_groups(own_dataset)
    rewrite(own_dataset, path, [sum(groups)])
    with pytest.raises(StalePlanError, match=f"row group {len(groups) - 1} of '{path}'|'{path}'.* rewritten since"):
        reader_ids(make_reader(0, 1, plan=plan))


def test_same_row_group_count_other_sizes_is_refused(own_dataset):
    plan = plan_shards(own_dataset.url, 1, batch_size=10, engine="local")
    path, groups = file_with_row_groups(own_dataset)
    rewrite(own_dataset, path, [groups[0] + 1, groups[1] - 1] + groups[2:])
    with pytest.raises(StalePlanError, match=r"row group \d has \d+ rows but the plan recorded|rewritten since"):
        reader_ids(make_reader(0, 1, plan=plan, workers_count=2))


def test_added_file_and_stale_plan_url_are_refused(own_dataset, tmp_path):
    plan = plan_shards(own_dataset.url, 1, batch_size=10, engine="local", output_url=str(tmp_path / "plan"))
    shutil.copy(os.path.join(own_dataset.path, own_dataset.files[0]), os.path.join(own_dataset.path, "extra.parquet"))
    with pytest.raises(StalePlanError, match="extra.parquet"):
        make_reader(0, 1, plan=plan)
    with pytest.raises(StalePlanError, match="extra.parquet"):
        make_loader(0, 1, plan=str(tmp_path / "plan"))


def test_list_columns_keep_one_representation_whatever_the_rows():
    """A variable-length list column is a list of Python lists even when this batch's lists are equal (G13: the
    type never depends on the rows); a fixed_size_list column is a (rows, size) array."""
    import pyarrow as pa

    from petastorm_balanced.reading.rows.fragments import as_list, to_columns
    table = pa.table({"equal": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int32())),
                      "ragged": pa.array([[1], [2, 3], None]),
                      "fixed": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int32(), 2))})
    out = to_columns(table.slice(1, 2))
    assert as_list(out["equal"]) == [[3, 4], [5, 6]] and as_list(out["ragged"]) == [[2, 3], None]
    assert out["fixed"].tolist() == [[3, 4], [5, 6]] and out["fixed"].dtype == np.int32
