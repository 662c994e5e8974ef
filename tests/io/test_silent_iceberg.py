"""Iceberg columns are identified by field id: a snapshot whose files store a column under another name than the
snapshot's schema (renamed, swapped, dropped and re-added, added) is refused naming the table, the file and the
field; an evolution a read by name serves exactly (a type promotion) gives pyiceberg's own scan values."""
import numpy as np
import pyarrow as pa
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError
from tests.support.iceberg import iceberg_catalog

pytest.importorskip("pyiceberg", reason="Iceberg tests need pyiceberg (pip install 'petastorm-balanced[iceberg]')")
if tuple(int(v) for v in pa.__version__.split(".")[:2]) < (17, 0):
    pytest.skip(f"pyiceberg writes Parquet with options pyarrow {pa.__version__} lacks (needs pyarrow >= 17; the "
                "modern stack runs these tests)", allow_module_level=True)


@pytest.fixture()
def table(tmp_path):
    catalog = iceberg_catalog(tmp_path)
    ids = np.arange(100, dtype=np.int64)
    data = pa.table({"id": ids, "a": ids * 10, "b": -ids, "n": pa.array(ids, pa.int32())})
    created = catalog.create_table("db.t", schema=data.schema)
    created.append(data)
    return catalog, catalog.load_table("db.t")


def scan(table):
    return table.scan().to_arrow().sort_by("id")


def delivered(plan, columns):
    out = {c: [] for c in columns}
    for batch in make_loader(0, 1, plan=plan, batch_size=10, shuffle=False, workers_count=1):
        for c in columns:
            out[c].extend(np.asarray(batch[c]).tolist())
    order = np.argsort(out["id"])
    return {c: np.asarray(v)[order].tolist() for c, v in out.items()}


def test_a_rename_swap_is_refused_naming_the_field(table):
    catalog, t = table
    with t.update_schema() as update:
        update.rename_column("a", "tmp")
    with catalog.load_table("db.t").update_schema() as update:
        update.rename_column("b", "a")
    with catalog.load_table("db.t").update_schema() as update:
        update.rename_column("tmp", "b")
    t = catalog.load_table("db.t")
    assert scan(t).column("a").to_pylist()[:3] == [0, -1, -2]  # pyiceberg: by field id, the values swapped names
    with pytest.raises(InvalidValueError, match=r"stores field id \d+ as column 'a', which the table now calls 'b'"):
        plan_shards(t, 1, engine="local", batch_size=10)


def test_a_dropped_and_re_added_column_is_refused(table):
    from pyiceberg.types import LongType
    catalog, t = table
    with t.update_schema() as update:
        update.delete_column("a")
    with catalog.load_table("db.t").update_schema() as update:
        update.add_column("a", LongType())
    t = catalog.load_table("db.t")
    assert scan(t).column("a").null_count == 100  # pyiceberg: the re-added column holds no value yet
    with pytest.raises(InvalidValueError, match=r"'a'.*dropped and re-added.*deleted values"):
        plan_shards(t, 1, engine="local", batch_size=10)


def test_a_renamed_column_is_refused(table):
    catalog, t = table
    with t.update_schema() as update:
        update.rename_column("b", "c")
    t = catalog.load_table("db.t")
    with pytest.raises(InvalidValueError, match=r"db.t|as column 'b', which the table now calls 'c'"):
        plan_shards(t, 1, engine="local", batch_size=10)


def test_an_added_column_is_refused_rather_than_a_schema_mismatch(table):
    from pyiceberg.types import LongType
    catalog, t = table
    with t.update_schema() as update:
        update.add_column("extra", LongType())
    t = catalog.load_table("db.t")
    with pytest.raises(InvalidValueError, match=r"lacks column\(s\) \['extra'\]"):
        plan_shards(t, 1, engine="local", batch_size=10)


def test_a_type_promotion_is_served_as_pyiceberg_scans_it(table):
    from pyiceberg.types import LongType
    catalog, t = table
    with t.update_schema() as update:
        update.update_column("n", LongType())
    t = catalog.load_table("db.t")
    ids = np.arange(100, 150, dtype=np.int64)
    t.append(pa.table({"id": ids, "a": ids * 10, "b": -ids, "n": ids * 2**33}))
    t = catalog.load_table("db.t")
    expected = scan(t)
    got = delivered(plan_shards(t, 1, engine="local", batch_size=10), ["id", "a", "b", "n"])
    assert got == {c: expected.column(c).to_pylist() for c in ["id", "a", "b", "n"]}
