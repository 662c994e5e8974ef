"""What ``loader.stats()`` costs: CPU per row with statistics on against off, in one process.

Not a test: ``python benchmarks/bench_stats.py [--rows N] [--rounds R]``. One plain dataset (numeric and string
columns), epochs of one loader alternated on/off ``--rounds`` times (each mode first in half the rounds) so drifting
machine load hits both alike; the figure is CPU seconds (``process_time``: every thread of the process) per row, the
best round of each mode, and the overhead ratio (the goal: <= 0.5%). On a loaded machine that A/B ratio drifts by
several percent either way, so the figure that decides is ``accounted``: what the statistics do per epoch (one loop
wrapper per batch, one timed interval per bundle, run or group of batches: ``stats()["calls"]``), each priced in a
tight loop here, over the epoch's CPU with statistics off. "Off" is ``PB_STATS=0``'s path: no recorder is current,
no stage timed, the loop not wrapped. Batches of 256 rows (smaller batches cost more per row: the loop's figures are
counted per batch).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from petastorm_balanced import datagen, make_loader, plan_shards  # noqa: E402
from petastorm_balanced.reading import stats  # noqa: E402


def epoch_cpu(loader, enabled: bool) -> tuple[float, int]:
    stats.ENABLED = enabled
    try:
        start = time.process_time()
        rows = sum(len(b["id"]) for b in loader)
        return time.process_time() - start, rows
    finally:
        stats.ENABLED = True


def unit_costs(n: int = 200_000) -> tuple[float, float]:
    """CPU seconds of the loop wrapper per batch, and of one timed interval (two clock reads, a cell update)."""
    recorder = stats.Recorder()
    recorder.begin(0)

    def items():
        yield from range(n)
    start = time.process_time()
    for _ in items():
        pass
    bare = time.process_time() - start
    start = time.process_time()
    for _ in recorder.measured(items()):
        pass
    per_batch = max(0.0, time.process_time() - start - bare) / n
    cell = recorder.cell()
    clock = time.perf_counter
    start = time.process_time()
    for _ in range(n):
        begun, inner = clock(), cell.inner
        cell.since("bench", begun, inner)
    per_interval = (time.process_time() - start) / n
    return per_batch, per_interval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        info = datagen.make_plain_dataset(os.path.join(tmp, "ds"), num_files=8, total_rows=args.rows, seed=1)
        plan = plan_shards(info.url, 1, batch_size=args.batch_size, engine="local")
        loader = make_loader(0, 1, plan=plan, batch_format="numpy", workers_count=2)
        loaders = {True: loader, False: loader}  # one loader, counting switched on and off between its epochs
        for mode in (True, False):
            epoch_cpu(loader, mode)  # warm: imports, caches, the first epoch's one-time costs
        best = {True: float("inf"), False: float("inf")}
        for round_ in range(args.rounds):
            for mode in ((False, True) if round_ % 2 else (True, False)):  # each mode first in half the rounds
                seconds, rows = epoch_cpu(loader, mode)
                best[mode] = min(best[mode], seconds / rows)
        on, off = best[True], best[False]
        s = loaders[True].stats()
        per_batch, per_interval = unit_costs()
        accounted = (s["batches"] * per_batch + sum(s["calls"].values()) * per_interval) / (off * rows)
        print(json.dumps({"accounted_overhead": round(accounted, 5), "ns_per_batch": round(per_batch * 1e9),
                          "ns_per_interval": round(per_interval * 1e9), "batches": s["batches"],
                          "intervals": sum(s["calls"].values()), "rows": args.rows, "batch_size": args.batch_size,
                          "rounds": args.rounds,
                          "cpu_ns_per_row_on": round(on * 1e9, 1), "cpu_ns_per_row_off": round(off * 1e9, 1),
                          "overhead": round(on / off - 1, 4), "loadavg": open("/proc/loadavg").read().split()[:3],
                          "stages": loaders[True].stats()["stages"]}, indent=1))


if __name__ == "__main__":
    main()
