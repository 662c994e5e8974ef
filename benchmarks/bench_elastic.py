"""Cost of an elastic mid-epoch resume (G10), measured beside a fresh start in the same process.

Not a test: run it standalone (``python benchmarks/bench_elastic.py``). Figures:

- time to the first batch of rank 0 of W' ranks after loading a state saved by W ranks at 40% of an epoch
  (``make_loader`` + ``load_state_dict`` + ``next(iter(loader))``), against a fresh start of the same loader at
  the top of an epoch; the ratio is the price of the resume;
- the arithmetic alone (which rows are left and how they are cut, ``plan.pieces`` with stages) against the plain
  assignment of an epoch, for a small and a large world;
- the size of the saved state (JSON bytes): it does not grow with the dataset;
- rows/s of rank 0 reading the rest of the epoch after the elastic resume, against a whole fresh epoch of the same
  world (the locality cost of the scattered rows of partly consumed windows).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")


def best(fn, repeats):
    """Fastest of ``repeats`` runs after a warm-up (the machine is shared: the minimum is the least disturbed)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def first_batch(plan, world, new_world, fraction, repeats, window):
    from petastorm_balanced import make_loader
    old = make_loader(0, world, plan=plan, shuffle_window=window, workers_count=2)
    state = {**old.state_dict(), "batches": int(len(old) * fraction)}
    old.close()

    def fresh():
        with make_loader(0, new_world, plan=plan, shuffle_window=window, workers_count=2) as loader:
            next(iter(loader))

    def resumed():
        with make_loader(0, new_world, plan=plan, shuffle_window=window, workers_count=2) as loader:
            loader.load_state_dict(state)
            next(iter(loader))

    def rows_per_s(state_or_none):
        with make_loader(0, new_world, plan=plan, shuffle_window=window, workers_count=2) as loader:
            if state_or_none is not None:
                loader.load_state_dict(state_or_none)
            start, rows = time.perf_counter(), 0
            for batch in loader:
                rows += len(batch["id"])
            return rows / (time.perf_counter() - start)

    fresh_s, resumed_s = best(fresh, repeats), best(resumed, repeats)
    rates = [(rows_per_s(None), rows_per_s(state)) for _ in range(max(1, repeats // 2))]
    rate_ratio = float(np.median([elastic / plain for plain, elastic in rates]))
    return {"rest_of_epoch_rows_per_s_ratio_elastic_vs_fresh_epoch": round(rate_ratio, 2), "world": world,
            "new_world": new_world, "resume_at_batch": state["batches"], "fresh_first_batch_s": round(fresh_s, 4),
            "elastic_first_batch_s": round(resumed_s, 4),
            "ratio_elastic_vs_fresh": round(resumed_s / fresh_s, 2), "state_json_bytes": len(json.dumps(state))}


def arithmetic(plan, world, new_world, fraction, repeats, window):
    from petastorm_balanced.core.elastic import Stage
    from petastorm_balanced.reading.source.layout import Layout
    layout = Layout(plan, new_world, batch_size=plan.batch_size, shuffle=True, shuffle_window=window,
                    reshuffle="epoch")
    stages = (Stage(world, 1, 0, int(plan.steps_per_epoch(world) * fraction)),)
    plain = best(lambda: plan.pieces(epoch=0, world_size=new_world), repeats)
    elastic = best(lambda: plan.pieces(**layout.pieces_args(0, 1, stages)), repeats)
    return {"world": world, "new_world": new_world, "plain_assignment_s": round(plain, 5),
            "elastic_assignment_s": round(elastic, 5), "ratio_elastic_vs_plain": round(elastic / plain, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--window", type=int, default=10_000, help="shuffle_window rows")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "pb-bench-elastic"))
    args = parser.parse_args(argv)
    from petastorm_balanced import datagen, plan_shards
    path = os.path.join(args.workdir, f"ds-{args.rows}")
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        url = "file://" + path
    else:
        url = datagen.make_plain_dataset(path, num_files=max(4, args.rows // 20_000), total_rows=args.rows,
                                         seed=7).url
    plan = plan_shards(url, 8, batch_size=args.batch_size, engine="local")
    results = {"rows": plan.total_rows, "row_groups": len(plan.catalog.row_groups), "batch_size": args.batch_size,
               "shuffle_window": args.window,
               "first_batch": [first_batch(plan, 8, 6, 0.4, args.repeats, args.window),
                               first_batch(plan, 4, 8, 0.4, args.repeats, args.window)],
               "arithmetic": [arithmetic(plan, 8, 6, 0.4, args.repeats, args.window),
                              arithmetic(plan, 64, 48, 0.4, args.repeats, args.window)]}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
