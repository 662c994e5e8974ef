"""Reading one planned fragment: its row group, only the requested columns, cut to the planned rows before
anything is decoded.

Both read paths use this module: the Petastorm worker classes in ``reader.py`` (thread or process pool) and the
in-process reads of ``BalancedIterableDataset`` inside DataLoader workers. Keeping one implementation is what makes
the two paths deliver the same rows, and the row count check here is what turns a dataset rewritten after planning
into a ``StalePlanError`` instead of silently shifted rows.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InvalidTypeError, InvalidValueError, StalePlanError
from ..plan.model import Fragment
from ..io.dataset import partition_values

OPEN_FILES = 8  # footers kept open per reader: consecutive fragments often come from the same file
BUNDLE_ROWS = 8192  # the loader reads consecutive fragments together until they hold this many rows


@dataclass(frozen=True)
class ReadSpec:
    """What a worker reads for every fragment: stored columns, and hive partition columns typed once."""

    columns: Tuple[str, ...]  # output column order
    partition_types: Tuple[Tuple[str, str], ...] = ()  # (name, 'int64' | 'string')
    fields: Optional[dict] = field(default=None, compare=False)  # Unischema fields by name, to decode

    @property
    def stored_columns(self) -> List[str]:
        partitions = dict(self.partition_types)
        return [c for c in self.columns if c not in partitions]


def partition_types(paths: Sequence[str]) -> Dict[str, str]:
    """Type of each hive partition column: int64 when every value parses as an integer, else string.

    This is pyarrow's inference for ``key=value`` folders, which Petastorm's schema also follows.
    """
    values: Dict[str, set] = {}
    for path in paths:
        for key, value in partition_values(path).items():
            values.setdefault(key, set()).add(value)
    return {key: "int64" if all(re.fullmatch(r"[+-]?\d+", v) for v in vals) else "string"
            for key, vals in sorted(values.items())}


def select_columns(available: Sequence[str], schema_fields) -> List[str]:
    """Resolve ``schema_fields`` like Petastorm: names, regular expressions matching a whole name, or
    UnischemaFields; ``None`` means every column. Keeps the dataset's column order."""
    if schema_fields is None:
        return list(available)
    if isinstance(schema_fields, (str, bytes)) or not hasattr(schema_fields, "__iter__"):
        raise InvalidTypeError(f"schema_fields={schema_fields!r} must be a list of column names or patterns")
    wanted = set()
    schema_fields = list(schema_fields)
    if not schema_fields:
        raise InvalidValueError("schema_fields=[] selects no column; pass None for every column, or name some")
    for item in schema_fields:
        name = getattr(item, "name", item)
        if not isinstance(name, str):
            raise InvalidTypeError(f"schema_fields item {item!r} is neither a column name nor a UnischemaField")
        try:
            matches = [c for c in available if c == name or re.fullmatch(name, c)]
        except re.error as exc:
            raise InvalidValueError(f"schema_fields item {name!r} is not a column name and not a valid regular "
                                    f"expression ({exc}); escape it with re.escape or name the column exactly") from None
        if not matches:
            raise InvalidValueError(f"schema_fields item {name!r} matches no column; the dataset has {list(available)}")
        wanted.update(matches)
    return [c for c in available if c in wanted]


