"""Arrow columns to the representation ``loader.schema`` declares (``schema.ColumnSchema``): no I/O, no torch.

A tensor column becomes a numpy array with rows on axis 0 (zero-copy where Arrow allows); a list column stays an
Arrow array (the shuffle permutes it inside Arrow; ``as_list`` makes Python values only for the rows handed out).
Nulls follow the schema: NaN in floating arrays, a ``<name>__valid`` boolean array beside the values (which are 0
there), or None in lists. A column holding nulls where its footers' statistics said it had none is refused rather
than shown as a value.
"""
from __future__ import annotations

from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...core.narrowing import checked_astype
from ...errors import InvalidValueError, RowShapeError
from ...io import partitions
from ..fields.schema import LIST, ColumnSchema

Values: TypeAlias = np.ndarray | pa.Array
_DTYPES: dict[str, np.dtype] = {}


def one_array(column) -> pa.Array:
    """A chunked column as one array (a single chunk as is)."""
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0)
        return concat_arrays(column.chunks) if column.num_chunks else pa.array([], type=column.type)
    return column


def concat_arrays(parts: list[pa.Array]) -> pa.Array:
    """``parts`` as one array; where their text or list items together overflow 32-bit offsets (2 GiB of text, a
    bundle or a window of long documents), one with 64-bit offsets: the values delivered are the same."""
    try:
        return pa.concat_arrays(parts)
    except pa.ArrowInvalid:  # (also parts already of both widths: each is brought to 64-bit offsets)
        return pa.concat_arrays([_large_offsets(p) for p in parts])


def _large_offsets(values: pa.Array) -> pa.Array:
    t = values.type
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t):
        return values
    if pa.types.is_string(t):
        return values.cast(pa.large_string())
    if pa.types.is_binary(t):
        return values.cast(pa.large_binary())
    if pa.types.is_list(t):
        return values.cast(pa.large_list(t.value_field))
    raise InvalidValueError(f"{t} values of one bundle or window overflow an Arrow array's 32-bit offsets; pass a "
                            "smaller shuffle_window, or store the column with 64-bit offsets (large_string, "
                            "large_binary, large_list)")


def to_values(column, spec: ColumnSchema, *, owned: bool = False) -> dict[str, Values]:
    """``{name: values}`` and, for a masked column, ``{mask name: validity}``. ``owned``: the column's buffers are
    held by nothing else (decoded from Parquet for this read), so a number column may be delivered as a writable view
    of them (``_writable_view``) rather than copied later to be writable."""
    array = one_array(column)
    if array.null_count and not spec.nullable:
        raise InvalidValueError(f"column {spec.name!r} holds nulls although the files' statistics say it has none "
                                "(a writer that records no null counts?); rewrite the files with statistics")
    if spec.kind == LIST:
        return {spec.name: array}
    if spec.shape and (spec.lengths is not None or not _all_fixed(array.type)):
        return list_tensor(array, spec)
    if spec.shape:
        return {spec.name: _fixed_lists(array, spec.shape)}
    out: dict[str, Values] = {}
    t = array.type
    if pa.types.is_floating(t):
        view = _writable_view(array) if owned and not array.null_count else None
        out[spec.name] = view if view is not None else array.to_numpy(zero_copy_only=False)  # nulls are NaN
        return out
    if not (pa.types.is_integer(t) or pa.types.is_boolean(t)):  # temporal: the integers Arrow stores
        array = array.view(pa.int64() if t.bit_width == 64 else pa.int32())
    valid = bits(array.buffers()[0], array.offset, len(array)) if array.null_count else None
    if valid is not None and pa.types.is_boolean(t):  # False where null: the values' bits and the validity's
        out[spec.name] = bits(array.buffers()[1], array.offset, len(array)) & valid
    elif valid is not None:  # 0 where null: the stored integers times the validity (fill_null cost 2.5x more)
        stored = np.frombuffer(array.buffers()[1], dtype=array.type.to_pandas_dtype())
        out[spec.name] = stored[array.offset:array.offset + len(array)] * valid
    else:
        view = _writable_view(array) if owned else None
        out[spec.name] = view if view is not None else array.to_numpy(zero_copy_only=False)
    dtype = spec.dtype or "int64"  # a tensor column always has one
    want = _DTYPES.get(dtype)
    if want is None:
        want = _DTYPES.setdefault(dtype, np.dtype(dtype))
    if out[spec.name].dtype != want:  # temporal int32 storage, a Unischema dtype (``dtype.name`` is slow: compare)
        out[spec.name] = checked_astype(out[spec.name], want, spec.name, "the Unischema declares")
    if spec.mask is not None:
        out[spec.mask] = valid if valid is not None else np.ones(len(array), dtype=bool)
    return out


