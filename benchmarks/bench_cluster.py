"""``where`` planning against Spark's own ``count(where)`` on a real standalone cluster (master + 2 workers).

Not a test: run it standalone. It starts a Spark standalone master and ``--workers`` workers on 127.0.0.1 (each
its own JVM, from pyspark's bin/, free ports; ``tests/support/standalone_cluster.py``), then for each ``--rows`` size
runs ``bench_spark_plan.py --master spark://127.0.0.1:PORT --parts where`` in a fresh driver process: the same
interleaved measurement as on ``local[*]`` (count, plan, plan as words, ... after one warm-up; median and best of
``--repeat``), but with the executors in the workers' JVMs, so every task result and the rows planning brings to
the driver cross processes. Goal: planning <= 1.5x ``count(where)`` at every size. The cluster is stopped at the
end whatever happens.

    . scripts/env.sh && python benchmarks/bench_cluster.py [--rows 4000000,16000000] [--repeat 3]
        [--workers 2 --cores 1 --memory 3g] [--parts where,job]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support.standalone_cluster import StandaloneCluster, cluster_env  # noqa: E402

GOAL = 1.5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rows", default="4000000,16000000", help="dataset sizes (comma list)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="3g", help="memory per worker (the executor gets all but 512m)")
    parser.add_argument("--where", action="append", help="passed on to bench_spark_plan.py")
    parser.add_argument("--parts", default="where", help="bench_spark_plan.py parts (where, partition, job)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bench_cluster"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    executor_mb = max(512, _megabytes(args.memory) - 512)
    sizes = [int(r) for r in args.rows.split(",")]
    results = []
    started = time.perf_counter()
    with StandaloneCluster(os.path.join(args.workdir, "cluster"), workers=args.workers, cores=args.cores,
                           memory=args.memory) as cluster:
        print(f"bench_cluster: {cluster.url}, {args.workers} workers x {args.cores} core(s), {args.memory} each "
              f"(executors {executor_mb}m), up in {time.perf_counter() - started:.1f} s", flush=True)
        for rows in sizes:
            cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "bench_spark_plan.py"), "--master", cluster.url,
                   "--rows", str(rows), "--parts", args.parts, "--repeat", str(args.repeat), "--json",
                   "--workdir", os.path.join(args.workdir, "data")]
            for where in args.where or []:
                cmd += ["--where", where]
            env = cluster_env({"PYSPARK_SUBMIT_ARGS": f"--conf spark.executor.memory={executor_mb}m "
                                                      f"--conf spark.executor.cores={args.cores} "
                                                      "--driver-memory 2g pyspark-shell"})
            run_started = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=args.workdir, check=False)
            if done.returncode:
                print(done.stdout[-3000:], done.stderr[-5000:], cluster.logs(), sep="\n")
                return 1
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["executor_apps"] = len({p.parent.name for p in cluster.executor_dirs()})
            result["wall_s"] = round(time.perf_counter() - run_started, 1)
            results.append(result)
            _print_size(result)
    if args.json:
        print(json.dumps(results))
    met = all(f["ratio_median"] <= GOAL for r in results for f in r["filters"])
    print(f"where planning goal <= {GOAL}x count(where) on the standalone cluster at "
          f"{', '.join(f'{r:,}' for r in sizes)} rows: {'met' if met else 'NOT met'}")
    return 0


def _print_size(result: dict) -> None:
    print(f"  {result['rows']:,} rows, {result['files']} files, {result['row_groups']} row groups, "
          f"{result['cores']} executor cores ({result['wall_s']:.0f} s in all)", flush=True)
    for f in result["filters"]:
        words = (f"; as words {f['plan_where_words']['median_s']:.2f} s: {f['words_ratio_median']:.2f}x "
                 f"({f['words_ratio_best']:.2f}x)" if "plan_where_words" in f else "")
        print(f"    where {f['where']!r}{' (hive partition column)' if f['hive'] else ''}: "
              f"{f['matching_rows']:,} rows; count() {f['count']['median_s']:.2f} s, plan "
              f"{f['plan_where']['median_s']:.2f} s: ratio {f['ratio_median']:.2f}x ({f['ratio_best']:.2f}x best)"
              f"{words}; goal <= {GOAL}x {'met' if f['ratio_median'] <= GOAL else 'NOT met'}", flush=True)
    job = result.get("job")
    if job:
        print(f"    spark-submit planning job against a count job ({job['rows']:,} rows): {job['ratio_median']:.2f}x "
              f"({job['plan_job']['median_s']:.1f} s against {job['count_job']['median_s']:.1f} s)", flush=True)


def _megabytes(memory: str) -> int:
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    memory = memory.strip().lower()
    return int(float(memory[:-1]) * units[memory[-1]]) if memory[-1] in units else int(memory) // (1 << 20)


if __name__ == "__main__":
    sys.exit(main())
