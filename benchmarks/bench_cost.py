"""Cost balance: how close the ranks' batch costs are in each step, measured on real loaders.

Not a test: run it standalone (``python benchmarks/bench_cost.py``). Every figure compares loaders over the same
plan and rows in one process:

- straggler ratio = mean over steps of (max rank batch cost / mean rank batch cost), 8 ranks, batches of 16, for
  lognormal row lengths (sigma 1): ``balance="rows"`` (random batches) against ``balance="cost"`` with
  ``cost_reduce="sum"`` (cost = sum of lengths) and ``"max"`` (cost = batch_size x longest row). Also on a dataset
  whose files come from four sources of different median lengths, with and without the cost-dealt row group
  order (the rule that gives every rank's stretch of row groups the mean cost).
- padding waste of padded batches: 1 - sum of lengths / (batch_size x longest row), over all batches.
- loader throughput (rows/s of one rank over an epoch, Arrow backend), cost balance against row balance:
  the best round's rows/s, and the median over interleaved rounds of rows per CPU-second's ratio.
- token budgets: mean batch fill (batch cost / max_batch_cost), steps per rank, rows left out per epoch.

The straggler ratios and the throughput are also measured under the previous cost arrangement version
(``core/cost/arrangement.ARRANGEMENTS``), in the same process and interleaved rounds: the new version's figures
against the old one's.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")

WORLD, BATCH = 8, 16
GOALS = {"sum": 1.05, "max": 1.10}
THROUGHPUT_GOAL = 0.9  # cost balance's rows per CPU-second against rows balance's


def write_dataset(path, rows, *, sources=False, files=16, row_group=5000, seed=0, text=False):
    """``id``, ``length`` (lognormal, sigma 1, median 64 tokens, at least 1) and a float payload. With
    ``sources`` every file comes from one of four sources whose median lengths are 23, 45, 91 and 181 (files
    written per source: row groups differ in mean cost, the case the cost-dealt row group order is for)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64)
    os.makedirs(path, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(rows), files)):
        median = 64 * 2.0 ** ((i % 4) - 1.5) if sources else 64
        length = np.maximum(1, np.round(np.exp(rng.normal(np.log(median), 1.0, len(part))))).astype(np.int64)
        columns = {"id": ids[part], "length": length, "x": rng.random(len(part))}
        if text:  # a text column of `length` random letters: what a cost such as length(text) measures
            letters = rng.integers(97, 123, size=int(length.sum()), dtype=np.uint8).tobytes().decode()
            ends = np.cumsum(length)
            columns["text"] = [letters[e - n:e] for e, n in zip(ends.tolist(), length.tolist(), strict=True)]
        table = pa.table(columns)
        pq.write_table(table, os.path.join(path, f"part-{i:05d}.parquet"), row_group_size=row_group)
    return path


def arranged_by(version):
    """Loaders made inside arrange cost windows with ``version`` (the current one: ``None``)."""
    from unittest import mock

    from petastorm_balanced.core.cost import arrangement
    return mock.patch.object(arrangement, "ARRANGEMENT_VERSION", version or arrangement.ARRANGEMENT_VERSION)


def epoch_costs(plan, balance, reduce, plain_order=False, version=None, **kwargs):
    """Per-step batch costs of every rank for epoch 1: (ranks, steps), plus the batches' padding waste.

    ``plain_order`` keeps the cost windows but deals row groups in the plain seeded order (no cost-dealt order),
    to show what the cross-rank rule contributes."""
    from petastorm_balanced import make_loader
    costs, waste_num, waste_den = [], 0, 0
    if plain_order:
        from unittest import mock

        from petastorm_balanced.core.cost.order import ROW_GROUP_ORDERS
        patch = mock.patch.dict(ROW_GROUP_ORDERS._choices, {"cost": ROW_GROUP_ORDERS["rows"]})
    for rank in range(WORLD):
        if plain_order:
            patch.start()
        with arranged_by(version):
            loader = make_loader(rank, WORLD, plan=plan, batch_size=BATCH, epoch=1, backend="arrow", balance=balance,
                                 cost_reduce=reduce, schema_fields=["length"], workers_count=2, **kwargs)
        mine = []
        for batch in loader:
            length = batch["length"].numpy()
            padded = len(length) * int(length.max())
            mine.append(padded if reduce == "max" else int(length.sum()))
            waste_num += padded - int(length.sum())
            waste_den += padded
        if plain_order:
            patch.stop()
        costs.append(mine)
    costs = np.array(costs, dtype=np.float64)  # (ranks, steps)
    return costs, waste_num / waste_den


