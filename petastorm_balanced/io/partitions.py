"""Hive partition values of a file's path, decoded and typed as ``pyarrow.dataset`` (hive partitioning) reads them.

Planning (predicates), the Spark engine and both readers take partition values from here, so a predicate sees the
very value the loader delivers (G13):

- ``key=value`` folders; key and value are URL-decoded after splitting on the first ``=`` (Spark and DuckDB write
  ``a/b`` as ``a%2Fb``, ``50%`` as ``50%25``);
- ``__HIVE_DEFAULT_PARTITION__`` (what Spark and DuckDB write for a null) is None;
- one type per column for the whole dataset: ``int32`` when every non-null value converts with pyarrow's own
  string-to-int32 cast (the conversion ``pyarrow.dataset`` uses to infer the type, so the same values pass: ``01``
  and ``0x10`` do, ``+3`` and ``2147483648`` do not), else ``string``; a column with no non-null value is a
  ``string`` column of nulls (``pyarrow.dataset`` refuses to infer that one at all);
- a table that declares its partition columns' types (a Delta table's schema: ``io/tables.py``) gives them as
  ``declared``, and the folder text is parsed as that type (``'007'`` stays ``'007'`` in a string column): the
  kinds are Arrow type names (``KINDS``, and ``decimal128(p, s)``).

>>> partition_values("year=2021/lang=a%2Fb/part-0.parquet")
{'year': '2021', 'lang': 'a/b'}
>>> partition_types(["p=1/x.parquet", "p=__HIVE_DEFAULT_PARTITION__/y.parquet", "p=07/z.parquet"])
{'p': 'int32'}
>>> typed_partition_values("p=07/z.parquet", {"p": "int32"})
{'p': 7}
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
TYPES = ("int32", "string")  # what folder names alone are inferred as
# what a table may declare (Arrow type names): decimal128(p, s) besides
KINDS = {str(t): t for t in (pa.string(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.bool_(), pa.float32(),
                             pa.float64(), pa.date32(), pa.timestamp("us"), pa.timestamp("us", tz="UTC"))}
_DECIMAL = re.compile(r"decimal128\((\d+), (\d+)\)")

Value = Any  # int, str, None, or for declared kinds bool, float, date, datetime, Decimal


def partition_values(relative_path: str) -> dict[str, str | None]:
    """Decoded hive partition values (None for a null) from the ``key=value`` folders of a relative path."""
    out: dict[str, str | None] = {}
    for part in relative_path.split("/")[:-1]:
        if "=" in part:
            key, value = part.split("=", 1)
            out[unquote(key)] = None if value == HIVE_NULL else unquote(value)
    return out


def partition_types(paths: Iterable[str], declared: Mapping[str, str] | None = None) -> dict[str, str]:
    """One type per partition column over all ``paths`` (relative paths), sorted by name: ``declared``'s kind where
    it names the column (a table's schema), else ``'int32'`` or ``'string'`` as inferred from the folder names."""
    declared = declared or {}
    values: dict[str, set] = {}
    for path in paths:
        for key, value in partition_values(path).items():
            seen = values.setdefault(key, set())
            if value is not None:
                seen.add(value)
    return {key: declared.get(key) or _infer(vals) for key, vals in sorted(values.items())}


def _infer(values: set) -> str:
    if not values:
        return "string"
    try:
        pa.array(sorted(values), type=pa.string()).cast(pa.int32())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return "string"
    return "int32"


def typed_partition_values(relative_path: str, types: Mapping[str, str]) -> dict[str, Value]:
    """The path's partition values converted to ``types`` (from ``partition_types``): Python values or None; a
    folder ``types`` does not name is no partition column (an Iceberg identity partition, read from the file)."""
    out: dict[str, Value] = {}
    for key, value in partition_values(relative_path).items():
        if key not in types:
            continue
        kind = types[key]
        out[key] = value if value is None or kind == "string" else parse(value, kind)
    return out


def parse(text: str, kind: str) -> Value:
    """A folder's (decoded) text as a value of ``kind``: pyarrow's string cast, and for a UTC timestamp a text
    without a zone offset (``2021-01-01 12:30:00.000500``, as Delta writes it) read as UTC, as deltalake reads it.
    Raises ``ArrowInvalid`` for a text the kind cannot hold."""
    target = arrow_type(kind)
    text_array = pa.array([text], type=pa.string())
    if pa.types.is_timestamp(target) and target.tz is not None and not _has_offset(text):
        return text_array.cast(pa.timestamp(target.unit)).cast(target)[0].as_py()
    return text_array.cast(target)[0].as_py()


def _has_offset(text: str) -> bool:
    return text.endswith("Z") or bool(re.search(r"[+-]\d\d:?\d\d$", text.split(" ")[-1].split("T")[-1]))


def arrow_type(kind: str) -> pa.DataType:
    """The Arrow type of a partition column typed ``kind``."""
    if kind in KINDS:
        return KINDS[kind]
    match = _DECIMAL.fullmatch(kind)
    if match:
        return pa.decimal128(int(match.group(1)), int(match.group(2)))
    raise ValueError(f"{kind!r} is not a partition column type ({sorted(KINDS)} or decimal128(p, s))")
