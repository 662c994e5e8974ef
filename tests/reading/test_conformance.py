"""Exact values (G13): every delivered value of every rank equals what ``pyarrow.dataset`` (hive partitioning) reads
for that row, matched by a unique id; every batch matches ``loader.schema``, decided before the first batch.

Datasets come from several writers (pyarrow always; polars and DuckDB where they import; Spark's writer in the slow
tier), with Hypothesis-drawn columns of every kind the loader maps (tests/support/strategies.py), nulls anywhere (in
some files only, or everywhere), small and uneven row groups, empty files, and hive partitions with special characters
and nulls. Both backends, in-thread and threaded reading, and ``BalancedIterableDataset`` with DataLoader workers.
"""
from __future__ import annotations

import importlib.util
import math
import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from petastorm_balanced import BalancedIterableDataset, make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.predicates import in_lambda
from petastorm_balanced.reading.backends import petastorm_importable
from petastorm_balanced.reading.fields.schema import LIST, delivered_type
from petastorm_balanced.reading.rows.convert import one_array
from tests.support.strategies import COLUMN_KINDS, DatasetSpec, dataset_specs

torch = pytest.importorskip("torch")
WRITERS = ["pyarrow"] + [w for w in ("polars", "duckdb") if importlib.util.find_spec(w)]  # skipped if absent
BACKENDS = ["arrow"] + (["petastorm"] if petastorm_importable() else [])
WORLD, BATCH = 2, 3
FAST = settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------------------------------------ writing

def spec_tables(spec: DatasetSpec):
    """One Arrow table per file of ``spec`` (the partition column included as data)."""
    out = []
    for values in spec.files:
        arrays = {"id": pa.array(values["id"], pa.int64())}
        for name in spec.columns:
            arrays[name] = pa.array(values[name], type=COLUMN_KINDS[name][0])
        if spec.partition:
            arrays["part"] = pa.array(values["part"], pa.string() if spec.partition == "string" else pa.int64())
        out.append(pa.table(arrays))
    return out


def write(spec: DatasetSpec, root: str) -> str:
    tables = spec_tables(spec)
    os.makedirs(root, exist_ok=True)
    if spec.partition:
        table = pa.concat_tables(tables)
        if spec.writer == "duckdb":
            import duckdb
            con = duckdb.connect()
            con.register("t", table)
            con.execute(f"COPY t TO '{root}' (FORMAT PARQUET, PARTITION_BY (part), ROW_GROUP_SIZE "
                        f"{spec.row_group_rows[0]})")
            con.close()
        else:
            pads.write_dataset(table, root, format="parquet", existing_data_behavior="overwrite_or_ignore",
                               partitioning=pads.partitioning(pa.schema([table.schema.field("part")]), flavor="hive"),
                               max_rows_per_group=spec.row_group_rows[0], max_rows_per_file=10_000)
        return root
    for i, (table, rows) in enumerate(zip(tables, spec.row_group_rows, strict=True)):
        path = os.path.join(root, f"part-{i:05d}.parquet")
        if spec.writer == "polars":
            import polars as pl
            pl.from_arrow(table).write_parquet(path, row_group_size=rows)
        elif spec.writer == "duckdb":
            import duckdb
            con = duckdb.connect()
            con.register("t", table)
            con.execute(f"COPY t TO '{path}' (FORMAT PARQUET, ROW_GROUP_SIZE {rows})")
            con.close()
        else:
            pq.write_table(table, path, row_group_size=rows)
    return root


# ------------------------------------------------------------------------------------------------ comparing

def oracle(root: str) -> dict:
    """``{column: {id: value}}`` as pyarrow.dataset reads it, in the loader's documented representation."""
    table = pads.dataset(root, format="parquet", partitioning="hive").to_table()
    ids = table.column("id").to_pylist()
    return {name: dict(zip(ids, canonical(table.column(name)), strict=True)) for name in table.column_names}


def canonical(column) -> list:
    """Python values: the delivered Arrow type's ``to_pylist`` (temporal values as their stored integers)."""
    t = delivered_type(column.type)
    array = one_array(column)
    array = array if array.type == t else array.cast(t)
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        array = array.view(pa.int64() if t.bit_width == 64 else pa.int32())
    return array.to_pylist()


