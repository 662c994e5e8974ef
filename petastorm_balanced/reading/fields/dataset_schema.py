"""The dataset's columns as the loader delivers them, read once per loader from every planned file's footer.

Why every footer: one file's schema says nothing of the others (a column ``int32`` here and ``int64`` there,
``string`` in one and ``string_view`` in another after a rewrite, nulls in some files only), and deciding from the
rows of a batch would change the batch type from one step to the next. The footers give each file's Arrow schema
and each column chunk's null count; files that share a schema are compared in C++ and converted to Arrow once.
Columns whose types cannot be unified are refused here, when the loader is made, naming both files.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from ...core.quality import clustered_columns
from ...io import footer as footer_io
from ...io import retry, tables
from ...io.location import DatasetLocation
from ...io.partitions import arrow_type, partition_values
from ...io.stats import row_bytes, value_ranges
from .schema import ColumnSchema, column_schema, delivered_type, unify_types

FOOTER_THREADS = 8  # footers read side by side on a local disk (CPU-bound: more threads only hand off)
# ... one per this many local files: a thread started per loader costs more CPU than a few footers' reads (12 local
# footers: 2.0 ms of CPU read in the calling thread, 4.9 ms in 8 threads, for 2 ms more wall time once per loader)
FOOTERS_PER_THREAD = 32
REMOTE_FOOTER_THREADS = 32  # and on an object store, where each read waits a round trip
ROW_BYTES_FILES = 16  # footers (the first in path order) that estimate variable-width columns' bytes per row


class Deferred(Mapping):
    """A mapping computed on first use (``compute()``), then kept; pickled as the plain dict it computes.

    Why: which columns are stored in order (``clustered``, from every sampled row group's statistics: most of a
    loader's setup, 5 ms of 13 for 12 footers) only matters to a shuffled loader whose rank needs more than one
    window (``settings.warn_stored_order``); others never ask."""

    def __init__(self, compute: Callable[[], Mapping]):
        self._compute: Callable[[], Mapping] | None = compute
        self._value: dict = {}

    def _values(self) -> dict:
        if self._compute is not None:
            self._value, self._compute = dict(self._compute()), None
        return self._value

    def __getitem__(self, key):
        return self._values()[key]

    def __iter__(self):
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._values())

    def __repr__(self) -> str:
        return repr(self._values())

    def __reduce__(self):
        return dict, (self._values(),)


@dataclass(frozen=True)
class StoredColumns:
    """Delivered Arrow type (unified over files) and "may hold nulls" of every stored column, in file order."""

    schema: pa.Schema
    nullable: dict[str, bool]
    row_bytes: float = 0.0  # estimated decoded bytes of one row of these columns (what a shuffle window holds)
    # columns stored in order (``quality.clustered_columns``), computed when first asked (``Deferred``)
    clustered: Mapping[str, float] = dataclasses.field(default_factory=dict)


def read_stored_columns(location: DatasetLocation, paths: Sequence[str], names: Sequence[str] | None = None,
                        threads: int | None = None) -> StoredColumns:
    """Read the footers of ``paths`` (relative to the dataset) for the stored columns ``names`` (None: all)."""
    return stored_columns(read_footers(location, paths, threads), names)


def read_footers(dataset: DatasetLocation, paths: Sequence[str], threads: int | None = None
                 ) -> list[tuple[str, pq.FileMetaData]]:
    """``(path, footer)`` of each of ``paths`` (in the ``dataset``: ``plan.location``), read side by side in
    ``threads`` (default: ``FOOTER_THREADS`` locally, ``REMOTE_FOOTER_THREADS`` on an object store, where each is a
    round trip or two), each under the retry policy."""
    filesystem, remote = dataset.filesystem, dataset.remote
    threads = threads or (REMOTE_FOOTER_THREADS if remote else
                          min(FOOTER_THREADS, -(-len(paths) // FOOTERS_PER_THREAD)))

    def read(path):
        location = dataset.path(path)
        if remote:  # a file kept open (no HEAD); the first epoch's reader checks this very read (G15)
            handle, footer = footer_io.read_kept_footer(filesystem, location, footer_io.READ_FOOTERS)
            footer_io.FRESH_FOOTERS.put(filesystem, location, handle, footer)
            return footer.metadata
        handle = filesystem.open_input_file(location)
        try:
            return footer_io.read_footer(handle, footer_io.READ_FOOTERS).metadata
        finally:
            handle.close()

    def footer(path):  # parsed into the reading path's cache: the first epoch's check then reads but parses none
        return retry.call(lambda: read(path), url=f"{dataset.url}/{path}")

    if threads <= 1 or len(paths) <= 1:
        return [(path, footer(path)) for path in paths]
    with ThreadPoolExecutor(min(threads, len(paths))) as pool:
        metas = list(pool.map(footer, paths))
    return list(zip(paths, metas, strict=True))


def stored_names(footers: Sequence[tuple[str, pq.FileMetaData]]) -> list[str]:
    """The stored column names of ``footers``: the first file's, then any a later file adds (``stored_columns``)."""
    schemas: list = []
    for _, meta in footers:
        if not any(meta.schema.equals(known) for known in schemas):
            schemas.append(meta.schema)
    return list(dict.fromkeys(n for schema in schemas for n in schema.to_arrow_schema().names))


def stored_columns(footers: Sequence[tuple[str, pq.FileMetaData]],
                   names: Sequence[str] | None = None) -> StoredColumns:
    """``StoredColumns`` from ``(path, footer)`` pairs (the first file's column order)."""
    distinct: list[tuple[pq.FileMetaData, pa.Schema, str]] = []  # one per distinct file schema
    nullable: dict[str, bool] = {}
    for path, meta in footers:
        arrow = None
        for known, known_arrow, _ in distinct:
            if meta.schema.equals(known.schema) and _arrow_key(meta) == _arrow_key(known):
                arrow = known_arrow
                break
        if arrow is None:
            arrow = meta.schema.to_arrow_schema()
            distinct.append((meta, arrow, path))
        _null_flags(meta, arrow, names, nullable)
    # the first file's columns, then any a later file adds (a Delta table's added columns: planning refuses files
    # with other columns in any other dataset), which the files without them give as nulls
    union = list(dict.fromkeys(n for _, arrow, _ in distinct for n in arrow.names))
    wanted = union if names is None else [n for n in union if n in set(names)]
    fields = []
    for name in wanted:
        typed = [(path, arrow.field(name).type) for _, arrow, path in distinct if name in arrow.names]
        everywhere = len(typed) == len(distinct)
        nullable_field = not everywhere or any(arrow.field(name).nullable for _, arrow, _ in distinct
                                               if name in arrow.names)
        fields.append(pa.field(name, unify_types(name, typed), nullable_field))
        nullable[name] = nullable_field and (not everywhere or nullable.get(name, False))
    schema = pa.schema(fields)
    sample = [meta for _, meta in sorted(footers, key=lambda pair: pair[0])[:ROW_BYTES_FILES]]
    return StoredColumns(schema, {n: nullable[n] for n in wanted}, row_bytes(schema, sample),
                         Deferred(lambda: clustered_columns(value_ranges(sample))))


def _arrow_key(meta) -> bytes:
    return (meta.metadata or {}).get(b"ARROW:schema", b"")


def _null_flags(meta, arrow: pa.Schema, names, nullable: dict[str, bool]) -> None:
    """Mark in ``nullable`` the columns that may hold nulls in this file: a chunk counting nulls, or one whose
    statistics do not say (then nulls are possible)."""
    leaves = _leaf_ranges(arrow)
    wanted = set(arrow.names if names is None else names)
    known = footer_io.FOOTER_FACTS.get(meta).setdefault("nulls", {})  # column -> may hold nulls here
    for name, (begin, end) in leaves.items():
        if name not in wanted or nullable.get(name):
            continue
        if name in known:
            nullable[name] = known[name]
            continue
        found = False
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            if group.num_rows == 0:
                continue
            for j in range(begin, end):
                stats = group.column(j).statistics
                if stats is None or not stats.has_null_count or stats.null_count > 0:
                    found = True
                    break
            if found:
                break
        nullable[name] = known[name] = found



def _leaf_ranges(arrow: pa.Schema) -> dict[str, tuple[int, int]]:
    """Parquet leaf column positions of each top-level field (Parquet flattens nested types depth first)."""
    out, at = {}, 0
    for field in arrow:
        count = _leaves(field.type)
        out[field.name] = (at, at + count)
        at += count
    return out


def _leaves(t: pa.DataType) -> int:
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if hasattr(t, "value_type") and not pa.types.is_dictionary(t):  # list, large_list, fixed_size_list, views
        return _leaves(t.value_type)
    return 1


def partition_columns(paths: Sequence[str], names: Sequence[str], table=None) -> dict[str, tuple[str, ColumnSchema]]:
    """``{name: (kind, ColumnSchema)}`` of the hive partition columns among ``names`` (typed as ``table``'s schema
    declares them, for a Delta table: ``io.tables.partition_types``)."""
    kinds = tables.partition_types(table, paths)
    with_nulls = {k for path in paths for k, v in partition_values(path).items() if v is None}
    return {name: (kind, column_schema(name, arrow_type(kind), nullable=name in with_nulls))
            for name, kind in kinds.items() if name in names}


__all__ = ["StoredColumns", "delivered_type", "partition_columns", "read_stored_columns", "stored_columns",
           "stored_names"]
