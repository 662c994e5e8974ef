"""``loader.schema``: what every batch holds, decided once from the Arrow types and whether a column can hold nulls.

Why before the first batch, from types and footers, never from rows: a batch type that depends on the rows of the
batch (an int column turned float64 because this batch had a null, a list column stacked into a 2-D tensor because
its lists happened to be equal) changes from one training step to the next, breaks ``torch.compile`` and collate
functions, and silently loses integer precision. Here the representation of a column is a function of its Arrow type
(unified over the dataset's files) and of one flag, "may hold nulls" (the footers' null counts), so every batch of
every epoch has the same keys, dtypes and shapes.

Nulls are never disguised as legal values: floating columns show them as NaN; other tensor columns get a boolean
validity tensor ``<name>__valid`` beside them (their values at null rows are 0); list columns hold None.

>>> import pyarrow as pa
>>> column_schema("id", pa.int64(), nullable=True)
ColumnSchema(name='id', arrow_type='int64', kind='tensor', dtype='int64', shape=(), nullable=True, nulls='mask', \
mask='id__valid', item=None, lengths=None)
>>> column_schema("lang", pa.dictionary(pa.int32(), pa.string()), nullable=True).item
'str'
>>> unify_types("x", [("a.parquet", pa.string()), ("b.parquet", pa.large_string())])
DataType(string)
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ...errors import InvalidValueError

MASK_SUFFIX = "__valid"
PADDING = "_padding"  # the padding flag every loader's rows carry; delivered only with padding_mask=True
TENSOR, LIST = "tensor", "list"
NULLS = ("never", "nan", "mask", "None")


@dataclass(frozen=True)
class ColumnSchema:
    """One delivered column.

    ``kind`` is ``'tensor'`` (a torch tensor of ``dtype`` with ``shape`` per row, so ``(batch, *shape)``) or
    ``'list'`` (a Python list with one value per row; ``item`` says what a value is: ``'str'``, ``'bytes'``,
    ``'python'``, the value ``pyarrow``'s ``to_pylist()`` gives, or ``'numpy'``, a decoded Unischema cell).
    ``nulls`` is how a null is shown: ``'never'`` (the column holds none), ``'nan'``, ``'mask'`` (False in the
    tensor named ``mask``; the value there is 0) or ``'None'``. A list column delivered as a tensor
    (``list_shapes.py``) has the list levels in ``shape``; padded, ``lengths`` names its tensor of items per row.
    """

    name: str
    arrow_type: str
    kind: str
    dtype: str | None
    shape: tuple[int, ...]
    nullable: bool
    nulls: str
    mask: str | None = None
    item: str | None = None
    lengths: str | None = None  # padded lists: the int64 tensor of each row's number of items (list_shapes.py)


@dataclass(frozen=True)
class BatchSchema:
    """Every key of every batch, in order: data columns, each followed by its validity mask, then the loader's own
    (``_cost``, ``_padding``). ``schema["id"]`` is a column; ``schema.names`` the batch's keys."""

    columns: tuple[ColumnSchema, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def __getitem__(self, name: str) -> ColumnSchema:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"{name!r} is not a column of this schema; its columns are {list(self.names)}")

    def __iter__(self) -> Iterator[ColumnSchema]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def check(self, batch: dict) -> None:
        """Raise ``ValueError`` if ``batch`` (a dict of tensors and lists) does not match this schema."""
        if tuple(batch) != self.names:
            raise ValueError(f"batch keys {list(batch)} differ from the schema's {list(self.names)}")
        for column in self.columns:
            value = batch[column.name]
            if column.kind == TENSOR:
                dtype = str(getattr(value, "dtype", "")).replace("torch.", "")
                if dtype != column.dtype or tuple(value.shape[1:]) != column.shape:
                    raise ValueError(f"column {column.name!r} is {dtype} {tuple(value.shape)}; the schema says "
                                     f"{column.dtype} (batch, *{column.shape})")
            elif not isinstance(value, list):
                raise ValueError(f"column {column.name!r} is {type(value).__name__}; the schema says a list")


def mask_column(of: str) -> ColumnSchema:
    return ColumnSchema(of + MASK_SUFFIX, "bool", TENSOR, "bool", (), False, "never")


def lengths_column(name: str) -> ColumnSchema:
    return ColumnSchema(name, "int64", TENSOR, "int64", (), False, "never")


def extra_column(name: str, dtype: str) -> ColumnSchema:
    """A column the loader adds (``_padding``, ``_cost``)."""
    return ColumnSchema(name, dtype, TENSOR, dtype, (), False, "never")


def column_schema(name: str, arrow_type: pa.DataType, *, nullable: bool) -> ColumnSchema:
    """The representation of a column of (unified) ``arrow_type``; ``nullable``: the footers allow nulls."""
    t = delivered_type(arrow_type)
    text = str(t)
    dtype = tensor_dtype(t)
    if dtype is not None:
        if not nullable:
            return ColumnSchema(name, text, TENSOR, dtype, (), False, "never")
        if pa.types.is_floating(t):
            return ColumnSchema(name, text, TENSOR, dtype, (), True, "nan")
        return ColumnSchema(name, text, TENSOR, dtype, (), True, "mask", name + MASK_SUFFIX)
    shape, leaf = _fixed_shape(t)
    if shape and tensor_dtype(leaf) is not None and not _is_temporal(leaf):
        if not nullable:
            return ColumnSchema(name, text, TENSOR, tensor_dtype(leaf), shape, False, "never")
        if pa.types.is_floating(leaf):  # a null row or element is NaN
            return ColumnSchema(name, text, TENSOR, tensor_dtype(leaf), shape, True, "nan")
    if _is_string(t):
        item = "str"
    elif _is_binary(t):
        item = "bytes"
    else:
        item = "python"
    return ColumnSchema(name, text, LIST, None, (), nullable, "None" if nullable else "never", item=item)


def unischema_column(field, stored_type: pa.DataType, nullable: bool, scalar: bool) -> ColumnSchema:
    """A Petastorm Unischema field: scalar fields as their stored column (cast to the field's numpy dtype);
    codec fields as a tensor of the field's shape when it is fixed and the column holds no nulls, else a list
    with one decoded numpy array (or None) per row."""
    dtype = np.dtype(field.numpy_dtype) if field.numpy_dtype is not None else None
    if scalar:
        base = column_schema(field.name, stored_type, nullable=nullable)
        if dtype is not None and dtype.kind in "biuf" and base.kind == TENSOR and not base.shape \
                and (base.nulls != "nan" or dtype.kind == "f"):
            return ColumnSchema(base.name, base.arrow_type, TENSOR, dtype.name, (), base.nullable, base.nulls,
                                base.mask)
        return base
    shape = tuple(field.shape or ())
    if not nullable and dtype is not None and dtype.kind in "biuf" and all(isinstance(d, int) for d in shape):
        return ColumnSchema(field.name, str(stored_type), TENSOR, dtype.name, shape, False, "never")
    return ColumnSchema(field.name, str(stored_type), LIST, None, (), nullable, "None" if nullable else "never",
                        item="numpy")


def tensor_dtype(t: pa.DataType) -> str | None:
    """The numpy/torch dtype of a scalar column delivered as a tensor, None if it is not one."""
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype()).name
    if _is_temporal(t):
        return "int64"  # counts of the type's unit since the epoch (dates: days; times: since midnight)
    return None


