"""How long does updating a plan for added files take, next to planning the grown dataset from scratch?

A dataset of N files (``--sizes``, each ``--rows-per-file`` rows, in ``day=`` hive folders) is planned; then N/20
files arrive in a new ``day=`` folder. Two ways to get the grown dataset's plan, timed in the same process:

- ``update``: ``plan_shards(..., update=OLD_PLAN_URL)`` (what ``petastorm-balanced plan --update`` runs): lists the
  dataset, reads the old plan, reads the added files' footers and evaluates the filter on them only;
- ``scratch``: ``plan_shards(...)`` over all N + N/20 files.

Both write the same plan (same checksum, checked every round). Two engines: the local engine with a Petastorm
predicate, and the Spark engine with a ``where`` (``local[*]`` here). Rounds are interleaved (update, scratch,
update, ...) after a warm-up of each, so a busy machine slows both alike; the figure is the ratio of medians.
Goal: time proportional to the files added (1/21 of the files: the larger Spark update under 0.15x). Figures and
the sizes that fit about 3-6 minutes on a loaded 2-core machine: docs/cli.md, "plan --update".

    . scripts/env.sh && python benchmarks/bench_update.py [--sizes 200,800] [--rows-per-file 2000] [--repeat 3]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from petastorm_balanced import plan_shards  # noqa: E402
from petastorm_balanced.predicates import in_set  # noqa: E402

WHERE = "lang = 'en' and value > 0"
PREDICATE = in_set(["en"], "lang")


def write_files(folder: str, first: int, count: int, rows: int, day: int, files_per_day: int) -> None:
    """``count`` files of ``rows`` rows (ids from ``first * rows``), ``files_per_day`` per ``day=`` folder."""
    for k in range(first, first + count):
        rng = np.random.default_rng(k)
        ids = np.arange(k * rows, (k + 1) * rows, dtype=np.int64)
        table = pa.table({"id": ids, "lang": rng.choice(["en", "de", "fr"], rows, p=[0.5, 0.3, 0.2]),
                          "value": rng.normal(size=rows), "label": rng.integers(0, 10, rows, dtype=np.int32)})
        folder_day = day if day >= 0 else (k - first) // files_per_day
        target = os.path.join(folder, f"day={folder_day}")
        os.makedirs(target, exist_ok=True)
        pq.write_table(table, os.path.join(target, f"part-{k:06d}.parquet"), row_group_size=max(1, rows // 2))


def prepare(workdir: str, files: int, rows: int) -> tuple[str, str]:
    """(dataset folder holding N files, folder holding the N/20 files to add); generated once per workdir."""
    base = os.path.join(workdir, f"n{files}-r{rows}")
    dataset, staged = os.path.join(base, "ds"), os.path.join(base, "added")
    marker = os.path.join(base, "_DONE")
    if not os.path.exists(marker):
        shutil.rmtree(base, ignore_errors=True)
        per_day = max(1, files // 20)
        write_files(dataset, 0, files, rows, -1, per_day)
        write_files(staged, files, max(1, files // 20), rows, files // per_day + 1, per_day)
        with open(marker, "w") as handle:
            handle.write("ok")
    return dataset, staged


def remove_added(dataset: str, staged: str) -> None:
    for name in os.listdir(staged):
        shutil.rmtree(os.path.join(dataset, name), ignore_errors=True)


def add(dataset: str, staged: str) -> None:
    for name in os.listdir(staged):
        shutil.copytree(os.path.join(staged, name), os.path.join(dataset, name), copy_function=shutil.copy2)


def measure(dataset: str, staged: str, workdir: str, repeat: int, kwargs: dict) -> dict:
    remove_added(dataset, staged)
    old_url = os.path.join(workdir, "old-plan")
    started = time.perf_counter()
    old = plan_shards(dataset, 8, output_url=old_url, **kwargs)
    first = time.perf_counter() - started
    add(dataset, staged)
    times: dict[str, list[float]] = {"update": [], "scratch": []}
    checksum = None
    try:
        for round_ in range(repeat + 1):  # round 0: warm-up, not counted
            for name in ("update", "scratch"):
                started = time.perf_counter()
                plan = plan_shards(dataset, 8, update=old_url if name == "update" else None, **kwargs)
                elapsed = time.perf_counter() - started
                checksum = checksum or plan.checksum
                if plan.checksum != checksum:
                    raise AssertionError(f"{name} planned checksum {plan.checksum}, the other {checksum}")
                if round_:
                    times[name].append(elapsed)
    finally:
        remove_added(dataset, staged)
    update, scratch = statistics.median(times["update"]), statistics.median(times["scratch"])
    return {"old_plan_s": round(first, 3), "update_s": round(update, 3), "scratch_s": round(scratch, 3),
            "ratio": round(update / scratch, 3), "rows_before": old.total_rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--sizes", default="200,800", help="files before the update (comma list)")
    parser.add_argument("--rows-per-file", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--engines", default="local,spark")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bench_update"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="rows are stored sorted")  # ids in file order: true, not our subject
    engines = args.engines.split(",")
    spark = None
    if "spark" in engines:
        from pyspark.sql import SparkSession
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (SparkSession.builder.master(args.master).appName("bench_update").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")).getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    results = []
    try:
        for files in (int(s) for s in args.sizes.split(",")):
            dataset, staged = prepare(args.workdir, files, args.rows_per_file)
            for engine in engines:
                kwargs = ({"engine": "local", "predicate": PREDICATE} if engine == "local" else
                          {"engine": "spark", "spark": spark, "where": WHERE})
                row = {"engine": engine, "files": files, "added": max(1, files // 20),
                       "rows": files * args.rows_per_file,
                       **measure(dataset, staged, args.workdir, args.repeat, kwargs)}
                results.append(row)
                if not args.json:
                    print(f"{engine:5s} N={files:5d} (+{row['added']:3d} files, {row['rows']:,} rows before): "
                          f"update {row['update_s']:.2f} s, scratch {row['scratch_s']:.2f} s, ratio "
                          f"{row['ratio']:.3f} (added/total files {row['added'] / (files + row['added']):.3f})",
                          flush=True)
    finally:
        if spark is not None:
            spark.stop()
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
