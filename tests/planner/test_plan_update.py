"""Plan updates (``plan_shards(update=)``, ``plan --update``): a dataset that only gained files gets the plan planning
from scratch would write (same checksum), reading only the added files; every other change is refused by name.

Datasets grow here as they do in use: files of a full dataset are held back, the old plan is made, and the held-back
files are copied in (``shutil.copy2``, which keeps the planned files untouched).
"""
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import PlanUpdateError, load_plan, make_loader, plan_shards
from petastorm_balanced.datagen import make_plain_dataset
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.planner import scan as scan_module
from petastorm_balanced.predicates import in_set
from petastorm_balanced.tools import cli
from tests.support.iceberg import iceberg_catalog

WORLD, BATCH = 3, 8
EN = in_set(["en"], "lang")
YEAR = in_set([2021, 2022], "year")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A hive dataset of 9 files in year=2020..2022 (the full, grown dataset)."""
    return make_plain_dataset(tmp_path_factory.mktemp("grow") / "src", num_files=9, total_rows=8_000, seed=2,
                              hive=True, min_row_group_rows=64, max_row_group_rows=700)


def data_files(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names
                  if n.endswith(".parquet"))


class Growing:
    """A copy of ``source`` without ``held`` files; ``grow()`` copies them in."""

    def __init__(self, source, folder, held):
        self.source, self.url, self.held = str(source), str(folder), held
        shutil.copytree(self.source, self.url)
        for path in held:
            os.remove(os.path.join(self.url, path))

    def grow(self):
        for path in self.held:
            os.makedirs(os.path.dirname(os.path.join(self.url, path)), exist_ok=True)
            shutil.copy2(os.path.join(self.source, path), os.path.join(self.url, path))


@pytest.fixture()
def new_partition(source, tmp_path):
    """The dataset before the year=2022 partition arrived."""
    return Growing(source.path, tmp_path / "ds", [p for p in data_files(source.path) if p.startswith("year=2022")])


def updated_and_scratch(ds, **kwargs):
    old = plan_shards(ds.url, WORLD, batch_size=BATCH, engine="local", **kwargs)
    ds.grow()
    new = plan_shards(ds.url, WORLD, batch_size=BATCH, engine="local", update=old, **kwargs)
    scratch = plan_shards(ds.url, WORLD, batch_size=BATCH, engine="local", **kwargs)
    return old, new, scratch


@pytest.mark.parametrize("kwargs", [{}, {"predicate": EN}, {"predicate": YEAR}, {"cost": "length(text)"},
                                    {"predicate": EN, "cost": "label"}, {"policy": "pad", "seed": 5}],
                         ids=["hive", "predicate", "partition-predicate", "cost", "predicate-cost", "pad-seed"])
def test_update_equals_planning_from_scratch(new_partition, kwargs):
    old, new, scratch = updated_and_scratch(new_partition, **kwargs)
    assert new.checksum == scratch.checksum
    assert new.catalog == scratch.catalog and new.dataset_fingerprint == scratch.dataset_fingerprint
    assert new.total_rows > old.total_rows
    assert new.extends == (old.checksum,) and scratch.extends == ()
    assert all(new.assignment(r, epoch=1) == scratch.assignment(r, epoch=1) for r in range(WORLD))


def test_update_reads_only_the_added_footers(new_partition, monkeypatch):
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local")
    new_partition.grow()
    read = []
    real = scan_module.read_footer

    def counting(filesystem, path):
        read.append(path)
        return real(filesystem, path)

    monkeypatch.setattr(scan_module, "read_footer", counting)
    plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", update=old)
    added = {os.path.join(new_partition.url, p) for p in new_partition.held}
    # every added footer, plus one planned and one added footer for the schema comparison
    assert set(read) - added == {os.path.join(new_partition.url, old.catalog.files[0].path)}
    assert len(read) == len(added) + 2


def test_update_saved_loads_and_chains(new_partition, tmp_path):
    """An update of an update, through saved plans: the same checksums as from scratch, each lineage recorded."""
    ds = new_partition
    later = ds.held[1:]
    ds.held = ds.held[:1]
    plan_shards(ds.url, WORLD, batch_size=BATCH, engine="local", output_url=str(tmp_path / "p0"))
    ds.grow()
    p1 = plan_shards(ds.url, WORLD, batch_size=BATCH, engine="local", update=str(tmp_path / "p0"),
                     output_url=str(tmp_path / "p1"))
    ds.held = later
    ds.grow()
    p2 = plan_shards(ds.url, WORLD, batch_size=BATCH, engine="local", update=str(tmp_path / "p1"),
                     output_url=str(tmp_path / "p2"))
    loaded = load_plan(str(tmp_path / "p2"))
    assert loaded.checksum == p2.checksum == plan_shards(ds.url, WORLD, batch_size=BATCH, engine="local").checksum
    assert loaded.extends == (load_plan(str(tmp_path / "p0"), check_dataset=False).checksum, p1.checksum)
    with open(tmp_path / "p2" / "plan.json") as handle:
        assert json.load(handle)["extends"] == list(loaded.extends)


def test_nothing_added_gives_the_same_plan(new_partition):
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", predicate=EN)
    again = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", predicate=EN, update=old)
    assert again.checksum == old.checksum and again.extends == (old.checksum,)


def test_added_files_matching_nothing_with_a_cost(new_partition):
    """Added files none of whose rows match still join the file list (the fingerprint), with no row group."""
    old, new, scratch = updated_and_scratch(new_partition, predicate=in_set([2020, 2021], "year"), cost="label")
    assert new.checksum == scratch.checksum and new.total_rows == old.total_rows


# ------------------------------------------------------------------------------------------------ refusals

def test_removed_file_is_refused_by_name(new_partition):
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local")
    new_partition.grow()
    gone = old.catalog.files[2].path
    os.remove(os.path.join(new_partition.url, gone))
    with pytest.raises(PlanUpdateError, match=f"'{gone}' was removed.*plan from scratch"):
        plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", update=old)


def test_resized_file_is_refused_by_name(new_partition):
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local")
    changed = old.catalog.files[1].path
    path = os.path.join(new_partition.url, changed)
    pq.write_table(pq.read_table(path).slice(1), path)
    with pytest.raises(PlanUpdateError, match=f"'{changed}' changed size"):
        plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", update=old)


def test_rewrite_of_the_same_size_is_refused_by_its_modification_time(new_partition):
    """G15: a file written again with the same size and footer (here its own bytes) is told by its modification
    time."""
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", predicate=EN)
    new_partition.grow()
    rewritten = old.catalog.files[3].path
    path = os.path.join(new_partition.url, rewritten)
    with open(path, "rb") as handle:
        data = handle.read()
    before = os.stat(path).st_mtime_ns
    os.remove(path)
    with open(path, "wb") as handle:
        handle.write(data)
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))  # coarse clocks: a visibly later time
    with pytest.raises(PlanUpdateError, match=f"'{rewritten}' was rewritten.*modification time"):
        plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", predicate=EN, update=old)


def test_touched_file_is_refused(new_partition):
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local")
    touched = old.catalog.files[0].path
    path = os.path.join(new_partition.url, touched)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 5_000_000_000))
    with pytest.raises(PlanUpdateError, match=f"'{touched}' was rewritten"):
        plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", update=old)


@pytest.mark.parametrize("change, name", [
    ({"world_size": WORLD + 1}, "world_size"), ({"batch_size": BATCH * 2}, "batch_size"),
    ({"policy": "pad"}, "policy"), ({"seed": 9}, "seed"), ({"predicate": YEAR}, "where/predicate"),
    ({"predicate": None}, "where/predicate"), ({"cost": "label"}, "cost"), ({"cost": None}, "cost"),
])
def test_other_parameters_are_refused_by_name(new_partition, change, name):
    base = {"world_size": WORLD, "batch_size": BATCH, "policy": "drop", "seed": 0, "predicate": EN,
            "cost": "length(text)"}
    old = plan_shards(new_partition.url, engine="local", **base)
    new_partition.grow()
    given = {**base, **change}
    with pytest.raises(PlanUpdateError, match=f"^{name} is .* but the plan to update was made with"):
        plan_shards(new_partition.url, engine="local", update=old, **given)


def test_another_dataset_is_refused(new_partition, source):
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local")
    with pytest.raises(PlanUpdateError, match="^dataset_url is"):
        plan_shards(source.url, WORLD, batch_size=BATCH, engine="local", update=old)


def test_added_file_of_another_schema_is_refused(new_partition):
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local")
    path = os.path.join(new_partition.url, "year=2020", "extra.parquet")
    first = os.path.join(new_partition.url, old.catalog.files[0].path)
    table = pq.read_table(first, partitioning=None)
    pq.write_table(table.append_column("more", pa.array(np.zeros(table.num_rows))), path)
    with pytest.raises((PlanUpdateError, InvalidValueError), match="extra.parquet"):
        plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", update=old)
    pq.write_table(table.set_column(0, "id", table.column("id").cast(pa.int32())), path)  # same names, other type
    with pytest.raises(PlanUpdateError, match="'year=2020/extra.parquet' has schema"):
        plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", update=old)


def test_partition_type_change_is_refused_when_the_filter_reads_it(new_partition):
    """year=abc makes 'year' a string column: a predicate on it sees other values in the planned files."""
    old = plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", predicate=YEAR)
    planned = old.catalog.files[0].path
    os.makedirs(os.path.join(new_partition.url, "year=abc"))
    shutil.copy2(os.path.join(new_partition.url, planned),
                 os.path.join(new_partition.url, "year=abc", os.path.basename(planned)))
    with pytest.raises(PlanUpdateError, match="partition column 'year' change its type from int32 to string"):
        plan_shards(new_partition.url, WORLD, batch_size=BATCH, engine="local", predicate=YEAR, update=old)


def test_new_partition_column_is_refused(tmp_path):
    make_plain_dataset(tmp_path / "ds", num_files=3, total_rows=600, seed=4)
    old = plan_shards(str(tmp_path / "ds"), 2, engine="local")
    first = data_files(str(tmp_path / "ds"))[0]
    os.makedirs(tmp_path / "ds" / "region=eu")
    shutil.copy2(tmp_path / "ds" / first, tmp_path / "ds" / "region=eu" / "new.parquet")
    with pytest.raises(PlanUpdateError, match="change the hive partition columns.*'region'"):
        plan_shards(str(tmp_path / "ds"), 2, engine="local", update=old)


# ------------------------------------------------------------------------------------------------ CLI

def test_cli_update_writes_the_scratch_plan_and_refuses_with_exit_2(new_partition, tmp_path, capsys):
    ds = new_partition
    assert cli.main(["plan", ds.url, "--world-size", str(WORLD), "--engine", "local", "--cost", "label",
                     "--output", str(tmp_path / "old")]) == 0
    ds.grow()
    assert cli.main(["plan", ds.url, "--world-size", str(WORLD), "--engine", "local", "--cost", "label",
                     "--output", str(tmp_path / "new"), "--update", str(tmp_path / "old")]) == 0
    assert "updated file://" in capsys.readouterr().out
    scratch = plan_shards(ds.url, WORLD, engine="local", cost="label")
    assert load_plan(str(tmp_path / "new")).checksum == scratch.checksum
    assert cli.main(["plan", ds.url, "--world-size", str(WORLD), "--engine", "local", "--output",
                     str(tmp_path / "bad"), "--update", str(tmp_path / "old")]) == 2
    err = capsys.readouterr().err
    assert "cost is None but the plan to update was made with 'label'" in err and "plan from scratch" in err
    assert not os.path.exists(tmp_path / "bad")


# ------------------------------------------------------------------------------------------------ loader state

def _ids(loader):
    return [b["id"].numpy().tolist() for b in loader]


def test_loader_state_across_an_update_at_an_epoch_boundary(new_partition):
    """A state saved at the end of an epoch on the old plan resumes on the updated plan: the next epoch is the
    updated plan's, the added rows included; a state saved mid-epoch is refused."""
    torch = pytest.importorskip("torch")
    del torch
    ds = new_partition
    old = plan_shards(ds.url, 2, batch_size=BATCH, engine="local")
    loader = make_loader(0, 2, plan=old, workers_count=1)
    _ids(loader)  # epoch 0, whole
    at_boundary = loader.state_dict()
    assert (at_boundary["epoch"], at_boundary["batches"]) == (1, 0)
    mid = make_loader(0, 2, plan=old, workers_count=1)
    iterator = iter(mid)
    next(iterator)
    next(iterator)
    mid_state = mid.state_dict()
    del iterator
    ds.grow()
    new = plan_shards(ds.url, 2, batch_size=BATCH, engine="local", update=old)
    resumed = make_loader(0, 2, plan=new, workers_count=1)
    resumed.load_state_dict(at_boundary)
    fresh = make_loader(0, 2, plan=new, epoch=1, workers_count=1)
    got, want = _ids(resumed), _ids(fresh)
    assert got == want and len(got) == new.steps_per_epoch() > old.steps_per_epoch()
    added = set(pq.read_table(os.path.join(ds.url, ds.held[0]), columns=["id"]).column("id").to_pylist())
    assert added & {i for batch in got for i in batch}  # the added rows join from this epoch
    refused = make_loader(0, 2, plan=new, workers_count=1)
    with pytest.raises(InvalidValueError, match=r"saved mid-epoch on the plan this plan updates"):
        refused.load_state_dict(mid_state)
    scratch = plan_shards(ds.url, 2, batch_size=BATCH, engine="local")  # no lineage: the old state is another plan's
    with pytest.raises(InvalidValueError, match="plan_checksum"):
        make_loader(0, 2, plan=scratch, workers_count=1).load_state_dict(at_boundary)