def _is_temporal(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t)


def _fixed_shape(t: pa.DataType) -> tuple[tuple[int, ...], pa.DataType]:
    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    return tuple(shape), t


def _is_string(t) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", _no)(t)


def _is_binary(t) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or getattr(pa.types, "is_binary_view", _no)(t))


def _no(_t) -> bool:
    return False


def _is_list(t) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or getattr(pa.types, "is_list_view", _no)(t)
            or getattr(pa.types, "is_large_list_view", _no)(t))


def delivered_type(t: pa.DataType) -> pa.DataType:
    """The one Arrow type a column is read as whatever its file's variant: dictionaries decoded to their values,
    ``large_``/view string, binary and list variants to the plain ones (values are the same; ``to_pylist`` and
    tensors do not tell them apart), recursively inside lists, structs and maps."""
    if pa.types.is_dictionary(t):
        return delivered_type(t.value_type)
    if _is_string(t):
        return pa.string()
    if _is_binary(t) and not pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if _is_list(t):
        return pa.list_(_field(t.value_field))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_field(t.value_field), t.list_size)
    if pa.types.is_map(t):
        return pa.map_(_field(t.key_field), _field(t.item_field))
    if pa.types.is_struct(t):
        return pa.struct([_field(t.field(i)) for i in range(t.num_fields)])
    return t


