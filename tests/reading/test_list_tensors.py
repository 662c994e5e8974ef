"""List columns of numbers as tensors (``reading/fields/list_shapes.py``, G13): values equal ``pyarrow.dataset``'s, the
form decided before the first batch and the same in every batch, on both backends and in DataLoader workers; rows of
another length and nulls with no tensor form are refused naming the column, the file and the row, never disguised.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from petastorm_balanced import BalancedIterableDataset, TransformSpec, make_loader, plan_shards
from petastorm_balanced.errors import InvalidValueError, RowShapeError
from petastorm_balanced.reading.backends import petastorm_importable
from petastorm_balanced.reading.fields.list_shapes import ListOptions
from petastorm_balanced.reading.fields.schema import LIST, TENSOR
from tests.support.resume_contract import check_resume_contract

torch = pytest.importorskip("torch")
BACKENDS = ["arrow"] + (["petastorm"] if petastorm_importable() else [])
FAST = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
ITEMS = {pa.int8(): st.integers(-128, 127), pa.int64(): st.integers(-2 ** 63, 2 ** 63 - 1),
         pa.uint64(): st.integers(0, 2 ** 64 - 1), pa.float32(): st.floats(width=32, allow_nan=False),
         pa.float64(): st.floats(allow_nan=False), pa.bool_(): st.booleans()}


# ------------------------------------------------------------------------------------------------ helpers

def write(tmp_path, tables, row_group_size=3, name="ds") -> str:
    root = tmp_path / name
    root.mkdir()
    for i, table in enumerate(tables):
        pq.write_table(table, root / f"part-{i}.parquet", row_group_size=row_group_size)
    return str(root)


def oracle(root: str) -> dict:
    """``{column: {id: value}}``: pyarrow.dataset's ``to_pylist()``."""
    table = pads.dataset(root, format="parquet", partitioning="hive").to_table()
    ids = table.column("id").to_pylist()
    return {n: dict(zip(ids, table.column(n).to_pylist(), strict=True)) for n in table.column_names}


