"""``Unischema`` and ``UnischemaField``: Petastorm 0.12.1's schema classes, reimplemented without Petastorm.

The instance layout is Petastorm's on purpose (``_name``, ``_fields`` as an ``OrderedDict``, one attribute per
field; a field is a 5-tuple ``(name, numpy_dtype, shape, codec, nullable)``): a Unischema is stored in
``_common_metadata`` as a pickle of exactly that layout, so ours and Petastorm's read each other's.
"""
from __future__ import annotations

import re
import warnings
from collections import OrderedDict, namedtuple
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ..errors import InvalidTypeError, InvalidValueError


class UnischemaField(NamedTuple):
    """One field: name, numpy type, shape (``None`` for a size that varies), codec, nullable.

    Equality and hash leave the codec out, as Petastorm's do (a codec has no value identity across pickles).
    """

    name: str
    numpy_dtype: Any
    shape: tuple[int | None, ...]
    codec: Any | None = None
    nullable: bool | None = False

    def __eq__(self, other: object) -> bool:
        return _key(self) == _key(other) if isinstance(other, tuple) and len(other) == 5 else False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(_key(self))


def _key(field) -> tuple:
    return (field[0], field[1], field[2], field[4])


_NAMEDTUPLES: dict[str, type] = {}


def row_type(schema_name: str, names: Iterable[str]) -> type:
    """The namedtuple type of rows of ``names`` (one type per schema name and field list, as Petastorm caches)."""
    names = list(names)
    key = " ".join([schema_name] + names)
    if key not in _NAMEDTUPLES:
        _NAMEDTUPLES[key] = namedtuple(f"{schema_name}_view", names)
    return _NAMEDTUPLES[key]


class Unischema:
    """A named, ordered set of ``UnischemaField``: what each column of a Petastorm dataset holds and its codec."""

    def __init__(self, name: str, fields: list[UnischemaField]):
        self._name = name
        self._fields = OrderedDict((f.name, f) for f in fields)
        for f in fields:
            if not hasattr(self, f.name):
                setattr(self, f.name, f)
            else:
                warnings.warn(f"Unischema field {f.name!r} is not an attribute: the name is taken by Unischema itself",
                              stacklevel=2)

    @property
    def fields(self) -> OrderedDict[str, UnischemaField]:
        return self._fields

    def create_schema_view(self, fields: Sequence[Any]) -> Unischema:
        """A Unischema of some fields: ``UnischemaField`` objects and/or regular expressions matching whole names."""
        patterns = [f for f in fields if isinstance(f, str)]
        objects: list[Any] = [f for f in fields if isinstance(f, tuple)]  # UnischemaFields: ours or Petastorm's
        if len(patterns) + len(objects) != len(fields):
            raise InvalidTypeError("fields must be regular expressions (str) or UnischemaField objects")
        unknown = sorted({f.name for f in objects} - set(self._fields))
        if unknown:
            raise InvalidValueError(f"fields {unknown} are not in the schema {self._name!r}")
        view = [self._fields[f.name] for f in objects] + match_unischema_fields(self, patterns)
        return Unischema(f"{self._name}_view", view)

    def _get_namedtuple(self) -> type:
        return row_type(self._name, self._fields.keys())

    def make_namedtuple(self, **values: Any) -> Any:
        return self._get_namedtuple()(**values)

    def as_spark_schema(self) -> Any:
        """The ``pyspark.sql.types.StructType`` of the stored columns (needs pyspark)."""
        import pyspark.sql.types as sql_types
        return sql_types.StructType([sql_types.StructField(f.name, _spark_type(f), bool(f.nullable))
                                     for f in self._fields.values()])

    def __str__(self) -> str:
        lines = "".join(f"  UnischemaField({f.name!r}, {getattr(f.numpy_dtype, '__name__', f.numpy_dtype)}, "
                        f"{f.shape}, {f.codec}, {f.nullable}),\n" for f in self._fields.values())
        return f"Unischema({self._name}, [\n{lines}])"

    __repr__ = __str__


def _spark_type(field: UnischemaField) -> Any:
    if field.codec is not None:
        return field.codec.spark_dtype()
    if field.shape != ():
        raise InvalidValueError(f"field {field.name!r} is not a scalar and has no codec: give it a codec "
                                "(NdarrayCodec, CompressedNdarrayCodec, CompressedImageCodec)")
    import numpy as np
    import pyspark.sql.types as sql_types
    mapping = {np.int8: sql_types.ByteType, np.uint8: sql_types.ShortType, np.int16: sql_types.ShortType,
               np.uint16: sql_types.IntegerType, np.int32: sql_types.IntegerType, np.int64: sql_types.LongType,
               np.float32: sql_types.FloatType, np.float64: sql_types.DoubleType, np.bytes_: sql_types.StringType,
               np.str_: sql_types.StringType, np.bool_: sql_types.BooleanType}
    if field.numpy_dtype not in mapping:
        raise InvalidValueError(f"field {field.name!r}: numpy type {field.numpy_dtype} has no Spark type; give it "
                                "a ScalarCodec(<pyspark.sql.types type>())")
    return mapping[field.numpy_dtype]()


def match_unischema_fields(schema: Unischema, patterns: Sequence[str]) -> list[UnischemaField]:
    """The fields whose whole name matches one of the regular expressions ``patterns``, in schema order."""
    return [f for name, f in schema.fields.items() if any(re.fullmatch(p, name) for p in patterns or ())]