def test_state_at_a_sub_epoch_boundary_inside_a_pass_is_refused(new_partition):
    pytest.importorskip("torch")
    ds = new_partition
    old = plan_shards(ds.url, 2, batch_size=BATCH, engine="local")
    loader = make_loader(0, 2, plan=old, workers_count=1, partition_epoch=2)
    _ids(loader)  # part 0 of pass 0
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    ds.grow()
    new = plan_shards(ds.url, 2, batch_size=BATCH, engine="local", update=old)
    with pytest.raises(InvalidValueError, match="start of a pass"):
        make_loader(0, 2, plan=new, workers_count=1, partition_epoch=2).load_state_dict(state)


# ------------------------------------------------------------------------------------------------ tables

def _delta():
    return pytest.importorskip("deltalake", reason="Delta tests need deltalake (pip install "
                               "'petastorm-balanced[delta]')")


def _rows(start, stop, part=None):
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({"id": ids, "x": (ids * 3).astype(np.float64),
                     "p": pa.array([part or ("a" if i % 3 else "b") for i in ids.tolist()])})


def test_delta_append_updates_to_the_scratch_plan(tmp_path):
    deltalake = _delta()
    path = str(tmp_path / "table")
    deltalake.write_deltalake(path, _rows(0, 40), partition_by=["p"])
    deltalake.write_deltalake(path, _rows(40, 60), mode="append", partition_by=["p"])
    old = plan_shards(path, 2, batch_size=4, engine="local", cost="x")
    deltalake.write_deltalake(path, _rows(60, 90, "c"), mode="append", partition_by=["p"])
    new = plan_shards(path, 2, batch_size=4, engine="local", cost="x", update=old)
    scratch = plan_shards(path, 2, batch_size=4, engine="local", cost="x")
    assert (old.table.version, new.table.version) == (1, 2)
    assert new.checksum == scratch.checksum and new.total_rows == 90
    table = deltalake.DeltaTable(path)
    table.delete("id = 3")  # a Delta remove (copy-on-write rewrite of one planned file)
    with pytest.raises(PlanUpdateError, match="was removed from the table.*plan from scratch"):
        plan_shards(path, 2, batch_size=4, engine="local", cost="x", update=new)


