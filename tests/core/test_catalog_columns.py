"""The catalog kept as columns (``RowGroups``) behaves as the tuple of ``RowGroupMatch`` it replaced, and the
column-wise checksum and fingerprint give the bytes the per-row-group formatting of plan format 1 gives."""
import hashlib
import json
from json.encoder import encode_basestring_ascii

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import load_plan
from petastorm_balanced.core import selection
from petastorm_balanced.core.catalog import Catalog, FileInfo, RowGroupMatch, RowGroups, full_catalog, match_from_mask
from petastorm_balanced.core.predicate_info import predicate_info
from petastorm_balanced.plan import format as plan_format
from petastorm_balanced.planner.plan_shards import make_plan

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@st.composite
def catalogs(draw):
    """Files with unicode names and row groups, a random subset of them matching all, runs or scattered rows."""
    paths = sorted(set(draw(st.lists(names, min_size=1, max_size=6))))
    files, matches = [], []
    for path in paths:
        rows = draw(st.lists(st.integers(0, 3_000), max_size=4))
        files.append(FileInfo(path, draw(st.integers(0, 2**40)), tuple(rows), draw(st.sampled_from(["", "ab" * 32])),
                              draw(st.none() | st.integers(0, 2**63 - 1))))
        for i, n in enumerate(rows):
            if n and draw(st.booleans()):
                positions = _positions(draw, n)
                matches.append(RowGroupMatch(path, i, n, len(positions), selection.encode(positions, n)))
    return Catalog(tuple(files), tuple(matches))


def _positions(draw, n):
    style = draw(st.sampled_from(["all", "some"]))
    if style == "all":
        return np.arange(n)
    chosen = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=50))))
    return np.array(chosen, dtype=np.int64)


def reference_checksum(plan) -> str:
    """Plan format 1's content checksum, spelled out one row group at a time."""
    digest = hashlib.sha256(json.dumps(plan_format._header(plan), sort_keys=True).encode())
    for r in plan.catalog.row_groups:
        digest.update(json.dumps([r.path, r.row_group, r.total_rows, r.matching_rows]).encode())
        digest.update(hashlib.sha256(r.selection).digest())
    return digest.hexdigest()


def reference_fingerprint(files) -> str:
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(json.dumps([f.path, f.size, list(f.row_group_rows)]).encode())
    return digest.hexdigest()


@settings(max_examples=60)
@given(catalogs())
def test_columns_behave_as_the_tuple_of_matches(catalog):
    matches = tuple(catalog.row_groups)
    rows = catalog.row_groups
    assert isinstance(rows, RowGroups) and len(rows) == len(matches)
    assert [rows[i] for i in range(len(rows))] == list(matches)
    assert rows[-1:] == list(matches[-1:]) and (not matches or rows[-1] == matches[-1])
    assert rows == matches and Catalog(catalog.files, matches) == catalog
    assert hash(Catalog(catalog.files, matches)) == hash(catalog)
    table = plan_format._catalog_table(catalog)
    assert plan_format.catalog_row_groups(table) == rows  # what load reads back
    assert catalog.total_rows == sum(m.matching_rows for m in matches)
    with pytest.raises(IndexError):
        rows[len(rows)]


@settings(max_examples=60)
@given(catalogs())
def test_column_wise_checksum_and_fingerprint_are_format_1(catalog):
    assert plan_format.dataset_fingerprint(catalog.files) == reference_fingerprint(catalog.files)
    if catalog.total_rows == 0:
        return
    plan = make_plan("file:///d", catalog, world_size=1, batch_size=None, policy="drop", seed=5,
                     predicate=predicate_info(None, None))
    assert plan.checksum == reference_checksum(plan)


def test_json_text_matches_json_dumps_for_awkward_names():
    """The checksum formats paths with json's own ASCII escaping; check the escapes named in the spec."""
    for name in ['q"uote', "back\\slash", "tab\t", "\u00e9", "\U0001F600", "\x00"]:
        assert encode_basestring_ascii(name) == json.dumps(name)


def test_full_catalog_skips_empty_row_groups_and_files():
    files = [FileInfo("b", 10, (3, 0, 2)), FileInfo("a", 5, (4,)), FileInfo("c", 1, ())]
    catalog = full_catalog(files)
    assert [f.path for f in catalog.files] == ["a", "b", "c"]
    assert list(catalog.row_groups) == [RowGroupMatch("a", 0, 4, 4), RowGroupMatch("b", 0, 3, 3),
                                        RowGroupMatch("b", 2, 2, 2)]
    assert catalog == Catalog(catalog.files, tuple(catalog.row_groups))


def test_unsorted_or_duplicate_row_groups_are_refused():
    with pytest.raises(ValueError, match="sorted"):
        Catalog((), (RowGroupMatch("b", 0, 1, 1), RowGroupMatch("a", 0, 1, 1)))
    with pytest.raises(ValueError, match="sorted"):
        Catalog((), (RowGroupMatch("a", 0, 1, 1), RowGroupMatch("a", 0, 1, 1)))


