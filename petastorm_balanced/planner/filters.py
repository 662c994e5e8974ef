"""Petastorm predicates evaluated one row group at a time, with Petastorm's own semantics.

Petastorm calls ``do_include`` differently by dataset kind, and we follow it so a predicate keeps the meaning it
has in ``make_reader``/``make_batch_reader``:

- Petastorm (Unischema) datasets: once per row, with a dict of *decoded* values (``make_reader``).
- plain Parquet: once per row group with a pandas DataFrame, expecting a boolean mask (``make_batch_reader``).
  Predicates written for single values (``in_set``, most ``in_lambda``) fail on a DataFrame inside Petastorm; we
  fall back to calling them once per row instead of failing, since the intent is unambiguous.

Only the predicate's ``get_fields()`` columns are read; hive partition columns come from the file's path.

A predicate sees the values the loader delivers (G13): hive partition values decoded and typed for the whole
dataset (``io.partitions``: an int column gives ints, ``__HIVE_DEFAULT_PARTITION__`` gives None), dictionary
columns decoded, and None for every null (never pandas' NaN, which would make ``s is None`` match nothing and
``s.startswith`` raise).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa

from ..errors import InvalidTypeError, InvalidValueError
from ..io.footer import open_file
from ..io.partitions import partition_types as infer_partition_types
from ..io.partitions import typed_partition_values


def check_fields(predicate, columns: Iterable[str], url: str) -> list:
    """The predicate's fields, after making sure each one is a column of the dataset."""
    if not hasattr(predicate, "get_fields") or not hasattr(predicate, "do_include"):
        raise InvalidTypeError(f"predicate={predicate!r} is not a petastorm.predicates.PredicateBase; use where= for "
                               "SQL")
    fields = sorted(set(predicate.get_fields()))
    if not fields:
        raise InvalidValueError(f"predicate={predicate!r} names no field in get_fields(); it must name the columns it "
                                "reads")
    missing = [f for f in fields if f not in set(columns)]
    if missing:
        raise InvalidValueError(f"predicate reads column(s) {missing} that dataset_url={url!r} does not have; "
                                f"its columns are {sorted(set(columns))}")
    return fields


def row_group_mask(handle, path: str, row_group: int, predicate, fields, *, unischema=None,
                   partition_types: Mapping[str, str] | None = None) -> np.ndarray:
    """Boolean match mask (rows,) of one row group of an open Parquet file. ``partition_types`` are the hive
    columns' types over the whole dataset (``io.partitions.partition_types``; this path's alone if None)."""
    import pandas as pd  # here, not at module level: pandas costs ~1 s of every CLI start and plan import
    partitions = typed_partition_values(path, partition_types if partition_types is not None else
                                        infer_partition_types([path]))
    stored = [f for f in fields if f not in partitions]
    parquet = open_file(handle)
    rows = parquet.metadata.row_group(row_group).num_rows
    frame = pd.DataFrame(index=range(rows))
    if stored:
        table = parquet.read_row_group(row_group, columns=stored)
        for name in stored:  # a column added to a Delta table after this file was written: nulls, as read
            frame[name] = _series(table.column(name), pd) if name in table.column_names else \
                pd.Series([None] * rows, dtype=object)
    for name in fields:
        if name in partitions:
            value = partitions[name]  # numbers as numbers; anything else as Python objects, as _series gives them
            frame[name] = value if isinstance(value, (int, float)) else pd.Series([value] * rows, dtype=object)
    if unischema is not None:
        return _per_row(frame, predicate, unischema)
    try:
        mask = predicate.do_include(frame)
        mask = np.asarray(mask, dtype=bool)
        if mask.shape == (len(frame),):
            return mask
    except Exception:  # noqa: BLE001 - a row-wise predicate handed a DataFrame; evaluate it row by row instead
        pass
    return _per_row(frame, predicate, None)


def _series(column, pd):
    """A column for the predicate's DataFrame: numbers without nulls as numpy (fast), anything else as Python
    objects with None for nulls (dictionaries decoded, no NaN standing for a null string or int)."""
    t = column.type
    if column.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return column.to_numpy()
    return pd.Series(column.to_pylist(), dtype=object)


def _per_row(frame, predicate, unischema) -> np.ndarray:
    records = frame.to_dict("records")
    if unischema is not None:
        from ..unischema.decode import decode_row
        records = [decode_row(r, unischema) for r in records]
    return np.fromiter((bool(predicate.do_include(r)) for r in records), dtype=bool, count=len(records))
