"""Spark SQL types as plain values, for reading a Unischema where pyspark is absent or not wanted.

A Petastorm Unischema pickle names ``pyspark.sql.types.LongType`` and friends (``ScalarCodec(LongType())``). Reading
a dataset needs only the type's name and attributes (decoding casts with the field's numpy dtype), so the restricted
unpickler builds these stand-ins instead of importing pyspark: reading works on a machine without Spark, and no
pyspark code runs while a stored schema is loaded. ``to_pyspark`` gives the real type where one is needed (writing).
The pickle of a stand-in names ``pyspark.sql.types.<name>`` again (``pickling.py``), so a schema read and written
back is the one Petastorm wrote.
"""
from __future__ import annotations

from typing import Any

# Every DataType class of pyspark.sql.types that a column (and so a ScalarCodec) can carry.
NAMES: tuple[str, ...] = (
    "NullType", "StringType", "CharType", "VarcharType", "BinaryType", "BooleanType", "DateType", "TimestampType",
    "TimestampNTZType", "DecimalType", "DoubleType", "FloatType", "ByteType", "IntegerType", "LongType", "ShortType",
    "DayTimeIntervalType", "YearMonthIntervalType", "CalendarIntervalType", "ArrayType", "MapType", "StructField",
    "StructType", "VariantType",
)
INTEGRAL = frozenset({"ByteType", "ShortType", "IntegerType", "LongType"})
FRACTIONAL = frozenset({"FloatType", "DoubleType"})


class SparkType:
    """A Spark SQL type by name and attributes (its pickled ``__dict__``); equal to another of the same both."""

    name = "DataType"

    def __init__(self, **attributes: Any):
        self.__dict__.update(attributes)

    def __eq__(self, other: object) -> bool:
        return type_name(other) == self.name and _state(other) == _state(self)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"{self.name}()"

    def typeName(self) -> str:  # noqa: N802 - pyspark's name
        return self.name[:-4].lower()

    def to_pyspark(self) -> Any:
        """The real ``pyspark.sql.types`` object (needs pyspark), with the same attributes."""
        import pyspark.sql.types as sql_types
        real = getattr(sql_types, self.name).__new__(getattr(sql_types, self.name))
        real.__dict__.update({k: to_pyspark(v) for k, v in self.__dict__.items()})
        return real


def type_name(spark_type: object) -> str:
    """``'LongType'`` for ``LongType()``, real or stand-in."""
    return spark_type.name if isinstance(spark_type, SparkType) else type(spark_type).__name__


def to_pyspark(value: Any) -> Any:
    """``value`` with stand-ins (also inside lists) replaced by real pyspark types."""
    if isinstance(value, SparkType):
        return value.to_pyspark()
    if isinstance(value, list):
        return [to_pyspark(v) for v in value]
    return value


def _state(value: object) -> dict[str, Any]:
    return dict(getattr(value, "__dict__", {}))


STAND_INS: dict[str, type] = {name: type(name, (SparkType,), {"name": name, "__module__": __name__})
                              for name in NAMES}
DEFAULTS: dict[str, dict[str, Any]] = {"StringType": {"collation": "UTF8_BINARY"}}  # pyspark 4's attributes


def spark_type(name: str, **attributes: Any) -> SparkType:
    """A stand-in ``pyspark.sql.types.<name>`` with pyspark 4's default attributes, e.g. ``spark_type('LongType')``
    (for writing a schema without pyspark; it pickles as the real type)."""
    if name not in STAND_INS:
        raise KeyError(f"{name!r} is not a Spark SQL type name; one of {NAMES}")
    return STAND_INS[name](**{**DEFAULTS.get(name, {}), **attributes})
