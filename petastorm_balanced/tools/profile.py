"""``petastorm-balanced profile PLAN``: how many steps per second one rank's input pipeline can feed, what limits
it, and what to change.

It runs one rank's loader alone, with the loader's options and no training step (so every wait is the pipeline's),
for an epoch or ``--max-batches`` batches, and reports ``loader.stats()`` as a table: each stage's seconds, the
threads that did it, its share of the pipeline's time per thread, and milliseconds per batch. The advice names the
option to change for the limiting stage (docs/stats.md).
"""
from __future__ import annotations

import time
from typing import Any

ADVICE = {
    "list": "many files or small row groups: every file's footer is read once per epoch; compact the dataset into "
            "fewer, larger files, or keep them on a faster store",
    "read": "reading row groups bounds it: raise workers_count (--workers) so more row groups are read side by side, "
            "read fewer columns (schema_fields), and on remote storage keep row groups on local disk "
            "(cache_type='local-disk')",
    "decode": "decoding to numpy bounds it: read fewer columns (schema_fields), raise workers_count (--workers); "
              "list columns of one length decode fastest as tensors (list_format)",
    "transform": "the TransformSpec bounds it: make func cheaper (vectorized pandas/numpy), move the work to the GPU "
                 "step, or raise workers_count (--workers) / DataLoader workers so more bundles transform at once",
    "batch": "shuffling and batching bound it: a smaller shuffle_budget permutes smaller windows, a larger batch_size "
             "cuts fewer batches",
    "convert": "making tensors bounds it: a larger batch_size makes fewer tensors; read fewer columns "
               "(schema_fields); batch_format='numpy' where torch tensors are not needed",
    "device": "copies to the device bound it: pin_memory=True with device='cuda' copies ahead on a side stream",
}


def profile(plan_url: str, *, rank: int = 0, world_size: int | None = None, workers: int = 4,
            batch_size: int | None = None, max_batches: int | None = None, columns: list[str] | None = None,
            loader_options: dict | None = None) -> dict:
    """Run one rank's pipeline alone and return ``{"steps_per_s", "batches", "seconds", "stats", "advice", ...}``."""
    from ..plan.load import load_plan
    from ..reading.front.loader import make_loader
    plan = load_plan(plan_url)
    world = world_size or plan.world_size
    options: dict[str, Any] = {"batch_format": "numpy", "workers_count": workers, **(loader_options or {})}
    if columns:
        options["schema_fields"] = columns
    with make_loader(rank, world, plan=plan, batch_size=batch_size, **options) as loader:
        started = time.perf_counter()
        batches = 0
        for _ in loader:
            batches += 1
            if max_batches is not None and batches >= max_batches:
                break
        seconds = time.perf_counter() - started
        stats = loader.stats()
    limit = stats["limit"]
    return {"plan_url": plan_url, "rank": rank, "world_size": world, "workers": workers,
            "batch_size": loader.batch_size, "batches": batches, "seconds": round(seconds, 4),
            "steps_per_s": round(batches / seconds, 2) if seconds > 0 else None,
            "rows_per_s": round(batches * (loader.batch_size or 0) / seconds, 1) if seconds > 0 else None,
            "limit": limit, "advice": ADVICE.get(limit, ""), "stats": stats}


def format_profile(report: dict) -> str:
    """The report as a table, then the limit and what to change."""
    stats = report["stats"]
    share = stats["evidence"]["stage_share"]
    batches = max(1, report["batches"])
    lines = [f"rank {report['rank']} of {report['world_size']}, workers_count {report['workers']}, batch_size "
             f"{report['batch_size']}: {report['batches']} batches in {report['seconds']:.2f} s = "
             f"{report['steps_per_s']} steps/s ({report['rows_per_s']} rows/s), first batch after "
             f"{stats['first_batch_s']:.2f} s",
             "",
             f"{'stage':<10} {'seconds':>9} {'threads':>7} {'s/thread':>9} {'share':>6} {'ms/batch':>9}"]
    for name, seconds in stats["stages"].items():
        threads = stats["threads"].get(name, 1)
        per = seconds / max(1, threads)
        lines.append(f"{name:<10} {seconds:>9.3f} {threads:>7} {per:>9.3f} {share.get(name, 0.0):>6.0%} "
                     f"{1000 * per / batches:>9.3f}")
    lines.append(f"{'wait':<10} {stats['wait_s']:>9.3f} {'':>7} {'':>9} {'':>6} "
                 f"{1000 * stats['wait_s'] / batches:>9.3f}")
    lines += ["", f"read {stats['rows']} rows, {stats['bytes'] / 2 ** 20:.1f} MiB decoded, {stats['requests']} "
              f"row group reads, {stats['retries']} retries",
              f"limit: {report['limit']}" + (f": {report['advice']}" if report["advice"] else "")]
    return "\n".join(lines)


def plot_profile(report: dict, path: str) -> str:
    """Seconds per thread of each stage as bars, the limit highlighted, steps per second in the title."""
    import os

    from ..errors import InvalidValueError
    try:
        import matplotlib
        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidValueError("--plot needs matplotlib: pip install 'petastorm-balanced[plot]'") from None
    stats = report["stats"]
    names = list(stats["stages"])
    per = [stats["stages"][n] / max(1, stats["threads"].get(n, 1)) for n in names]
    colors = ["#d62728" if n == report["limit"] else "#1f77b4" for n in names]
    fig, ax = plt.subplots(figsize=(9.0, 4.0), dpi=100)
    try:
        ax.barh(names[::-1], per[::-1], color=colors[::-1])
        ax.set_xlabel("seconds per thread doing the stage")
        ax.set_title(f"rank {report['rank']} of {report['world_size']}: {report['steps_per_s']} steps/s, "
                     f"limit {report['limit']!r} (waited {stats['wait_s']:.2f} s of {report['seconds']:.2f} s)",
                     fontsize=11)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
