"""Rows per CPU-second of a three-source mixture against one loader over the same rows.

Not a test: run it standalone (``python benchmarks/bench_mixture.py [--rows N] [--rounds R]``). Three datasets of
different sizes (the skewed generator) are mixed with weights proportional to their rows, so one mixture epoch
reads about every row of each once; the baseline is ``make_loader`` over one dataset holding the same files. Both
deliver the same columns, shuffled, in batches of the same size, at world size 1 with the same reading threads.
Both loaders are made before the rounds, as a training loop has them; rounds alternate between the two (one epoch
each), and the medians of rows per CPU-second (``process_time``: every thread of the process) are compared.
Goal: >= 0.9x. (A mixture's first epoch also reads the shuffle window that each source's next pass starts with,
which the next epoch then uses; ``--fresh`` builds a loader per round to show that too.)

``--cost``: cost balance instead of speed. Three cost plans (``cost="length"``, lognormal lengths, sigma 1, medians
16, 64 and 256) mixed 5:3:2 at 8 ranks with batches of 16; the straggler ratio (mean over the steps of epoch 1 of
the slowest rank's batch cost over the mean rank's, as ``bench_cost.py`` measures it) of the mixture balanced by
rows and by cost, against one cost plan (the middle source) balanced by cost, for ``cost_reduce="sum"`` (a batch
costs the sum of its lengths) and ``"max"`` (batch rows x its longest row).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")

GOAL = 0.9
SHARES = (0.5, 0.3, 0.2)


def datasets(root: str, rows: int, columns_kind: str):
    """Three datasets with ``SHARES`` of ``rows``, and one folder holding all their files."""
    from petastorm_balanced import datagen
    urls = []
    combined = os.path.join(root, "all")
    os.makedirs(combined, exist_ok=True)
    for i, share in enumerate(SHARES):
        path = os.path.join(root, f"s{i}")
        info = datagen.make_plain_dataset(path, num_files=6, total_rows=int(rows * share), seed=40 + i)
        urls.append(info.url)
        for name in os.listdir(path):
            if name.endswith(".parquet"):
                shutil.copy(os.path.join(path, name), os.path.join(combined, f"s{i}-{name}"))
    return urls, "file://" + combined


def epoch_rate(loader) -> tuple[float, int]:
    """(rows per CPU-second, rows) of the next epoch of ``loader``."""
    start = time.process_time()
    rows = 0
    for batch in loader:
        rows += len(batch["id"])
    return rows / (time.process_time() - start), rows


def cost_balance(root: str) -> None:
    """The straggler ratios of ``--cost`` (see the module docstring)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petastorm_balanced import make_loader, plan_shards
    world, batch = 8, 16
    plans = []
    for i, n in enumerate((24_000, 12_000, 8_000)):
        rng = np.random.default_rng(i)
        length = np.maximum(1, np.round(np.exp(rng.normal(np.log(16 * 4 ** i), 1.0, n)))).astype(np.int64)
        folder = os.path.join(root, f"cost{i}")
        os.makedirs(folder)
        for f, part in enumerate(np.array_split(np.arange(n), 4)):
            pq.write_table(pa.table({"id": part, "length": length[part]}), os.path.join(folder, f"part-{f}.parquet"),
                           row_group_size=2000)
        plans.append(plan_shards("file://" + folder, world, batch_size=batch, cost="length", seed=i, engine="local"))

    def straggler(plan, reduce, **kwargs) -> float:
        per_rank = []
        for rank in range(world):
            loader = make_loader(rank, world, plan=plan, batch_size=batch, backend="arrow", workers_count=1,
                                 cost_reduce=reduce, schema_fields=["id", "length"], **kwargs)
            loader.set_epoch(1)
            per_rank.append([float(b["length"].sum()) if reduce == "sum" else
                             float(len(b["length"]) * b["length"].max()) for b in loader])
        costs = np.array(per_rank)
        return float(np.mean(costs.max(axis=0) / costs.mean(axis=0)))

    for reduce in ("sum", "max"):
        rows = straggler(plans, reduce, weights=[5, 3, 2], balance="rows")
        mixed = straggler(plans, reduce, weights=[5, 3, 2])
        single = straggler(plans[1], reduce)
        print(f"cost_reduce={reduce}: slowest rank's batch cost / mean: mixture by cost {mixed:.3f}, one cost plan "
              f"{single:.3f}, mixture by rows {rows:.3f} ({world} ranks, batches of {batch})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--backend", default="arrow")
    parser.add_argument("--columns", choices=["numeric", "all"], default="numeric")
    parser.add_argument("--fresh", action="store_true", help="a new loader per round (its setup and first epoch)")
    parser.add_argument("--cost", action="store_true", help="cost balance of a mixture of cost plans, not speed")
    args = parser.parse_args(argv)
    if args.cost:
        with tempfile.TemporaryDirectory() as root:
            cost_balance(root)
        return 0
    from petastorm_balanced import make_loader, plan_shards
    fields = ["id", "value", "label"] if args.columns == "numeric" else None
    with tempfile.TemporaryDirectory() as root:
        urls, combined = datasets(root, args.rows, args.columns)
        plans = [plan_shards(u, 1, batch_size=args.batch_size, engine="local") for u in urls]
        single = plan_shards(combined, 1, batch_size=args.batch_size, engine="local")
        common = dict(batch_size=args.batch_size, backend=args.backend, workers_count=2, schema_fields=fields)
        weights = [p.total_rows for p in plans]
        kinds = {
            "mixture": lambda: make_loader(0, 1, plan=plans, weights=weights, **common),
            "single": lambda: make_loader(0, 1, plan=single, **common),
        }
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        rows: dict[str, int] = {}
        made = {name: make() for name, make in kinds.items()}
        for name in kinds:  # one epoch each before measuring: the readers' first start is not an epoch's cost
            epoch_rate(made[name])
        for _ in range(args.rounds):  # interleaved, so a loaded machine slows both alike
            for name, make in kinds.items():
                if args.fresh:
                    start = time.process_time()
                    loader = make()
                    rate, rows[name] = epoch_rate(loader)
                    rate = rows[name] / (time.process_time() - start)
                    loader.close()
                else:
                    rate, rows[name] = epoch_rate(made[name])
                rates[name].append(rate)
        medians = {k: statistics.median(v) for k, v in rates.items()}
        for name in kinds:
            print(f"{name:8s} {rows[name]:>9,} rows per epoch  {medians[name]:>12,.0f} rows per CPU-second "
                  f"(median of {args.rounds}: {', '.join(f'{r:,.0f}' for r in rates[name])})")
        ratio = medians["mixture"] / medians["single"]
        print(f"mixture / single: {ratio:.2f}x rows per CPU-second (goal >= {GOAL}x; {args.columns} columns, "
              f"backend {args.backend}, batch {args.batch_size}, "
              f"{'fresh loaders' if args.fresh else 'epochs of one loader'})")
        for loader in made.values():
            loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
