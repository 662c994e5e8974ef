"""Reading one planned fragment: its row group, only the requested columns, cut to the planned rows before
anything is decoded.

Every read path uses this module: the Petastorm worker classes in ``backends/petastorm.py`` (thread or process
pool), the Arrow backend's threads (``backends/arrow.py``) and the in-process reads of ``BalancedIterableDataset``
inside DataLoader workers. Keeping one implementation is what makes the paths deliver the same rows, and the row
count check here is what turns a dataset rewritten after planning into a ``StalePlanError`` instead of silently
shifted rows.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import InvalidValueError, RowShapeError, StalePlanError, StorageUnavailableError
from ...io import partitions, retry
from ...plan.model import Fragment
from ...unischema.decode import decode_value, is_scalar
from ..fields.schema import LIST, ColumnSchema, column_schema, delivered_type
from . import convert

# to_pylist of list arrays: value-by-value boxing up to pyarrow 14 (the petastorm stack), fast by pyarrow 26 (the
# modern one); versions between take the flat path, exact either way (python_values)
_FAST_TO_PYLIST = int(pa.__version__.split(".")[0]) >= 20
# files kept open per reading thread (LRU): a seeded row group order crosses files, and with 8 a dozen files were
# reopened all through an epoch (about 0.1 ms each, measured)
OPEN_FILES = 16
BUNDLE_ROWS = 8192  # the loader reads consecutive fragments together until they hold this many rows
# ... and, where its threads read a local dataset, until they hold this many decoded bytes (``bundle_rows``): each
# bundle handed from a reading thread to the batcher costs far more CPU than reading it alone (the threads take the
# GIL in turn while the batcher runs, and each chunk is converted, padded and batched on its own). Three numeric
# columns per CPU-second against raw pyarrow: 0.78-0.83x in bundles of 8,192 rows, 0.85-0.99x in 131,072 (250k and
# 1M rows, measured). Memory: the prefetch holds ``workers_count + 4`` bundles, so about 6 x 4 MiB by default.
BUNDLE_BYTES = 4 << 20


def bundle_rows(row_bytes: float) -> int:
    """Rows per bundle for rows of ``row_bytes`` decoded bytes: ``BUNDLE_BYTES`` worth (at least ``BUNDLE_ROWS``
    for rows of up to 512 bytes; fewer for larger rows, so the prefetch stays a few MiB whatever a row weighs)."""
    return max(1, int(BUNDLE_BYTES // max(float(row_bytes), 1.0)))


@dataclass(frozen=True)
class ReadSpec:
    """What a worker reads for every fragment: stored columns, and hive partition columns typed once."""

    columns: tuple[str, ...]  # output column order
    partition_types: tuple[tuple[str, str], ...] = ()  # (name, kind): 'int32', 'string' or a table's, io.partitions
    fields: dict | None = field(default=None, compare=False)  # Unischema fields by name, to decode
    target: pa.Schema | None = field(default=None, compare=False)  # delivered types of the stored columns
    # pyarrow's own decode threads: off where our reader threads already run reads side by side (its pool on top
    # of them costs CPU in handoffs: about a third more CPU per row group measured on 2 cores, for no more speed)
    use_threads: bool = field(default=True, compare=False)

    @property
    def stored_columns(self) -> list[str]:
        partitions = dict(self.partition_types)
        return [c for c in self.columns if c not in partitions]


def partition_types(paths: Sequence[str]) -> dict[str, str]:
    """Type of each hive partition column over the whole dataset, as ``pyarrow.dataset`` infers it
    (``io.partitions``: ``'int32'`` or ``'string'``)."""
    return partitions.partition_types(paths)


def read_fragment(parquet_file: pq.ParquetFile, fragment: Fragment, spec: ReadSpec, *,
                  indices: np.ndarray | None = None, cache: Callable | None = None) -> pa.Table:
    """The fragment's rows (``indices`` overrides its ``row_indices()``), requested columns in ``spec`` order.
    ``cache(fragment, columns, load)``: the row group's stored columns from a cache, or ``load()`` (the read)."""
    meta = parquet_file.metadata
    if fragment.row_group >= meta.num_row_groups:
        raise StalePlanError(f"{fragment.path!r} has {meta.num_row_groups} row groups but the plan reads row group "
                             f"{fragment.row_group}; the file changed since planning, re-run planning")
    rows_in_file = meta.row_group(fragment.row_group).num_rows
    if rows_in_file != fragment.total_rows:
        raise StalePlanError(f"{fragment.path!r} row group {fragment.row_group} has {rows_in_file} rows but the plan "
                             f"recorded {fragment.total_rows}; the file changed since planning, re-run planning")
    columns = spec.stored_columns

    def load() -> pa.Table:
        return parquet_file.read_row_group(fragment.row_group, columns=columns, use_threads=spec.use_threads)
    table = load() if cache is None else cache(fragment, columns, load)
    if indices is None and not fragment.selection:  # every row matches: the fragment is one run
        table = table.slice(fragment.start, fragment.num_rows)
    else:
        table = cut(table, fragment.row_indices() if indices is None else indices)
    target = spec.target
    whole = table.num_columns == len(spec.stored_columns)  # pyarrow skips a column the file lacks
    if whole and not spec.partition_types and (target is None or table.schema.equals(target)):
        return table
    kinds = dict(spec.partition_types)
    values = partitions.typed_partition_values(fragment.path, kinds)
    arrays = []
    for name in spec.columns:
        kind = kinds.get(name)
        if kind is not None:
            arrays.append(convert.partition_array(values.get(name), kind, table.num_rows))
            continue
        if not whole and table.schema.get_field_index(name) < 0:
            if target is None:
                raise StalePlanError(f"{fragment.path!r} has no column {name!r}; the file changed since planning, "
                                     "re-run planning")
            # a column added to a Delta table after this file was written: nulls, as deltalake reads it
            arrays.append(pa.nulls(table.num_rows, target.field(name).type))
            continue
        column = table.column(name)
        wanted = target.field(name).type if target is not None else column.type
        arrays.append(column if column.type == wanted else column.cast(wanted))  # one type in every file
    return pa.Table.from_arrays(arrays, names=list(spec.columns))