def straggler(costs):
    return float(np.mean(costs.max(axis=0) / costs.mean(axis=0)))


def throughput(plan, repeats=9, previous=1):
    """Rows/s of a single rank reading epoch 1 (every column) with each balance (the best round), and the median
    over rounds of each round's cost / rows ratio of rows per CPU-second, for the current arrangement and for
    version ``previous``. Rounds interleave the three (each round starting with the next one), so a burst of load
    on a shared machine hits all alike, and the median of per-round ratios is not moved by the one round a burst
    favoured (best-of, used before, swung by 0.1 from run to run)."""
    from petastorm_balanced import make_loader
    wall = {"rows": 0.0, "cost": 0.0, "previous": 0.0}
    ratios: dict[str, list] = {"cost": [], "previous": []}
    names = list(wall)
    for round_ in range(repeats):
        cpu = {}
        for name in names[round_ % 3:] + names[:round_ % 3]:  # one rank reading every row; each first in turn
            with arranged_by(previous if name == "previous" else None):
                loader = make_loader(0, 1, plan=plan, batch_size=BATCH, epoch=1, backend="arrow",
                                     balance="rows" if name == "rows" else "cost", workers_count=2)
            start, start_cpu = time.perf_counter(), time.process_time()
            rows = sum(len(b["id"]) for b in loader)
            wall[name] = max(wall[name], rows / (time.perf_counter() - start))
            cpu[name] = rows / (time.process_time() - start_cpu)
        for name in ratios:
            ratios[name].append(cpu[name] / cpu["rows"])
    return wall, {name: float(np.median(r)) for name, r in ratios.items()}