def read_fragment(parquet_file: pq.ParquetFile, fragment: Fragment, spec: ReadSpec, *,
                  indices: Optional[np.ndarray] = None) -> pa.Table:
    """The fragment's rows (``indices`` overrides its ``row_indices()``), requested columns in ``spec`` order."""
    meta = parquet_file.metadata
    if fragment.row_group >= meta.num_row_groups:
        raise StalePlanError(f"{fragment.path!r} has {meta.num_row_groups} row groups but the plan reads row group "
                             f"{fragment.row_group}; the file changed since planning, re-run planning")
    rows_in_file = meta.row_group(fragment.row_group).num_rows
    if rows_in_file != fragment.total_rows:
        raise StalePlanError(f"{fragment.path!r} row group {fragment.row_group} has {rows_in_file} rows but the plan "
                             f"recorded {fragment.total_rows}; the file changed since planning, re-run planning")
    table = parquet_file.read_row_group(fragment.row_group, columns=spec.stored_columns)
    if indices is None and not fragment.selection:  # every row matches: the fragment is one run
        table = table.slice(fragment.start, fragment.num_rows)
    else:
        table = _cut(table, fragment.row_indices() if indices is None else indices)
    if not spec.partition_types:
        return table
    rows = range(table.num_rows)
    values = partition_values(fragment.path)
    arrays = []
    for name in spec.columns:
        kind = dict(spec.partition_types).get(name)
        if kind is None:
            arrays.append(table.column(name))
        elif kind == "int64":
            arrays.append(pa.array(np.full(len(rows), int(values[name]), dtype=np.int64)))
        else:
            arrays.append(pa.array([values[name]] * len(rows), type=pa.string()))
    return pa.Table.from_arrays(arrays, names=list(spec.columns))


def bundle(fragments: Sequence[Fragment], rows: int) -> List[List[Fragment]]:
    """Consecutive fragments grouped until each group holds at least ``rows`` rows (0: one per group)."""
    groups, current, count = [], [], 0
    for fragment in fragments:
        current.append(fragment)
        count += fragment.num_rows
        if count >= rows:
            groups.append(current)
            current, count = [], 0
    if current:
        groups.append(current)
    return groups


def concat_tables(tables: List[pa.Table]) -> pa.Table:
    """One table from fragments of several files (types unified if the files disagree, e.g. int32 and int64)."""
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        return pa.concat_tables(tables, promote_options="permissive")


def _cut(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """Keep ``rows`` (positions, in order): a zero-copy slice when they are one ascending run."""
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and np.all(np.diff(rows) == 1):
        return table.slice(int(rows[0]), len(rows))
    return table.take(pa.array(rows))


def to_columns(table: pa.Table, fields: Optional[dict] = None) -> Dict[str, np.ndarray]:
    """Column arrays with rows on axis 0; Unischema ``fields`` are decoded (after the cut, so only delivered
    rows pay for codecs).

    String and binary columns stay ``pyarrow`` arrays: the shuffle permutes them inside Arrow (contiguous
    buffers) and Python ``str`` objects are made once, for the rows handed out (``as_list``).
    """
    out = {}
    for name in table.column_names:
        column = table.column(name)
        unischema_field = fields.get(name) if fields else None
        if _is_text(column.type) and (unischema_field is None or _is_scalar(unischema_field)):
            out[name] = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        elif unischema_field is None and _is_list(column.type):
            out[name] = _list_values(column)
        elif unischema_field is None or _is_scalar(unischema_field):
            values = column.to_numpy(zero_copy_only=False) if column.num_chunks != 1 else \
                column.chunk(0).to_numpy(zero_copy_only=False)
            dtype = getattr(unischema_field, "numpy_dtype", None)
            if dtype is not None and values.dtype != object and np.dtype(dtype) != values.dtype \
                    and np.dtype(dtype).kind in "biuf":
                values = values.astype(dtype)
            out[name] = values
        else:
            out[name] = _decode_cells(column, unischema_field)
    return out


def _is_text(arrow_type) -> bool:
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or
            pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type))


def as_list(values) -> list:
    """Python values of a column: ``str``/``bytes`` for Arrow text arrays, items of numpy arrays."""
    if isinstance(values, pa.Array):
        return values.to_numpy(zero_copy_only=False).tolist()  # far faster than to_pylist in pyarrow 14
    return values.tolist()


def _is_list(arrow_type) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or \
        pa.types.is_fixed_size_list(arrow_type)