def _nan_to_none(value):
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def delivered(batches, schema) -> dict:
    """``{column: {id: value}}`` from batches (padding rows left out), nulls read back as the schema says."""
    out = {c.name: {} for c in schema if c.name != "_padding" and not c.name.endswith("__valid")}
    for batch in batches:
        schema.check(batch)
        keep = [not p for p in batch["_padding"].tolist()]
        ids = batch["id"].tolist()
        for column in schema:
            if column.name not in out:
                continue
            values = batch[column.name] if column.kind == LIST else batch[column.name].tolist()
            if column.nulls == "mask":
                values = [v if ok else None for v, ok in zip(values, batch[column.mask].tolist(), strict=True)]
            elif column.nulls == "nan":
                values = _nan_to_none(values)
            for i, value, k in zip(ids, values, keep, strict=True):
                if k:
                    assert i not in out[column.name], f"id {i} delivered twice"
                    out[column.name][i] = value
    return out


def check_equal(got: dict, expected: dict) -> None:
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    for name, values in expected.items():
        assert set(got[name]) == set(values), f"{name}: ids differ"
        for i, value in values.items():
            assert got[name][i] == value, f"column {name!r} id {i}: delivered {got[name][i]!r}, file holds {value!r}"


def loaders(plan, *, iterable_workers=0):
    """(label, rank, batches iterable, schema) of every reading path checked."""
    for rank in range(WORLD):
        for backend in BACKENDS:
            for pool, shuffle in (("dummy", True), ("thread", False)):
                loader = make_loader(rank, WORLD, plan=plan, backend=backend, reader_pool_type=pool,
                                     workers_count=2, shuffle=shuffle, padding_mask=True, shuffle_window=5)
                yield f"{backend}/{pool}", loader, loader.schema
        if iterable_workers:
            dataset = BalancedIterableDataset(plan, rank, WORLD, batch_size=BATCH, padding_mask=True,
                                              backend="arrow", shuffle_window=5)
            yield "iterable", dataset.dataloader(num_workers=iterable_workers), dataset.schema


def check_dataset(root: str, *, iterable_workers=0) -> None:
    plan = plan_shards(root, WORLD, batch_size=BATCH, policy="pad", engine="local")
    expected = oracle(root)
    by_path = {}
    schemas = set()
    for label, batches, schema in loaders(plan, iterable_workers=iterable_workers):
        schemas.add(schema)
        got = delivered(batches, schema)
        for name, values in got.items():
            by_path.setdefault(label, {}).setdefault(name, {}).update(values)
    assert len(schemas) == 1, "the schema differs between ranks or reading paths"
    for got in by_path.values():
        check_equal(got, expected)


# ------------------------------------------------------------------------------------------------ the suite

def check_written(spec) -> None:
    """Write ``spec``'s dataset, compare every delivered value with pyarrow.dataset, then remove it."""
    root = tempfile.mkdtemp(prefix="conf-", dir=_tmp())
    try:
        check_dataset(write(spec, root))
        if spec.partition:
            check_partition_predicate(root, spec)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("writer", WRITERS)
@FAST
@given(data=st.data())
def test_every_value_equals_pyarrow_dataset(writer, data):
    spec = data.draw(dataset_specs(writers=(writer,)))
    check_written(spec)


@pytest.mark.slow
@pytest.mark.stack
@pytest.mark.parametrize("writer", WRITERS)
@SLOW
@given(data=st.data())
def test_every_value_equals_pyarrow_dataset_more_examples(writer, data):
    spec = data.draw(dataset_specs(writers=(writer,), max_rows=80))
    check_written(spec)


def check_partition_predicate(root: str, spec: DatasetSpec) -> None:
    """A predicate on the hive column sees the value the loader delivers (typed, None for a null)."""
    expected = oracle(root)["part"]
    chosen = next(v for f in spec.files for v in f["part"])  # a value present in the data (maybe None)
    predicate = in_lambda(["part"], (lambda p: p is None) if chosen is None else (lambda p: p == chosen))
    plan = plan_shards(root, 1, batch_size=1, predicate=predicate, engine="local")
    assert plan.total_rows == sum(1 for v in expected.values() if v == chosen)


@pytest.mark.parametrize("writer", WRITERS)
def test_dataloader_workers_deliver_the_same_values(writer, tmp_path):
    spec = DatasetSpec(writer, ("i64", "str", "list_i32", "dict", "ts_utc"), (
        {"id": [0, 1, 2, 3, 4], "i64": [2**60 + 1, None, 3, None, -2**63], "str": ["a", None, "é", "", None],
         "list_i32": [[1], None, [], [2, None], [3, 4]], "dict": ["red", None, "blue", "red", None],
         "ts_utc": [1, None, -5, 2**50, None]},
        {"id": [5, 6, 7, 8, 9, 10], "i64": [1, 2, 3, 4, 5, 6], "str": ["x"] * 6, "list_i32": [[1, 2]] * 6,
         "dict": ["green"] * 6, "ts_utc": [0] * 6}), (2, 4))
    check_dataset(write(spec, str(tmp_path / "ds")), iterable_workers=2)


