"""``TransformSpec``: a user function applied to the delivered rows where they are decoded, schema declared first.

Petastorm's contract (``petastorm.transform.TransformSpec``, whose instances are accepted as well): ``func`` gets
a pandas DataFrame of the rows being delivered (decoded values for a Unischema dataset: one numpy array per codec
cell) and returns them edited; ``edit_fields`` declares the columns it adds or changes (``(name, numpy_dtype,
shape, nullable)`` tuples or UnischemaFields), ``removed_fields`` those it drops, ``selected_fields`` picks and
orders the output. The declaration is what ``loader.schema`` says before the first batch, so every batch keeps one
set of keys, dtypes and shapes.

One rule more than Petastorm: ``func`` must return **the same rows in the same order**. A planned loader promises
every rank the same number of steps (G1) and a resumable position counted in rows; a function that drops, adds or
reorders rows would break both silently. Checked on every call, at no real cost: the row count, and the
DataFrame's index (the input has a ``RangeIndex``; filtering, ``sort_values`` or ``sample`` change it). A function
that reorders rows and then calls ``reset_index(drop=True)`` is not detected: the rule still applies to it.

The schema part is pure (``output_columns``); ``Transform.apply`` runs in the reader threads, Petastorm's workers or
the DataLoader worker processes, wherever the decoding runs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import InvalidTypeError, InvalidValueError, RowShapeError
from ...unischema.decode import decode_value, is_scalar
from ..fields.schema import LIST, MASK_SUFFIX, TENSOR, ColumnSchema
from . import convert
from .fragments import locate

RULE = "transform_spec.func must return the same rows, in the same order, as the DataFrame it was given"


class TransformSpec:
    """What to do to the delivered rows: ``func(DataFrame) -> DataFrame`` plus the schema edits it makes.

    The same arguments as Petastorm's ``TransformSpec`` (whose instances the readers accept too). ``edit_fields``:
    ``(name, numpy_dtype, shape, nullable)`` tuples or UnischemaFields for every column ``func`` adds or changes
    the type or shape of; ``removed_fields``: names dropped (also when ``func`` leaves them in); ``selected_fields``:
    the output columns, in this order (only one of ``removed_fields`` and ``selected_fields``).
    """

    def __init__(self, func: Callable[[Any], Any] | None = None, edit_fields: Sequence[Any] | None = None,
                 removed_fields: Sequence[str] | None = None, selected_fields: Sequence[str] | None = None):
        if func is not None and not callable(func):
            raise InvalidTypeError(f"TransformSpec(func={func!r}) must be callable (DataFrame -> DataFrame) or None")
        if removed_fields is not None and selected_fields is not None:
            raise InvalidValueError("TransformSpec takes removed_fields or selected_fields, not both: list the columns "
                                    "to keep in selected_fields, or the ones to drop in removed_fields")
        self.func = func
        self.edit_fields = [edited_field(f) for f in edit_fields or ()]
        self.removed_fields = _names("removed_fields", removed_fields or ())
        self.selected_fields = None if selected_fields is None else _names("selected_fields", selected_fields)

    def __repr__(self) -> str:
        return (f"TransformSpec(func={self.func!r}, edit_fields={self.edit_fields!r}, "
                f"removed_fields={self.removed_fields!r}, selected_fields={self.selected_fields!r})")


def edited_field(item: Any) -> tuple[str, Any, tuple, bool]:
    """One ``edit_fields`` entry as ``(name, numpy_dtype, shape, nullable)``: a 4-tuple or a UnischemaField."""
    if hasattr(item, "name") and hasattr(item, "numpy_dtype"):  # a UnischemaField (ours or Petastorm's)
        name, dtype, shape, nullable = item.name, item.numpy_dtype, item.shape, item.nullable
    elif isinstance(item, (tuple, list)) and len(item) == 4:
        name, dtype, shape, nullable = item
    else:
        raise InvalidTypeError(f"edit_fields item {item!r} must be a (name, numpy_dtype, shape, nullable) tuple or a "
                               "UnischemaField")
    if not isinstance(name, str):
        raise InvalidTypeError(f"edit_fields item {item!r}: the name must be a str")
    shape = tuple(shape or ())
    if any(d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 0) for d in shape):
        raise InvalidValueError(f"edit_fields item {item!r}: shape {shape} must hold ints >= 0 (None: varies)")
    return name, dtype, shape, bool(nullable)


def _names(parameter: str, names: Sequence[str]) -> list[str]:
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise InvalidTypeError(f"TransformSpec({parameter}={names!r}) must be a list of column names")
    return list(names)


def as_spec(value: Any) -> TransformSpec | None:
    """Ours, or Petastorm's ``TransformSpec`` (anything with its four attributes) converted; None stays None."""
    if value is None or isinstance(value, TransformSpec):
        return value
    if all(hasattr(value, a) for a in ("func", "edit_fields", "removed_fields", "selected_fields")):
        return TransformSpec(value.func, value.edit_fields, value.removed_fields or None, value.selected_fields)
    raise InvalidTypeError(f"transform_spec={value!r} must be a petastorm_balanced.TransformSpec (or Petastorm's)")


