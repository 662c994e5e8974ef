"""Writing Petastorm datasets without Petastorm: ``dict_to_spark_row`` and ``materialize_dataset`` on Spark 4.x.

What makes Petastorm 0.12.1 read the result: the cells are encoded by the same codecs, and ``_common_metadata``
carries Petastorm's two keys, ``dataset-toolkit.unischema.v1`` (the schema pickled under Petastorm's class paths)
and ``dataset-toolkit.num_row_groups_per_file.v1`` (JSON: relative file path -> row groups), on the Arrow schema of
the first data file, as ``petastorm.etl.dataset_metadata.materialize_dataset`` writes them. The row-group counts are
read from the footers on the driver (pyarrow, a few threads) instead of a Spark job: a footer read is
milliseconds, and the driver already has the filesystem.
"""
from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import InvalidTypeError, InvalidValueError
from ..io.footer import footer_at
from . import pickling
from .storage import ROW_GROUPS_PER_FILE_KEY, UNISCHEMA_KEY

# Hadoop settings materialize_dataset changes for the write, and restores after (Petastorm's list).
_HADOOP_KEYS = ("parquet.summary.metadata.level", "parquet.enable.summary-metadata",
                "parquet.summary.metadata.propagate-errors", "parquet.block.size.row.check.min",
                "parquet.row-group.size.row.check.min", "parquet.block.size")


def dict_to_spark_row(unischema: Any, row_dict: dict) -> Any:
    """A ``pyspark.Row`` of ``row_dict`` encoded by the schema's codecs, fields in schema order.

    Missing nullable fields become None; a missing or None non-nullable field, or an unknown key, is an error.
    """
    import pyspark
    if not hasattr(unischema, "fields"):
        raise InvalidTypeError(f"unischema={unischema!r} is not a Unischema")
    values = copy.copy(row_dict)
    for name, field in unischema.fields.items():
        if name not in values:
            if not field.nullable:
                raise InvalidValueError(f"field {name!r} is missing from the row and is not nullable")
            values[name] = None
    unknown = sorted(set(values) - set(unischema.fields))
    if unknown:
        raise InvalidValueError(f"row fields {unknown} are not in the schema (fields: {list(unischema.fields)})")
    encoded: list = []
    for name, field in unischema.fields.items():
        value = values[name]
        if value is None:
            if not field.nullable:
                raise InvalidValueError(f"field {name!r} is None but not nullable")
            encoded.append(None)
        elif field.codec:
            encoded.append(field.codec.encode(field, value))
        else:
            encoded.append(value.tolist() if isinstance(value, np.generic) else value)
    row = pyspark.Row(*encoded)
    row.__fields__ = list(unischema.fields)
    return row


@contextlib.contextmanager
def materialize_dataset(spark: Any, dataset_url: str, schema: Any,
                        row_group_size_mb: int | None = None) -> Iterator[None]:
    """Around the Spark write of a Petastorm dataset: row-group size and summary settings during the write, then
    ``_common_metadata`` with the schema and row-group counts (Petastorm's ``materialize_dataset``).

    Needs a classic SparkSession (its Hadoop configuration); the schema is ours or Petastorm's Unischema.
    """
    if row_group_size_mb is not None and (not isinstance(row_group_size_mb, int) or row_group_size_mb <= 0):
        raise InvalidValueError(f"row_group_size_mb={row_group_size_mb!r} must be a positive int (MiB) or None")
    payload = pickling.dumps(_ours(schema))
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    saved = {key: hadoop.get(key) for key in _HADOOP_KEYS}
    hadoop.set("parquet.summary.metadata.level", "NONE")
    hadoop.setBoolean("parquet.summary.metadata.propagate-errors", True)
    hadoop.setInt("parquet.block.size.row.check.min", 3)
    hadoop.setInt("parquet.row-group.size.row.check.min", 3)
    if row_group_size_mb:
        hadoop.setInt("parquet.block.size", row_group_size_mb * 1024 * 1024)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                hadoop.unset(key)
            else:
                hadoop.set(key, value)
    write_metadata(dataset_url, payload)


def write_metadata(dataset_url: str, unischema_pickle: bytes) -> None:
    """``_common_metadata`` of the dataset at ``dataset_url`` with Petastorm's two keys (replaced if present)."""
    from ..io.dataset import list_data_files, relative_path
    filesystem, root, files = list_data_files(dataset_url)

    def row_groups(info):
        return relative_path(info.path, root), footer_at(filesystem, info.path).num_row_groups

    with ThreadPoolExecutor(8) as pool:
        counts = dict(pool.map(row_groups, files))
    base = footer_at(filesystem, files[0].path).schema.to_arrow_schema()
    metadata = dict(base.metadata or {})
    metadata[UNISCHEMA_KEY] = unischema_pickle
    metadata[ROW_GROUPS_PER_FILE_KEY] = json.dumps(counts).encode()
    with filesystem.open_output_stream(f"{root}/_common_metadata") as out:
        pq.write_metadata(base.with_metadata(metadata), out)
    crc = f"{root}/._common_metadata.crc"  # Hadoop's checksum of the old file would not match the new one
    if filesystem.get_file_info(crc).type == pafs.FileType.File:
        filesystem.delete_file(crc)


def _ours(schema):
    """Our Unischema for ``schema`` (ours, or Petastorm's converted field by field)."""
    from . import codecs as ours
    from .schema import Unischema, UnischemaField
    if isinstance(schema, Unischema):
        return schema
    if not hasattr(schema, "fields") or not hasattr(schema, "_name"):
        raise InvalidTypeError(f"schema={schema!r} is not a Unischema")
    fields = []
    for f in schema.fields.values():
        codec = f.codec
        if codec is not None and not isinstance(codec, ours.CODECS):
            kind = type(codec).__name__
            if kind == "ScalarCodec":
                codec = ours.ScalarCodec(codec._spark_type)
            elif kind == "CompressedImageCodec":
                codec = ours.CompressedImageCodec(codec.image_codec, codec._quality)
            elif kind in ("NdarrayCodec", "CompressedNdarrayCodec"):
                codec = getattr(ours, kind)()
            else:
                raise InvalidTypeError(f"field {f.name!r} has codec {kind}, not one of Petastorm's four")
        fields.append(UnischemaField(f.name, f.numpy_dtype, f.shape, codec, f.nullable))
    return Unischema(schema._name, fields)


__all__ = ["dict_to_spark_row", "materialize_dataset", "write_metadata"]
