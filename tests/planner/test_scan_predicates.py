"""Scanning and predicate planning (engine='local') against pyarrow/pandas ground truth, and input edge cases.

The ground truth reads every row group with pyarrow and filters it with a pandas expression written
independently of the predicate; the plan must hold exactly those positions, per row group, and its assignment
must deliver exactly those rows.
"""
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import plan_shards
from petastorm_balanced.io.dataset import is_data_name, list_data_files
from petastorm_balanced.planner.scan import scan
from petastorm_balanced.predicates import in_lambda, in_negate, in_reduce, in_set
from tests.support.delivery_contract import check_planned

WORLD, BATCH = 3, 8


def expected_positions(info, row_filter):
    """{(file, row group): matching positions} from pyarrow + a pandas filter; row groups with none left out."""
    import pyarrow.dataset as pads
    # hive values as pyarrow.dataset types them (the values the loader delivers and predicates see)
    keys = {os.path.relpath(f.path, info.path): pads.get_partition_keys(f.partition_expression)
            for f in pads.dataset(info.path, partitioning="hive").get_fragments()}
    out = {}
    for path, rg, _ in info.row_groups:
        frame = pq.ParquetFile(os.path.join(info.path, path)).read_row_group(rg).to_pandas()
        for key, value in keys[path].items():
            frame[key] = value
        positions = np.flatnonzero(np.asarray(row_filter(frame), dtype=bool))
        if len(positions):
            out[(path, rg)] = positions
    return out


def check_plan_matches(info, predicate, row_filter):
    """Catalog positions equal the ground truth per row group, and a 'pad' plan delivers each match once."""
    plan = plan_shards(info.url, WORLD, predicate=predicate, batch_size=BATCH, policy="pad", engine="local")
    expected = expected_positions(info, row_filter)
    got = {(r.path, r.row_group): r.positions() for r in plan.catalog.row_groups}
    assert sorted(got) == sorted(expected)
    for key, positions in expected.items():
        assert np.array_equal(got[key], positions), key
    assert plan.total_rows == sum(len(p) for p in expected.values())
    delivered = {key: [] for key in expected}
    for rank in range(WORLD):
        for fragment in plan.assignment(rank):
            if not fragment.padding:
                delivered[(fragment.path, fragment.row_group)].append(fragment.row_indices())
    for key, positions in expected.items():
        assert np.array_equal(np.sort(np.concatenate(delivered[key])), positions), key
    return plan


PLAIN_CASES = {
    "in_lambda vectorized": (in_lambda(["lang"], lambda lang: lang == "en"), lambda f: f.lang == "en"),
    "in_set per row": (in_set({"de", "fr"}, "lang"), lambda f: f.lang.isin(["de", "fr"])),
    "in_reduce all": (in_reduce([in_set({"en"}, "lang"), in_lambda(["label"], lambda label: label < 3)], all),
                      lambda f: (f.lang == "en") & (f.label < 3)),
    "in_negate": (in_negate(in_lambda(["value"], lambda v: v > 2.0)), lambda f: ~(f.value > 2.0)),
    "scattered half": (in_lambda(["id"], lambda i: i * 2654435761 % 1000 < 500),
                       lambda f: f.id * 2654435761 % 1000 < 500),
}


@pytest.mark.parametrize("name", sorted(PLAIN_CASES))
def test_plain_predicates_match_pandas(plain_dataset, name):
    predicate, row_filter = PLAIN_CASES[name]
    check_plan_matches(plain_dataset, predicate, row_filter)


@pytest.mark.parametrize("predicate, row_filter", [
    (in_set({2021}, "year"), lambda f: f.year == 2021),  # an int partition column: predicates see ints (G13)
    (in_lambda(["year", "lang"], lambda year, lang: (year != 2020) & (lang == "en")),
     lambda f: (f.year != 2020) & (f.lang == "en")),
], ids=["in_set on partition", "partition and column"])
def test_hive_partition_predicates(hive_dataset, predicate, row_filter):
    plan = check_plan_matches(hive_dataset, predicate, row_filter)
    assert plan.catalog.partition_columns == ("year",)


def test_hive_scan_lists_partition_columns(hive_dataset):
    listing = scan(hive_dataset.url)
    assert listing.partition_columns == ("year",) and listing.kind == "plain"
    assert "year" not in listing.schema.names
    assert all(f.path.startswith("year=") for f in listing.files)


def test_petastorm_predicate_sees_decoded_values(petastorm_dataset):
    """in_lambda on an NdarrayCodec field gets the decoded numpy array, as in Petastorm's make_reader."""
    import io

    def first_positive(frame):  # NdarrayCodec cells are .npy bytes: numpy itself is the oracle
        return np.array([np.load(io.BytesIO(v))[0] > 0 for v in frame.vec])

    plan = check_plan_matches(petastorm_dataset, in_lambda(["vec"], lambda vec: vec[0] > 0), first_positive)
    assert plan.catalog.kind == "petastorm"
    check_plan_matches(petastorm_dataset, in_set({1, 2, 3}, "label"), lambda f: f.label.isin([1, 2, 3]))


def test_no_predicate_catalog_is_every_nonempty_row_group(plain_dataset):
    plan = plan_shards(plain_dataset.url, WORLD, batch_size=BATCH, engine="local")
    assert [(r.path, r.row_group, r.total_rows) for r in plan.catalog.row_groups] == list(plain_dataset.row_groups)
    assert all(r.selection == b"" and r.matching_rows == r.total_rows for r in plan.catalog.row_groups)
    assert plan.total_rows == plain_dataset.num_rows
    assert [f.path for f in plan.catalog.files] == list(plain_dataset.files)  # the empty file is listed too


