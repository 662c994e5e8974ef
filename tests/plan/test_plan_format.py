"""Plan files: round trip, every kind of damage refused with the right PlanError, staleness, crash safety, G9."""
import dataclasses
import functools
import json
import os
import posixpath
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import PlanError, PlanIntegrityError, PlanVersionError, StalePlanError, load_plan, plan_shards
from petastorm_balanced.core.predicate_info import predicate_info
from petastorm_balanced.datagen import make_plain_dataset
from petastorm_balanced.plan import format as plan_format
from petastorm_balanced.planner.scan import check_footers
from petastorm_balanced.predicates import in_lambda, in_set
from tests.support.delivery_contract import check_planned
from tests.support.strategies import catalog_paths

WORLD, BATCH = 3, 16
EN = in_lambda(["lang"], lambda lang: lang == "en")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_plain_dataset(tmp_path_factory.mktemp("fmt") / "ds", num_files=5, total_rows=3_000, seed=11,
                              empty_files=1, min_row_group_rows=16, max_row_group_rows=400)


@pytest.fixture(scope="module")
def saved(dataset, tmp_path_factory):
    """(plan, plan dir, {file name: bytes}) of a 'pad' plan with a predicate, written once."""
    plan_dir = str(tmp_path_factory.mktemp("saved") / "plan")
    plan = plan_shards(dataset.url, WORLD, predicate=EN, batch_size=BATCH, policy="pad", seed=4, engine="local",
                       output_url=plan_dir)
    files = {}
    for name in (plan_format.PLAN_JSON, plan_format.CATALOG, plan_format.ASSIGNMENT):
        with open(os.path.join(plan_dir, name), "rb") as handle:
            files[name] = handle.read()
    return plan, plan_dir, files


