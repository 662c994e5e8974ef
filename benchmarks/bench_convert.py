"""What does ``make_spark_converter`` cost next to writing the same rows with ``df.write.parquet``?

One DataFrame of ``--rows`` rows (1,000,000 by default: an id, a double written as float32, a 4-element array and a
short string, in ``--partitions`` partitions) is converted by ``petastorm_balanced.spark.make_spark_converter``
(cache key, write to a temporary folder, the fixed-shape check of the array column, the rename, planning, the plan
written beside the copy) and written by ``df.write.parquet`` with the same precision cast and Parquet options.
Runs are interleaved (write, convert, write, convert, ...) after one warm-up of each, each convert into a fresh
cache folder so nothing is reused; we report the median and the best of ``--repeat`` runs, and the ratio of the
medians. A last line times a second convert of the same DataFrame (the cache hit).

    python benchmarks/bench_convert.py [--rows 1000000] [--repeat 3]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from petastorm_balanced.spark import DEFAULT_ROW_GROUP_SIZE_BYTES, make_spark_converter


def frame(spark, rows: int, partitions: int):
    from pyspark.sql import functions as F
    return (spark.range(0, rows, 1, partitions)
            .withColumn("x", F.col("id") * 0.5)
            .withColumn("arr", F.array(*[(F.col("id") + i).cast("double") for i in range(4)]))
            .withColumn("tag", F.concat(F.lit("t"), (F.col("id") % 97).cast("string"))))


def plain_write(df, url: str) -> None:
    """What a user would run to get the same Parquet: the same float32 cast and row group size, no compression."""
    from pyspark.sql import functions as F
    df = df.withColumn("x", F.col("x").cast("float")).withColumn("arr", F.col("arr").cast("array<float>"))
    df.write.option("compression", "none").option("parquet.block.size", str(DEFAULT_ROW_GROUP_SIZE_BYTES)) \
        .parquet(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = frame(spark, args.rows, args.partitions)
    work = tempfile.mkdtemp(prefix="bench_convert-")
    times = {"write": [], "convert": []}
    try:
        for run in range(args.repeat + 1):  # run 0 warms up both
            for name in ("write", "convert"):
                target = os.path.join(work, f"{name}-{run}")
                started = time.perf_counter()
                if name == "write":
                    plain_write(df, target)
                else:
                    converter = make_spark_converter(df, parent_cache_dir_url=target, batch_size=256)
                seconds = time.perf_counter() - started
                if run:
                    times[name].append(seconds)
                shutil.rmtree(target, ignore_errors=True)
        parent = os.path.join(work, "hit")
        make_spark_converter(df, parent_cache_dir_url=parent, batch_size=256)
        started = time.perf_counter()
        converter = make_spark_converter(df, parent_cache_dir_url=parent, batch_size=256)
        hit = time.perf_counter() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    for name, values in times.items():
        print(f"{name:8s} {args.rows:,} rows: median {statistics.median(values):.2f} s, best {min(values):.2f} s "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    ratio = statistics.median(times["convert"]) / statistics.median(times["write"])
    best = min(times["convert"]) / min(times["write"])
    print(f"convert / df.write.parquet: {ratio:.2f}x (medians); best {best:.2f}x")
    print(f"second convert of the same DataFrame (cache hit): {hit:.2f} s ({len(converter)} rows planned)")


if __name__ == "__main__":
    main()