def test_iceberg_append_updates_and_a_delete_is_refused(tmp_path):
    catalog = iceberg_catalog(tmp_path)
    table = catalog.create_table("db.t", schema=_rows(0, 1).schema)
    with table.update_spec() as spec:
        spec.add_identity("p")
    table = catalog.load_table("db.t")
    table.append(_rows(0, 40))
    old = plan_shards(table, 2, batch_size=4, engine="local", predicate=in_set(["a"], "p"))
    table.append(_rows(40, 70))
    table = catalog.load_table("db.t")
    new = plan_shards(table, 2, batch_size=4, engine="local", predicate=in_set(["a"], "p"), update=old)
    scratch = plan_shards(table, 2, batch_size=4, engine="local", predicate=in_set(["a"], "p"))
    assert new.table.version != old.table.version
    assert new.checksum == scratch.checksum and new.total_rows > old.total_rows
    table.delete("id < 5")
    table = catalog.load_table("db.t")
    with pytest.raises(PlanUpdateError, match="plan from scratch"):
        plan_shards(table, 2, batch_size=4, engine="local", predicate=in_set(["a"], "p"), update=new)


# ------------------------------------------------------------------------------------------------ Spark (G8)

SPARK = [pytest.mark.slow, pytest.mark.timeout(900)]  # three Spark plans each: minutes on a loaded machine