def write_files(folder, files):
    os.makedirs(folder, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(data)
    return folder


def same_assignments(a, b, world=WORLD):
    return all(a.assignment(r, epoch=e) == b.assignment(r, epoch=e) for r in range(world) for e in (0, 1))


def test_round_trip(saved):
    plan, plan_dir, _ = saved
    loaded = load_plan(plan_dir)
    assert loaded == plan and loaded.checksum == plan.checksum
    assert same_assignments(loaded, plan)
    assert loaded.predicate.kind == "petastorm" and loaded.total_rows == plan.total_rows


def test_plan_json_totals_describe_the_assignment(saved):
    plan, plan_dir, files = saved
    document = json.loads(files[plan_format.PLAN_JSON])
    totals = document["totals"]
    rows = [sum(f.num_rows for f in plan.assignment(r)) for r in range(WORLD)]
    padded = sum(f.num_rows for r in range(WORLD) for f in plan.assignment(r) if f.padding)
    assert rows == [totals["rows_per_rank"]] * WORLD == [plan.rows_per_rank()] * WORLD
    assert totals["steps_per_epoch"] * BATCH == totals["rows_per_rank"]
    assert totals["matching_rows"] == plan.total_rows and totals["padded_rows"] == padded
    assert totals["dropped_rows"] == 0 and 0 <= totals["split_row_groups"] <= WORLD - 1
    table = pq.read_table(os.path.join(plan_dir, plan_format.ASSIGNMENT)).to_pandas()
    per_rank = (table.stop - table.start).groupby(table["rank"]).sum()
    assert per_rank.tolist() == rows


def json_edit(edit):
    def mutate(files):
        document = json.loads(files[plan_format.PLAN_JSON])
        edit(document)
        return {**files, plan_format.PLAN_JSON: json.dumps(document).encode()}
    return mutate


def replace(name, data):
    return lambda files: {**files, name: data(files[name]) if callable(data) else data}


def drop(name):
    return lambda files: {k: v for k, v in files.items() if k != name}


CORRUPTIONS = {
    "truncated catalog": (replace(plan_format.CATALOG, lambda b: b[: len(b) // 2]), PlanIntegrityError),
    "truncated assignment": (replace(plan_format.ASSIGNMENT, lambda b: b[:-10]), PlanIntegrityError),
    "seed edited": (json_edit(lambda d: d["parameters"].update(seed=5)), PlanIntegrityError),
    "world size edited": (json_edit(lambda d: d["parameters"].update(world_size=4)), PlanIntegrityError),
    "steps edited": (json_edit(lambda d: d["totals"].update(steps_per_epoch=d["totals"]["steps_per_epoch"] + 1)),
                     PlanIntegrityError),
    "file size edited": (json_edit(lambda d: d["dataset_files"][0].__setitem__(1, 1)), PlanIntegrityError),
    "wrong sha256": (json_edit(lambda d: d["files"].update({plan_format.CATALOG: "0" * 64})), PlanIntegrityError),
    "missing catalog": (drop(plan_format.CATALOG), PlanIntegrityError),
    "missing assignment": (drop(plan_format.ASSIGNMENT), PlanIntegrityError),
    "missing plan.json": (drop(plan_format.PLAN_JSON), PlanIntegrityError),
    "garbage plan.json": (replace(plan_format.PLAN_JSON, b"\x00\xff garbage {"), PlanIntegrityError),
    "empty plan.json": (replace(plan_format.PLAN_JSON, b""), PlanIntegrityError),
    "json list": (replace(plan_format.PLAN_JSON, b"[1, 2]"), PlanIntegrityError),
    "foreign json": (replace(plan_format.PLAN_JSON, b'{"format": "mds", "version": 2}'), PlanError),
    "newer format": (json_edit(lambda d: d.update(format_version=plan_format.FORMAT_VERSION + 1)), PlanVersionError),
    "newer algorithm": (json_edit(lambda d: d["parameters"].update(algorithm_version=2)), PlanVersionError),
    "catalog of another plan": (replace(plan_format.CATALOG, lambda b: pq_bytes_with_extra_row(b)),
                                PlanIntegrityError),
}


def pq_bytes_with_extra_row(data):
    table = pq.read_table(pa.BufferReader(pa.py_buffer(data).slice(0)))
    sink = pa.BufferOutputStream()
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), sink)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_is_refused_with_the_right_error(saved, tmp_path, name):
    mutate, error = CORRUPTIONS[name]
    folder = write_files(str(tmp_path / "plan"), mutate(saved[2]))
    with pytest.raises(PlanError) as caught:
        load_plan(folder, check_dataset=False)
    assert type(caught.value) is error, caught.value
    assert "re-run planning" in str(caught.value) or "re-plan" in str(caught.value) or error is PlanError


def test_missing_plan_dir_and_plain_folder(tmp_path, dataset):
    with pytest.raises(PlanIntegrityError, match="plan.json"):
        load_plan(str(tmp_path / "nowhere"))
    with pytest.raises(PlanIntegrityError, match="plan.json"):
        load_plan(dataset.path)  # a dataset is not a plan


MUTATIONS = st.sampled_from(["flip", "truncate", "insert", "replace", "json leaf"])


@st.composite
def mutated_files(draw, files):
    name = draw(st.sampled_from(sorted(files)))
    data = bytearray(files[name])
    kind = draw(MUTATIONS)
    if kind == "flip":
        for _ in range(draw(st.integers(1, 3))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif kind == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=16))
    elif kind == "replace":
        data = bytearray(draw(st.binary(max_size=200)))
    else:
        name = plan_format.PLAN_JSON
        document = json.loads(files[name])
        node, key = document, None
        while True:  # walk down to a random leaf
            keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            if not isinstance(node[key], (dict, list)) or not node[key]:
                break
            node = node[key]
        if key is not None:
            node[key] = draw(st.one_of(st.none(), st.booleans(), st.integers(-2, 2**65), st.text(max_size=8),
                                       st.lists(st.integers(), max_size=2)))
        data = bytearray(json.dumps(document).encode())
    return {**files, name: bytes(data)}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return str(tmp_path_factory.mktemp("mutated"))


@given(st.data())
def test_any_mutation_is_refused_or_harmless(saved, scratch, data):
    """Damaged plans raise only PlanError subclasses; a plan that still loads is the original plan."""
    plan, _, files = saved
    mutated = data.draw(mutated_files(files))
    for name in files:
        if name not in mutated and os.path.exists(os.path.join(scratch, name)):
            os.remove(os.path.join(scratch, name))
    write_files(scratch, mutated)
    try:
        loaded = load_plan(scratch, check_dataset=False)
    except PlanError:
        return
    assert loaded == plan and loaded.checksum == plan.checksum


# ---- staleness (G7) ----

@pytest.fixture
def fresh(dataset, tmp_path):
    """A private copy of the dataset and a plan of it, for tests that change the dataset."""
    copy = str(tmp_path / "ds")
    shutil.copytree(dataset.path, copy)
    plan = plan_shards(copy, WORLD, batch_size=BATCH, engine="local", output_url=str(tmp_path / "plan"))
    return copy, str(tmp_path / "plan"), plan


def rewrite(path, row_group_size):
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=row_group_size)