# ---- edge cases: clear errors or defined behaviour ----

def write_table(path, rows, row_group_size=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = pa.table({"id": np.arange(rows, dtype=np.int64), "x": np.arange(rows) % 7})
    pq.write_table(table, path, row_group_size=row_group_size or max(rows, 1))


@pytest.mark.parametrize("make, pattern", [
    (lambda d: os.makedirs(d), "no Parquet data file"),
    (lambda d: None, "does not exist"),
    (lambda d: (os.makedirs(d), open(os.path.join(d, "_SUCCESS"), "w").close()), "no Parquet data file"),
    (lambda d: (os.makedirs(os.path.join(d, ".hidden")), write_table(os.path.join(d, ".hidden", "a.parquet"), 5),
                write_table(os.path.join(d, "_tmp", "b.parquet"), 5)), "no Parquet data file"),
], ids=["empty folder", "missing path", "only _SUCCESS", "only hidden/underscore folders"])
def test_unusable_dataset_paths_are_refused(tmp_path, make, pattern):
    folder = str(tmp_path / "ds")
    make(folder)
    with pytest.raises(ValueError, match=pattern) as error:
        plan_shards(folder, 2, engine="local")
    assert "dataset_url=" in str(error.value)


def test_non_parquet_file_is_named(tmp_path):
    write_table(str(tmp_path / "ds" / "part-0.parquet"), 100)
    (tmp_path / "ds" / "notes.txt").write_text("not parquet")
    with pytest.raises(ValueError, match="'notes.txt'.*not a readable Parquet file"):
        plan_shards(str(tmp_path / "ds"), 2, engine="local")


def test_only_empty_files_is_refused(tmp_path):
    write_table(str(tmp_path / "ds" / "part-0.parquet"), 0)
    with pytest.raises(ValueError, match="matches no row"):
        plan_shards(str(tmp_path / "ds"), 1, engine="local")


def test_metadata_names_are_not_data():
    assert not is_data_name("_SUCCESS") and not is_data_name("_common_metadata") and not is_data_name(".x.crc")
    assert not is_data_name("part-0.parquet.crc") and is_data_name("year=2020") and is_data_name("_y=1")
    assert is_data_name("part-0.parquet")


def test_single_file_url(tmp_path):
    write_table(str(tmp_path / "ds" / "only.parquet"), 50, row_group_size=20)
    _, _, entries = list_data_files(str(tmp_path / "ds" / "only.parquet"))
    assert len(entries) == 1
    plan = plan_shards(str(tmp_path / "ds" / "only.parquet"), 2, batch_size=5, engine="local")
    assert [r.total_rows for r in plan.catalog.row_groups] == [20, 20, 10]


def test_predicate_matching_nothing(plain_dataset):
    with pytest.raises(ValueError, match="matches no row"):
        plan_shards(plain_dataset.url, 2, predicate=in_set({"xx"}, "lang"), engine="local")


def test_predicate_on_missing_column(plain_dataset):
    with pytest.raises(ValueError, match=r"\['nope'\].*columns are"):
        plan_shards(plain_dataset.url, 2, predicate=in_set({1}, "nope"), engine="local")


def test_predicate_and_where_together_or_where_on_local(plain_dataset):
    with pytest.raises(ValueError, match="not both"):
        plan_shards(plain_dataset.url, 2, where="lang = 'en'", predicate=in_set({"en"}, "lang"), engine="local")
    with pytest.raises(ValueError, match="engine='spark'"):
        plan_shards(plain_dataset.url, 2, where="lang = 'en'", engine="local")
    with pytest.raises(TypeError, match="PredicateBase"):
        plan_shards(plain_dataset.url, 2, predicate=lambda row: True, engine="local")


def test_world_times_batch_larger_than_matches(plain_dataset):
    with pytest.raises(ValueError, match="world_size=64"):
        plan_shards(plain_dataset.url, 64, batch_size=512, engine="local")


@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_one_huge_row_group_world_eight(tmp_path, policy):
    """One 10,000-row group over 8 ranks: balanced by splitting it, each rank reading a disjoint slice."""
    write_table(str(tmp_path / "ds" / "big.parquet"), 10_000)
    plan = plan_shards(str(tmp_path / "ds"), 8, batch_size=32, policy=policy, engine="local")
    assigned = [plan.assignment(rank) for rank in range(8)]
    for fragments in assigned:
        assert sum(f.num_rows for f in fragments) == plan.rows_per_rank() == plan.steps_per_epoch() * 32
    check = check_planned(plan, assigned, world=8, batch_size=32)  # G2: disjoint slices, bounded left-out/padding
    assert check.ok, check.detail


def test_world_larger_than_row_groups(tmp_path):
    for i in range(3):
        write_table(str(tmp_path / "ds" / f"part-{i}.parquet"), 100 + 37 * i)
    plan = plan_shards(str(tmp_path / "ds"), 16, batch_size=4, policy="pad", engine="local")
    assert len(plan.catalog.row_groups) == 3
    assert {sum(f.num_rows for f in plan.assignment(r)) for r in range(16)} == {plan.rows_per_rank()}


def test_copied_dataset_scans_identically(plain_dataset, tmp_path):
    """Scanning depends on content and relative paths only, not on where the dataset lives."""
    copy = tmp_path / "copy"
    shutil.copytree(plain_dataset.path, copy)
    assert scan(str(copy)).files == scan(plain_dataset.url).files
