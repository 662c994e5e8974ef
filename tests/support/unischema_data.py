"""A Unischema dataset with every codec and several Spark SQL scalar types, written with Spark by Petastorm's
``materialize_dataset`` or ours, and a canonical form of decoded rows to compare readers (in-process and across
stacks). Not a test module: tests/integration/test_unischema_spark.py and tests/support/stack_side.py use it."""
import datetime
import hashlib
from decimal import Decimal

import numpy as np

ROWS = 60


def schema(writer: str):
    """The schema built from Petastorm's classes (``writer='petastorm'``) or ours (``'ours'``)."""
    if writer == "petastorm":
        from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
        from petastorm.unischema import Unischema, UnischemaField
    else:
        from petastorm_balanced.unischema import (
            CompressedImageCodec,
            CompressedNdarrayCodec,
            NdarrayCodec,
            ScalarCodec,
            Unischema,
            UnischemaField,
        )
    from pyspark.sql import types as T
    return Unischema("AllCodecs", [
        UnischemaField("id", np.int64, (), ScalarCodec(T.LongType()), False),
        UnischemaField("i32", np.int32, (), ScalarCodec(T.IntegerType()), False),
        UnischemaField("i16", np.int16, (), ScalarCodec(T.ShortType()), False),
        UnischemaField("f32", np.float32, (), ScalarCodec(T.FloatType()), False),
        UnischemaField("f64", np.float64, (), ScalarCodec(T.DoubleType()), True),
        UnischemaField("flag", np.bool_, (), ScalarCodec(T.BooleanType()), False),
        UnischemaField("name", np.str_, (), ScalarCodec(T.StringType()), True),
        UnischemaField("price", Decimal, (), ScalarCodec(T.DecimalType(10, 2)), False),
        UnischemaField("day", np.datetime64, (), ScalarCodec(T.DateType()), False),
        UnischemaField("vec", np.float32, (None,), NdarrayCodec(), False),
        UnischemaField("mat", np.float64, (3, 2), CompressedNdarrayCodec(), False),
        UnischemaField("png", np.uint8, (12, 10, 3), CompressedImageCodec("png"), False),
        UnischemaField("gray", np.uint8, (9, 11), CompressedImageCodec("png"), False),
        UnischemaField("jpg", np.uint8, (16, 16, 3), CompressedImageCodec("jpeg", 90), False),
    ])


def row(i: int) -> dict:
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:16, 0:16]
    picture = np.stack([x * 12 + i % 40, y * 12, (x + y) * 6 + i % 20], -1)  # smooth, no wrap-around edges
    return {"id": i, "i32": int(rng.integers(-2 ** 31, 2 ** 31)), "i16": int(rng.integers(-2 ** 15, 2 ** 15)),
            "f32": float(np.float32(rng.standard_normal())),
            "f64": None if i % 7 == 3 else float(rng.standard_normal()),
            "flag": bool(i % 3), "name": None if i % 5 == 2 else f"name-{i}-é",
            "price": Decimal(int(rng.integers(0, 10 ** 6))) / 100,
            "day": datetime.date(2020, 1, 1) + datetime.timedelta(days=i),
            "vec": rng.standard_normal(int(rng.integers(1, 6))).astype(np.float32),
            "mat": rng.standard_normal((3, 2)), "png": rng.integers(0, 256, (12, 10, 3), dtype=np.uint8),
            "gray": rng.integers(0, 256, (9, 11), dtype=np.uint8), "jpg": picture.astype(np.uint8)}


def write(spark, path: str, writer: str) -> None:
    """``ROWS`` rows in 3 files, through ``materialize_dataset`` and ``dict_to_spark_row`` of ``writer``."""
    if writer == "petastorm":
        from petastorm.etl.dataset_metadata import materialize_dataset
        from petastorm.unischema import dict_to_spark_row
    else:
        from petastorm_balanced.unischema import dict_to_spark_row, materialize_dataset
    the_schema = schema(writer)
    url = "file://" + str(path)
    with materialize_dataset(spark, url, the_schema, row_group_size_mb=1):
        rows = [dict_to_spark_row(the_schema, row(i)) for i in range(ROWS)]
        frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, 3), the_schema.as_spark_schema())
        frame.write.mode("overwrite").parquet(url)


def canonical(value) -> str:
    """A value's type, dtype, shape and content as text: equal text means equal values of equal types."""
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"ndarray:{value.dtype.str}:{value.shape}:{hashlib.sha256(value.tobytes()).hexdigest()}"
    if isinstance(value, float) and value != value or isinstance(value, np.floating) and np.isnan(value):
        return f"{type(value).__name__}:nan"
    if isinstance(value, np.generic):  # numpy 1 and 2 print scalars differently: compare dtype and Python value
        return f"numpy:{value.dtype.str}:{value.item()!r}"  # np.bool_ is named bool_ in numpy 1, bool in 2
    return f"{type(value).__name__}:{value!r}"


def row_digests(rows) -> dict:
    """{id: {field: canonical value}} of decoded rows (namedtuples or dicts)."""
    out = {}
    for r in rows:
        values = r._asdict() if hasattr(r, "_asdict") else dict(r)
        out[str(int(values["id"]))] = {k: canonical(v) for k, v in values.items()}
    return out
