"""spark-submit job: plan equal steps per rank over a Parquet dataset and write the plan (ships in the package).

    spark-submit "$(petastorm-balanced spark-job-path)" DATASET_URL --world-size W --output PLAN_URL \\
        [--where SQL] [--batch-size B] [--policy drop|pad] [--seed S] [--cost EXPR] \\
        [--table-version N | --snapshot-id ID] [--update OLD_PLAN_URL]

``petastorm-balanced spark-job-path`` prints this file's path (``spark_jobs/plan_shards.py`` in a checkout is a thin
wrapper around it). The work happens in ``petastorm_balanced.planner.engines.spark`` (footers and filters in Spark
tasks) and ``petastorm_balanced.planner.plan_shards`` (the same balancing as every other entry point); the
arguments are the CLI's own (``tools/cli.add_planning_arguments``). The driver imports the installed package (the
python spark-submit runs: ``PYSPARK_DRIVER_PYTHON``/``spark.pyspark.driver.python``); the engine ships a zip of the
package to the executors. Without ``--master`` spark-submit runs ``local[*]``. Exit codes: 0 plan written, 2 bad
arguments or input (nothing written), 1 anything else. spark-submit prints this script's stdout and stderr (our log
lines and errors, prefixed ``plan_shards:``) on its own stdout, and Spark's logging on stderr.
"""
import argparse
import logging
import os
import sys
import time

# Run as a script (spark-submit FILE), Python puts this file's folder first on sys.path: the package's tools/
# folder, whose module names (cli, plot, report, ...) must not shadow top-level modules. The package itself is
# imported by its absolute name from wherever it is installed.
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

from petastorm_balanced.tools.cli import add_planning_arguments, table_arguments  # noqa: E402  (after the path is cleaned)

PROG = "plan_shards"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="spark-submit $(petastorm-balanced spark-job-path)",
                                     description=__doc__.strip().splitlines()[0])
    parser.add_argument("dataset_url", help="dataset folder or file: a path, file://, s3://, hdfs://")
    parser.add_argument("--output", required=True, help="plan folder to write (plan.json is written last)")
    add_planning_arguments(parser, engine_options=False)  # the CLI's own definitions: one set of rules
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    ours = logging.getLogger("petastorm_balanced")  # our lines only; Spark's own logging is left as configured
    if not ours.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
        ours.addHandler(handler)
        ours.propagate = False
    ours.setLevel(logging.INFO)
    from pyspark.sql import SparkSession

    from petastorm_balanced.errors import BadInputError, InvalidWhereError, PlanError
    from petastorm_balanced.planner.engines.spark import get_session
    from petastorm_balanced.planner.plan_shards import plan_shards

    owned = SparkSession.getActiveSession() is None  # stop only a session this job started
    started = time.perf_counter()
    spark = get_session()
    ours.info("Spark session ready in %.1f s (planning's own time follows on the 'time:' line)",
              time.perf_counter() - started)
    try:
        plan = plan_shards(args.dataset_url, args.world_size, where=args.where, batch_size=args.batch_size,
                           policy=args.policy, seed=args.seed, engine="spark", spark=spark, output_url=args.output,
                           cost=args.cost, update=args.update, **table_arguments(args))
    except InvalidWhereError as exc:
        print(f"{PROG}: error: --where {exc.expression!r} {exc.problem}: {exc.reason}", file=sys.stderr)
        return 2
    except (BadInputError, PlanError) as exc:  # our checks' errors (what to install, e.g. S3A, included)
        print(f"{PROG}: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 2
    finally:
        if owned:
            spark.stop()
    per_rank = (f"{plan.steps_per_epoch()} steps of {plan.batch_size} rows per rank" if plan.batch_size else
                f"{plan.steps_per_epoch(batch_size=1)} rows per rank (no batch size planned)")
    updated = f" (updated {args.update})" if args.update else ""
    print(f"{PROG}: wrote {args.output}{updated}: {plan.total_rows} matching rows in "
          f"{len(plan.catalog.row_groups)} row groups, world_size={plan.world_size}, {per_rank}, "
          f"checksum {plan.checksum}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