# ------------------------------------------------------------------------------------------------ each bug

def _table_dataset(tmp_path, tables, row_group_size=3):
    root = tmp_path / "ds"
    root.mkdir()
    for i, table in enumerate(tables):
        pq.write_table(table, root / f"part-{i}.parquet", row_group_size=row_group_size)
    return str(root)


def test_nulls_in_some_files_give_one_schema_and_exact_int64(tmp_path):
    """An int64 column with nulls in one file only: every batch int64 with a mask, 2**60 + 20 exact."""
    big = 2**60 + 20
    root = _table_dataset(tmp_path, [pa.table({"id": list(range(9)), "x": [big] * 9}),
                                     pa.table({"id": list(range(9, 18)), "x": [None, big + 1] * 4 + [None]})])
    plan = plan_shards(root, 1, batch_size=3, engine="local")
    loader = make_loader(0, 1, plan=plan, backend="arrow", shuffle=False)
    assert loader.schema["x"].nulls == "mask" and loader.schema["x"].dtype == "int64"
    batches = list(loader)
    assert all(b["x"].dtype == torch.int64 and "x__valid" in b for b in batches)
    values = {i: (v if ok else None) for b in batches
              for i, v, ok in zip(b["id"].tolist(), b["x"].tolist(), b["x__valid"].tolist(), strict=True)}
    assert values == dict(zip(range(18), [big] * 9 + [None, big + 1] * 4 + [None], strict=True))



def test_a_rewritten_file_with_nulls_gets_a_mask_though_its_footers_null_counts_were_kept(tmp_path):
    """The null counts worked out from a footer are kept with that parsed footer (``FileMemo``): after the file is
    rewritten with a null in place of a value, a new plan's loader delivers the mask, not a value for the null."""
    root = _table_dataset(tmp_path, [pa.table({"id": list(range(6)), "x": [7] * 6})])
    first = make_loader(0, 1, plan=plan_shards(root, 1, batch_size=3, engine="local"), shuffle=False)
    assert first.schema["x"].nulls != "mask" and "x__valid" not in next(iter(first))
    pq.write_table(pa.table({"id": list(range(6)), "x": [7, None] * 3}), os.path.join(root, "part-0.parquet"))
    again = make_loader(0, 1, plan=plan_shards(root, 1, batch_size=3, engine="local"), shuffle=False)
    valid = [v for b in again for v in b["x__valid"].tolist()]
    assert again.schema["x"].nulls == "mask" and valid == [True, False] * 3


def test_a_footers_memo_answers_for_that_footer_alone_and_goes_with_it():
    """``FileMemo`` keeps one dict per living footer object: the same for the same object, another for another,
    dropped when its footer is collected (and its address may be reused)."""
    import gc

    from petastorm_balanced.io.footer import FileMemo

    class Footer:  # any object with weak references stands for a FileMetaData
        pass
    memo, one, two = FileMemo(), Footer(), Footer()
    memo.get(one)["x"] = True
    assert memo.get(one) == {"x": True} and memo.get(two) == {} and len(memo) == 2
    del one
    gc.collect()
    assert len(memo) == 1 and all(memo.get(Footer()) == {} for _ in range(50))

def test_multi_chunk_dictionary_and_polars_categorical_nulls_stay_none(tmp_path):
    """A dictionary column with nulls read across row groups (several chunks) keeps its nulls as None."""
    values = [None if i % 4 == 0 else ["red", "green", "blue"][i % 3] for i in range(20)]
    (tmp_path / "pa").mkdir()
    roots = [_table_dataset(tmp_path / "pa", [pa.table({"id": list(range(20)),
                                                         "c": pa.array(values).dictionary_encode()})])]
    if "polars" in WRITERS:
        import polars as pl
        root = tmp_path / "pl"
        root.mkdir()
        frame = pl.DataFrame({"id": list(range(20)), "c": values}, schema={"id": pl.Int64, "c": pl.Categorical})
        frame.write_parquet(root / "x.parquet", row_group_size=3)
        roots.append(str(root))
    for root in roots:
        check_dataset(root)
        plan = plan_shards(root, 1, batch_size=4, engine="local")
        got = {i: v for b in make_loader(0, 1, plan=plan, backend="arrow")
               for i, v in zip(b["id"].tolist(), b["c"], strict=True)}
        assert got == dict(enumerate(values))


