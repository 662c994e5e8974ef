"""How much does Spark planning cost next to the query it is built on?

Three figures:

1. ``where`` planning time divided by a plain Spark ``spark.read.parquet(url).where(expr).count()`` on the same
   data and session (goal: <= 1.5x). Both read the same columns with the same pushdown; planning also reads the
   row index and brings the matching rows to the driver, which encodes them per row group. Both transfers are
   timed: one int64 per matching row (what planning uses up to ``ROWS_TO_DRIVER_MAX`` scanned rows) and 64-row
   words folded in the JVM (above it). A third case: the same rows in hive folders and a where on the partition
   column alone (``year = 2021``), which planning decides per file.
2. Metadata-only planning time (no filter) for many small files: footers in Spark tasks, on the driver, and with
   the in-process engine for reference.

3. Fixed overheads: the spark-submit planning job (``spark_jobs/plan_shards.py --where``) on a small dataset
   (``--job-rows``, 60,000) against a spark-submit job that starts a session and runs one ``count()`` of the same
   where (goal: <= 2x wall time), with the job's own ``time:`` line.

Runs are interleaved (count, plan, count, plan, ...) after one warm-up of each, so a busy machine slows both
sides alike; we report the median and the best of ``--repeat`` runs.

    . scripts/env.sh && python benchmarks/bench_spark_plan.py [--rows 4000000] [--small-files 2000] [--repeat 5]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from petastorm_balanced import datagen, plan_shards  # noqa: E402
from petastorm_balanced.core.predicate_info import predicate_info
from petastorm_balanced.planner.engines import spark as spark_engine  # noqa: E402
from petastorm_balanced.planner.plan_shards import make_plan  # noqa: E402


def dataset(path: str, make) -> datagen.DatasetInfo:
    """Generate once per work folder: a rerun with the same arguments reuses the files."""
    marker = os.path.join(path, "_BENCH_DONE")
    if os.path.exists(marker):
        with open(marker) as handle:
            return datagen.DatasetInfo(**{k: tuple(v) if isinstance(v, list) else v
                                          for k, v in json.load(handle).items()})
    shutil.rmtree(path, ignore_errors=True)
    info = make(path)
    with open(marker, "w") as handle:
        json.dump(info.__dict__, handle)
    return info


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def summary(times):
    return {"median_s": round(statistics.median(times), 3), "best_s": round(min(times), 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=24)
    parser.add_argument("--small-files", type=int, default=2000)
    parser.add_argument("--where", action="append",
                        help="Spark SQL filter; repeat for several (default: one matching about half the rows, "
                             "one matching about 5%%)")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bench_spark_plan"))
    parser.add_argument("--job-rows", type=int, default=60_000, help="rows of the small dataset the job plans")
    parser.add_argument("--parts", default="where,partition,metadata,job",
                        help="which figures to measure (comma list)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    wheres = args.where or ["lang = 'en' AND value > 3", "lang = 'en' AND label = 3"]

    big = dataset(os.path.join(args.workdir, f"big-{args.rows}-{args.files}"),
                  lambda p: datagen.make_plain_dataset(p, num_files=args.files, total_rows=args.rows, seed=11,
                                                       min_row_group_rows=20_000, max_row_group_rows=200_000))
    hive = dataset(os.path.join(args.workdir, f"hive-{args.rows}-{args.files}"),
                   lambda p: datagen.make_plain_dataset(p, num_files=args.files, total_rows=args.rows, seed=11,
                                                        hive=True, min_row_group_rows=20_000,
                                                        max_row_group_rows=200_000)) if "partition" in parts else None
    small = dataset(os.path.join(args.workdir, f"small-{args.small_files}"),
                    lambda p: datagen.make_plain_dataset(p, num_files=args.small_files,
                                                         total_rows=args.small_files * 40, seed=12,
                                                         min_row_group_rows=8, max_row_group_rows=64))

    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(args.master).appName("bench_spark_plan")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    cores = spark.sparkContext.defaultParallelism

    def metadata(in_tasks):
        catalog = spark_engine.build_catalog(small.url, spark=spark, footers_in_tasks=in_tasks)
        return make_plan(small.url, catalog, world_size=args.world_size, batch_size=None, policy="drop", seed=0,
                         predicate=predicate_info(None, None))

    filters = []
    cases = [(big, where, True) for where in (wheres if "where" in parts else [])]
    cases += [(hive, "year = 2021", False)] if "partition" in parts else []  # per file: no words to compare
    for data, where, with_words in cases:
        def count(data=data, where=where):
            return spark.read.parquet(data.url).where(where).count()

        def plan(data=data, where=where, rows_max=spark_engine.ROWS_TO_DRIVER_MAX):
            default, spark_engine.ROWS_TO_DRIVER_MAX = spark_engine.ROWS_TO_DRIVER_MAX, rows_max
            try:
                return plan_shards(data.url, args.world_size, where=where, engine="spark", spark=spark)
            finally:
                spark_engine.ROWS_TO_DRIVER_MAX = default

        def words(plan=plan):
            return plan(rows_max=0)

        # Warm-up (JIT, page cache), then interleaved runs so load drifts hit both sides alike.
        matched = count()
        assert plan().total_rows == matched, "planning and Spark's count disagree"
        assert not with_words or words().total_rows == matched, "planning and Spark's count disagree"
        counts, plans, worded = [], [], []
        for _ in range(args.repeat):
            counts.append(timed(count)[0])
            plans.append(timed(plan)[0])
            if with_words:
                worded.append(timed(words)[0])
        filters.append({"where": where, "hive": not with_words, "matching_rows": matched, "count": summary(counts),
                        "plan_where": summary(plans),
                        "ratio_median": round(statistics.median(plans) / statistics.median(counts), 2),
                        "ratio_best": round(min(plans) / min(counts), 2),
                        **({"plan_where_words": summary(worded),
                            "words_ratio_median": round(statistics.median(worded) / statistics.median(counts), 2),
                            "words_ratio_best": round(min(worded) / min(counts), 2)} if worded else {})})

    tasks, driver, local = [], [], []
    if "metadata" in parts:
        metadata(True), metadata(False)
    for _ in range(args.repeat if "metadata" in parts else 0):
        tasks.append(timed(lambda: metadata(True))[0])
        driver.append(timed(lambda: metadata(False))[0])
        local.append(timed(lambda: plan_shards(small.url, args.world_size, engine="local"))[0])

    spark.stop()
    job = job_overhead(args, wheres[0]) if "job" in parts else None
    result = {
        "cores": cores, "rows": big.num_rows, "files": len(big.files), "row_groups": big.num_row_groups,
        "filters": filters, "small_files": len(small.files), "small_row_groups": small.num_row_groups,
        **({"metadata_spark_tasks": summary(tasks), "metadata_spark_driver": summary(driver),
            "metadata_local_engine": summary(local)} if tasks else {}), "job": job,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"Spark {args.master} ({cores} cores): {result['rows']:,} rows, {result['files']} files, "
          f"{result['row_groups']} row groups; median (best) of {args.repeat} interleaved runs")
    for f in filters:
        print(f"  where {f['where']!r}{' (hive partition column)' if f['hive'] else ''}: {f['matching_rows']:,} "
              "matching rows")
        print(f"    count() {f['count']['median_s']:.2f} s ({f['count']['best_s']:.2f}), plan "
              f"{f['plan_where']['median_s']:.2f} s ({f['plan_where']['best_s']:.2f}): ratio "
              f"{f['ratio_median']:.2f}x ({f['ratio_best']:.2f}x), goal <= 1.5x")
        if "plan_where_words" in f:
            print(f"    as words (planning above {spark_engine.ROWS_TO_DRIVER_MAX:,} scanned rows): plan "
                  f"{f['plan_where_words']['median_s']:.2f} s ({f['plan_where_words']['best_s']:.2f}): ratio "
                  f"{f['words_ratio_median']:.2f}x ({f['words_ratio_best']:.2f}x)")
    if tasks:
        print(f"metadata-only planning, {result['small_files']} files, {result['small_row_groups']} row groups")
        for label, key in (("footers in Spark tasks", "metadata_spark_tasks"),
                           ("footers on the driver ", "metadata_spark_driver"),
                           ("local engine          ", "metadata_local_engine")):
            print(f"  {label}: median {result[key]['median_s']:.2f} s  best {result[key]['best_s']:.2f} s")
    if job:
        print(f"planning job (spark-submit, {job['rows']:,} rows, where {job['where']!r}) against spark-submit of "
              "a session + one count()")
        print(f"  count job {job['count_job']['median_s']:.1f} s ({job['count_job']['best_s']:.1f}), planning job "
              f"{job['plan_job']['median_s']:.1f} s ({job['plan_job']['best_s']:.1f}): ratio "
              f"{job['ratio_median']:.2f}x ({job['ratio_best']:.2f}x), goal <= 2x: "
              f"{'met' if job['ratio_median'] <= 2 else 'NOT met'}")
        print(f"  job's own line: {job['time_line']}")
    for f in filters:
        words = (f"; as words {f['words_ratio_median']:.2f}x: "
                 f"{'met' if f['words_ratio_median'] <= 1.5 else 'NOT met'}" if "words_ratio_median" in f else "")
        print(f"where goal <= 1.5x for {f['where']!r}: {'met' if f['ratio_median'] <= 1.5 else 'NOT met'} "
              f"(median ratio {f['ratio_median']:.2f}x{words})")
    return 0


def job_overhead(args, where: str) -> dict:
    """Wall time of whole spark-submit runs, interleaved: the planning job, and a session plus one count()."""
    info = dataset(os.path.join(args.workdir, f"job-{args.job_rows}"),
                   lambda p: datagen.make_plain_dataset(p, num_files=12, total_rows=args.job_rows, seed=13))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    master = ["--master", args.master, "--conf", "spark.ui.enabled=false"]
    count_cmd = ["spark-submit", *master, os.path.join(repo, "benchmarks", "spark_count_job.py"), info.url, where]
    plan_cmd = ["spark-submit", *master, os.path.join(repo, "spark_jobs", "plan_shards.py"), info.url,
                "--world-size", str(args.world_size), "--where", where, "--output",
                os.path.join(args.workdir, "job-plan")]

    def run(cmd):
        started = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=args.workdir)
        if out.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        return time.perf_counter() - started, out.stdout + out.stderr

    counts, plans, line = [], [], ""
    for _ in range(args.repeat):
        counts.append(run(count_cmd)[0])
        seconds, text = run(plan_cmd)
        plans.append(seconds)
        line = next((x for x in text.splitlines() if x.startswith("plan_shards: time:")), "")
    return {"rows": info.num_rows, "where": where, "count_job": summary(counts), "plan_job": summary(plans),
            "ratio_median": round(statistics.median(plans) / statistics.median(counts), 2),
            "ratio_best": round(min(plans) / min(counts), 2), "time_line": line}


if __name__ == "__main__":
    sys.exit(main())