@pytest.mark.parametrize("where", [pytest.param("year >= 2021", id="partition-where", marks=SPARK),
                                   pytest.param(None, id="no-where", marks=SPARK)])
def test_spark_update_equals_both_engines_from_scratch(spark, new_partition, where):
    ds = new_partition
    cost = "length(text)" if where is None else None
    old = plan_shards(ds.url, WORLD, batch_size=BATCH, engine="spark", spark=spark, where=where, cost=cost)
    ds.grow()
    new = plan_shards(ds.url, WORLD, batch_size=BATCH, engine="spark", spark=spark, where=where, cost=cost,
                      update=old)
    scratch = plan_shards(ds.url, WORLD, batch_size=BATCH, engine="spark", spark=spark, where=where, cost=cost)
    assert new.checksum == scratch.checksum and new.total_rows > old.total_rows
    if where is None:  # the local engine plans the same (G8), and updates the Spark plan to the same
        assert plan_shards(ds.url, WORLD, batch_size=BATCH, engine="local", cost=cost).checksum == new.checksum


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_spark_update_with_a_sql_cost_and_where(spark, new_partition):
    ds = new_partition
    args = dict(batch_size=BATCH, engine="spark", spark=spark, where="lang = 'en' and value > 0.5",
                cost="label * 2 + 1")  # a where row by row, and a cost only Spark evaluates
    old = plan_shards(ds.url, WORLD, **args)
    ds.grow()
    new = plan_shards(ds.url, WORLD, update=old, **args)
    assert new.checksum == plan_shards(ds.url, WORLD, **args).checksum
    with pytest.raises(PlanUpdateError, match="^where/predicate is"):
        plan_shards(ds.url, WORLD, update=old, **{**args, "where": "value > 1"})


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_spark_job_update(spark, new_partition, tmp_path, capsys):
    from petastorm_balanced.tools import spark_job
    ds = new_partition
    common = [ds.url, "--world-size", str(WORLD), "--where", "lang = 'en'"]
    assert spark_job.main([*common, "--output", str(tmp_path / "old")]) == 0
    ds.grow()
    assert spark_job.main([*common, "--output", str(tmp_path / "new"), "--update", str(tmp_path / "old")]) == 0
    assert "updated" in capsys.readouterr().out
    scratch = plan_shards(ds.url, WORLD, engine="spark", spark=spark, where="lang = 'en'")
    assert load_plan(str(tmp_path / "new")).checksum == scratch.checksum
    assert spark_job.main([*common, "--seed", "3", "--output", str(tmp_path / "bad"), "--update",
                           str(tmp_path / "old")]) == 2
    assert "seed is 3 but the plan to update was made with 0" in capsys.readouterr().err
