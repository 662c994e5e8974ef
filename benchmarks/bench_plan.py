"""Planning cost: metadata-only plan time over many small files, and plan bytes per scanned row.

Run: ``python benchmarks/bench_plan.py [--files 10000] [--workdir DIR]``. Prints one line per figure; the budgets
(docs/plan-format.md) are about 1 bit per scanned row when a predicate matches at random, and tens of bytes per row
group when whole row groups match. Everything is generated in a temporary folder with pyarrow (no Spark).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from petastorm_balanced import load_plan, plan_shards  # noqa: E402
from petastorm_balanced.planner.scan import scan  # noqa: E402
from petastorm_balanced.predicates import in_lambda  # noqa: E402


def write_small_files(folder: str, num_files: int, rows_per_file: int, row_groups_per_file: int) -> float:
    """``num_files`` files of ``rows_per_file`` rows; returns the seconds it took.

    Footers are all a scan reads, so one file is encoded with pyarrow and its bytes written ``num_files`` times
    (each file a real, complete Parquet file), which takes a second instead of a minute.
    """
    started = time.perf_counter()
    os.makedirs(folder)
    base = pa.table({"id": np.arange(rows_per_file, dtype=np.int64), "x": np.arange(rows_per_file) % 10,
                     "s": [f"row-{i}" for i in range(rows_per_file)]})
    sink = pa.BufferOutputStream()
    pq.write_table(base, sink, row_group_size=-(-rows_per_file // row_groups_per_file))
    data = sink.getvalue().to_pybytes()
    for i in range(num_files):
        with open(os.path.join(folder, f"part-{i:05d}.parquet"), "wb") as out:
            out.write(data)
    open(os.path.join(folder, "_SUCCESS"), "wb").close()
    return time.perf_counter() - started


def plan_bytes(plan_dir: str) -> int:
    return sum(os.path.getsize(os.path.join(plan_dir, name)) for name in os.listdir(plan_dir))


def bench_many_files(workdir: str, num_files: int, repeats: int) -> None:
    folder = os.path.join(workdir, "many")
    seconds = write_small_files(folder, num_files, rows_per_file=100, row_groups_per_file=2)
    print(f"generate: {num_files} files x 100 rows (2 row groups each) in {seconds:.1f} s")
    import resource
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        listing = scan(folder)
        times.append(time.perf_counter() - started)
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime) / repeats
    print(f"scan (list + footers): {num_files} files, {sum(len(f.row_group_rows) for f in listing.files)} row "
          f"groups: best {min(times):.2f} s, median {np.median(times):.2f} s of {repeats} "
          f"({min(times) / num_files * 1e3:.3f} ms per file); CPU {used:.2f} s per scan (all threads)")
    started = time.perf_counter()
    plan = plan_shards(folder, 64, batch_size=32, engine="local", output_url=os.path.join(workdir, "many-plan"))
    total = time.perf_counter() - started
    size = plan_bytes(os.path.join(workdir, "many-plan"))
    print(f"plan_shards(engine='local', no predicate) + save: {total:.2f} s; plan {size / 1e6:.2f} MB, "
          f"{size / len(plan.catalog.row_groups):.1f} bytes per row group (whole row groups, world 64)")
    started = time.perf_counter()
    load_plan(os.path.join(workdir, "many-plan"))
    print(f"load_plan (checksums, assignment re-derived, dataset listing compared): "
          f"{time.perf_counter() - started:.2f} s")


def bench_plan_size(workdir: str, rows: int, row_group_rows: int) -> None:
    folder = os.path.join(workdir, "sized")
    os.makedirs(folder)
    num_files = 8
    per_file = rows // num_files
    rng = np.random.default_rng(0)
    for i in range(num_files):
        table = pa.table({"id": np.arange(per_file, dtype=np.int64), "r": rng.random(per_file)})
        pq.write_table(table, os.path.join(folder, f"part-{i}.parquet"), row_group_size=row_group_rows)
    random_half = in_lambda(["r"], lambda r: r < 0.5)
    cases = [("whole row groups (no predicate)", None),
             ("long runs (alternate blocks of 1,000 rows)", in_lambda(["id"], lambda i: i // 1000 % 2 == 0)),
             ("50% at random", random_half)]
    for name, predicate in cases:
        out = os.path.join(workdir, "plan-" + str(len(os.listdir(workdir))))
        plan = plan_shards(folder, 8, predicate=predicate, batch_size=64, engine="local", output_url=out)
        size = plan_bytes(out)
        selection = sum(len(r.selection) for r in plan.catalog.row_groups)
        groups = len(plan.catalog.row_groups)
        print(f"plan size, {name}: {plan.catalog.scanned_rows} scanned rows, {groups} row groups, "
              f"{plan.total_rows} matching: files {size} B = {size * 8 / plan.catalog.scanned_rows:.3f} bits per "
              f"scanned row = {size / groups:.0f} B per row group; selections alone "
              f"{selection * 8 / plan.catalog.scanned_rows:.3f} bits per scanned row")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of the plan-size dataset")
    parser.add_argument("--row-group-rows", type=int, default=4_000)
    parser.add_argument("--workdir", help="kept after the run when given (default: a temporary folder)")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_plan_")
    try:
        bench_many_files(workdir, args.files, args.repeats)
        bench_plan_size(workdir, args.rows, args.row_group_rows)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
