"""Planning a Delta table as a snapshot against planning the same files as a bare Parquet folder.

Run: ``python benchmarks/bench_tables.py [--files 1000] [--history 0] [--repeat 5] [--workdir DIR]``. Writes one
Delta table of ``--files`` data files (one commit, one file per partition value; ``--history N`` adds N appends
and deletes so the log has that many commits and the folder holds removed files), then times, in this process,
``plan_shards(engine="local")`` of the latest version (log replay with deltalake, then the footers) against
``table_format="parquet"`` (a folder listing, then the footers) and prints the ratio. The snapshot cache is
cleared before every table run, so each one pays the log read.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from petastorm_balanced import plan_shards  # noqa: E402
from petastorm_balanced.io import tables  # noqa: E402


def write_table(path: str, files: int, rows_per_file: int, history: int) -> float:
    from deltalake import DeltaTable, write_deltalake
    started = time.perf_counter()
    ids = np.arange(files * rows_per_file, dtype=np.int64)
    write_deltalake(path, pa.table({"id": ids, "x": ids * 2.0, "p": ids % files}), partition_by=["p"])
    for i in range(history):
        extra = np.arange(10, dtype=np.int64) + 10 ** 9 + 10 * i
        write_deltalake(path, pa.table({"id": extra, "x": extra * 2.0, "p": extra % files}), mode="append",
                        partition_by=["p"])
        DeltaTable(path).delete(f"id = {int(extra[0])}")
    return time.perf_counter() - started


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rows-per-file", type=int, default=100)
    parser.add_argument("--history", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench_tables_", dir=args.workdir)
    try:
        path = os.path.join(work, "table")
        wrote = write_table(path, args.files, args.rows_per_file, args.history)

        def as_table():
            tables.snapshot.cache_clear()
            return plan_shards(path, 2, engine="local")

        def as_folder():
            return plan_shards(path, 2, engine="local", table_format="parquet")

        plan, raw = as_table(), as_folder()
        snapshot_files, folder_files = len(plan.catalog.files), len(raw.catalog.files)
        as_table(), as_folder()  # warm both paths (imports, page cache)
        table_s, folder_s = best(as_table, args.repeat), best(as_folder, args.repeat)
        tables.snapshot.cache_clear()
        started = time.perf_counter()
        tables.resolve(path)
        resolve_s = time.perf_counter() - started
        print(f"table: {snapshot_files} snapshot files (folder {folder_files}), {plan.table.describe()}, "
              f"written in {wrote:.1f} s")
        print(f"plan as a Delta snapshot {table_s * 1e3:.0f} ms (log replay alone {resolve_s * 1e3:.0f} ms), "
              f"as a bare folder {folder_s * 1e3:.0f} ms: ratio {table_s / folder_s:.2f}x (best of {args.repeat})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