def test_temporal_nulls_are_masked_not_sentinels(tmp_path):
    table = pa.table({"id": list(range(8)),
                      "ts": pa.array([None, 1, 2, None, 4, 5, 6, 7], pa.timestamp("ns")),
                      "d": pa.array([None] + list(range(7)), pa.date32()),
                      "dur": pa.array([1, None] * 4, pa.duration("s"))})
    root = _table_dataset(tmp_path, [table])
    loader = make_loader(0, 1, plan=plan_shards(root, 1, batch_size=2, engine="local"), backend="arrow")
    for batch in loader:
        for name in ("ts", "d", "dur"):
            assert not (batch[name] == np.iinfo(np.int64).min).any()
            assert (batch[name][~batch[name + "__valid"]] == 0).all()
    check_dataset(root)


def test_list_columns_have_one_type_whatever_the_batch(tmp_path):
    """Equal-length lists in one file, ragged and nested ones in another: lists of Python lists in every batch."""
    root = _table_dataset(tmp_path, [
        pa.table({"id": list(range(6)), "l": pa.array([[1, 2]] * 6, pa.list_(pa.int32())),
                  "n": pa.array([[[1], [2, 3]]] * 6, pa.list_(pa.list_(pa.int32())))}),
        pa.table({"id": list(range(6, 12)), "l": pa.array([[1], [], None, [1, 2, 3], [4], [5]], pa.list_(pa.int32())),
                  "n": pa.array([[[1, 2], []], None, [], [[None]], [[1]], [[2]]], pa.list_(pa.list_(pa.int32())))})])
    check_dataset(root)
    loader = make_loader(0, 1, plan=plan_shards(root, 1, batch_size=3, engine="local"), backend="arrow",
                         shuffle=False)
    assert {type(b["l"]) for b in loader} == {list} and loader.schema["n"].kind == LIST


