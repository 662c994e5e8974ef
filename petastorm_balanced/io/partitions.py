"""Hive partition values of a file's path, decoded and typed as ``pyarrow.dataset`` (hive partitioning) reads them.

Planning (predicates), the Spark engine and both readers take partition values from here, so a predicate sees the
very value the loader delivers (G13):

- ``key=value`` folders; key and value are URL-decoded after splitting on the first ``=`` (Spark and DuckDB write
  ``a/b`` as ``a%2Fb``, ``50%`` as ``50%25``);
- ``__HIVE_DEFAULT_PARTITION__`` (what Spark and DuckDB write for a null) is None;
- one type per column for the whole dataset: ``int32`` when every non-null value converts with pyarrow's own
  string-to-int32 cast (the conversion ``pyarrow.dataset`` uses to infer the type, so the same values pass: ``01``
  and ``0x10`` do, ``+3`` and ``2147483648`` do not), else ``string``; a column with no non-null value is a
  ``string`` column of nulls (``pyarrow.dataset`` refuses to infer that one at all).

>>> partition_values("year=2021/lang=a%2Fb/part-0.parquet")
{'year': '2021', 'lang': 'a/b'}
>>> partition_types(["p=1/x.parquet", "p=__HIVE_DEFAULT_PARTITION__/y.parquet", "p=07/z.parquet"])
{'p': 'int32'}
>>> typed_partition_values("p=07/z.parquet", {"p": "int32"})
{'p': 7}
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import unquote

import pyarrow as pa

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
TYPES = ("int32", "string")

Value = int | str | None


def partition_values(relative_path: str) -> dict[str, str | None]:
    """Decoded hive partition values (None for a null) from the ``key=value`` folders of a relative path."""
    out: dict[str, str | None] = {}
    for part in relative_path.split("/")[:-1]:
        if "=" in part:
            key, value = part.split("=", 1)
            out[unquote(key)] = None if value == HIVE_NULL else unquote(value)
    return out


def partition_types(paths: Iterable[str]) -> dict[str, str]:
    """One type per partition column over all ``paths`` (relative paths): ``'int32'`` or ``'string'``, sorted by
    name."""
    values: dict[str, set] = {}
    for path in paths:
        for key, value in partition_values(path).items():
            seen = values.setdefault(key, set())
            if value is not None:
                seen.add(value)
    return {key: _infer(vals) for key, vals in sorted(values.items())}


def _infer(values: set) -> str:
    if not values:
        return "string"
    try:
        pa.array(sorted(values), type=pa.string()).cast(pa.int32())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return "string"
    return "int32"


def typed_partition_values(relative_path: str, types: Mapping[str, str]) -> dict[str, Value]:
    """The path's partition values converted to ``types`` (from ``partition_types``): ints, strings or None."""
    out: dict[str, Value] = {}
    for key, value in partition_values(relative_path).items():
        if value is not None and types.get(key) == "int32":
            out[key] = pa.array([value], type=pa.string()).cast(pa.int32())[0].as_py()
        else:
            out[key] = value
    return out


def arrow_type(kind: str) -> pa.DataType:
    """The Arrow type of a partition column typed ``kind``."""
    return pa.int32() if kind == "int32" else pa.string()
