"""A plan of a million row groups: its size, and what it costs a rank to start and to change epoch.

A catalog of ``--row-groups`` row groups over ``--files`` files is synthesized in memory (no data files: sizes
and row counts drawn from a seed; ``--partial`` of the row groups keep a few runs of rows, as a predicate would
leave them, the rest match whole), balanced for ``--world-size`` ranks and saved. Then a fresh Python process
plays one rank: ``load_plan`` (every integrity check on, the dataset listing off since the files do not exist),
the first ``assignment(rank, epoch=0, num_workers)``, and the assignments of the next epochs.

Goals: plan <= 40 bytes per row group; rank start (load + first assignment) <= 2 s; memory added to
the rank <= 300 MB (resident set after start minus before); each epoch's assignment <= 1 s.

    . scripts/env.sh && python benchmarks/bench_scale.py [--row-groups 1000000] [--files 50000] [--json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

GOALS = {"bytes_per_row_group": 40, "rank_start_s": 2.0, "rss_added_mb": 300, "epoch_assignment_s": 1.0}


def synthesize(num_files: int, num_row_groups: int, partial: float, seed: int):
    """A catalog as planning would make it, built column-wise (a million dataclasses would take longer than the
    plan's own work)."""
    from petastorm_balanced.core import selection
    from petastorm_balanced.core.catalog import Catalog, FileInfo, RowGroups
    rng = np.random.default_rng(seed)
    per_file = np.bincount(rng.integers(0, num_files, num_row_groups), minlength=num_files)  # (files,)
    rows = rng.integers(1_000, 200_000, num_row_groups)  # (row groups,)
    bounds = np.concatenate(([0], np.cumsum(per_file)))
    # each file with a footer digest and a modification time, as planning records them (plan format 2)
    files = tuple(FileInfo(f"date={i % 365:03d}/part-{i:06d}.parquet", int(rows[lo:hi].sum()) * 9 + 4096,
                           tuple(rows[lo:hi].tolist()), f"{rng.integers(2**63):016x}" * 4,
                           1_700_000_000_000_000_000 + int(rng.integers(10**15)))
                  for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)))
    order = sorted(range(num_files), key=lambda i: files[i].path)  # catalog row groups are sorted by path
    files = tuple(files[i] for i in order)
    per_file = per_file[order]
    rows = np.concatenate([np.asarray(f.row_group_rows, dtype=np.int64) for f in files])
    index = np.arange(num_row_groups) - np.repeat(np.cumsum(per_file) - per_file, per_file)
    matching = rows.copy()
    selections = [b""] * num_row_groups
    for i in np.flatnonzero(rng.random(num_row_groups) < partial).tolist():
        starts = np.sort(rng.integers(0, rows[i] - 100, 4))
        positions = np.unique(np.concatenate([np.arange(s, s + 50) for s in starts]))
        selections[i] = selection.encode(positions, int(rows[i]))
        matching[i] = len(positions)
    row_groups = RowGroups([f.path for f in files], np.repeat(np.arange(num_files), per_file), index, rows,
                           matching, selections)
    return Catalog(files, row_groups)


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def rank_child(plan_dir: str, rank: int, world: int, workers: int, epochs: int) -> dict:
    """One rank's start, in a fresh process so the memory figure is the plan's alone."""
    import pandas  # noqa: F401  - pyarrow imports it on first conversions; a training process has it anyway
    import pyarrow.parquet  # noqa: F401

    import petastorm_balanced  # noqa: F401  - the package and its imports are part of any rank, not of the plan
    from petastorm_balanced import load_plan
    before = rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    plan = load_plan(plan_dir, check_dataset=False)
    loaded = time.perf_counter()
    first = plan.assignment(rank, epoch=0, world_size=world, num_workers=workers)
    ready, cpu = time.perf_counter(), time.process_time() - cpu
    per_epoch = []
    for epoch in range(1, epochs + 1):
        t = time.perf_counter()
        plan.assignment(rank, epoch=epoch, world_size=world, num_workers=workers)
        per_epoch.append(time.perf_counter() - t)
    with open("/proc/self/status") as handle:
        peak = next(int(line.split()[1]) / 1e3 for line in handle if line.startswith("VmHWM"))
    return {"load_s": loaded - started, "first_assignment_s": ready - loaded, "rank_start_s": ready - started,
            "rank_start_cpu_s": cpu,
            "epoch_assignment_s": max(per_epoch), "rss_added_mb": rss_mb() - before, "peak_rss_mb": peak,
            "rss_before_mb": before, "fragments": len(first)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--row-groups", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--partial", type=float, default=0.1, help="share of row groups matching only some rows")
    parser.add_argument("--world-size", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rank", type=int, help="the rank played (default: world_size // 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--rank-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_child:
        print(json.dumps(rank_child(args.rank_child, args.rank, args.world_size, args.workers, args.epochs)))
        return 0

    rank_played = args.world_size // 2 if args.rank is None else args.rank
    from petastorm_balanced.core.predicate_info import predicate_info
    from petastorm_balanced.planner.plan_shards import make_plan
    started = time.perf_counter()
    catalog = synthesize(args.files, args.row_groups, args.partial, seed=0)
    plan = make_plan("file:///synthetic/scale", catalog, world_size=args.world_size, batch_size=args.batch_size,
                     policy="drop", seed=0, predicate=predicate_info(None, None))
    synthesized = time.perf_counter() - started
    work = tempfile.mkdtemp(prefix="bench_scale-")
    try:
        started = time.perf_counter()
        plan.save(os.path.join(work, "plan"))
        saved = time.perf_counter() - started
        folder = os.path.join(work, "plan")
        sizes = {n: os.path.getsize(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--rank-child", os.path.join(work, "plan"),
                              "--rank", str(rank_played), "--world-size", str(args.world_size), "--workers",
                              str(args.workers), "--epochs", str(args.epochs)],
                             capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"the rank process failed:\n{out.stderr}")
        rank = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"row_groups": len(catalog.row_groups), "files": len(catalog.files), "world_size": args.world_size,
              "workers": args.workers, "synthesize_s": synthesized, "save_s": saved, "plan_bytes": sizes,
              "bytes_per_row_group": sum(sizes.values()) / len(catalog.row_groups), **rank}
    met = {k: result[k] <= v for k, v in GOALS.items()}
    if args.json:
        print(json.dumps({**result, "goals_met": met}))
        return 0
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times stretch with load)")
    print(f"{result['row_groups']:,} row groups over {result['files']:,} files ({args.partial:.0%} partial), "
          f"world {args.world_size} x {args.workers} workers; synthesized in {synthesized:.1f} s, saved in "
          f"{saved:.1f} s")
    print("  plan files: " + ", ".join(f"{n} {b / 1e6:.1f} MB" for n, b in sizes.items()))
    rows = [("plan size", f"{result['bytes_per_row_group']:.1f} bytes per row group", "bytes_per_row_group", "B"),
            ("rank start", f"{result['rank_start_s']:.2f} s ({result['rank_start_cpu_s']:.2f} s CPU; load_plan "
             f"{result['load_s']:.2f} s + first assignment {result['first_assignment_s']:.2f} s, "
             f"{result['fragments']} fragments)", "rank_start_s", "s"),
            ("memory added", f"{result['rss_added_mb']:.0f} MB resident (peak of the process "
             f"{result['peak_rss_mb']:.0f} MB, {result['rss_before_mb']:.0f} MB before loading)", "rss_added_mb",
             "MB"),
            ("epoch assignment", f"{result['epoch_assignment_s']:.2f} s (slowest of epochs 1-{args.epochs})",
             "epoch_assignment_s", "s")]
    for label, text, key, unit in rows:
        print(f"  {label:17s} {text}: goal <= {GOALS[key]} {unit}: {'met' if met[key] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