_LIST_ITEMS = {pa.int8(): st.integers(-128, 127), pa.int64(): st.integers(-2 ** 63, 2 ** 63 - 1),
               pa.uint64(): st.integers(0, 2 ** 64 - 1), pa.float32(): st.floats(width=32),
               pa.float64(): st.floats(), pa.bool_(): st.booleans()}


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_list_values_built_from_flat_values_equal_to_pylist(data):
    """The loader's fast path for list columns (flat values cut at the offsets) gives exactly ``to_pylist()``:
    the same values and Python types, None for null lists, sliced arrays, null items (where it falls back)."""
    from unittest import mock

    from petastorm_balanced.reading.rows import fragments
    item_type = data.draw(st.sampled_from(list(_LIST_ITEMS)))
    items = _LIST_ITEMS[item_type] | st.none() if data.draw(st.booleans()) else _LIST_ITEMS[item_type]
    rows = data.draw(st.lists(st.none() | st.lists(items, max_size=5), max_size=20))
    array = pa.array(rows, type=(pa.large_list if data.draw(st.booleans()) else pa.list_)(item_type))
    begin, end = sorted(data.draw(st.tuples(st.integers(0, len(rows)), st.integers(0, len(rows)))))
    array = array.slice(begin, end - begin)
    with mock.patch.object(fragments, "_FAST_TO_PYLIST", False):  # the flat path, whatever this pyarrow
        got = fragments.python_values(array)
    want = array.to_pylist()
    same = [(type(a), a if a == a else "nan") for row in got if row for a in row]
    assert same == [(type(a), a if a == a else "nan") for row in want if row for a in row]
    assert [None if row is None else len(row) for row in got] == [None if row is None else len(row) for row in want]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_list_values_cut_batch_by_batch_equal_to_pylist(data):
    """``batch_values`` (a run's list column made one batch at a time from offsets and items read once) gives
    each batch exactly ``to_pylist()`` of its rows: values, Python types, None for null lists, sliced arrays."""
    from unittest import mock

    from petastorm_balanced.reading.rows import fragments
    item_type = data.draw(st.sampled_from(list(_LIST_ITEMS)))
    items = _LIST_ITEMS[item_type] | st.none() if data.draw(st.booleans()) else _LIST_ITEMS[item_type]
    batch_size = data.draw(st.integers(1, 4))
    rows = data.draw(st.lists(st.none() | st.lists(items, max_size=5), max_size=20))
    array = pa.array(rows, type=(pa.large_list if data.draw(st.booleans()) else pa.list_)(item_type))
    begin = data.draw(st.integers(0, len(rows)))
    array = array.slice(begin, (len(rows) - begin) // batch_size * batch_size)
    fast = data.draw(st.booleans())  # the flat path, or to_pylist per batch (pyarrow 20 and later)
    with mock.patch.object(fragments, "_FAST_TO_PYLIST", not fast):
        cut = fragments.batch_values(array, batch_size)
        got = [cut(b) for b in range(len(array) // batch_size)]
    want = [array.slice(b * batch_size, batch_size).to_pylist() for b in range(len(array) // batch_size)]

    def typed(batches):
        return [[None if row is None else [(type(a), a if a == a else "nan") for a in row] for row in batch]
                for batch in batches]
    assert typed(got) == typed(want)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(1, 100), min_size=1, max_size=40), data=st.data(),
       kind=st.sampled_from([pa.bool_(), pa.int8(), pa.int16(), pa.uint64(), pa.int64(), pa.date32(),
                             pa.timestamp("ns")]))
def test_nullable_values_and_masks_equal_arrow_at_any_offset(values, data, kind):
    """A nullable bool, int or temporal column (sliced at any bit offset, whatever its null slots store) converts
    to Arrow's values, False or 0 where null, and a ``__valid`` mask equal to ``is_valid()``: the bitmaps are
    unpacked from their bytes."""
    from petastorm_balanced.reading.fields.schema import column_schema
    from petastorm_balanced.reading.rows.convert import to_values
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))))
    stored = np.array(values)  # null slots hold these too, as a writer may leave them
    storage = pa.bool_() if kind == pa.bool_() else pa.int32() if kind == pa.date32() else kind
    if pa.types.is_timestamp(kind):
        storage = pa.int64()
    payload = np.packbits(stored % 2 == 1, bitorder="little") if kind == pa.bool_() else \
        stored.astype(storage.to_pandas_dtype())
    array = pa.Array.from_buffers(kind, len(values), [pa.py_buffer(np.packbits(valid, bitorder="little")),
                                                      pa.py_buffer(payload)])
    array = array.slice(data.draw(st.integers(0, len(values))))
    spec = column_schema("x", array.type, nullable=True)
    out = to_values(array, spec)
    as_stored = array.view(storage) if pa.types.is_temporal(kind) else array
    assert out["x"].tolist() == as_stored.fill_null(False if kind == pa.bool_() else 0).to_pylist()
    if spec.mask is not None and array.null_count:
        assert out[spec.mask].dtype == np.bool_ and out[spec.mask].tolist() == array.is_valid().to_pylist()


def test_incompatible_types_across_files_are_refused_when_the_loader_is_made(tmp_path):
    root = _table_dataset(tmp_path, [pa.table({"id": [0, 1, 2], "x": [1, 2, 3]}),
                                     pa.table({"id": [3, 4, 5], "x": ["a", "b", "c"]})])
    plan = plan_shards(root, 1, batch_size=3, engine="local")
    with pytest.raises(InvalidValueError, match=r"column 'x' is int64 in 'part-0.parquet' but string in "
                                                r"'part-1.parquet'"):
        make_loader(0, 1, plan=plan, backend="arrow")


def test_widened_and_variant_types_unify(tmp_path):
    """int32 in one file and int64 in another, string and large_string (and string_view where pyarrow writes it):
    one delivered type, values exact."""
    tables = [pa.table({"id": pa.array([0, 1, 2], pa.int64()), "x": pa.array([1, 2, None], pa.int32()),
                        "s": pa.array(["a", None, "b"], pa.string())}),
              pa.table({"id": pa.array([3, 4, 5], pa.int64()), "x": pa.array([2**40, 5, 6], pa.int64()),
                        "s": pa.array(["c", "d", None], pa.large_string())})]
    if hasattr(pa, "string_view"):
        tables.append(pa.table({"id": pa.array([6, 7, 8], pa.int64()), "x": pa.array([7, 8, 9], pa.int64()),
                                "s": pa.array(["e", None, "f"], pa.string_view())}))
    root = _table_dataset(tmp_path, tables)
    plan = plan_shards(root, 1, batch_size=3, engine="local")
    loader = make_loader(0, 1, plan=plan, backend="arrow", shuffle=False)
    assert loader.schema["x"].dtype == "int64" and loader.schema["s"].item == "str"
    got = delivered(list(make_loader(0, 1, plan=plan, backend="arrow", padding_mask=True)),
                    make_loader(0, 1, plan=plan, backend="arrow", padding_mask=True).schema)
    assert got["x"] == {0: 1, 1: 2, 2: None, 3: 2**40, 4: 5, 5: 6, **({6: 7, 7: 8, 8: 9} if len(tables) > 2 else {})}
    assert got["s"] == {0: "a", 1: None, 2: "b", 3: "c", 4: "d", 5: None,
                        **({6: "e", 7: None, 8: "f"} if len(tables) > 2 else {})}


