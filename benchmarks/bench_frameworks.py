"""Throughput of the TensorFlow and JAX paths against ``batch_format="numpy"`` (ratios in one process).

Not a test: run it standalone on the modern stack (TensorFlow and JAX installed). One rank of a 2-rank plan over a
generated dataset, numeric columns (``id``, ``value``, ``label``) by default; each round times one epoch through
each path, in turn (a rotated order of numpy, torch, tf, jax), after one warm-up epoch each; the report is the
median epoch time of each path and its ratio to numpy's in the same round (median of the ratios), so machine load
cancels out.

- numpy: ``make_loader(..., batch_format="numpy")``, every batch touched (``batch["id"][0]``);
- torch: ``make_loader(...)`` (the default), for scale;
- tf: ``for batch in make_tf_dataset(...)`` in eager mode (``from_generator`` copies each batch into tensors);
- jax: ``for batch in make_jax_iterator(...)`` (``jax.device_put`` of each column, then ``block_until_ready``).

    PB_STACK=modern . scripts/env.sh && python benchmarks/bench_frameworks.py [--rows 200000] [--batch 256]
        [--rounds 5] [--columns id,value,label] [--paths numpy,torch,tf,jax]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from petastorm_balanced import datagen, make_loader, plan_shards  # noqa: E402


def epoch_runner(path: str, plan, columns, batch: int):
    kwargs = dict(plan=plan, batch_size=batch, schema_fields=columns, backend="arrow")
    if path == "numpy":
        loader = make_loader(0, 2, batch_format="numpy", **kwargs)
        return lambda: sum(1 for b in loader if b["id"][0] is not None)
    if path == "torch":
        loader = make_loader(0, 2, **kwargs)
        return lambda: sum(1 for b in loader if b["id"][0] is not None)
    if path == "tf":
        from petastorm_balanced.tf import make_tf_dataset
        dataset = make_tf_dataset(0, 2, **kwargs)
        return lambda: sum(1 for b in dataset if b["id"][0] is not None)
    if path == "jax":
        import jax

        from petastorm_balanced.jax import make_jax_iterator
        jax.config.update("jax_enable_x64", True)  # id and value are 64-bit
        batches = make_jax_iterator(0, 2, **kwargs)

        def run():
            n = 0
            for b in batches:
                b["id"].block_until_ready()
                n += 1
            return n
        return run
    raise SystemExit(f"unknown path {path!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--columns", default="id,value,label")
    parser.add_argument("--paths", default="numpy,torch,tf,jax")
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    columns = args.columns.split(",")
    folder = tempfile.mkdtemp(prefix="bench_frameworks-")
    info = datagen.make_plain_dataset(os.path.join(folder, "ds"), num_files=4, total_rows=args.rows, seed=1)
    plan = plan_shards(info.url, 2, batch_size=args.batch, engine="local")
    runners = {p: epoch_runner(p, plan, columns, args.batch) for p in paths}
    steps = plan.steps_per_epoch(2)
    for path, run in runners.items():  # warm-up: imports, first traces, the reader's pool
        assert run() == steps, path
    times: dict[str, list[float]] = {p: [] for p in paths}
    for round_ in range(args.rounds):
        order = paths[round_ % len(paths):] + paths[:round_ % len(paths)]  # each path leads a round in turn: a
        for path in order:  # path run right after TensorFlow's or JAX's epoch pays for their garbage (measured)
            run = runners[path]
            started = time.perf_counter()
            assert run() == steps, path
            times[path].append(time.perf_counter() - started)
    base = times["numpy"] if "numpy" in times else None
    print(f"{args.rows} rows, columns {columns}, batch {args.batch}: {steps} steps per epoch, rank 0 of 2, "
          f"{args.rounds} rounds (load average {os.getloadavg()[0]:.1f})")
    for path in paths:
        median = statistics.median(times[path])
        ratio = "" if base is None else \
            f"  x{statistics.median(t / b for t, b in zip(times[path], base, strict=True)):.2f} of numpy's time"
        print(f"  {path:6} {median:7.3f} s/epoch  {steps * args.batch / median:10,.0f} rows/s{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