def _field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, delivered_type(f.type), f.nullable)


def unify_types(name: str, typed: Sequence[tuple[str, pa.DataType]]) -> pa.DataType:
    """The one delivered type of column ``name`` given ``(file, Arrow type)`` of each file: equal delivered types,
    integers widened where no value can change (int32 and int64 -> int64, uint32 and int32 -> int64), floats to the
    widest, a file's all-null ``null`` column to the others' type. Anything else (int and float, int64 and string,
    other units or time zones) is refused, naming both files and both types: converting would change values."""
    chosen: pa.DataType | None = None
    first = ""
    for path, arrow_type in typed:
        t = delivered_type(arrow_type)
        if chosen is None or pa.types.is_null(chosen):
            chosen, first = t, path if chosen is None or not pa.types.is_null(t) else first
            continue
        if t == chosen or pa.types.is_null(t):
            continue
        wider = _widen(chosen, t)
        if wider is None:
            raise InvalidValueError(f"column {name!r} is {chosen} in {first!r} but {t} in {path!r}; one column must "
                                    "have one type in every file: rewrite one of them with the other's type, or "
                                    f"leave the column out (schema_fields= without {name!r})")
        chosen = wider
    return chosen if chosen is not None else pa.null()


def _widen(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    if pa.types.is_floating(a) and pa.types.is_floating(b):
        return a if a.bit_width >= b.bit_width else b
    if not (pa.types.is_integer(a) and pa.types.is_integer(b)):
        return None
    signed = [t for t in (a, b) if pa.types.is_signed_integer(t)]
    unsigned = [t for t in (a, b) if pa.types.is_unsigned_integer(t)]
    if not signed:
        return a if a.bit_width >= b.bit_width else b
    width = max([t.bit_width for t in signed] + [2 * t.bit_width for t in unsigned])
    return {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}.get(width)


def batch_schema(columns: Sequence[ColumnSchema], extras: Sequence[ColumnSchema] = (),
                 internal: Sequence[str] = ()) -> BatchSchema:
    """The batch's keys in order: each column, its mask right after it, then the loader's extras.

    The one rule for names, for one plan and for mixtures alike: a dataset column never takes a name the loader
    gives something else (``PADDING``, which every loader's rows carry, an extra such as ``_source`` or ``_cost``,
    a name in ``internal`` that the rows carry undelivered, another column's mask or lengths): refused naming it,
    because the loader's value would replace the dataset's without a word."""
    taken = {PADDING: "the padding flags the loader carries", **{n: "a column the loader adds" for n in internal},
             **{e.name: "a column the loader adds" for e in extras}}
    for column in columns:
        if column.name in taken:
            raise InvalidValueError(f"the dataset has a column named {column.name!r}, which is also "
                                    f"{taken[column.name]}; rename it, or pass schema_fields= without it")
    out: list[ColumnSchema] = []
    for column in columns:
        out.append(column)
        if column.mask is not None:
            out.append(mask_column(column.name))
        if column.lengths is not None:
            out.append(lengths_column(column.lengths))
    names = [c.name for c in out]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        owner = next(c for c in out if clash[0] in (c.mask, c.lengths))
        what = "validity mask" if clash[0] == owner.mask else "lengths"
        raise InvalidValueError(f"the dataset has a column named {clash[0]!r}, which is also the {what} the "
                                f"loader delivers for column {owner.name!r}; rename it, or pass "
                                "schema_fields= without one of them")
    return BatchSchema(tuple(out) + tuple(extras))


def by_name(schema: BatchSchema) -> dict[str, ColumnSchema]:
    return {c.name: c for c in schema.columns}
