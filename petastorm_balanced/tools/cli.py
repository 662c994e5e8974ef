"""``petastorm-balanced``: plan, inspect, verify and compare balanced shard plans (docs/cli.md).

Exit codes: 0 ok, 1 a check failed (``verify``) or a bug, 2 bad usage or input. Input errors (a missing plan, a
bad parameter, a stale or corrupt plan given to ``inspect``: our own checks' typed errors, ``errors.BadInputError``
and ``PlanError``) print one line on stderr: the message already names the parameter and the fix. Anything else is
a bug and keeps its traceback (exit 1), so it is never mistaken for bad usage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

from ..errors import BadInputError, PlanError
from ..io import fs as fsutil
from ..plan.format import PLAN_JSON
from . import progress
from .progress import Progress

PROG = "petastorm-balanced"
OK, CHECK_FAILED, BAD_INPUT = 0, 1, 2


def _note(message, category, *_args, **_kwargs) -> None:
    print(f"{PROG}: note: {message}", file=sys.stderr)


class InputError(Exception):
    """Bad input found by the CLI itself (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    progress.QUIET = args.quiet
    # Petastorm 0.12.1 drives pyarrow's legacy API; its deprecation warnings are noise a CLI user cannot act on.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.showwarning = _note  # our own warnings (sorted storage) as one line, without the source line
    try:
        return args.run(args)
    except (InputError, PlanError, BadInputError, OSError) as exc:  # our checks' errors, and files that are not there
        print(f"{PROG} {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - Spark's errors (bad SQL, missing column) are bad input too
        if type(exc).__module__.split(".")[0] in ("pyspark", "py4j"):
            print(f"{PROG} {args.command}: error: Spark refused the input: {_one_line(exc)}", file=sys.stderr)
            return BAD_INPUT
        raise  # anything else is a bug: its traceback, and exit 1


def cmd_plan(args) -> int:
    from ..planner.plan_shards import plan_shards
    with Progress("reading footers") as bar, _spark(args) as spark:
        plan = plan_shards(args.dataset_url, args.world_size, where=args.where, batch_size=args.batch_size,
                           policy=args.policy, seed=args.seed, engine=args.engine, spark=spark,
                           output_url=args.output, progress=bar, cost=args.cost, update=args.update,
                           **table_arguments(args))
    from .report import compare_report
    r = compare_report(plan)
    if plan.batch_size is None:
        shape = (f"no batch size (the loader's decides the steps): {r['rows_per_rank']} rows per rank, dropped "
                 f"{r['dropped_rows']}, padded {r['padded_rows']}")
    else:
        shape = (f"batch_size {plan.batch_size}: {r['steps_per_epoch']} steps per rank, dropped {r['dropped_rows']}"
                 f", padded {r['padded_rows']}; Petastorm would give {r['petastorm']['min_steps']}.."
                 f"{r['petastorm']['max_steps']} steps")
    how = "planned" if args.update is None else f"updated {fsutil.normalize_url(args.update)}:"
    print(f"{how} {r['matching_rows']} matching rows of {r['scanned_rows']} ({r['row_groups']} row groups) for "
          f"world_size {plan.world_size}, {shape} -> {fsutil.normalize_url(args.output)} "
          f"(checksum {plan.checksum[:12]})")
    return OK


def cmd_inspect(args) -> int:
    from .report import format_inspect, inspect_report
    if args.mixed or args.weights:
        return _inspect_mixture(args)
    plan = _load(args.plan_url)
    extra = {"partition_epoch": args.partition_epoch}
    epoch, batch_size = args.epoch, args.batch_size
    if args.state:
        from ..reading import state as loader_state
        layout, epoch, batches, stages, state = _resume(plan, args)
        if batch_size not in (None, layout.batch_size):
            raise InputError(f"--batch-size {batch_size} differs from the state's batch_size={layout.batch_size}; "
                             "leave it out with --state")
        batch_size = layout.batch_size
        extra = {"partition_epoch": layout.partition_epoch, "stages": stages,
                 "windows": layout.windows,
                 "resume": {"saved_world_size": state[loader_state.WORLD_SIZE],
                            "saved_epoch": state[loader_state.EPOCH],
                            "saved_batches": state[loader_state.BATCHES], "batches": batches,
                            "stages": [s.as_list() for s in stages]}}
    report = inspect_report(plan, plan_url=fsutil.normalize_url(args.plan_url), world_size=args.world_size,
                            epoch=epoch, num_workers=args.workers, batch_size=batch_size, **extra)
    if args.plot:
        from .plot import plot_report
        report["plot"] = plot_report(report, args.plot)
    from ..planner.stored_order import find_stored_order
    order = find_stored_order(plan, args.world_size, batch_size)  # the planning warning's finding, stated here too
    if order is not None:
        report["stored_order"] = order.as_dict()
    said = [order.describe()] if order is not None and order.clustered else []
    return _show(args, report, format_inspect, plan, said, batch_size=batch_size, epoch=epoch)


def _inspect_mixture(args) -> int:
    from .mixture_report import format_mixture, mixture_report
    urls = [args.plan_url, *args.mixed]
    if not args.weights:
        raise InputError(f"{len(urls)} plans make a mixture: pass --weights with one weight per plan (0.7,0.3)")
    try:
        weights = [float(w) for w in args.weights.split(",")]
    except ValueError:
        raise InputError(f"--weights {args.weights!r} must be numbers separated by commas (0.7,0.3)") from None
    if args.state or args.plot:
        raise InputError("--state and --plot apply to one plan; leave them out for a mixture")
    plans = [_load(u) for u in urls]
    report = mixture_report(plans, [fsutil.normalize_url(u) for u in urls], weights, world_size=args.world_size,
                            batch_size=args.batch_size, epoch=args.epoch, epoch_steps=args.epoch_steps,
                            num_workers=args.workers)
    return _show(args, report, format_mixture, plans, [], batch_size=report["batch_size"], epoch=args.epoch,
                 weights=weights, epoch_steps=args.epoch_steps, workers=args.workers)


def _show(args, report: dict, formatted, plan, said: list[str], **loader) -> int:
    """Print an ``inspect`` report (one plan's or a mixture's) and the lines ``said`` after it, with
    ``--shuffle-quality`` measured on the batches of the loader ``plan`` and ``loader`` describe."""
    quality = None
    if args.shuffle_quality:
        from .shuffle_quality import shuffle_quality
        quality = shuffle_quality(plan, args.shuffle_quality, world_size=args.world_size,
                                  shuffle_budget=args.shuffle_budget, **loader)
        report["shuffle_quality"] = quality.as_dict()
    print(json.dumps(report, indent=2) if args.json else formatted(report))
    for line in [] if args.json else said:
        print(line)
    if quality is not None and not args.json:
        print(quality.format())
    return OK


def cmd_verify(args) -> int:
    from .verify import Check, ReadCheck, plan_checks
    if args.id_column and not args.read:
        raise InputError("--id-column only applies to --read; add --read")
    url = fsutil.normalize_url(args.plan_url)
    _require_plan(url)
    try:
        plan = _load(url)
    except PlanError as exc:  # a plan that is there but broken is a failed check, not bad usage
        print(Check("plan integrity", False, _one_line(exc)).line())
        return CHECK_FAILED
    checks = [Check("plan integrity", True, f"checksum {plan.checksum[:12]}, files match plan.json")]
    passes = None
    if args.state or args.partition_epoch > 1:  # whole passes, served as the loaders serve them
        if args.id_column:
            raise InputError("--id-column does not combine with --state or --partition-epoch; leave it out (rows "
                             "are then checked by position)")
        passes = _passes(plan, args)
        checks += plan_checks(plan, epochs=0)
        checks += [c for layout, epoch, stages in passes for c in _pass_checks(layout, epoch, stages, args)]
    elif args.world_size is not None:
        raise InputError("--world-size applies to --state (the world that resumes); add --state STATE.json")
    else:
        checks += plan_checks(plan, epochs=args.epochs, batch_size=args.batch_size)
    stale = not checks[1].ok
    reads = None
    if args.read and not stale and passes is None:  # built before any output: a bad --id-column is bad input
        reads = ReadCheck(plan, batch_size=args.batch_size, id_column=args.id_column)
    for c in checks:
        print(c.line())
    if args.read and stale:
        print("skipped --read: the dataset changed since planning")
    elif args.read and passes is not None:
        with Progress(f"reading {len(passes)} pass(es)", len(passes)) as bar:
            rows = ReadCheck(plan, batch_size=args.batch_size).rows
            expected, source = rows.expected_keys()
            read = []
            try:
                for layout, epoch, stages in passes:
                    read += _pass_checks(layout, epoch, stages, args, keys=rows.keys, expected=expected,
                                         label=f"read; against {source}")
                    bar(1)
            except (PlanError, OSError) as exc:
                read.append(Check("rows readable as planned", False, _one_line(exc)))
        for c in read:
            print(c.line())
        checks += read
    elif reads is not None:
        with Progress(f"reading {plan.world_size} ranks x {args.epochs} epoch(s)",
                      plan.world_size * args.epochs) as bar:
            try:
                read = reads.run(epochs=args.epochs, progress=bar)
            except (PlanError, OSError) as exc:
                read = [Check("rows readable as planned", False, _one_line(exc))]
        for c in read:
            print(c.line())
        checks += read
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed" + (": FAILED" if failed else ""))
    return CHECK_FAILED if failed else OK


def _resume(plan, args):
    """(layout, epoch, batches, stages, state) of ``--state`` resumed at ``--world-size`` (default: its own)."""
    from ..reading.source.layout import Layout, loaded
    from ..reading.state import NUM_WORKERS, PLAN_CHECKSUM, WORLD_SIZE, flat
    try:
        with open(args.state) as handle:
            state = flat(json.load(handle))  # every key at the top; a state saved before the nesting too
    except (OSError, ValueError) as exc:
        raise InputError(f"--state {args.state!r} is not a readable JSON loader state ({_one_line(exc)}); save "
                         "json.dumps(loader.state_dict())") from None
    except KeyError as exc:  # StateKeyError: a key the state format does not declare
        raise InputError(f"--state {args.state!r}: {exc}") from None
    if not isinstance(state, dict) or state.get(PLAN_CHECKSUM) != plan.checksum:
        raise InputError(f"--state {args.state!r} was not saved by a loader of this plan (plan_checksum differs)")
    world = args.world_size or state.get(WORLD_SIZE)
    if world is None:
        raise InputError(f"--state {args.state!r} holds no {WORLD_SIZE}; pass --world-size")
    layout = Layout.of_state(plan, state, world)
    epoch, batches, stages = loaded(layout, state, workers=state.get(NUM_WORKERS, 1))
    return layout, epoch, batches, stages, state


def _passes(plan, args):
    """(layout, epoch, stages) of each pass ``verify`` serves."""
    from ..reading.source.layout import Layout
    if args.state:
        layout, epoch, _, stages, _ = _resume(plan, args)
        return [(layout, epoch, stages)]
    batch = args.batch_size or plan.batch_size or 1
    layout = Layout(plan, plan.world_size, batch_size=batch, shuffle=True, shuffle_window=10_000,
                    reshuffle="epoch", partition_epoch=args.partition_epoch)
    return [(layout, p * args.partition_epoch, ()) for p in range(args.epochs)]


def _pass_checks(layout, epoch, stages, args, **kwargs):
    from .verify_pass import pass_checks
    return pass_checks(layout, epoch=epoch, stages=stages, num_workers=args.workers, **kwargs)


def cmd_compare(args) -> int:
    from ..planner.plan_shards import plan_shards
    from .report import compare_report, format_compare
    engine = args.engine or ("spark" if args.where else "local")
    with Progress("reading footers") as bar, _spark(args, engine) as spark:
        plan = plan_shards(args.dataset_url, args.world_size, where=args.where, batch_size=args.batch_size,
                           policy=args.policy, seed=args.seed, engine=engine, spark=spark, progress=bar,
                           cost=args.cost, **table_arguments(args))
    report = compare_report(plan)
    print(json.dumps(report, indent=2) if args.json else format_compare(report))
    return OK


def cmd_profile(args) -> int:
    from .profile import format_profile, plot_profile, profile
    report = profile(args.plan_url, rank=args.rank, world_size=args.world_size, workers=args.workers,
                     batch_size=args.batch_size, max_batches=args.max_batches,
                     columns=args.columns.split(",") if args.columns else None,
                     loader_options={"backend": args.backend, "shuffle_budget": args.shuffle_budget})
    if args.plot:
        report["plot"] = plot_profile(report, args.plot)
    print(json.dumps(report, indent=2) if args.json else format_profile(report))
    return OK


def cmd_spark_job_path(args) -> int:
    """The installed job's file (tools/spark_job.py): what a pip user hands to spark-submit (docs/spark.md)."""
    print(os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_job.py"))  # not imported: it imports us
    return OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Equal steps on every rank over Parquet: plan shards, "
                                     "inspect and verify plans, compare with Petastorm's own sharding.")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar or progress log lines")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("plan", help="scan a dataset and write a balanced plan")
    p.add_argument("dataset_url", metavar="DATASET_URL")
    p.add_argument("--output", required=True, metavar="PLAN_URL", help="plan directory to write")
    add_planning_arguments(p, default_engine="spark")
    p.set_defaults(run=cmd_plan)

    p = sub.add_parser("inspect", help="per-rank rows, steps, padding and read cost of a plan (or a mixture)")
    p.add_argument("plan_url", metavar="PLAN_URL")
    p.add_argument("mixed", nargs="*", metavar="PLAN_URL", help="more plans: a mixture (with --weights)")
    p.add_argument("--weights", metavar="W1,W2,...", help="a mixture's weights, one per plan: 0.7,0.3")
    p.add_argument("--epoch-steps", type=_positive, metavar="S", help="a mixture's epoch length (default: until "
                   "the scarcest source completes a pass)")
    p.add_argument("--world-size", type=_positive, metavar="W", help="ranks (default: the planned world size)")
    p.add_argument("--epoch", type=_non_negative, default=0, metavar="E")
    p.add_argument("--workers", type=_positive, default=1, metavar="K", help="DataLoader workers per rank")
    p.add_argument("--batch-size", type=_positive, metavar="B", help="default: the plan's batch size, else 1")
    p.add_argument("--json", action="store_true", help="machine-readable output (fields in docs/cli.md)")
    p.add_argument("--plot", metavar="FILE.png", help="draw rows and steps per rank beside Petastorm's sharding")
    p.add_argument("--shuffle-quality", metavar="COLUMN", help="read COLUMN in the loader's order and report how "
                   "far its batches are from i.i.d. (per rank and global batch, against a uniform permutation)")
    p.add_argument("--shuffle-budget", default="512MiB", metavar="BYTES",
                   help="the loader's shuffle_budget for --shuffle-quality (default 512MiB; '1GiB' works)")
    _pass_args(p)
    p.set_defaults(run=cmd_inspect)

    p = sub.add_parser("verify", help="check a plan against its dataset (exit 1 if a check fails)")
    p.add_argument("plan_url", metavar="PLAN_URL")
    p.add_argument("--read", action="store_true", help="read every rank's rows and check G1 and G2 on them")
    p.add_argument("--epochs", type=_positive, default=1, metavar="N", help="epochs to check (default 1)")
    p.add_argument("--batch-size", type=_positive, metavar="B", help="default: the plan's batch size, else 1")
    p.add_argument("--id-column", metavar="COL", help="with --read: read through make_loader (needs torch) and "
                   "identify rows by this unique column instead of by position")
    p.add_argument("--world-size", type=_positive, metavar="W", help="with --state: the world that resumes")
    p.add_argument("--workers", type=_positive, default=1, metavar="K",
                   help="with --state or --partition-epoch: DataLoader workers per rank (default 1)")
    _pass_args(p)
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("compare", help="Petastorm's cur_shard/shard_count per-rank counts beside a balanced plan")
    p.add_argument("dataset_url", metavar="DATASET_URL")
    add_planning_arguments(p, default_engine=None, update=False)
    p.add_argument("--json", action="store_true", help="machine-readable output (fields in docs/cli.md)")
    p.set_defaults(run=cmd_compare)

    p = sub.add_parser("profile", help="run one rank's input pipeline alone: steps/s it can feed, its limit, "
                       "what to change")
    p.add_argument("plan_url", metavar="PLAN_URL")
    p.add_argument("--rank", type=_non_negative, default=0, metavar="R")
    p.add_argument("--world-size", type=_positive, metavar="W", help="ranks (default: the planned world size)")
    p.add_argument("--workers", type=_positive, default=4, metavar="K", help="make_loader(workers_count=K)")
    p.add_argument("--batch-size", type=_positive, metavar="B", help="default: the plan's")
    p.add_argument("--max-batches", type=_positive, metavar="N", help="stop after N batches (default: an epoch)")
    p.add_argument("--columns", metavar="A,B,...", help="read only these columns (schema_fields)")
    p.add_argument("--backend", default="auto", choices=("auto", "arrow", "petastorm"))
    p.add_argument("--shuffle-budget", default="512MiB", metavar="BYTES", help="make_loader(shuffle_budget=)")
    p.add_argument("--json", action="store_true", help="machine-readable output (loader.stats() under 'stats')")
    p.add_argument("--plot", metavar="FILE.png", help="draw seconds per stage, the limit highlighted")
    p.set_defaults(run=cmd_profile)

    p = sub.add_parser("spark-job-path", help="print the path of the spark-submit planning job installed with the "
                       "package: spark-submit \"$(petastorm-balanced spark-job-path)\" DATASET_URL ...")
    p.set_defaults(run=cmd_spark_job_path)
    return parser


def _pass_args(p) -> None:
    p.add_argument("--partition-epoch", type=_positive, default=1, metavar="P",
                   help="sub-epochs per pass (make_loader(partition_epoch=P)); verify checks whole passes")
    p.add_argument("--state", metavar="STATE.json", help="a loader state_dict() saved as JSON: show (inspect) or "
                   "check (verify) the rest of its epoch in --world-size ranks, as an elastic resume serves it")


def add_planning_arguments(p, default_engine=None, *, engine_options: bool = True,
                           update: bool = True) -> None:
    """The planning arguments, shared by ``plan``, ``compare`` and the spark-submit job (which has no
    ``--engine``/``--master``: spark-submit decides both); ``update``: with ``--update`` (not ``compare``)."""
    p.add_argument("--world-size", type=_positive, required=True, metavar="W", help="number of ranks to balance over")
    p.add_argument("--where", metavar="SQL", help="Spark SQL boolean filter on the rows (needs the Spark engine); "
                   "rows where it is NULL do not match")
    p.add_argument("--batch-size", type=_positive, metavar="B",
                   help="rows per batch; without it rows are balanced, not batches")
    p.add_argument("--policy", choices=("drop", "pad"), default="drop")
    p.add_argument("--seed", type=_non_negative, default=0, metavar="S")
    p.add_argument("--cost", metavar="EXPR", help="per-row cost to balance per step: a numeric column, "
                   "length(col), size(col), or with the Spark engine any Spark SQL numeric expression")
    p.add_argument("--table-version", type=_integer, metavar="N",
                   help="Delta table: plan version N (default: the latest); docs/tables.md")
    p.add_argument("--snapshot-id", type=_integer, metavar="ID",
                   help="Iceberg table (DATASET_URL: its metadata JSON): plan snapshot ID (default: the current)")
    p.add_argument("--table-format", choices=("delta", "iceberg", "parquet"),
                   help="default: detected; 'parquet' reads a Delta folder's raw Parquet files, removed ones included")
    if update:
        p.add_argument("--update", metavar="OLD_PLAN_URL",
                       help="a plan of this dataset made with the same arguments: read only the files added since "
                       "(same result as planning from scratch); anything but added files is refused")
    if engine_options:
        p.add_argument("--engine", choices=("spark", "local"), default=default_engine,
                       help="default: spark" if default_engine else "default: spark with --where, else local")
        p.add_argument("--master", default="local[*]", help="Spark master for --engine spark (default local[*])")


def table_arguments(args) -> dict:
    """The table snapshot arguments of ``plan_shards`` (checked there with ``params.check_int``)."""
    return {"table_version": args.table_version, "snapshot_id": args.snapshot_id, "table_format": args.table_format}


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _positive(text: str) -> int:
    return _int(text, 1)


def _non_negative(text: str) -> int:
    return _int(text, 0)


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
    return value


def _require_plan(url: str) -> None:
    filesystem, root = fsutil.resolve(url)
    if filesystem.get_file_info(f"{root}/{PLAN_JSON}").type.name == "NotFound":
        raise InputError(f"PLAN_URL={url!r} holds no {PLAN_JSON}: not a plan (make one with "
                         f"`{PROG} plan DATASET_URL --world-size W --output PLAN_URL`)")


def _load(url: str):
    from ..plan.load import load_plan
    _require_plan(fsutil.normalize_url(url))
    return load_plan(url, check_dataset=False)


class _spark:
    """A SparkSession for ``--engine spark`` (stopped afterwards), None for the local engine."""

    def __init__(self, args, engine: str | None = None):
        self.engine, self.master = engine or args.engine, args.master
        self.session: Any = None  # a SparkSession once entered

    def __enter__(self):
        if self.engine != "spark":
            return None
        try:
            from pyspark.sql import SparkSession
        except ImportError:
            raise InputError("--engine spark needs pyspark: pip install 'petastorm-balanced[spark]', or pass "
                             "--engine local (no --where)") from None
        show = "true" if sys.stderr.isatty() else "false"  # Spark's own progress bar, quiet off a terminal
        self.session = (SparkSession.builder.master(self.master).appName(PROG)
                        .config("spark.ui.showConsoleProgress", show).getOrCreate())
        return self.session

    def __exit__(self, *exc):
        if self.session is not None:
            self.session.stop()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 500 else text[:497] + "..."


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """Console entry: exit with ``main``'s code without interpreter teardown.

    pyarrow 14's thread pool can abort the process while Python finalizes ("terminate called without an active
    exception", seen in ~1 of 100 CLI runs); the answer is already printed and flushed by then, so skipping
    teardown loses nothing and keeps exit codes 0/1/2 reliable for scripts.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
