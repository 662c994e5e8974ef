"""Decoding Unischema cells: one row as Petastorm's ``make_reader`` gives it, or one column for the loaders.

The one decode step of both read paths (the loader's column arrays and ``make_reader``'s rows) and of predicate
evaluation at planning, so a value is decoded the same way wherever it is read.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.narrowing import checked_scalar
from .codecs import ScalarCodec


def is_scalar(unischema_field: Any) -> bool:
    """Whether the column is read as a plain Arrow column (no codec, or a ScalarCodec of a numeric/text type)."""
    codec = unischema_field.codec
    if codec is None or isinstance(codec, ScalarCodec) or type(codec).__name__ == "ScalarCodec":
        dtype = unischema_field.numpy_dtype
        try:
            return dtype is None or np.dtype(dtype).kind in "biufUSO"
        except TypeError:  # Decimal and other non-numpy types
            return False
    return False


def decode_value(unischema_field: Any, value: Any) -> Any:
    """One cell as Petastorm's ``decode_row`` decodes it: the codec's ``decode``; without a codec, a cast to the
    field's numpy (or Decimal) type; ``None`` stays ``None``."""
    if value is None:
        return None
    codec = unischema_field.codec
    if codec:
        return codec.decode(unischema_field, value)
    dtype = unischema_field.numpy_dtype
    if dtype is not None and isinstance(dtype, type) and issubclass(dtype, (np.generic, Decimal)):
        return checked_scalar(dtype, value, unischema_field.name, "the Unischema declares")
    return value


def decode_row(row: dict, unischema: Any) -> dict:
    """The decoded values of the fields of ``unischema`` that ``row`` holds (Petastorm's ``decode_row``)."""
    fields = unischema.fields
    return {name: decode_value(fields[name], value) for name, value in row.items() if name in fields}


def rows(table: pa.Table, unischema: Any) -> list:
    """A table's rows as Petastorm's ``make_reader`` decodes them: pandas' values (``to_pandas(
    integer_object_nulls=True)``, as Petastorm reads), then ``decode_row``."""
    columns: dict[str, list] = {name: _python_values(table.column(name)) for name in table.column_names}
    names = [n for n in table.column_names if n in unischema.fields]
    fields = unischema.fields
    return [{n: decode_value(fields[n], columns[n][i]) for n in names} for i in range(table.num_rows)]


def _python_values(column: pa.ChunkedArray) -> list:
    """The values pandas 2 gives per cell (what Petastorm's ``decode_row`` receives): null floats as NaN, other
    nulls as None, binary as bytes, timestamps as ``pandas.Timestamp``."""
    kind = column.type
    if pa.types.is_floating(kind):
        return column.to_numpy().tolist() if column.null_count == 0 else \
            list(column.to_numpy(zero_copy_only=False))
    if pa.types.is_timestamp(kind):
        import pandas as pd
        return [None if v is None else pd.Timestamp(v) for v in column.to_pylist()]
    if column.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_boolean(kind)):
        return list(column.to_numpy())
    return column.to_pylist()