@pytest.mark.parametrize("change, pattern", [
    (lambda d: shutil.copy(os.path.join(d, "part-00001.parquet"), os.path.join(d, "part-00009.parquet")),
     "'part-00009.parquet' was added"),
    (lambda d: os.remove(os.path.join(d, "part-00002.parquet")), "'part-00002.parquet' was removed"),
    (lambda d: (os.remove(os.path.join(d, "part-00004.parquet")), os.remove(os.path.join(d, "part-00003.parquet"))),
     "'part-00003.parquet' was removed"),  # the first difference, in path order
    (lambda d: rewrite(os.path.join(d, "part-00001.parquet"), 7), "'part-00001.parquet' changed size"),
    (lambda d: shutil.rmtree(d), "dataset is gone"),
    (lambda d: open(os.path.join(d, "part-00001.parquet"), "ab").write(b"x"), "changed size"),
])
def test_changed_dataset_is_stale(fresh, change, pattern):
    copy, plan_dir, plan = fresh
    load_plan(plan_dir)
    change(copy)
    with pytest.raises(StalePlanError, match=pattern):
        load_plan(plan_dir)
    with pytest.raises(StalePlanError):
        check_footers(plan)
    assert load_plan(plan_dir, check_dataset=False) == plan


def test_row_counts_changed_found_by_footers(fresh):
    """Same sizes but other row group counts: only reading footers can tell, and it names the file."""
    _, _, plan = fresh
    files = list(plan.catalog.files)
    target = next(i for i, f in enumerate(files) if f.num_rows > 1)
    rows = files[target].row_group_rows
    files[target] = dataclasses.replace(files[target], row_group_rows=(rows[0] - 1,) + rows[1:] + (1,))
    tampered = dataclasses.replace(plan, catalog=dataclasses.replace(plan.catalog, files=tuple(files)))
    plan_format.check_dataset(tampered)  # listing sees equal sizes
    with pytest.raises(StalePlanError, match=f"{files[target].path!r} changed row groups"):
        check_footers(tampered)
    check_footers(plan)


def test_rewritten_row_groups_are_stale(fresh):
    copy, plan_dir, plan = fresh
    target = next(f for f in plan.catalog.files if f.num_rows > 10)
    rewrite(os.path.join(copy, target.path), 3)
    with pytest.raises(StalePlanError, match=repr(target.path)):
        check_footers(plan)


def test_predicate_changed_is_stale(saved):
    plan = saved[0]
    plan_format.check_predicate(plan, predicate_info(None, in_lambda(["lang"], lambda lang: lang == "en")))
    for where, predicate, pattern in [(None, in_lambda(["lang"], lambda lang: lang == "de"), "fingerprint"),
                                      (None, in_set({"en"}, "lang"), "fingerprint"),
                                      (None, None, "kind 'petastorm' -> 'none'"),
                                      ("lang = 'en'", None, "kind 'petastorm' -> 'sql'")]:
        with pytest.raises(StalePlanError, match=pattern):
            plan_format.check_predicate(plan, predicate_info(where, predicate))


def above(value, threshold):
    return value > threshold


@pytest.mark.parametrize("first, second", [
    (in_lambda(["x"], lambda x, t=5: x > t), in_lambda(["x"], lambda x, t=6: x > t)),
    (in_lambda(["x"], functools.partial(above, threshold=1)), in_lambda(["x"], functools.partial(above, threshold=2))),
    (in_lambda(["x"], lambda x, s: x > s, 1), in_lambda(["x"], lambda x, s: x > s, 2)),
], ids=["default argument", "partial keyword", "state_arg"])
def test_predicate_fingerprint_sees_bound_values(first, second):
    """Predicates that differ only in a bound value are different predicates (else G7 would miss the change)."""
    a, b = predicate_info(None, first), predicate_info(None, second)
    assert a.fingerprint != b.fingerprint
    assert a == predicate_info(None, first)
    assert "0x" not in a.text  # no memory address: the same predicate gets the same fingerprint in every process


