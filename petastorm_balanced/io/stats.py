"""Row group min/max statistics of footers, as the plain numbers ``core/quality.clustered_columns`` judges."""
from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .footer import FOOTER_FACTS

NUMERIC = ("INT32", "INT64", "FLOAT", "DOUBLE")  # physical types whose min/max order like numbers


def value_ranges(footers: Iterable[pq.FileMetaData]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{column: (mins, maxs, rows)}`` over every row group of ``footers`` for the numeric top-level columns whose
    statistics give a min and max in every non-empty row group (others are left out: nothing to judge). Each
    file's leaves are named and typed once from its schema, not per row group (a few microseconds each)."""
    out: dict[str, tuple[list, list, list]] = {}
    skip: set[str] = set()
    for meta in footers:
        for name, ranges in _file_ranges(meta).items():
            if name in skip:
                continue
            if ranges is None:
                skip.add(name)
                out.pop(name, None)
                continue
            mins, maxs, rows = out.setdefault(name, ([], [], []))
            mins.extend(ranges[0])
            maxs.extend(ranges[1])
            rows.extend(ranges[2])
    return {name: (np.array(a), np.array(b), np.array(c, dtype=np.int64)) for name, (a, b, c) in out.items()}


def _file_ranges(meta: pq.FileMetaData) -> dict[str, tuple[list, list, list] | None]:
    """``{column: (mins, maxs, rows)}`` of one file's non-empty row groups, ``None`` for a column some row group
    gives no numeric min and max for; kept with the parsed footer (``footer.FOOTER_FACTS``)."""
    facts = FOOTER_FACTS.get(meta)
    known = facts.get("ranges")
    if known is not None:
        return known
    schema = meta.schema
    leaves = [(j, leaf.path, leaf.physical_type in NUMERIC) for j, leaf in
              ((j, schema.column(j)) for j in range(meta.num_columns))]
    leaves = [leaf for leaf in leaves if "." not in leaf[1]]
    out: dict[str, tuple[list, list, list] | None] = {}
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        if group.num_rows == 0:
            continue
        for j, name, numeric in leaves:
            if name in out and out[name] is None:
                continue
            low = high = None
            if numeric:
                try:
                    stats = group.column(j).statistics
                    if stats is not None and stats.has_min_max:
                        low, high = stats.min, stats.max
                except pa.ArrowException:  # a logical type pyarrow cannot turn into a Python value
                    pass
            low, high = _number(low), _number(high)
            if low is None or high is None:
                out[name] = None
                continue
            ranges = out.setdefault(name, ([], [], []))
            assert ranges is not None
            ranges[0].append(low)
            ranges[1].append(high)
            ranges[2].append(group.num_rows)
    facts["ranges"] = out
    return out


def _number(value) -> float | None:
    """A statistic as a float (times and dates as seconds and days), or None when it is not a finite number."""
    kind = type(value)
    if kind is int or kind is float:  # nearly every statistic: math.isfinite, not numpy's ufunc on a scalar
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, datetime.datetime):
        return value.replace(tzinfo=value.tzinfo or datetime.UTC).timestamp()
    if isinstance(value, datetime.date):
        return float(value.toordinal())
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    number = float(value)
    return number if np.isfinite(number) else None


def row_bytes(schema: pa.Schema, footers: Sequence[pq.FileMetaData]) -> float:
    """Estimated decoded bytes per row of ``schema``'s columns: fixed-width types by their width, the others by
    their uncompressed Parquet size per row in ``footers`` (the loader passes the first files in path order: the
    same on every rank, so every rank sizes its shuffle windows alike)."""
    total, variable = 0.0, set()
    for field in schema:
        width = fixed_width(field.type)
        if width is None:
            variable.add(field.name)
        else:
            total += width
    if not variable:
        return total
    size = rows = 0
    for meta in footers:  # the variable columns' chunks found once per file (a chunk's metadata costs a microsecond)
        schema = meta.schema
        chunks = [j for j in range(meta.num_columns) if schema.column(j).path.split(".")[0] in variable]
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            rows += group.num_rows
            for j in chunks:
                size += group.column(j).total_uncompressed_size
    return total + size / max(rows, 1)


def fixed_width(t: pa.DataType) -> float | None:
    """Bytes per value of a fixed-width type as delivered (numpy), or None for variable-width types."""
    if pa.types.is_boolean(t):
        return 1.0
    if pa.types.is_fixed_size_list(t):
        inner = fixed_width(t.value_type)
        return None if inner is None else inner * t.list_size
    try:
        return t.bit_width / 8
    except ValueError:
        return None