def _list_values(column) -> np.ndarray:
    """A list column as a (rows, length) array when every list has the same length and no nulls (as
    ``make_batch_reader`` stacks them); otherwise an object array of per-row arrays."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(array) and array.null_count == 0 and not pa.types.is_fixed_size_list(array.type):
        lengths = np.diff(array.offsets.to_numpy())
        if np.all(lengths == lengths[0]):
            flat = array.flatten()
            if flat.null_count == 0:
                return flat.to_numpy(zero_copy_only=False).reshape(len(array), int(lengths[0]))
    elif len(array) and array.null_count == 0:
        flat = array.flatten()
        if flat.null_count == 0:
            return flat.to_numpy(zero_copy_only=False).reshape(len(array), array.type.list_size)
    out = np.empty(len(array), dtype=object)
    out[:] = [None if v is None else np.asarray(v) for v in array.to_pylist()]
    return out


def _is_scalar(unischema_field) -> bool:
    from petastorm.codecs import ScalarCodec
    codec = unischema_field.codec
    if codec is None or isinstance(codec, ScalarCodec):
        dtype = unischema_field.numpy_dtype
        return dtype is None or np.dtype(dtype).kind in "biufUSO"
    return False


def _decode_cells(column, unischema_field) -> np.ndarray:
    """Decode codec cells one by one and stack them; ragged or missing cells stay an object array."""
    codec = unischema_field.codec
    cells = [None if v is None else codec.decode(unischema_field, v) for v in column.to_pylist()]
    if cells and all(c is not None for c in cells) and all(np.shape(c) == np.shape(cells[0]) for c in cells):
        return np.stack(cells)
    out = np.empty(len(cells), dtype=object)
    out[:] = cells
    return out


class FileCache:
    """A few open Parquet files (footers parsed once), keyed by path, least recently used out first."""

    def __init__(self, opener: Callable[[str], pq.ParquetFile], size: int = OPEN_FILES):
        self._opener, self._size, self._files = opener, size, OrderedDict()

    def get(self, path: str) -> pq.ParquetFile:
        handle = self._files.pop(path, None)
        if handle is None:
            handle = self._opener(path)
        self._files[path] = handle
        while len(self._files) > self._size:
            self._files.popitem(last=False)
        return handle


def read_error(fragment: Fragment, exc: BaseException) -> Exception:
    """What to raise when reading ``fragment`` failed with ``exc``: the error, naming the file and row group.

    A missing file is a ``StalePlanError`` (the dataset changed since planning); anything pyarrow or the filesystem
    raised (a corrupt page, a bad footer, a network error) becomes an ``OSError`` that names where it happened, so
    the message reaching the training loop (through thread or process pools) says which file to look at.
    """
    where = f"row group {fragment.row_group} of {fragment.path!r}"
    if isinstance(exc, FileNotFoundError):
        return StalePlanError(f"{fragment.path!r} is gone (removed since planning?) while reading {where}; "
                              "re-run planning")
    return OSError(f"reading {where} failed ({type(exc).__name__}: {' '.join(str(exc).split())}); the file is "
                   "corrupt or changed since planning: check it with `petastorm-balanced verify PLAN_URL`")


def unreadable_dataset_error(plan, exc: BaseException, path: Optional[str] = None) -> Exception:
    """What to raise when opening a file of the dataset (``path``, or one pyarrow's error did not name) failed:
    ``StalePlanError`` if the listing differs from the plan's, else an ``OSError`` naming the unreadable file."""
    from ..plan.format import check_dataset
    from ..io.dataset import unreadable_file
    check_dataset(plan)  # raises StalePlanError naming a removed, added or resized file
    bad = (path, exc) if path is not None else unreadable_file(plan.dataset_url, [f.path for f in plan.catalog.files])
    if bad is None:
        return exc if isinstance(exc, Exception) else OSError(str(exc))
    path, error = bad
    return OSError(f"{path!r} in {plan.dataset_url} is not a readable Parquet file ({type(error).__name__}: "
                   f"{' '.join(str(error).split())}); it is corrupt or changed since planning: restore it, or "
                   "re-run planning without it")