def test_from_columns_sorts_paths_as_python_does():
    rows = RowGroups.from_columns(pa.array(["\u00e9", "Z", "a"]), [0, 0, 0], [1, 1, 1], [1, 1, 1], [b"", b"", b""])
    assert rows.paths == tuple(sorted(["\u00e9", "Z", "a"]))
    assert [r.path for r in rows] == ["\u00e9", "Z", "a"]


def test_saved_plan_loads_to_an_equal_plan(tmp_path):
    files = tuple(FileInfo(f"f{i}", 100 + i, (50, 70)) for i in range(4))
    matches = tuple(RowGroupMatch(f.path, 1, 70, 3, selection.encode(np.array([1, 2, 60]), 70)) for f in files)
    plan = make_plan("file:///d", Catalog(files, matches), world_size=2, batch_size=2, policy="pad", seed=1,
                     predicate=predicate_info("x > 1", None))
    plan.save(str(tmp_path / "plan"))
    loaded = load_plan(str(tmp_path / "plan"), check_dataset=False)
    assert loaded.catalog == plan.catalog and loaded.checksum == plan.checksum == reference_checksum(plan)
    assert loaded.assignment(1, num_workers=2) == plan.assignment(1, num_workers=2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 200), min_size=1, max_size=4), min_size=1, max_size=4), st.data())
def test_rows_and_words_from_spark_become_the_matches_masks_give(files_rows, data):
    """What the where job collects, matching rows packed with their file's size or 64-row words (any order), gives
    exactly the records the local engine's masks give (G8)."""
    spark_engine = pytest.importorskip("petastorm_balanced.planner.engines.spark")
    shift = 10  # above 4 x 200 rows
    files = {1000 + i: FileInfo(f"f{i}.parquet", 1000 + i, tuple(rows)) for i, rows in enumerate(files_rows)}
    expected, rows, keys, words, bits = [], [], [], [], []
    for size, info in files.items():
        density = data.draw(st.sampled_from([0.0, 0.02, 0.5, 0.98, 1.0]))
        mask = np.random.default_rng(data.draw(st.integers(0, 2 ** 32))).random(info.num_rows) < density
        bounds = np.concatenate(([0], np.cumsum(info.row_group_rows)))
        expected += [m for i in range(len(info.row_group_rows))
                     if (m := match_from_mask(info.path, i, mask[bounds[i]:bounds[i + 1]])) is not None]
        rows += [size << shift | int(r) for r in np.flatnonzero(mask)]
        for w in np.unique(np.flatnonzero(mask) >> 6):
            keys.append(size)
            words.append(w)
            value = sum(1 << int(j) for j in np.flatnonzero(mask[64 * w:64 * w + 64]))
            bits.append(value - (1 << 64) if value >= 1 << 63 else value)  # Spark's long: bit 63 is the sign
    with_rows = [f for f in files.values() if f.num_rows]
    got_rows = spark_engine.matches_from_rows(np.array(data.draw(st.permutations(rows)), np.int64), shift, with_rows)
    order = data.draw(st.permutations(range(len(keys))))
    got_words = spark_engine.matches_from_words(np.array(keys, np.int64)[order], np.array(words, np.int64)[order],
                                                np.array(bits, np.int64)[order], files)
    assert sorted(got_rows, key=lambda m: (m.path, m.row_group)) == expected
    assert sorted(got_words, key=lambda m: (m.path, m.row_group)) == expected


def test_rows_past_a_footer_mean_the_dataset_changed():
    spark_engine = pytest.importorskip("petastorm_balanced.planner.engines.spark")
    files = [FileInfo("a.parquet", 3, (10, 20)), FileInfo("b.parquet", 5, (64,))]
    with pytest.raises(ValueError, match="changed while planning"):
        spark_engine.matches_from_rows(np.array([3 << 8 | 30]), 8, files)  # a.parquet has rows 0-29
    with pytest.raises(ValueError, match="changed while planning"):
        spark_engine.matches_from_rows(np.array([4 << 8 | 1]), 8, files)  # no file of size 4
    with pytest.raises(ValueError, match="changed while planning"):
        spark_engine.matches_from_words(np.array([3]), np.array([0]), np.array([1 << 30]), {3: files[0]})
    with pytest.raises(ValueError, match="changed while planning"):
        spark_engine.matches_from_words(np.array([5]), np.array([1]), np.array([1]), {5: files[1]})


def test_time_summary_names_steps_in_order_and_sums_wall_time():
    from petastorm_balanced.planner.plan_shards import time_summary
    line = time_summary({"footers": 0.5, "where": 2.0, "encode": 0.75, "balance": 0.25, "write": 0.25,
                         "session": 0.0})
    assert line == "footers 0.50 s, where 2.00 s, encode 0.75 s, balance 0.25 s, write 0.25 s; total 3.75 s"