# ---- crash safety ----

def test_plan_dir_without_plan_json_is_refused(saved, tmp_path):
    files = {k: v for k, v in saved[2].items() if k != plan_format.PLAN_JSON}
    folder = write_files(str(tmp_path / "plan"), files)
    with pytest.raises(PlanIntegrityError, match="cut short"):
        load_plan(folder, check_dataset=False)


def test_failed_overwrite_leaves_no_plan_and_rerun_succeeds(saved, tmp_path, monkeypatch):
    plan, _, files = saved
    folder = write_files(str(tmp_path / "plan"), files)
    other = dataclasses.replace(plan, seed=plan.seed + 1)
    real_put = plan_format._put

    def disk_full_on_assignment(filesystem, path, data, atomic=False):
        if path.endswith(plan_format.ASSIGNMENT):
            raise OSError(28, "No space left on device")
        return real_put(filesystem, path, data, atomic)

    monkeypatch.setattr(plan_format, "_put", disk_full_on_assignment)
    with pytest.raises(OSError):
        other.save(folder)
    with pytest.raises(PlanIntegrityError):
        load_plan(folder, check_dataset=False)  # neither the old plan nor a half of the new one
    monkeypatch.setattr(plan_format, "_put", real_put)
    other.save(folder)
    assert load_plan(folder, check_dataset=False).checksum == other.checksum != plan.checksum


# ---- G9: one plan, any world size ----

@pytest.mark.parametrize("world", [1, 2, 5, 7, 13])
@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_plan_serves_other_world_sizes(saved, world, policy):
    plan = dataclasses.replace(saved[0], policy=policy)
    steps = plan.steps_per_epoch(world_size=world)
    assigned = [plan.assignment(rank, world_size=world, epoch=2, num_workers=2) for rank in range(world)]
    for fragments in assigned:
        assert sum(f.num_rows for f in fragments) == steps * BATCH == plan.rows_per_rank(world_size=world)
    check = check_planned(plan, assigned, world=world, batch_size=BATCH)
    assert check.ok, check.detail


# ---- G14: hostile catalog paths, signed by the package's own writer ----

@settings(max_examples=80, deadline=None)
@given(path=catalog_paths)
def test_catalog_paths_outside_the_root_never_load(saved, tmp_path_factory, path):
    """A plan whose only defect is a catalog path (checksums, fingerprint and assignment all valid) loads iff the
    path is a plain root-relative path, and a path that loads never names a file outside the root."""
    plan = saved[0]
    victim = plan.catalog.row_groups.paths[0]
    files = tuple(dataclasses.replace(f, path=path) if f.path == victim else f for f in plan.catalog.files)
    if len({f.path for f in files}) != len(files) or sorted(f.path for f in files) != [f.path for f in files]:
        return  # a name that collides with or sorts before another file is a different test
    rows = plan.catalog.row_groups
    renamed = type(rows)([path if p == victim else p for p in rows.paths], rows.path_index, rows.row_group,
                         rows.total_rows, rows.matching_rows, rows.selection)
    catalog = dataclasses.replace(plan.catalog, files=files, row_groups=renamed)
    forged = dataclasses.replace(plan, catalog=catalog, dataset_fingerprint=plan_format.dataset_fingerprint(files))
    folder = str(tmp_path_factory.mktemp("forged"))
    plan_format.write_plan(forged, folder)
    plain = (bool(path) and not path.startswith("/") and "\\" not in path and "://" not in path
             and all(part not in ("", ".", "..") for part in path.split("/"))
             and not any(ord(c) < 32 or c == "\x7f" for c in path)
             and not re.match(r"[A-Za-z][A-Za-z0-9+.\-]+:/", path))
    try:
        loaded = load_plan(folder, check_dataset=False)
    except PlanIntegrityError as exc:
        assert not plain, (path, exc)
        return
    assert plain, path
    root = "/data/root"
    assert posixpath.normpath(posixpath.join(root, path)).startswith(root + "/")
    assert loaded.catalog.files == files
