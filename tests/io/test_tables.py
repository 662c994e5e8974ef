"""Delta Lake and Iceberg tables planned as snapshots (io/tables.py), with tables written by the real libraries.

The oracle is each library's own snapshot read (``DeltaTable(..., version=v)``, ``table.scan(snapshot_id=...)``),
compared by the ``id`` column with what ``make_loader`` delivers from the plan.
"""
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pytest

from petastorm_balanced import load_plan, make_loader, plan_shards
from petastorm_balanced.errors import InvalidTypeError, InvalidValueError, StalePlanError
from petastorm_balanced.io import tables
from petastorm_balanced.io.dataset import list_data_files
from tests.support.iceberg import iceberg_catalog

deltalake = pytest.importorskip("deltalake", reason="Delta tests need deltalake (pip install "
                                "'petastorm-balanced[delta]')")


def rows(start, stop, part=None):
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({"id": ids, "x": (ids * 3).astype(np.float64),
                     "p": pa.array([part or ("a" if i % 3 else "b") for i in ids.tolist()])})


def delta_ids(path, version=None):
    """The library's own read of one version (DataFusion, so it also works where pyarrow is too old for
    ``to_pyarrow_table``'s view types), as a sorted id array."""
    table = deltalake.DeltaTable(str(path), version=version)
    try:
        ids = table.to_pyarrow_table(columns=["id"]).column("id")
    except TypeError:  # pyarrow < 16: delta-rs's dataset export needs newer pyarrow
        reader = deltalake.QueryBuilder().register("t", table).execute("select id from t")
        ids = pa.RecordBatchReader._import_from_c_capsule(reader.__arrow_c_stream__()).read_all().column("id")
    return np.sort(np.asarray(ids.to_pylist(), dtype=np.int64))


def delivered_ids(plan, world=2, batch_size=4):
    """Every real (non-padding) id the ranks deliver for one epoch, sorted; each rank takes the same steps."""
    out, steps = [], set()
    for rank in range(world):
        loader = make_loader(rank, world, plan=plan, batch_size=batch_size, workers_count=1, padding_mask=True,
                             shuffle=False)
        count = 0
        for batch in loader:
            count += 1
            keep = ~batch["_padding"].numpy().astype(bool)
            out.append(batch["id"].numpy()[keep])
        steps.add(count)
    assert len(steps) == 1, f"ranks took different step counts {steps}"
    return np.sort(np.concatenate(out))


@pytest.fixture()
def delta_table(tmp_path):
    """A partitioned Delta table with history: v0 write, v1 append, v2 delete, v3 update, v4 overwrite-by-append.

    Returns (path, {version: sorted ids}); each version's ids come from deltalake itself.
    """
    path = tmp_path / "table"
    deltalake.write_deltalake(str(path), rows(0, 40), partition_by=["p"])
    deltalake.write_deltalake(str(path), rows(40, 60), mode="append", partition_by=["p"])
    table = deltalake.DeltaTable(str(path))
    table.delete("id % 5 = 0")
    table.update(updates={"x": "x + 1"}, predicate="id < 10")
    deltalake.write_deltalake(str(path), rows(100, 130), mode="append", partition_by=["p"])
    return path, {v: delta_ids(path, v) for v in range(5)}


def test_delta_latest_and_time_travel_deliver_exactly_the_versions_rows(delta_table):
    path, ids = delta_table
    latest = plan_shards(str(path), 2, engine="local", batch_size=4, policy="pad")
    assert latest.table.format == "delta" and latest.table.version == 4
    assert latest.total_rows == len(ids[4])
    np.testing.assert_array_equal(delivered_ids(latest), ids[4])
    for version in (0, 1, 2):
        plan = plan_shards(str(path), 2, engine="local", batch_size=4, policy="pad", table_version=version)
        assert plan.table.version == version
        np.testing.assert_array_equal(delivered_ids(plan), ids[version])
    # a bare listing would have planned the removed files too: the history left more rows on disk than v4 holds
    raw = plan_shards(str(path), 2, engine="local", table_format="parquet")
    assert raw.total_rows > latest.total_rows and raw.table.format == "parquet"