def _writable_view(array: pa.Array) -> np.ndarray | None:
    """The values of a fixed-width number array without nulls as a writable numpy view of its data buffer, where
    Arrow marks that buffer mutable (memory it allocated, not a file mapping or another object's bytes); else None.
    Why: ``to_numpy`` views are read-only, and torch tensors must be writable, so each one cost a copy of every
    number column once per run; a view costs nothing, and nothing else reads the buffer (``owned``)."""
    t = array.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)) or pa.types.is_float16(t):
        return None
    data = array.buffers()[1]
    if data is None or not data.is_mutable:
        return None
    return np.frombuffer(data, dtype=t.to_pandas_dtype())[array.offset:array.offset + len(array)]


def bits(bitmap: pa.Buffer, offset: int, length: int) -> np.ndarray:
    """Bits ``offset`` to ``offset + length`` of an Arrow bitmap (validity or boolean values, least significant bit
    first) as a writable boolean array: one ``unpackbits`` of the bytes that hold them, where ``is_valid()`` and
    ``fill_null`` made an Arrow array first (a tenth of their cost on pyarrow 14, measured)."""
    first = offset // 8
    packed = np.frombuffer(bitmap, dtype=np.uint8)[first:(offset + length + 7) // 8]
    shift = offset - first * 8
    return np.unpackbits(packed, bitorder="little")[shift:shift + length].view(np.bool_)


def _fixed_lists(array: pa.Array, shape) -> np.ndarray:
    """A fixed_size_list column (at any depth) as an array of ``(rows, *shape)``; null rows are NaN (floats only:
    the schema gives other nullable fixed-size lists as lists)."""
    size = shape[0]
    child = array.values.slice(array.offset * size, len(array) * size)
    inner = _fixed_lists(child, shape[1:]) if len(shape) > 1 else child.to_numpy(zero_copy_only=False)
    out = inner.reshape(len(array), *shape)
    if array.null_count:
        out = out.copy()
        out[~array.is_valid().to_numpy(zero_copy_only=False)] = np.nan
    return out


def _all_fixed(t: pa.DataType) -> bool:
    """Only ``fixed_size_list`` levels (column_schema's tensors): no length to check."""
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return not (pa.types.is_list(t) or pa.types.is_large_list(t))


def list_tensor(array: pa.Array, spec: ColumnSchema) -> dict[str, np.ndarray]:
    """A list column (``list``, ``large_list``, ``fixed_size_list`` levels) as the tensor ``spec`` declares
    (``list_shapes.py``): ``(rows, *shape)`` values, every row's length checked against ``shape[0]`` (equal, or at
    most it when padded, with ``lengths``), null rows NaN or 0 with a mask. A row that does not fit raises
    ``RowShapeError`` naming its position. No Python object per row: the items are cut from the flat values."""
    rows = len(array)
    lengths = pc.list_value_length(array)
    valid = array.is_valid().to_numpy(zero_copy_only=False) if array.null_count else None
    lengths = (lengths.fill_null(0) if lengths.null_count else lengths).to_numpy(zero_copy_only=False)
    first = spec.shape[0]
    bad = lengths > first if spec.lengths is not None else lengths != first
    if valid is not None:
        bad &= valid
    if bad.any():
        row = int(np.argmax(bad))
        rule = f"at most {first}" if spec.lengths is not None else f"{first}"
        raise RowShapeError(f"column {spec.name!r} holds a list of {int(lengths[row])} items where loader.schema "
                            f"says {rule} (list_shapes, or the lengths read when the loader was made)", row)
    try:
        items = _items(array.flatten(), spec, spec.shape[1:])  # (valid rows' items, *shape[1:])
    except RowShapeError as exc:  # an item's position: its row (null rows hold no item)
        at = int(np.searchsorted(np.cumsum(lengths), exc.row, side="right")) if exc.row >= 0 else -1
        raise RowShapeError(str(exc), at) from None
    dtype = _DTYPES.get(spec.dtype or "") or _DTYPES.setdefault(spec.dtype or "float64", np.dtype(spec.dtype))
    if spec.lengths is None and valid is None:
        out = items.reshape(rows, *spec.shape)
    else:
        fill = np.nan if spec.nulls == "nan" else 0
        out = np.full((rows, *spec.shape), fill, dtype=dtype) if fill else np.zeros((rows, *spec.shape), dtype)
        if spec.lengths is None:  # a null row stays NaN or 0
            assert valid is not None
            out[valid] = items.reshape(int(valid.sum()), *spec.shape)
        else:  # padded: row-major order of the kept cells is the items' order
            out[np.arange(first) < lengths[:, None]] = items
    result = {spec.name: out if out.dtype == dtype else out.astype(dtype)}
    if spec.mask is not None:
        result[spec.mask] = np.ones(rows, dtype=bool) if valid is None else valid
    if spec.lengths is not None:
        result[spec.lengths] = lengths.astype(np.int64, copy=False)
    return result


def _items(values: pa.Array, spec: ColumnSchema, shape: tuple[int, ...], depth: int = 0) -> np.ndarray:
    """The flat items of the lists below the outer level, as ``(len(values), *shape)``: every inner list of its
    level's one length, no null inner list, null items NaN (floats) or refused (``RowShapeError.row``: the item's
    position among ``values`` at depth 0, else -1: unknown)."""
    if not shape:
        if values.null_count and not pa.types.is_floating(values.type):
            raise RowShapeError(f"column {spec.name!r} holds a null item in a list of {values.type}, which no "
                                f"{spec.dtype} tensor can show; pass list_format='python' for it, or fill the nulls "
                                "when writing", _first_null(values) if depth == 0 else -1)
        return values.to_numpy(zero_copy_only=False)
    if values.null_count:
        raise RowShapeError(f"column {spec.name!r} holds a null inner list, which no tensor can show; pass "
                            "list_format='python' for it", -1)
    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
    if len(lengths) and (lengths != shape[0]).any():
        raise RowShapeError(f"column {spec.name!r} holds an inner list of "
                            f"{int(lengths[np.argmax(lengths != shape[0])])} items where loader.schema says "
                            f"{shape[0]}", -1)
    return _items(values.flatten(), spec, shape[1:], depth + 1).reshape(len(values), *shape)


def _first_null(values: pa.Array) -> int:
    return int(np.argmax(~values.is_valid().to_numpy(zero_copy_only=False)))


def partition_array(value, kind: str, rows: int) -> pa.Array:
    """``rows`` copies of one partition value (None: nulls) as an Arrow array of the partition column's type."""
    if kind == "int32":
        if value is None:
            return pa.nulls(rows, pa.int32())
        return pa.array(np.full(rows, value, dtype=np.int32))
    target = partitions.arrow_type(kind)
    return pa.nulls(rows, target) if value is None else pa.repeat(pa.scalar(value, type=target), rows)