def bundle(fragments: Sequence[Fragment], rows: int) -> list[list[Fragment]]:
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


def concat_tables(tables: list[pa.Table]) -> pa.Table:
    """One table from fragments of several files. The loader's fragments already have the dataset's delivered
    types (``ReadSpec.target``); elsewhere files that disagree are first brought to one variant of each type
    (``string_view`` and ``large_string`` to ``string``, dictionaries decoded), then widened (int32 and int64)."""
    if len(tables) == 1:
        return tables[0]
    if any(not t.schema.equals(tables[0].schema) for t in tables[1:]):
        tables = [_delivered(t) for t in tables]
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        return pa.concat_tables(tables, promote_options="permissive")


def _delivered(table: pa.Table) -> pa.Table:
    schema = pa.schema([pa.field(f.name, delivered_type(f.type), f.nullable) for f in table.schema])
    return table if schema.equals(table.schema) else table.cast(schema)


def cut(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """Keep ``rows`` (positions, in order): a zero-copy slice when they are one ascending run."""
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and np.all(np.diff(rows) == 1):
        return table.slice(int(rows[0]), len(rows))
    return table.take(pa.array(rows))


def to_columns(table: pa.Table, fields: dict | None = None, schemas: Sequence[ColumnSchema] = (),
               fragments: Sequence[Fragment] = ()) -> dict[str, np.ndarray]:
    """Column values with rows on axis 0, as ``schemas`` (the loader's ``ColumnSchema`` per column) declare:
    numpy arrays for tensors (plus ``<name>__valid`` masks), Arrow arrays for list columns (permuted inside
    Arrow, turned into Python values only for the rows handed out: ``as_list``). Unischema ``fields`` are decoded
    after the cut, so only delivered rows pay for codecs. Without ``schemas`` each column is taken as this table
    has it (for one-off conversions; the loaders always pass their schema). ``fragments``: those the table's rows
    come from, in order, to name the file and row of a row that does not fit its schema."""
    try:
        return _to_columns(table, fields, schemas)
    except RowShapeError as exc:
        raise RowShapeError(f"{exc} ({locate(fragments, exc.row)})", exc.row) from None


def locate(fragments: Sequence[Fragment], row: int) -> str:
    """Where row ``row`` of the fragments' concatenated rows is stored: file, row group and row in it."""
    for fragment in fragments:
        if 0 <= row < fragment.num_rows:
            return f"{fragment.path!r} row group {fragment.row_group} row {int(fragment.row_indices()[row])}"
        row -= fragment.num_rows
    names = sorted({f"{f.path!r} row group {f.row_group}" for f in fragments})
    return "in " + ", ".join(names) if names else "row unknown"


def _to_columns(table: pa.Table, fields: dict | None, schemas: Sequence[ColumnSchema]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    declared = {c.name: c for c in schemas}
    for name in table.column_names:
        column = table.column(name)
        unischema_field = fields.get(name) if fields else None
        spec = declared.get(name)
        if spec is None:
            spec = column_schema(name, column.type, nullable=column.null_count > 0)
        if unischema_field is not None and not is_scalar(unischema_field):
            out[name] = _decode_cells(column, unischema_field, spec)
            continue
        out.update(convert.to_values(column, spec, owned=True))  # a table read for this call alone
    return out


def check_declared(table: pa.Table, fields) -> None:
    """Refuse a stored number that the Unischema's narrower numeric type cannot hold (``core.narrowing``), before
    a decoder that would wrap it (Petastorm's ``decode_row``: ``numpy.int8(399)`` is -113 on numpy 1)."""
    for name in table.column_names:
        field = fields.get(name)
        dtype = getattr(field, "numpy_dtype", None)
        if not (isinstance(dtype, type) and issubclass(dtype, (np.integer, np.floating))) or \
                (field.codec is not None and type(field.codec).__name__ != "ScalarCodec"):
            continue
        array = convert.one_array(table.column(name))
        if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
            values = array.drop_null().to_numpy(zero_copy_only=False)
            convert.checked_astype(values, np.dtype(dtype), name, "the Unischema declares")


def as_list(values) -> list:
    """Python values of a column: ``str``/``bytes`` for Arrow text arrays, ``to_pylist()`` for other Arrow arrays
    (None for nulls), items of numpy arrays."""
    if isinstance(values, pa.Array):
        if is_text(values.type):
            return values.to_numpy(zero_copy_only=False).tolist()  # far faster than to_pylist in pyarrow 14
        return python_values(values)
    return values.tolist()


def python_values(array: pa.Array) -> list:
    """``array.to_pylist()``, the same values, built faster for the common list column on older pyarrow: a list (or
    large list) of integers, floats or booleans with no null items is made from its flat values (one ``tolist``)
    cut at its offsets, 20 times faster than pyarrow 14's ``to_pylist`` (pyarrow 26's is twice as fast again)."""
    return batch_values(array, len(array))(0)


def batch_values(array: pa.Array, batch_size: int) -> Callable[[int], list]:
    """``batch -> python_values(array.slice(batch * batch_size, batch_size))``: the same values, made one batch at
    a time (so they die young), with what every batch of the common list column shares read once from the whole
    array (its offsets and flat items as numpy arrays): per batch only a numpy slice and ``tolist``, not five Arrow
    calls (a quarter of a batch's lists on pyarrow 14, measured)."""
    kind = array.type
    flat = None
    if not _FAST_TO_PYLIST and (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and len(array) \
            and _flat_item(kind.value_type):
        offsets = array.offsets.to_numpy()  # (rows + 1,), into array.values (the whole child, not sliced)
        flat = array.values.slice(int(offsets[0]), int(offsets[-1]) - int(offsets[0]))
    if flat is None or flat.null_count:  # a null item: to_pylist gives None there, which no numpy array holds
        return lambda batch: array.slice(batch * batch_size, batch_size).to_pylist()
    items = flat.to_numpy(zero_copy_only=False)
    bounds = offsets - offsets[0]
    nulls = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else None

    def values(batch: int) -> list:
        begin = batch * batch_size
        ends = bounds[begin:begin + batch_size + 1]
        first = int(ends[0])
        row_items = items[first:int(ends[-1])].tolist()
        cuts = (ends - first).tolist()
        out = [row_items[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        if nulls is not None:
            for row in np.flatnonzero(nulls[begin:begin + batch_size]).tolist():
                out[row] = None
        return out
    return values


def _flat_item(item: pa.DataType) -> bool:
    """Items whose numpy ``tolist`` gives ``to_pylist``'s values: integers, booleans, 32- and 64-bit floats."""
    return pa.types.is_integer(item) or pa.types.is_boolean(item) or pa.types.is_float32(item) \
        or pa.types.is_float64(item)


def is_text(arrow_type) -> bool:
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or
            pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type))


def _decode_cells(column, unischema_field, spec: ColumnSchema) -> np.ndarray:
    """Decode codec cells one by one: stacked when the schema declares a tensor (the field's shape is fixed and
    it holds no nulls), else an object array (one array or None per row) whatever this batch's cells are.

    Image cells of a tensor column are decoded straight into the batch array (``decode_into``), from views of the
    Arrow buffer: no bytes object per cell, no per-cell array stacked afterwards; the pixels are ``decode``'s."""
    decode_into = getattr(unischema_field.codec, "decode_into", None)
    if decode_into is not None and spec.kind != LIST and not column.null_count:
        out = np.empty((len(column), *spec.shape), dtype=spec.dtype)
        wrong = decode_into(_binary_cells(column), out)
        if wrong is None:
            return out
        raise InvalidValueError(f"column {spec.name!r} row {wrong[0]} decodes to shape {wrong[1]}, not the "
                                f"Unischema's {spec.shape}")
    cells = [decode_value(unischema_field, v) for v in column.to_pylist()]  # the one decode step
    if spec.kind != LIST:
        wrong = [i for i, c in enumerate(cells) if c is None or np.shape(c) != spec.shape]
        if wrong:
            raise InvalidValueError(f"column {spec.name!r} row {wrong[0]} decodes to shape "
                                    f"{None if cells[wrong[0]] is None else np.shape(cells[wrong[0]])}, not the "
                                    f"Unischema's {spec.shape}")
        return np.stack(cells).astype(spec.dtype, copy=False) if cells else np.empty((0, *spec.shape), spec.dtype)
    out = np.empty(len(cells), dtype=object)
    for i, cell in enumerate(cells):
        out[i] = cell
    return out


def _binary_cells(column):
    """Each cell of a binary column as a zero-copy uint8 view of the Arrow data buffer (bytes for other types)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    for chunk in chunks:
        if not (pa.types.is_binary(chunk.type) or pa.types.is_large_binary(chunk.type)) or not len(chunk):
            yield from chunk.to_pylist()
            continue
        _, offsets_buffer, data_buffer = chunk.buffers()
        width = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
        offsets = np.frombuffer(offsets_buffer, dtype=width)[chunk.offset:chunk.offset + len(chunk) + 1].tolist()
        data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
        for start, end in zip(offsets[:-1], offsets[1:], strict=True):
            yield data[start:end]


class FileCache:
    """A few open Parquet files (footers parsed once), keyed by path, least recently used out first."""

    def __init__(self, opener: Callable[[str], pq.ParquetFile], size: int = OPEN_FILES):
        self._opener, self._size = opener, size
        self._files: OrderedDict[str, pq.ParquetFile] = OrderedDict()

    def get(self, path: str) -> pq.ParquetFile:
        handle = self._files.pop(path, None)
        if handle is None:
            handle = self._opener(path)
        self._files[path] = handle
        while len(self._files) > self._size:
            self._files.popitem(last=False)
        return handle


def read_error(fragment: Fragment, exc: BaseException) -> Exception:
    """What to raise when reading ``fragment`` failed with ``exc`` (always a new exception, never ``exc``, so
    ``raise read_error(f, exc) from exc`` makes no cycle): the error, naming the file and row group.

    A missing file is a ``StalePlanError`` (the dataset changed since planning); a storage fault that outlived the
    retry policy (``StorageUnavailableError``) says so, with the URL; anything else pyarrow or the filesystem
    raised (a corrupt page, a bad footer) becomes an ``OSError`` that names where it happened, so the message
    reaching the training loop (through thread or process pools) says which file to look at.
    """
    where = f"row group {fragment.row_group} of {fragment.path!r}"
    if isinstance(exc, FileNotFoundError):
        return StalePlanError(f"{fragment.path!r} is gone (removed since planning?) while reading {where}; "
                              "re-run planning")
    if isinstance(exc, StorageUnavailableError):
        return StorageUnavailableError(exc.url, exc.attempts, exc.last_error, f"reading {where} at")
    if retry.is_transient(exc):  # a fault not retried here (Petastorm's own reads): the storage's, not the file's
        return OSError(f"reading {where} failed ({type(exc).__name__}: {' '.join(str(exc).split())}): the storage "
                       "is unreachable or throttling, nothing says the file is wrong; retry later")
    return OSError(f"reading {where} failed ({type(exc).__name__}: {' '.join(str(exc).split())}); the file is "
                   "corrupt or changed since planning: check it with `petastorm-balanced verify PLAN_URL`")


def unreadable_dataset_error(plan, exc: BaseException, path: str | None = None) -> Exception:
    """What to raise when opening a file of the dataset (``path``, or one pyarrow's error did not name) failed,
    always a new exception (never ``exc``: ``raise ... from exc`` must make no cycle):
    ``StalePlanError`` if the listing differs from the plan's; ``StorageUnavailableError`` for a storage fault
    that outlived the retry policy; else an ``OSError`` naming the unreadable file, or, when every file reads
    now, one saying the failure passed (the storage's, not the data's)."""
    from ...io.dataset import unreadable_file
    from ...plan.format import check_dataset
    if isinstance(exc, StorageUnavailableError):
        return StorageUnavailableError(exc.url, exc.attempts, exc.last_error)
    check_dataset(plan)  # raises StalePlanError naming a removed, added or resized file
    bad = (path, exc) if path is not None else unreadable_file(plan.dataset_url, [f.path for f in plan.catalog.files])
    detail = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if bad is None:
        return OSError(f"reading the footers of {plan.dataset_url} failed ({detail}), but every planned file reads "
                       "now: the failure was the storage's, not the data's; retry")
    path, error = bad
    if isinstance(error, StorageUnavailableError) or retry.is_transient(error):
        return OSError(f"opening {path!r} in {plan.dataset_url} failed ({type(error).__name__}: "
                       f"{' '.join(str(error).split())}): the storage is unreachable or throttling, nothing says the "
                       "file is wrong; retry later")
    return OSError(f"{path!r} in {plan.dataset_url} is not a readable Parquet file ({type(error).__name__}: "
                   f"{' '.join(str(error).split())}); it is corrupt or changed since planning: restore it, or "
                   "re-run planning without it")
