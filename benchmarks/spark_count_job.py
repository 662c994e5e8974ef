"""The baseline of bench_spark_plan.py's job figure: a spark-submit job that starts a session and runs one
``spark.read.parquet(url).where(SQL).count()``, nothing else.

    spark-submit benchmarks/spark_count_job.py DATASET_URL SQL
"""
import sys

from pyspark.sql import SparkSession

if __name__ == "__main__":
    spark = SparkSession.builder.appName("count baseline").getOrCreate()
    print(f"count_job: {spark.read.parquet(sys.argv[1]).where(sys.argv[2]).count()} rows")
    spark.stop()