def test_delta_partition_values_match_pyarrow_dataset(delta_table):
    """Values, not only ids: each delivered row equals the version's row, partition column included."""
    path, _ = delta_table
    plan = plan_shards(str(path), 1, engine="local", batch_size=1, table_version=3)
    batches = list(make_loader(0, 1, plan=plan, batch_size=1, workers_count=1, shuffle=False))
    got = {int(b["id"][0]): (float(b["x"][0]), b["p"][0]) for b in batches}
    snap = tables.snapshot(plan.table)
    import pyarrow.dataset as ds
    expected = ds.dataset([f"{path}/{f.path}" for f in snap.files], partitioning="hive",
                          partition_base_dir=str(path)).to_table()
    want = {i: (x, p) for i, x, p in zip(*(expected.column(c).to_pylist() for c in ("id", "x", "p")), strict=True)}
    assert got == want
    assert {dict(f.partition_values)["p"] for f in snap.files} == {"a", "b"}


def test_delta_plan_survives_new_commits_and_vacuum_is_stale(delta_table, tmp_path):
    path, ids = delta_table
    plan = plan_shards(str(path), 2, engine="local", batch_size=4, policy="pad", table_version=1,
                       output_url=str(tmp_path / "plan"))
    document = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert document["dataset"]["table"] == {"format": "delta", "location": plan.dataset_url, "version": 1,
                                            "metadata": ""}
    deltalake.write_deltalake(str(path), rows(200, 210), mode="append", partition_by=["p"])  # the table moves on
    loaded = load_plan(str(tmp_path / "plan"))
    assert loaded.table == plan.table
    np.testing.assert_array_equal(delivered_ids(loaded), ids[1])
    assert load_plan(str(tmp_path / "plan"), dataset_url=str(path)).table.version == 1
    from petastorm_balanced.tools.cli import main
    assert main(["verify", str(tmp_path / "plan"), "--read"]) == 0  # footers and every row, of the snapshot
    deltalake.DeltaTable(str(path)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(StalePlanError, match=r"version 1 is gone|gone \(vacuumed"):
        load_plan(str(tmp_path / "plan"))


def test_delta_changed_file_is_stale(delta_table, tmp_path):
    path, _ = delta_table
    plan = plan_shards(str(path), 1, engine="local", output_url=str(tmp_path / "plan"))
    victim = path / plan.catalog.files[0].path
    with open(victim, "ab") as handle:
        handle.write(b"x")
    with pytest.raises(StalePlanError, match=plan.catalog.files[0].path):
        load_plan(str(tmp_path / "plan"))


def test_delta_folder_is_never_listed_as_bare_parquet(delta_table):
    path, _ = delta_table
    with pytest.raises(InvalidValueError, match="is a Delta table.*table_format='parquet'"):
        list_data_files(str(path))
    _, _, raw = list_data_files(str(path), table=tables.TableRef("parquet", str(path)))
    assert len(raw) > len(tables.snapshot(tables.resolve(str(path)).ref).files)


@pytest.mark.parametrize("kwargs, error, text", [
    ({"table_version": -1}, InvalidValueError, "table_version=-1 must be >= 0"),
    ({"table_version": "3"}, InvalidTypeError, "table_version must be an int"),
    ({"table_version": True}, InvalidTypeError, "table_version must be an int"),
    ({"snapshot_id": 5}, InvalidValueError, "snapshot_id=5 needs an Iceberg table.*table_version="),
    ({"snapshot_id": 1.5}, InvalidTypeError, "snapshot_id must be an int"),
    ({"table_format": "orc"}, InvalidValueError, "table_format='orc' is not one of"),
    ({"table_format": "iceberg"}, InvalidValueError, "table_format='iceberg' but .* is a delta table"),
    ({"table_format": "parquet", "table_version": 1}, InvalidValueError, "takes no table_version"),
    ({"table_version": 99}, InvalidValueError, "table_version=99 is past the latest version 4"),
])
def test_delta_bad_parameters_name_the_parameter(delta_table, kwargs, error, text):
    path, _ = delta_table
    with pytest.raises(error, match=text):
        plan_shards(str(path), 2, engine="local", **kwargs)


def test_version_on_a_plain_folder_is_refused(plain_dataset):
    with pytest.raises(InvalidValueError, match="table_version=1 needs a Delta table"):
        plan_shards(plain_dataset.url, 2, engine="local", table_version=1)


def _commit(path, version, actions):
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json"), "w") as out:
        out.write("\n".join(json.dumps(a) for a in actions) + "\n")


def test_delta_column_mapping_is_refused(delta_table):
    path, _ = delta_table
    table = deltalake.DeltaTable(str(path))
    metadata = table.metadata()
    _commit(path, 5, [{"metaData": {"id": metadata.id, "format": {"provider": "parquet", "options": {}},
                                    "schemaString": table.schema().to_json(), "partitionColumns": ["p"],
                                    "configuration": {"delta.columnMapping.mode": "name"},
                                    "createdTime": 1}}])
    with pytest.raises(InvalidValueError, match="version 5 uses column mapping"):
        plan_shards(str(path), 2, engine="local")
    assert plan_shards(str(path), 2, engine="local", table_version=4).table.version == 4  # older versions plan


def _z85(data: bytes) -> str:
    chars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        out.append("".join(chars[value // 85 ** k % 85] for k in range(4, -1, -1)))
    return "".join(out)


def test_delta_deletion_vectors_are_refused_not_ignored(tmp_path):
    """A deletion vector (inline, as Spark/Databricks write them) hides rows that stay in the file: refused."""
    pyroaring = pytest.importorskip("pyroaring")
    path = tmp_path / "dv"
    deltalake.write_deltalake(str(path), rows(0, 20))
    table = deltalake.DeltaTable(str(path))
    add = pa.table(table.get_add_actions(flatten=False)).to_pylist()[0]
    bitmap = pyroaring.BitMap([1, 5]).serialize()
    payload = (1681511377).to_bytes(4, "little") + (1).to_bytes(8, "little") + (0).to_bytes(4, "little") + bitmap
    payload += b"\0" * (-len(payload) % 4)
    dv = {"storageType": "i", "pathOrInlineDv": _z85(payload), "sizeInBytes": len(payload), "cardinality": 2}
    _commit(path, 1, [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
        {"remove": {"path": add["path"], "deletionTimestamp": 2, "dataChange": True}},
        {"add": {"path": add["path"], "size": add["size_bytes"], "partitionValues": {}, "modificationTime": 2,
                 "dataChange": True, "deletionVector": dv, "stats": json.dumps({"numRecords": 20})}}])
    try:
        assert len(delta_ids(path, 1)) == 18  # a library that reads the vector hides 2 rows: we must not deliver 20
    except deltalake.exceptions.DeltaError as exc:  # delta-rs 1.x refuses the reader feature itself
        assert "deletionVectors" in str(exc)
    with pytest.raises(InvalidValueError, match="version 1 has deletion vectors"):
        plan_shards(str(path), 1, engine="local")
    assert plan_shards(str(path), 1, engine="local", table_version=0).total_rows == 20


def test_table_ref_json_round_trip_and_corrupt_refs_refused():
    ref = tables.TableRef("iceberg", "file:///t", 12, "file:///t/metadata/v2.metadata.json")
    assert tables.TableRef.from_json(ref.to_json()) == ref
    for bad in ({"format": "orc", "location": "x", "version": 1, "metadata": ""},
                {"format": "delta", "location": "x", "version": None, "metadata": ""}):
        with pytest.raises(ValueError):
            tables.TableRef.from_json(bad)


# ---------------------------------------------------------------------------------------------- Iceberg

def iceberg_ids(table, snapshot_id):
    return np.sort(table.scan(snapshot_id=snapshot_id).to_arrow().column("id").to_numpy())


@pytest.fixture()
def iceberg_table(tmp_path):
    """An identity-partitioned Iceberg table: append, append, delete, overwrite; (table, [(snapshot id, ids)])."""
    catalog = iceberg_catalog(tmp_path)
    table = catalog.create_table("db.t", schema=rows(0, 1).schema)
    with table.update_spec() as spec:
        spec.add_identity("p")
    history = []
    for step in (lambda t: t.append(rows(0, 40)), lambda t: t.append(rows(40, 60)),
                 lambda t: t.delete("id < 10"), lambda t: t.overwrite(rows(300, 330, "c"))):
        step(table)
        table = catalog.load_table("db.t")
        sid = table.current_snapshot().snapshot_id
        history.append((sid, iceberg_ids(table, sid)))
    return table, history


def test_iceberg_snapshots_deliver_exactly_their_rows(iceberg_table):
    table, history = iceberg_table
    current = plan_shards(table, 2, engine="local", batch_size=4, policy="pad")
    assert current.table.format == "iceberg" and current.table.version == history[-1][0]
    np.testing.assert_array_equal(delivered_ids(current), history[-1][1])
    for sid, ids in history[:-1]:
        by_url = plan_shards(table.metadata_location, 2, engine="local", batch_size=4, policy="pad",
                             snapshot_id=sid)
        np.testing.assert_array_equal(delivered_ids(by_url), ids)
    with pytest.raises(InvalidValueError, match="snapshot_id=7 is not a snapshot"):
        plan_shards(table, 2, engine="local", snapshot_id=7)
    with pytest.raises(InvalidValueError, match="table_version=1 needs a Delta table.*snapshot_id="):
        plan_shards(table, 2, engine="local", table_version=1)


def test_iceberg_plan_survives_commits_and_expired_file_is_stale(iceberg_table, tmp_path):
    table, history = iceberg_table
    sid, ids = history[1]
    plan_shards(table, 2, engine="local", batch_size=4, policy="pad", snapshot_id=sid,
                output_url=str(tmp_path / "plan"))
    table.append(rows(500, 520))
    loaded = load_plan(str(tmp_path / "plan"), dataset_url=table.metadata_location)  # a later metadata JSON
    assert load_plan(str(tmp_path / "plan"), dataset_url=table).table == loaded.table
    np.testing.assert_array_equal(delivered_ids(loaded), ids)
    gone = tables.snapshot(loaded.table).files[0].path
    os.remove(os.path.join(loaded.dataset_url[len("file://"):], gone))  # what an expiry with file cleanup does
    with pytest.raises(StalePlanError, match=gone):
        load_plan(str(tmp_path / "plan"))


def _commit_delete_file(catalog, table, content, rows_of_file, **fields):
    """Commit a merge-on-read delete file as Spark or Flink would (pyiceberg itself only writes copy-on-write
    deletes): the file is written with pyarrow and committed through pyiceberg's own snapshot producer, its
    manifest marked as a delete manifest. Returns the reloaded table."""
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, ManifestContent, ManifestWriterV2
    data = next(t.file for t in table.scan().plan_files() if t.file.record_count >= 4)
    local = data.file_path[len("file://"):]
    path = os.path.join(os.path.dirname(local), f"delete-{content.name.lower()}.parquet")
    pq.write_table(rows_of_file(data), path)
    delete = DataFile.from_args(content=content, file_path="file://" + path, file_format=data.file_format,
                                partition=data.partition, record_count=pq.read_metadata(path).num_rows,
                                file_size_in_bytes=os.path.getsize(path), spec_id=data.spec_id, **fields)
    real = ManifestWriterV2.content
    ManifestWriterV2.content = lambda self: ManifestContent.DELETES
    try:
        with table.transaction() as transaction:
            with transaction.update_snapshot().fast_append() as append:
                append.append_data_file(delete)
    finally:
        ManifestWriterV2.content = real
    return catalog.load_table("db.t"), data


def test_iceberg_position_deletes_are_honoured(tmp_path):
    """Rows a position delete file removes stay in the Parquet file; the plan must never deliver them, on the
    rows pyiceberg's own read returns."""
    _position_deleted_table(tmp_path)


def _position_deleted_table(tmp_path):
    """An Iceberg table with a position delete file of 3 rows, its local plan, and pyiceberg's ids (checked)."""
    from pyiceberg.manifest import DataFileContent
    catalog = iceberg_catalog(tmp_path)
    table = catalog.create_table("db.t", schema=rows(0, 1).schema, properties={"format-version": "2"})
    with table.update_spec() as spec:
        spec.add_identity("p")
    table = catalog.load_table("db.t")
    table.append(rows(0, 60))
    table, data = _commit_delete_file(catalog, table, DataFileContent.POSITION_DELETES, lambda data: pa.table(
        {"file_path": [data.file_path] * 3, "pos": pa.array([0, 2, 3], pa.int64())}))
    sid = table.current_snapshot().snapshot_id
    expected = iceberg_ids(table, sid)
    assert len(expected) == 57  # pyiceberg applies the delete file
    plan = plan_shards(table, 2, engine="local", batch_size=4, policy="pad")
    assert plan.total_rows == 57
    np.testing.assert_array_equal(delivered_ids(plan), expected)
    snap = tables.snapshot(plan.table)
    assert [len(f.deleted_rows) for f in snap.files if f.deleted_rows] == [3]
    return table, plan, expected


@pytest.mark.slow
def test_spark_applies_the_same_position_deletes(tmp_path, spark):
    from petastorm_balanced.plan.format import content_checksum
    table, local, expected = _position_deleted_table(tmp_path)
    on_spark = plan_shards(table, 2, engine="spark", spark=spark, batch_size=4, policy="pad")
    assert content_checksum(on_spark) == content_checksum(local)
    where = plan_shards(table, 2, engine="spark", spark=spark, where="id < 30")
    np.testing.assert_array_equal(delivered_ids(where, world=1, batch_size=1), expected[expected < 30])
    with pytest.raises(InvalidValueError, match="position deletes that Spark would count"):
        plan_shards(table, 2, engine="spark", spark=spark, cost="x * 2")
    costed = plan_shards(table, 2, engine="spark", spark=spark, cost="id")
    assert costed.catalog.cost_sums().sum() == expected.sum()


def test_iceberg_equality_deletes_are_refused_not_ignored(iceberg_table):
    from pyiceberg.catalog.sql import SqlCatalog  # noqa: F401 - the fixture's catalog module
    from pyiceberg.manifest import DataFileContent
    table, history = iceberg_table
    catalog = table.catalog
    table, _ = _commit_delete_file(catalog, table, DataFileContent.EQUALITY_DELETES,
                                   lambda data: pa.table({"id": pa.array([45], pa.int64())}), equality_ids=[1])
    with pytest.raises(InvalidValueError, match="equality deletes"):
        plan_shards(table, 2, engine="local")
    assert plan_shards(table, 2, engine="local", snapshot_id=history[-1][0]).total_rows == len(history[-1][1])


# ---------------------------------------------------------------------------------------------- Spark (G8)

@pytest.mark.slow
def test_spark_plans_the_same_delta_snapshot(delta_table, spark):
    path, ids = delta_table
    for version in (1, 4):
        local = plan_shards(str(path), 2, engine="local", batch_size=4, table_version=version)
        on_spark = plan_shards(str(path), 2, engine="spark", spark=spark, batch_size=4, table_version=version)
        from petastorm_balanced.plan.format import content_checksum
        assert content_checksum(on_spark) == content_checksum(local)
        where = plan_shards(str(path), 2, engine="spark", spark=spark, where="id % 2 = 0", table_version=version)
        assert where.total_rows == int((ids[version] % 2 == 0).sum())
        np.testing.assert_array_equal(delivered_ids(where, world=1, batch_size=1), ids[version][ids[version] % 2 == 0])


@pytest.mark.slow
def test_spark_plans_the_same_iceberg_snapshot(iceberg_table, spark):
    table, history = iceberg_table
    from petastorm_balanced.plan.format import content_checksum
    sid, ids = history[2]
    local = plan_shards(table, 2, engine="local", batch_size=4, snapshot_id=sid)
    on_spark = plan_shards(table, 2, engine="spark", spark=spark, batch_size=4, snapshot_id=sid)
    assert content_checksum(on_spark) == content_checksum(local)
    where = plan_shards(table, 2, engine="spark", spark=spark, where="id >= 30", snapshot_id=sid)
    np.testing.assert_array_equal(delivered_ids(where, world=1, batch_size=1), ids[ids >= 30])


def test_moved_table_copy_keeps_its_relative_paths(delta_table, tmp_path):
    """A copied table is the same snapshot at a new location: its plan addresses files relative to the table."""
    path, ids = delta_table
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    plan = plan_shards(str(copy), 1, engine="local", table_version=2)
    assert plan.dataset_url.endswith("/copy")
    np.testing.assert_array_equal(delivered_ids(plan, world=1, batch_size=1), ids[2])


def test_cli_plans_a_version_and_inspect_shows_it(delta_table, tmp_path, capsys):
    from petastorm_balanced.tools.cli import main
    path, ids = delta_table
    out = str(tmp_path / "plan")
    assert main(["plan", str(path), "--world-size", "2", "--engine", "local", "--table-version", "2",
                 "--output", out]) == 0
    assert load_plan(out).total_rows == len(ids[2])
    capsys.readouterr()
    assert main(["inspect", out]) == 0
    text = capsys.readouterr().out
    assert f"table Delta table {load_plan(out).dataset_url} version 2" in text
    assert main(["inspect", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["table"]["version"] == 2
    assert main(["plan", str(path), "--world-size", "2", "--engine", "local", "--table-version", "-3",
                 "--output", out]) == 2
    assert "table_version=-3 must be >= 0" in capsys.readouterr().err
    assert main(["compare", str(path), "--world-size", "2", "--table-version", "1"]) == 0