def _none_for_nan(value):
    if isinstance(value, list):
        return [_none_for_nan(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def delivered(batches, schema) -> dict:
    """``{column: {id: value}}`` read back as the schema says: tensors to lists, padded values cut at their length,
    masked rows None, NaN None (the data here holds no NaN value)."""
    out: dict = {c.name: {} for c in schema if not c.name.endswith(("__valid", "__lengths")) and c.name != "_padding"}
    for batch in batches:
        schema.check(batch)
        keep = [not p for p in batch["_padding"].tolist()] if "_padding" in batch else [True] * len(batch["id"])
        for column in schema:
            if column.name not in out:
                continue
            values = batch[column.name] if column.kind == LIST else batch[column.name].tolist()
            if column.lengths is not None:
                values = [v[:n] for v, n in zip(values, batch[column.lengths].tolist(), strict=True)]
            if column.mask is not None:
                values = [v if ok else None for v, ok in zip(values, batch[column.mask].tolist(), strict=True)]
            if column.kind == TENSOR and (column.nulls == "nan" or column.dtype.startswith("float")):
                values = _none_for_nan(values)
            for i, value, k in zip(batch["id"].tolist(), values, keep, strict=True):
                if k:
                    assert i not in out[column.name], f"id {i} delivered twice"
                    out[column.name][i] = value
    return out


def _nan_rows(shape):
    """A null row of a NaN tensor column, read back: NaN (None) at every item of the shape."""
    return None if not shape else [_nan_rows(shape[1:]) for _ in range(shape[0])]


def check_values(got: dict, expected: dict, schema=None) -> None:
    for name, values in got.items():
        assert set(values) == set(expected[name]), f"{name}: ids differ"
        column = schema[name] if schema is not None else None
        for i, value in values.items():
            want = expected[name][i]
            if want is None and column is not None and column.nulls == "nan" and column.shape:
                want = _nan_rows(column.shape)  # documented: a null row of floats is NaN
            assert value == want, f"column {name!r} id {i}: delivered {value!r}, file holds {want!r}"


def every_path(plan, world=1, batch=2, **kwargs):
    """(label, batches, schema) of each reading path: both backends, in-thread and threaded, DataLoader-style."""
    for rank in range(world):
        for backend in BACKENDS:
            for pool, shuffle in (("dummy", True), ("thread", False)):
                loader = make_loader(rank, world, plan=plan, backend=backend, reader_pool_type=pool, workers_count=2,
                                     shuffle=shuffle, shuffle_window=4, padding_mask=True, batch_size=batch, **kwargs)
                yield f"{backend}/{pool}", list(loader), loader.schema
        dataset = BalancedIterableDataset(plan, rank, world, batch_size=batch, backend="arrow", shuffle_window=4,
                                          padding_mask=True, **kwargs)
        yield "iterable", list(dataset), dataset.schema


def check_all_paths(root, world=1, batch=2, **kwargs):
    """Every path's values equal pyarrow.dataset's and one schema for all; returns the schema."""
    plan = plan_shards(root, world, batch_size=batch, policy="pad", engine="local")
    expected = oracle(root)
    schemas, merged = set(), {}
    for label, batches, schema in every_path(plan, world, batch, **kwargs):
        schemas.add(schema)
        for name, values in delivered(batches, schema).items():
            merged.setdefault(label, {}).setdefault(name, {}).update(values)
    assert len(schemas) == 1, "the schema differs between reading paths"
    schema = next(iter(schemas))
    for got in merged.values():
        check_values(got, expected, schema)
        assert set(got["id"]) == set(expected["id"])
    return schemas.pop()


# ------------------------------------------------------------------------------------------------ the case

def test_fixed_length_float_lists_are_batch_by_k_float32_tensors(tmp_path):
    """``vec: list<float>`` of 4 items in every row (as Spark writes arrays): ``(batch, 4)`` float32 tensors equal
    to the files' values, with the default list_format, on both backends and in DataLoader workers."""
    rng = np.random.default_rng(0)
    tables = []
    for f in range(2):
        values = rng.standard_normal((10, 4)).astype(np.float32)
        tables.append(pa.table({"id": np.arange(10 * f, 10 * f + 10), "length": np.full(10, 4),
                                "vec": pa.array(list(values), pa.list_(pa.float32()))}))
    root = write(tmp_path, tables, row_group_size=4)
    schema = check_all_paths(root, world=2, batch=3)
    assert (schema["vec"].kind, schema["vec"].dtype, schema["vec"].shape, schema["vec"].nulls) == \
        (TENSOR, "float32", (4,), "never")
    plan = plan_shards(root, 1, batch_size=4, engine="local")
    files = {i: v for t in tables for i, v in zip(t["id"].to_pylist(), t["vec"].to_pylist(), strict=True)}
    for batch in make_loader(0, 1, plan=plan):
        assert batch["vec"].shape == (4, 4) and batch["vec"].dtype == torch.float32
        for i, row in zip(batch["id"].tolist(), batch["vec"], strict=True):
            assert np.array_equal(row.numpy(), np.array(files[i], dtype=np.float32))


# ------------------------------------------------------------------------------------------------ properties

@st.composite
def list_columns(draw):
    """(Arrow type, rows) of a numeric list column: one length or several, nested or not, nulls or not."""
    item = draw(st.sampled_from(list(ITEMS)))
    nested = draw(st.booleans())
    length = draw(st.integers(0, 3))
    ragged = draw(st.booleans())
    null_rows, null_items = draw(st.booleans()), draw(st.booleans())
    items = ITEMS[item] | st.none() if null_items else ITEMS[item]
    inner = st.lists(items, min_size=2, max_size=2) if nested else items
    sizes = (0, 4) if ragged else (length, length)
    row = st.lists(inner, min_size=sizes[0], max_size=sizes[1])
    rows = draw(st.lists(st.none() | row if null_rows else row, min_size=4, max_size=12))
    make = draw(st.sampled_from([pa.list_, pa.large_list]))
    t = make(make(item)) if nested else make(item)
    return t, rows


def expected_form(t, rows, list_format: str) -> str:
    """'tensor', 'padded' or 'list': what the documented rules give for this column."""
    valid = [r for r in rows if r is not None]
    nested = pa.types.is_list(t.value_type) or pa.types.is_large_list(t.value_type)
    items = [x for r in valid for x in (sum(r, []) if nested else r)]
    if nested and not any(valid):  # no inner list: its length is unknown
        return "list"
    floating = pa.types.is_floating(t.value_type if not hasattr(t.value_type, "value_type")
                                    else t.value_type.value_type)
    if not valid or (any(x is None for x in items) and not floating):
        return "list"
    if list_format == "padded":
        return "padded"
    return "tensor" if len({len(r) for r in valid}) == 1 else "list"


@FAST
@given(data=st.data())
def test_list_values_equal_pyarrow_dataset_in_every_form(data, tmp_path_factory):
    t, rows = data.draw(list_columns())
    list_format = data.draw(st.sampled_from(["auto", "padded"]))
    tmp_path = tmp_path_factory.mktemp("lists")
    half = len(rows) // 2
    tables = [pa.table({"id": np.arange(len(part)) + offset, "x": pa.array(part, t)})
              for offset, part in ((0, rows[:half]), (half, rows[half:]))]
    root = write(tmp_path, tables)
    form = expected_form(t, rows, list_format)
    if form == "list" and list_format == "padded":
        with pytest.raises(InvalidValueError, match="'x'"):
            make_loader(0, 1, plan=plan_shards(root, 1, batch_size=2, engine="local"), list_format="padded",
                        backend="arrow")
        return
    schema = check_all_paths(root, list_format=list_format)
    column = schema["x"]
    assert column.kind == (LIST if form == "list" else TENSOR)
    assert (column.lengths is not None) == (form == "padded")
    if column.kind == TENSOR:
        leaf = t.value_type
        while hasattr(leaf, "value_type"):
            leaf = leaf.value_type
        assert column.dtype == np.dtype(leaf.to_pandas_dtype()).name
        assert (column.nulls == "mask") == (any(r is None for r in rows) and
                                            (form == "padded" or not pa.types.is_floating(leaf)))


def test_hypothesis_draws_every_form():
    """The strategy above reaches tensors, padded tensors and lists (else the property would check too little)."""
    forms = set()

    @settings(max_examples=200, deadline=None, database=None)
    @given(column=list_columns(), list_format=st.sampled_from(["auto", "padded"]))
    def collect(column, list_format):
        forms.add(expected_form(*column, list_format))
    collect()
    assert forms == {"tensor", "padded", "list"}


# ------------------------------------------------------------------------------------------------ refusals

def _ragged(tmp_path):
    return write(tmp_path, [pa.table({"id": [0, 1, 2, 3], "x": pa.array([[1, 2], [3, 4], [5, 6], [7, 8]])}),
                            pa.table({"id": [4, 5, 6, 7], "x": pa.array([[1, 2], [3, 4], [5, 6, 7], [8, 9]])})])


def test_a_declared_shape_is_checked_on_every_batch_naming_file_and_row(tmp_path):
    root = _ragged(tmp_path)
    plan = plan_shards(root, 1, batch_size=2, engine="local")
    for backend in BACKENDS:
        loader = make_loader(0, 1, plan=plan, backend=backend, list_shapes={"x": (2,)}, shuffle=False)
        assert loader.schema["x"].shape == (2,)
        with pytest.raises(RowShapeError, match=r"column 'x' holds a list of 3 items where loader.schema says 2 .*"
                                                r"'part-1.parquet' row group 0 row 2"):
            list(loader)
    dataset = BalancedIterableDataset(plan, 0, 1, batch_size=2, backend="arrow", list_shapes={"x": (2,)},
                                      shuffle=False)
    with pytest.raises(RowShapeError, match="'part-1.parquet' row group 0 row 2"):
        list(dataset)


def test_list_format_tensor_refuses_other_lengths_when_the_loader_is_made(tmp_path):
    plan = plan_shards(_ragged(tmp_path), 1, batch_size=2, engine="local")
    with pytest.raises(InvalidValueError, match=r"list_format='tensor': column 'x' holds lists of 2 to 3 items; "
                                                r"first at 'part-1.parquet' row group 0 row 2 .*list_format='padded'"):
        make_loader(0, 1, plan=plan, list_format="tensor", backend="arrow")
    auto = make_loader(0, 1, plan=plan, backend="arrow")
    assert auto.schema["x"].kind == LIST  # auto keeps ragged columns as lists of lists
    padded = make_loader(0, 1, plan=plan, backend="arrow", list_format={"x": "padded"})
    assert (padded.schema["x"].shape, padded.schema["x"].lengths) == ((3,), "x__lengths")


def test_nulls_are_nan_masks_or_refusals_never_values(tmp_path):
    """A null row of floats is NaN; of ints, a mask (values 0 there); a null int item has no tensor form: 'auto'
    keeps lists of lists (None inside), 'tensor' refuses naming the column and the fix."""
    root = write(tmp_path, [pa.table({
        "id": [0, 1, 2, 3],
        "f": pa.array([[1.5, 2.0], None, [3.0, None], [4.0, 5.0]], pa.list_(pa.float32())),
        "i": pa.array([[1, 2], None, [3, 4], [5, 6]], pa.list_(pa.int64())),
        "h": pa.array([[1, 2], [3, None], [5, 6], [7, 8]], pa.list_(pa.int64()))})])
    schema = check_all_paths(root)
    assert (schema["f"].nulls, schema["i"].nulls, schema["i"].mask, schema["h"].kind) == \
        ("nan", "mask", "i__valid", LIST)
    plan = plan_shards(root, 1, batch_size=4, engine="local")
    batch = next(iter(make_loader(0, 1, plan=plan, shuffle=False, backend="arrow")))
    order = torch.argsort(batch["id"])  # rows by id
    batch = {k: v[order] if isinstance(v, torch.Tensor) else [v[i] for i in order.tolist()] for k, v in batch.items()}
    assert torch.isnan(batch["f"][1]).all() and torch.isnan(batch["f"][2, 1]) and not torch.isnan(batch["f"][2, 0])
    assert batch["i__valid"].tolist() == [True, False, True, True] and batch["i"][1].tolist() == [0, 0]
    assert batch["h"] == [[1, 2], [3, None], [5, 6], [7, 8]]
    with pytest.raises(InvalidValueError, match=r"column 'h' holds null items in lists of int64.*'python'"):
        make_loader(0, 1, plan=plan, list_format={"h": "tensor"}, backend="arrow")
    declared = make_loader(0, 1, plan=plan, list_shapes={"h": (2,)}, shuffle=False, backend="arrow")
    with pytest.raises(RowShapeError, match=r"column 'h' holds a null item .*'part-0.parquet' row group 0 row 1"):
        list(declared)


def test_bad_list_arguments_are_refused(tmp_path):
    root = write(tmp_path, [pa.table({"id": [0, 1], "x": pa.array([[1, 2], [3, 4]]), "s": ["a", "b"],
                                      "x__lengths": [2, 2]})])
    plan = plan_shards(root, 1, batch_size=2, engine="local")
    for kwargs, message in (({"list_format": "jagged"}, "list_format='jagged' is not one of"),
                            ({"list_shapes": {"x": (2.0,)}}, r"list_shapes\['x'\]"),
                            ({"list_shapes": {"x": (2, 2)}}, "does not fit the column's list levels"),
                            ({"list_shapes": {"s": (2,)}}, "'s', which is string, not a list of numbers"),
                            ({"list_shapes": {"nope": (2,)}}, "'nope', which is not a list column read"),
                            ({"list_format": "python", "list_shapes": {"x": (2,)}}, "drop one of the two"),
                            ({"list_format": "padded", "schema_fields": ["id", "x", "x__lengths"]},
                             "'x__lengths', which is also the lengths")):
        with pytest.raises((InvalidValueError, TypeError), match=message):
            make_loader(0, 1, plan=plan, backend="arrow", **kwargs)
    assert ListOptions.of({"x": "padded"}, None).format_of("x") == "padded"


# ------------------------------------------------------------------------------------------------ everywhere else

def test_transform_spec_and_resume_keep_list_tensors(tmp_path):
    """A TransformSpec sees the list column as arrays per row (as Petastorm's) and delivers the declared tensor;
    resuming mid-epoch gives the batches that would have come next."""
    rows = [[float(i), float(i) + 0.5, -float(i)] for i in range(24)]
    root = write(tmp_path, [pa.table({"id": np.arange(24), "v": pa.array(rows, pa.list_(pa.float64()))})],
                 row_group_size=5)
    plan = plan_shards(root, 1, batch_size=4, engine="local")

    def double(frame):
        frame["id"] = frame["id"] * 1  # the rows unchanged; v as it was
        return frame
    for backend in BACKENDS:
        loader = make_loader(0, 1, plan=plan, backend=backend, transform_spec=TransformSpec(double))
        for batch in loader:
            assert batch["v"].shape == (4, 3) and batch["v"].dtype == torch.float64
            assert batch["v"].tolist() == [rows[i] for i in batch["id"].tolist()]
    check_resume_contract(lambda: make_loader(0, 1, plan=plan, backend="arrow", shuffle_window=8),
                          iter, epochs=2, cuts=[1, 3, -1])


def test_padded_lists_with_a_cost_plan_cost_their_lengths(tmp_path):
    """A cost plan on size(tokens) balanced by cost: the cost of a padded row is its length, not the padding."""
    rows = [list(range(i % 5)) for i in range(30)]
    root = write(tmp_path, [pa.table({"id": np.arange(30), "tokens": pa.array(rows, pa.list_(pa.int32()))})],
                 row_group_size=6)
    plan = plan_shards(root, 1, batch_size=3, engine="local", cost="size(tokens)")
    loader = make_loader(0, 1, plan=plan, backend="arrow", list_format="padded")
    for batch in loader:
        assert batch["_cost"].tolist() == batch["tokens__lengths"].tolist()
        assert batch["tokens"].shape == (3, 4)


def test_dataloader_workers_deliver_list_tensors(tmp_path):
    """BalancedDataLoader with worker processes: fixed and padded list tensors, the same batches as in-process."""
    rows = [list(range(i % 3)) for i in range(24)]
    root = write(tmp_path, [pa.table({"id": np.arange(24), "vec": pa.array([[i, -i] for i in range(24)]),
                                      "tokens": pa.array(rows, pa.list_(pa.int16()))})], row_group_size=5)
    plan = plan_shards(root, 1, batch_size=4, engine="local")
    dataset = BalancedIterableDataset(plan, 0, 1, batch_size=4, backend="arrow", list_format={"tokens": "padded"})
    batches = list(dataset.dataloader(num_workers=2))
    assert len(batches) == 6
    for batch in batches:
        dataset.schema.check(batch)
        ids = batch["id"].tolist()
        assert batch["vec"].tolist() == [[i, -i] for i in ids]
        assert [t[:n] for t, n in zip(batch["tokens"].tolist(), batch["tokens__lengths"].tolist(), strict=True)] == \
            [rows[i] for i in ids]
        assert batch["tokens"].dtype == torch.int16 and batch["tokens"].shape == (4, 2)