def budget_figures(plan, budget):
    from petastorm_balanced import make_loader
    fills, steps, delivered = [], [], 0
    for rank in range(WORLD):
        loader = make_loader(rank, WORLD, plan=plan, batch_size=None, max_batch_cost=budget, epoch=1,
                             backend="arrow", schema_fields=["length"], workers_count=2)
        n = 0
        for batch in loader:
            cost = int(batch["_cost"].sum())
            assert cost <= budget, (cost, budget)
            fills.append(cost / budget)
            delivered += len(batch["length"])
            n += 1
        steps.append(n)
    return float(np.mean(fills)), steps, plan.total_rows - delivered


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--previous", type=int, default=1, help="the arrangement version to compare with")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved throughput rounds")
    parser.add_argument("--budget", type=int, default=None,
                        help="max_batch_cost for the token budget figures (default: 8192, or the longest row)")
    args = parser.parse_args(argv)
    from petastorm_balanced import plan_shards
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sources in (("lognormal", False), ("files by source", True)):
            path = write_dataset(os.path.join(tmp, name.replace(" ", "_")), args.rows, sources=sources)
            plan = plan_shards(path, WORLD, batch_size=BATCH, engine="local", cost="length")
            print(f"\n{name}: {plan.total_rows} rows, {len(plan.catalog.row_groups)} row groups, {WORLD} ranks, "
                  f"batch {BATCH}, mean length {plan.catalog.cost_sums().sum() / plan.total_rows:.1f}, "
                  f"longest {plan.max_row_cost}")
            for reduce in ("sum", "max"):
                random_costs, random_waste = epoch_costs(plan, "rows", reduce)
                cost_costs, cost_waste = epoch_costs(plan, "cost", reduce)
                r, c = straggler(random_costs), straggler(cost_costs)
                old_costs, old_waste = epoch_costs(plan, "cost", reduce, version=args.previous)
                results[(name, reduce)] = (r, c, random_waste, cost_waste)
                print(f"  straggler ratio, cost_reduce={reduce!r}: random batches {r:.3f}, cost balance {c:.3f} "
                      f"(goal <= {GOALS[reduce]:.2f}; arrangement v{args.previous}: {straggler(old_costs):.4f} against "
                      f"{c:.4f})")
                if reduce == "max":
                    print(f"  padding waste: random {random_waste:.1%}, cost balance {cost_waste:.1%} "
                          f"({cost_waste / random_waste:.2f}x; goal <= 0.5x; arrangement v{args.previous}: "
                          f"{old_waste:.1%})")
            if sources:  # what the cost-dealt order adds: the same loaders over the plain seeded order
                for reduce in ("sum", "max"):
                    c = straggler(epoch_costs(plan, "cost", reduce, plain_order=True)[0])
                    print(f"  straggler ratio, cost_reduce={reduce!r}, windows balanced but row groups in the plain "
                          f"seeded order: {c:.3f}")
            if not sources:
                wall, per_cpu = throughput(plan, args.repeats, previous=args.previous)
                print(f"  throughput, one rank reading all rows, numeric columns only (the worst case for the "
                      f"arrangement's overhead): rows balance {wall['rows']:,.0f} rows/s, cost balance "
                      f"{wall['cost']:,.0f} rows/s ({wall['cost'] / wall['rows']:.2f}x); per CPU second (less "
                      f"sensitive to a shared machine; median of rounds) {per_cpu['cost']:.2f}x (arrangement "
                      f"v{args.previous}: {per_cpu['previous']:.2f}x)")
                results["throughput numeric"] = per_cpu['cost']
                text_path = write_dataset(os.path.join(tmp, "with_text"), args.rows, text=True)
                text_plan = plan_shards(text_path, WORLD, batch_size=BATCH, engine="local", cost="length(text)")
                wall, per_cpu = throughput(text_plan, args.repeats, previous=args.previous)
                results["throughput"] = per_cpu["cost"]  # wall clock swings 2x on a shared machine
                print(f"  throughput with a text column (cost='length(text)'): rows balance {wall['rows']:,.0f} "
                      f"rows/s, cost balance {wall['cost']:,.0f} rows/s ({wall['cost'] / wall['rows']:.2f}x); per CPU "
                      f"second (median of rounds; goal >= {THROUGHPUT_GOAL}x) {per_cpu['cost']:.2f}x (arrangement "
                      f"v{args.previous}: {per_cpu['previous']:.2f}x)")
                budget = args.budget or max(8192, plan.max_row_cost)
                fill, steps, left = budget_figures(plan, budget)
                results["fill"] = fill
                print(f"  token budget max_batch_cost={budget}: mean fill {fill:.1%} (goal >= 90%), steps per "
                      f"rank {sorted(set(steps))}, rows left out this epoch {left} of {plan.total_rows} "
                      f"({left / plan.total_rows:.2%})")
    print("\ngoals:")
    for reduce in ("sum", "max"):
        value = results[("lognormal", reduce)][1]
        print(f"  straggler {reduce}: {value:.3f} <= {GOALS[reduce]}: {'met' if value <= GOALS[reduce] else 'NOT met'}")
    _, _, random_waste, cost_waste = results[("lognormal", "max")]
    halved = "met" if cost_waste <= random_waste / 2 else "NOT met"
    print(f"  padding waste halved: {cost_waste / random_waste:.2f}x: {halved}")
    fast_enough = "met" if results["throughput"] >= THROUGHPUT_GOAL else "NOT met"
    print(f"  throughput >= {THROUGHPUT_GOAL}x (rows per CPU second, text column): {results['throughput']:.2f}x: "
          f"{fast_enough}")
    numeric = results["throughput numeric"]
    print(f"  throughput >= {THROUGHPUT_GOAL}x (rows per CPU second, numeric columns): {numeric:.2f}x: "
          f"{'met' if numeric >= THROUGHPUT_GOAL else 'NOT met'}")
    print(f"  token budget fill >= 90%: {results['fill']:.1%}: {'met' if results['fill'] >= 0.9 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
