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


def test_identity_partitions_are_read_from_the_files_as_pyiceberg_reads_them(tmp_path):
    """A string identity partition holding '007', '01' and '1' sits in folders s=007, s=01, s=1; the values are the
    files' own ('007', not 7), and a predicate over the partition columns sees them too."""
    from petastorm_balanced.predicates import in_lambda
    catalog = iceberg_catalog(tmp_path)
    data = pa.table({"id": pa.array(range(7), pa.int64()), "s": ["007", "01", "1", "1", "a b", "007", None],
                     "k": pa.array([5, 5, 7, 8, 8, 9, None], pa.int64())})
    t = catalog.create_table("db.p", schema=data.schema)
    with t.update_spec() as update:
        update.add_identity("s")
        update.add_identity("k")
    t = catalog.load_table("db.p")
    t.append(data)
    want = scan(t)
    got = {c: [] for c in ["id", "s", "k"]}
    for batch in make_loader(0, 1, plan=plan_shards(t, 1, engine="local", batch_size=1), batch_size=1,
                             shuffle=False, workers_count=1):
        for c in got:
            got[c].extend(np.asarray(batch[c]).tolist())
    order = np.argsort(got["id"])
    got = {c: np.asarray(v, dtype=object)[order].tolist() for c, v in got.items()}
    assert got["s"] == want.column("s").to_pylist() and got["id"] == list(range(7))
    assert got["k"][:6] == want.column("k").to_pylist()[:6] and want.column("k")[6].as_py() is None
    plan = plan_shards(t, 1, engine="local", batch_size=1, predicate=in_lambda(["s", "k"], lambda s, k: s == "01"
                                                                                  or k == 9))
    assert sorted(int(i) for b in make_loader(0, 1, plan=plan, batch_size=1, workers_count=1) for i in b["id"]) \
        == [1, 5]


@pytest.mark.slow
def test_a_spark_where_over_identity_partitions_sees_the_files_values(tmp_path, spark):
    """Spark reads the snapshot's files without a basePath: the identity partition columns are the files' own (no
    folder text: '007' stays a string, pyiceberg's 'a+b' folder is 'a b')."""
    catalog = iceberg_catalog(tmp_path)
    data = pa.table({"id": pa.array(range(6), pa.int64()), "s": ["007", "01", "1", "1", "a b", "007"]})
    t = catalog.create_table("db.p", schema=data.schema)
    with t.update_spec() as update:
        update.add_identity("s")
    t = catalog.load_table("db.p")
    t.append(data)
    for where, want in [("s = '007'", [0, 5]), ("s = 'a b'", [4]), ("s = '1'", [2, 3])]:
        plan = plan_shards(t, 1, engine="spark", spark=spark, batch_size=1, where=where)
        got = sorted(int(i) for b in make_loader(0, 1, plan=plan, batch_size=1, workers_count=1) for i in b["id"])
        assert got == want, where