def edited_column(name: str, dtype: Any, shape: tuple, nullable: bool) -> ColumnSchema:
    """How an ``edit_fields`` column is delivered: a tensor for a numeric dtype of fixed shape (nullable floats
    as NaN, nullable scalars with a ``__valid`` mask), else a list of one value per row."""
    try:
        numpy_dtype = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        numpy_dtype = None  # Decimal and other Python types: values as they are
    described = f"{getattr(numpy_dtype, 'name', dtype)}{list(shape)}"
    fixed = all(d is not None for d in shape)
    if numpy_dtype is not None and numpy_dtype.kind in "biuf" and fixed:
        if not nullable:
            return ColumnSchema(name, described, TENSOR, numpy_dtype.name, shape, False, "never")
        if numpy_dtype.kind == "f":
            return ColumnSchema(name, described, TENSOR, numpy_dtype.name, shape, True, "nan")
        if not shape:
            return ColumnSchema(name, described, TENSOR, numpy_dtype.name, (), True, "mask", name + MASK_SUFFIX)
    nulls = "None" if nullable else "never"
    if numpy_dtype is not None and not shape and numpy_dtype.kind in "US":
        return ColumnSchema(name, described, LIST, None, (), nullable, nulls, item="str" if numpy_dtype.kind == "U"
                            else "bytes")
    return ColumnSchema(name, described, LIST, None, (), nullable, nulls, item="numpy" if shape else "python")


def output_columns(spec: TransformSpec, schemas: Sequence[ColumnSchema]) -> tuple[ColumnSchema, ...]:
    """The delivered columns after ``spec``, as Petastorm's ``transform_schema`` orders them: the input's minus
    removed and edited ones, then the edited ones, then ``selected_fields``' order if given."""
    names = [c.name for c in schemas]
    unknown = sorted(set(spec.removed_fields) - set(names))
    if unknown:
        raise InvalidValueError(f"transform_spec removed_fields names {unknown[0]!r}, which is not a column read; the "
                                f"columns are {names}")
    edited = {f[0] for f in spec.edit_fields}
    out = [c for c in schemas if c.name not in edited and c.name not in set(spec.removed_fields)]
    out += [edited_column(*f) for f in spec.edit_fields]
    if spec.selected_fields is not None:
        twice = sorted({n for n in spec.selected_fields if list(spec.selected_fields).count(n) > 1})
        if twice:
            raise InvalidValueError(f"transform_spec selected_fields names {twice[0]!r} more than once; a batch "
                                    "holds each column once: name it once")
        by_name = {c.name: c for c in out}
        missing = [n for n in spec.selected_fields if n not in by_name]
        if missing:
            raise InvalidValueError(f"transform_spec selected_fields names {missing[0]!r}, which is neither a column "
                                    f"read nor in edit_fields; the columns are {list(by_name)}")
        out = [by_name[n] for n in spec.selected_fields]
    if not out:
        raise InvalidValueError("transform_spec leaves no column to deliver; keep at least one")
    return tuple(out)