def test_hive_values_are_decoded_and_typed_as_pyarrow_dataset(tmp_path):
    """'a/b', '50%', spaces, unicode and nulls in folder names, an int column with a null; predicates see them."""
    root = tmp_path / "ds"
    for i, (s, n) in enumerate([("a%2Fb", "1"), ("50%25", "__HIVE_DEFAULT_PARTITION__"), ("x y", "2"),
                                ("%C3%BC", "1"), ("__HIVE_DEFAULT_PARTITION__", "3")]):
        folder = root / f"s={s}" / f"n={n}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": [2 * i, 2 * i + 1]}), folder / "f.parquet")
    check_dataset(str(root))
    plan = plan_shards(str(root), 1, batch_size=1, engine="local")
    schema = make_loader(0, 1, plan=plan, backend="arrow").schema
    assert (schema["n"].dtype, schema["n"].nulls, schema["s"].item) == ("int32", "mask", "str")
    for predicate, rows in ((in_lambda(["n"], lambda n: n == 1), 4), (in_lambda(["n"], lambda n: n > 1), 4),
                            (in_lambda(["s"], lambda s: s is None), 2), (in_lambda(["s"], lambda s: s == "a/b"), 2),
                            (in_lambda(["s"], lambda s: s is not None and s.startswith("5")), 2)):
        assert plan_shards(str(root), 1, batch_size=1, predicate=predicate, engine="local").total_rows == rows


def test_nullable_string_column_reaches_predicates_as_none(tmp_path):
    root = _table_dataset(tmp_path, [pa.table({"id": list(range(6)), "t": ["ab", None, "ac", None, "b", "a"]})])
    for predicate, rows in ((in_lambda(["t"], lambda t: t is None), 2),
                            (in_lambda(["t"], lambda t: t is not None and t.startswith("a")), 3)):
        assert plan_shards(root, 1, batch_size=1, predicate=predicate, engine="local").total_rows == rows


def test_a_validity_mask_name_clash_is_refused(tmp_path):
    root = _table_dataset(tmp_path, [pa.table({"id": [0, 1, 2], "x": [1, None, 3], "x__valid": [True, True, True]})])
    with pytest.raises(InvalidValueError, match="x__valid"):
        make_loader(0, 1, plan=plan_shards(root, 1, batch_size=3, engine="local"), backend="arrow")


@pytest.mark.slow
@pytest.mark.stack
def test_spark_written_datasets_and_where_agree(spark, tmp_path):
    """Spark's own partitioned writer ('a/b', '50%', nulls, an int partition): values equal pyarrow.dataset's, and
    a where on the partition columns selects the rows the loader delivers with those values."""
    rows = [(i, f"v{i}" if i % 3 else None, ["a/b", "50%", None, "x y"][i % 4], [1, None, 2][i % 3])
            for i in range(24)]
    frame = spark.createDataFrame(rows, "id long, v string, s string, n int")
    out = str(tmp_path / "spark")
    frame.coalesce(2).write.partitionBy("s", "n").parquet(out)
    check_dataset(out)
    expected = oracle(out)
    for where, keep in (("n = 1", lambda i: expected["n"][i] == 1), ("s IS NULL", lambda i: expected["s"][i] is None),
                        ("s = 'a/b' AND n > 0", lambda i: expected["s"][i] == "a/b" and (expected["n"][i] or 0) > 0)):
        plan = plan_shards(out, 1, batch_size=1, where=where, spark=spark)
        assert plan.total_rows == sum(1 for i in expected["id"] if keep(i)), where


def _tmp() -> str:
    path = os.path.join(tempfile.gettempdir(), "pb-conformance")
    os.makedirs(path, exist_ok=True)
    return path
