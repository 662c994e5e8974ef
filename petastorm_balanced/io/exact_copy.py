"""A copy written by Spark that keeps every column's Arrow type and value as ``pyarrow.dataset`` reads the source
(G13 owed by a copy as by its source: ``spark.make_shuffled_copy``).

Why a second step: Spark reads Parquet into its own types and writes those back. A ``timestamp[us, tz=UTC]``
comes back as INT96 (read as ``timestamp[ns]`` without a zone: a loader would deliver 1000x the microseconds),
``uint32`` as ``int64``, ``uint64`` as ``decimal(20, 0)``, a dictionary or ``large_string`` as ``string``, a
``duration`` as ``int64``, a ``fixed_size_list`` as a list. Each of those holds the source's value exactly, so the
copy's files are rewritten once, row group by row group (the shuffled order and the row group boundaries kept),
with every column cast back to the source's type (``safe``: an overflow or a truncation raises, never wraps), and
read back by anyone, ``pyarrow.dataset`` and the loaders alike, with the source's types. INT96 timestamps are read
at microseconds (Spark's precision), so no date outside the nanosecond range wraps.

What Spark cannot read or hold exactly (nanosecond timestamps, times of day, half floats, nested dictionaries, ...)
is refused by ``check_copyable`` before Spark runs, naming the column and the fix.
"""
from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import InvalidValueError
from . import fs as fsutil
from .dataset import is_data_name
from .footer import open_file

_FIX = ("cast it in the source to a type Spark holds exactly (pyarrow: table.cast), or give the loader a "
        "shuffle_budget its rows fit instead of copying")
_LEAVES = (pa.types.is_boolean, pa.types.is_integer, pa.types.is_float32, pa.types.is_float64, pa.types.is_string,
           pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary, pa.types.is_date,
           pa.types.is_duration, pa.types.is_decimal128)


def source_schema(url: str) -> tuple[pa.Schema, list[str]]:
    """The source's columns as ``pyarrow.dataset`` reads them (hive partitioning), what the copy must give, and
    the names of its hive partition columns."""
    filesystem, root = fsutil.resolve(url)
    schema = pads.dataset(root, filesystem=filesystem, format="parquet", partitioning="hive").schema
    stored = set(pads.dataset(root, filesystem=filesystem, format="parquet").schema.names)
    return schema, [name for name in schema.names if name not in stored]


def check_copyable(schema: pa.Schema) -> None:
    """``InvalidValueError`` naming the first column whose type Spark cannot read or give back exactly."""
    for field in schema:
        reason = _refusal(field.type, top=True)
        if reason is not None:
            raise InvalidValueError(f"column {field.name!r} ({field.type}) cannot be copied exactly by Spark: "
                                    f"{reason}; {_FIX}")


def _refusal(kind: pa.DataType, *, top: bool = False) -> str | None:
    if any(test(kind) for test in _LEAVES):
        return None
    if pa.types.is_timestamp(kind):
        return "Spark reads nanoseconds neither from Parquet nor into its timestamps" if kind.unit == "ns" else None
    if pa.types.is_time(kind):
        return "Spark reads no Parquet time of day"
    if pa.types.is_dictionary(kind):
        if not top:
            return "a dictionary inside a nested column is written back without its encoding"
        return _refusal(kind.value_type)
    if pa.types.is_struct(kind):
        return next((r for r in (_refusal(kind.field(i).type) for i in range(kind.num_fields)) if r), None)
    if pa.types.is_map(kind):
        return _refusal(kind.key_type) or _refusal(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _refusal(kind.value_type)
    if str(kind) in ("string_view", "binary_view"):
        return None
    return f"Spark has no type that holds {kind} exactly"


def spark_types_ok(schema: pa.Schema, spark_schema, partition_names) -> None:
    """``InvalidValueError`` for a hive partition column Spark types otherwise than ``pyarrow.dataset``: folder
    names read as a double or a date cannot be turned back into the strings they were (``1.50`` reads ``1.5``)."""
    types = {f.name: f.dataType.typeName() for f in spark_schema.fields}
    for name in partition_names:
        want, got = schema.field(name).type, types.get(name)
        fits = got == "string" if pa.types.is_string(want) else got in ("integer", "long")
        if not fits:
            raise InvalidValueError(f"hive partition column {name!r}: Spark types its folder values as {got}, "
                                    f"pyarrow.dataset as {want}, and a copy would not give back the folder names; "
                                    "set spark.sql.sources.partitionColumnTypeInference.enabled=false for the copy")


def restore_types(url: str, schema: pa.Schema, compression: str) -> int:
    """Rewrite the Parquet files Spark wrote under ``url`` (a copy not committed yet) with ``schema``'s types;
    returns the number of files rewritten (those already of the source's types are kept as they are)."""
    filesystem, root = fsutil.resolve(url)
    selector = pafs.FileSelector(root, recursive=True)
    names = sorted(e.path for e in filesystem.get_file_info(selector)
                   if e.type == pafs.FileType.File and is_data_name(e.base_name))
    rewritten = 0
    for path in names:
        with filesystem.open_input_file(path) as handle:
            parquet = open_file(handle, coerce_int96_timestamp_unit="us")
            if parquet.schema_arrow.remove_metadata().equals(schema.remove_metadata()):
                continue
            temporary = f"{path}.{uuid.uuid4().hex}.tmp"
            with filesystem.open_output_stream(temporary) as out, \
                    pq.ParquetWriter(out, schema, compression=compression) as writer:
                for index in range(parquet.num_row_groups):
                    table = parquet.read_row_group(index)
                    writer.write_table(cast_table(table, schema), row_group_size=max(1, table.num_rows))
        filesystem.move(temporary, path)
        folder, _, name = path.rpartition("/")
        sidecar = f"{folder}/.{name}.crc"  # Hadoop's checksum of the bytes replaced: it would fail Spark's reads
        if filesystem.get_file_info(sidecar).type == pafs.FileType.File:
            filesystem.delete_file(sidecar)
        rewritten += 1
    return rewritten


def cast_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns in ``schema``'s order, each cast to its type exactly (``safe``)."""
    return pa.Table.from_arrays([cast_exact(table.column(f.name), f.type) for f in schema], schema=schema)


def cast_exact(column, kind: pa.DataType):
    """``column`` cast to ``kind``, refusing any value that would change (``safe=True``). A dictionary is encoded
    from its values' type, which ``cast`` does not do on every pyarrow."""
    if column.type.equals(kind):
        return column
    if pa.types.is_dictionary(kind):
        values = pc.dictionary_encode(cast_exact(column, kind.value_type))
        return values if values.type.equals(kind) else values.cast(kind)
    return column.cast(kind, safe=True)