def check_rows(given: Any, returned: Any) -> None:
    """Raise unless ``returned`` is a DataFrame with ``given``'s rows in ``given``'s order (count and index)."""
    import pandas as pd
    if not isinstance(returned, pd.DataFrame):
        raise InvalidTypeError(f"transform_spec.func returned {type(returned).__name__}, not a pandas DataFrame; "
                               f"{RULE}")
    if len(returned) != len(given):
        raise InvalidValueError(f"transform_spec.func returned {len(returned)} rows for {len(given)}: {RULE} "
                                "(every rank takes the same number of steps); filter rows at planning "
                                "(plan_shards(where=...) or a predicate), not in func")
    if not returned.index.equals(given.index):
        raise InvalidValueError(f"transform_spec.func returned the rows in another order (the DataFrame's index "
                                f"changed): {RULE}; edit the columns in place instead of sorting or sampling")


def checked(func: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``func`` with ``check_rows`` after every call (for Petastorm's own workers, which call it themselves)."""
    def call(frame):
        returned = func(frame)
        check_rows(frame, returned)
        return returned
    return call


@dataclass(frozen=True)
class Transform:
    """A ``TransformSpec`` bound to the loader's columns: the input schemas, the output ones, the Unischema
    fields that decode the input. Pickled into DataLoader workers (spawn) and Petastorm's process pool."""

    spec: TransformSpec
    inputs: tuple[ColumnSchema, ...]
    outputs: tuple[ColumnSchema, ...]
    fields: dict | None = None

    def apply(self, table: pa.Table, fragments: Sequence = ()) -> dict:
        """The table's rows decoded into a DataFrame, through ``func`` (rows checked), as delivered columns
        (``fragments``: where the rows come from, to name a row that does not fit the schema)."""
        frame = input_frame(table, self.fields)
        returned = frame
        if self.spec.func is not None:
            returned = self.spec.func(frame)
            check_rows(frame, returned)
        out: dict = {}
        edited = {f[0] for f in self.spec.edit_fields}
        types = {f.name: f.type for f in table.schema}
        twice = sorted({str(n) for n in returned.columns[returned.columns.duplicated()]})
        if twice:
            raise InvalidValueError(f"transform_spec.func returned column {twice[0]!r} more than once (a DataFrame "
                                    "with duplicate column names); return each column once")
        for column in self.outputs:
            if column.name not in returned.columns:
                raise InvalidValueError(f"transform_spec.func returned no column {column.name!r}, which the schema "
                                        "declares (loader.schema); return it, or list it in removed_fields")
            values = returned[column.name]
            field = (self.fields or {}).get(column.name)
            if column.name not in edited and column.name in types and (field is None or is_scalar(field)):
                array = _stored(values, types[column.name], column.name)  # back to the stored type
                if array.null_count and not column.nullable and not table.column(column.name).null_count:
                    raise InvalidValueError(f"transform_spec.func put a null into column {column.name!r}, which is "
                                            "not nullable as read; declare it in edit_fields with nullable=True, or "
                                            "fill the nulls in func")
                try:
                    out.update(convert.to_values(array, column))
                except RowShapeError as exc:
                    raise RowShapeError(f"{exc} ({locate(fragments, exc.row)})", exc.row) from None
            else:
                out.update(from_cells(column, list(values)))
        return out


def _stored(values, arrow_type, name: str) -> pa.Array:
    """A column the func returned, back in its stored type; refused naming the column when func changed its type
    (strings for integers) without declaring it."""
    try:
        return pa.array(values, type=arrow_type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise InvalidValueError(f"transform_spec.func changed column {name!r} to {values.dtype} values that are not "
                                f"its stored {arrow_type} ({detail}); declare the new type in edit_fields, e.g. "
                                f"TransformSpec(func, edit_fields=[({name!r}, np.str_, (), False)])") from None


def bind(spec: Any, inputs: Sequence[ColumnSchema], fields: dict | None) -> Transform | None:
    """``spec`` (ours, Petastorm's or None) bound to the columns read; refuses names that are not there."""
    ours = as_spec(spec)
    if ours is None:
        return None
    return Transform(ours, tuple(inputs), output_columns(ours, inputs), fields)


def input_frame(table: pa.Table, fields: dict | None):
    """The DataFrame ``func`` gets: pandas' values (as ``make_batch_reader`` gives them) for plain columns, the
    decoded value per cell (a numpy array per codec cell, the field's numpy type for scalars) for Unischema
    fields; a ``RangeIndex``."""
    import pandas as pd
    data = {}
    for name in table.column_names:
        column = table.column(name)
        field = (fields or {}).get(name)
        if field is None or is_scalar(field):
            data[name] = column.to_pandas()
        else:
            cells = np.empty(len(column), dtype=object)
            cells[:] = [decode_value(field, v) for v in column.to_pylist()]
            data[name] = pd.Series(cells, dtype=object)
    return pd.DataFrame(data, index=pd.RangeIndex(table.num_rows))


def from_cells(column: ColumnSchema, cells: list) -> dict:
    """Per-row values as ``column`` declares them: stacked into a tensor (shape and nulls checked, dtype cast
    where numpy's ``same_kind`` allows), or an object array of one value per row."""
    if column.kind == LIST:
        items = np.empty(len(cells), dtype=object)
        items[:] = [None if _is_null(c) else c for c in cells] if column.nullable else cells
        if not column.nullable and any(_is_null(c) for c in cells):
            raise InvalidValueError(f"transform_spec column {column.name!r} holds None but is not declared nullable "
                                    "(edit_fields: nullable=True)")
        return {column.name: items}
    dtype = np.dtype(column.dtype)
    valid = None
    if column.nulls == "mask":
        valid = np.array([not _is_null(c) for c in cells], dtype=bool)
        cells = [c if ok else 0 for c, ok in zip(cells, valid, strict=True)]
    elif column.nulls == "nan":
        cells = [np.full(column.shape, np.nan) if _is_null(c) else c for c in cells]
    wrong = [i for i, c in enumerate(cells) if _is_null(c) or np.shape(c) != column.shape]
    if wrong:
        cell = cells[wrong[0]]
        raise InvalidValueError(f"transform_spec column {column.name!r} row {wrong[0]} is "
                                f"{'None' if _is_null(cell) else np.shape(cell)}, not the declared shape "
                                f"{column.shape}{'' if column.nullable else ' (not nullable)'} (edit_fields)")
    stacked = np.asarray(cells) if not column.shape else (np.stack(cells) if cells else
                                                          np.empty((0, *column.shape)))
    if not len(cells):
        stacked = stacked.reshape((0, *column.shape))
    if stacked.dtype != dtype:
        if not np.can_cast(stacked.dtype, dtype, casting="same_kind"):
            raise InvalidValueError(f"transform_spec column {column.name!r} holds {stacked.dtype}, which does not "
                                    f"cast to the declared {dtype} without changing kind (edit_fields); cast it "
                                    "in func or declare its dtype")
        stacked = convert.checked_astype(stacked, dtype, column.name, "transform_spec's edit_fields declares")
    out = {column.name: stacked}
    if valid is not None:
        out[column.mask or column.name + MASK_SUFFIX] = valid
    return out


def _is_null(value: Any) -> bool:
    if value is None:
        return True
    if type(value).__name__ in ("NAType", "NaTType"):  # pandas' pd.NA (nullable Int64, boolean, string) and NaT
        return True
    return isinstance(value, float) and value != value


def transformed_unischema(schema: Any, spec: TransformSpec) -> Any:
    """Petastorm's ``transform_schema`` on our classes: the Unischema ``make_reader`` rows follow after ``spec``."""
    from ...unischema import Unischema, UnischemaField
    removed, edited = set(spec.removed_fields), {f[0] for f in spec.edit_fields}
    fields = [v for k, v in schema.fields.items() if k not in edited | removed]
    fields += [UnischemaField(name, dtype, shape, None, nullable) for name, dtype, shape, nullable in spec.edit_fields]
    selected = spec.selected_fields
    if selected is not None:
        fields = sorted((f for f in fields if f.name in selected), key=lambda f: selected.index(f.name))
    return Unischema(schema._name + "_transformed", fields)


__all__ = ["RULE", "Transform", "TransformSpec", "bind", "check_rows", "checked"]
