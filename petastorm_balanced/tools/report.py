"""The numbers behind ``inspect`` and ``compare``: plain dicts (the ``--json`` output) and their text tables.

Pure: a plan (already in memory) in, dicts and strings out. The field names are a contract documented in
``docs/cli.md``; scripts parse them, so add fields rather than rename them.
"""
from __future__ import annotations

import numpy as np

from ..core import balance
from ..core.catalog import Catalog
from ..core.cost.order import rank_costs, straggler_ratio
from ..plan.format import split_row_groups
from ..plan.model import ShardPlan
from .petastorm_sharding import petastorm_shards, piece_keys

JSON_VERSION = 1
_BATCH_FROM = {"argument": "(--batch-size)", "plan": "(the plan's)", "state": "(the state's)",
               "none": "(the plan has none, so rows are counted one by one; pass --batch-size)"}


def inspect_report(plan: ShardPlan, *, plan_url: str, world_size: int | None = None, epoch: int = 0,
                   num_workers: int = 1, batch_size: int | None = None, partition_epoch: int = 1,
                   stages=(), windows=None, resume: dict | None = None) -> dict:
    """Per-rank rows, steps, padding and read cost of one epoch, beside what Petastorm's sharding would give.

    With ``partition_epoch=P`` the epoch is part ``epoch % P`` of pass ``epoch // P``; with ``stages`` (an elastic
    resume, described by ``resume``) it is what the pass has left for this world.
    """
    world = plan.world_size if world_size is None else world_size
    batch = batch_size or plan.batch_size or 1
    pieces = plan.pieces(epoch=epoch, world_size=world, num_workers=num_workers, batch_size=batch,
                         partition_epoch=partition_epoch, stages=stages, windows=windows)
    pass_steps = plan.steps_per_epoch(world, batch)
    parts = {"partition_epoch": partition_epoch, "pass": epoch // partition_epoch, "part": epoch % partition_epoch,
             "part_steps": balance.part_steps(pass_steps, partition_epoch).tolist(),
             "pass_dropped_rows": plan.total_rows - pass_steps * world * batch if plan.policy == "drop" else 0}
    if resume is not None:
        resume = {**resume, "steps_left": pieces.steps_per_rank - resume["batches"]}
    return {
        "json_version": JSON_VERSION,
        "plan_url": plan_url,
        **_header(plan.dataset_url, plan.predicate.kind, plan.predicate.text, world, batch, plan.policy, plan.seed),
        **({} if plan.table is None else {"table": {**plan.table.to_json(), "description": plan.table.describe()}}),
        "batch_size_from": "state" if resume is not None else
        ("argument" if batch_size else ("plan" if plan.batch_size else "none")),
        "epoch": epoch,
        "workers": num_workers,
        "worker_steps": balance.worker_steps(pieces.steps_per_rank, num_workers).tolist(),
        **balanced_totals(plan.catalog, pieces),
        "ranks": balanced_ranks(plan.catalog, pieces),
        "petastorm": petastorm_report(plan.catalog, world, batch),
        **parts,
        "resume": resume,
        **cost_report(plan.catalog, pieces),
    }


def cost_report(catalog: Catalog, pieces: balance.Pieces) -> dict:
    """The cost side of a cost plan (empty for others): each rank's epoch cost, ours and Petastorm's, estimated
    from the plan's per-row-group sums, and the straggler ratio (max / mean) of those totals. Per-step figures
    need the rows themselves: benchmarks/bench_cost.py measures them."""
    if catalog.cost is None:
        return {}
    ours = rank_costs(catalog, pieces)
    sums = {(r.path, r.row_group): r.cost_sum or 0 for r in catalog.row_groups}
    keys = piece_keys(catalog)
    theirs = np.bincount(np.arange(len(keys)) % pieces.world_size,
                         weights=[sums.get((p, i), 0) for p, i, _ in keys], minlength=pieces.world_size)
    return {"cost": {"text": catalog.cost, "total_cost": int(catalog.cost_sums().sum()),
                     "max_row_cost": catalog.max_row_cost, "rank_costs": [int(round(c)) for c in ours],
                     "straggler_ratio": round(straggler_ratio(ours), 4),
                     "petastorm_rank_costs": [int(c) for c in theirs],
                     "petastorm_straggler_ratio": round(straggler_ratio(theirs), 4)}}


def format_cost(report: dict) -> list[str]:
    """Lines for the cost side (none for a plan without a cost)."""
    cost = report.get("cost")
    if not cost:
        return []
    return ["", f"cost {cost['text']!r}: {cost['total_cost']} in all, largest row {cost['max_row_cost']}",
            f"epoch cost per rank (from row group sums): petastorm-balanced {cost['rank_costs']}, max/mean "
            f"{cost['straggler_ratio']:.3f}; Petastorm cur_shard/shard_count {cost['petastorm_rank_costs']}, "
            f"max/mean {cost['petastorm_straggler_ratio']:.3f}",
            "per step, make_loader(balance='cost') evens the ranks' batch costs inside each shuffle window "
            "(benchmarks/bench_cost.py)"]


def compare_report(plan: ShardPlan, *, batch_size: int | None = None) -> dict:
    """Petastorm's per-rank rows and steps beside the balanced plan's, for the plan's world size, epoch 0."""
    batch = batch_size or plan.batch_size or 1
    pieces = plan.pieces(batch_size=batch)
    return {
        "json_version": JSON_VERSION,
        **_header(plan.dataset_url, plan.predicate.kind, plan.predicate.text, plan.world_size, batch, plan.policy,
                  plan.seed),
        **balanced_totals(plan.catalog, pieces),
        "ranks": balanced_ranks(plan.catalog, pieces),
        "petastorm": petastorm_report(plan.catalog, plan.world_size, batch),
        **cost_report(plan.catalog, pieces),
    }


def balanced_totals(catalog: Catalog, pieces: balance.Pieces) -> dict:
    real = ~pieces.padding
    delivered = int(pieces.num_rows[real].sum())
    padded = int(pieces.num_rows[pieces.padding].sum())
    rows_read = _rows_read(catalog, pieces)
    return {
        "scanned_rows": catalog.scanned_rows,
        "matching_rows": catalog.total_rows,
        "row_groups": len(catalog.row_groups),
        "steps_per_epoch": pieces.steps_per_rank,
        "rows_per_rank": pieces.steps_per_rank * pieces.batch_size,
        "padded_rows": padded,
        "dropped_rows": catalog.total_rows - delivered,
        "split_row_groups": split_row_groups(pieces),
        "rows_read": int(rows_read.sum()),
        "read_amplification": _ratio(int(rows_read.sum()), delivered + padded),
    }


def balanced_ranks(catalog: Catalog, pieces: balance.Pieces) -> list[dict]:
    """One dict per rank; a rank reads whole row groups (each worker its own) and keeps its slice of them."""
    world = pieces.world_size
    slot = pieces.rank * pieces.num_workers + pieces.worker
    rows = np.bincount(pieces.rank, weights=pieces.num_rows, minlength=world).astype(np.int64)
    padded = np.bincount(pieces.rank[pieces.padding], weights=pieces.num_rows[pieces.padding],
                         minlength=world).astype(np.int64)
    # distinct (slot, row group) reads: (reads, 2)
    reads = np.unique(np.stack([slot, pieces.catalog_row], axis=1), axis=0)
    read_rank = reads[:, 0] // pieces.num_workers
    rows_read = _rows_read(catalog, pieces)
    row_groups = np.bincount(np.unique(np.stack([pieces.rank, pieces.catalog_row], axis=1), axis=0)[:, 0],
                             minlength=world)
    split = _split_per_rank(pieces, slot)
    out = []
    for r in range(world):
        out.append({"rank": r, "rows": int(rows[r]), "steps": int(rows[r] // pieces.batch_size),
                    "real_rows": int(rows[r] - padded[r]), "padded_rows": int(padded[r]),
                    "row_groups": int(row_groups[r]), "row_group_reads": int((read_rank == r).sum()),
                    "split_row_groups": int(split[r]), "rows_read": int(rows_read[r]),
                    "read_amplification": _ratio(int(rows_read[r]), int(rows[r]))})
    return out


def petastorm_report(catalog: Catalog, world_size: int, batch_size: int) -> dict:
    """What ``cur_shard=r, shard_count=world_size`` gives each rank (see ``petastorm_sharding``)."""
    shards = petastorm_shards(catalog, world_size, batch_size)
    ranks = [{"rank": r, "rows": int(shards.rows[r]), "steps": int(shards.steps[r]),
              "full_steps": int(shards.full_steps[r]), "row_groups": int(shards.row_groups[r]),
              "rows_read": int(shards.rows_read[r])} for r in range(world_size)]
    return {"ranks": ranks, "min_steps": int(shards.steps.min()), "max_steps": int(shards.steps.max()),
            "min_rows": int(shards.rows.min()), "max_rows": int(shards.rows.max()),
            "empty_ranks": int((shards.rows == 0).sum()),
            "refused": bool(sum(len(f.row_group_rows) for f in catalog.files) < world_size)}


def format_inspect(report: dict) -> str:
    lines = _title(report) + [
        f"epoch {report['epoch']}, {report['workers']} worker(s) per rank (steps per worker "
        f"{report['worker_steps']}), batch_size {report['batch_size']} " + _BATCH_FROM[report["batch_size_from"]],
        _totals_line(report), *_parts_lines(report), "",
        _row("rank", "rows", "steps", "padded", "row_groups", "split", "rows_read", "read_amp"),
    ]
    for r in report["ranks"]:
        lines.append(_row(r["rank"], r["rows"], r["steps"], r["padded_rows"], r["row_groups"],
                          r["split_row_groups"], r["rows_read"], f"{r['read_amplification']:.2f}"))
    p = report["petastorm"]
    lines += ["", f"Petastorm cur_shard/shard_count over the same rows: {p['min_rows']}..{p['max_rows']} rows, "
              f"{p['min_steps']}..{p['max_steps']} steps per rank (petastorm-balanced compare shows the table)"]
    return "\n".join(lines + format_cost(report))


def _parts_lines(report: dict) -> list[str]:
    lines = []
    if report.get("partition_epoch", 1) > 1:
        lines.append(f"part {report['part']} of pass {report['pass']} ({report['partition_epoch']} parts; steps per "
                     f"part {report['part_steps']}; the pass drops {report['pass_dropped_rows']} rows)")
    resume = report.get("resume")
    if resume:
        lines.append(f"elastic resume of a state saved at world_size {resume['saved_world_size']} (epoch "
                     f"{resume['saved_epoch']}, batch {resume['saved_batches']}): {resume['steps_left']} steps left "
                     f"per rank of {report['world_size']}; rows above are what the pass has left (worlds before: "
                     f"{[s[0] for s in resume['stages']]})")
    return lines


def format_compare(report: dict) -> str:
    p = report["petastorm"]
    lines = _title(report) + [_totals_line(report), "",
                              f"{'':>6}  {'Petastorm cur_shard/shard_count':^33}      {'petastorm-balanced':^32}",
                              _row("rank", "rows", "steps", "row_groups", "|", "rows", "steps", "padded",
                                   widths=(6, 10, 8, 11, 2, 10, 8, 8))]
    for ours, theirs in zip(report["ranks"], p["ranks"], strict=True):
        lines.append(_row(ours["rank"], theirs["rows"], theirs["steps"], theirs["row_groups"], "|", ours["rows"],
                          ours["steps"], ours["padded_rows"], widths=(6, 10, 8, 11, 2, 10, 8, 8)))
    ours_steps = [r["steps"] for r in report["ranks"]]
    lines += ["", f"steps per rank: Petastorm {p['min_steps']}..{p['max_steps']}, "
              f"petastorm-balanced {min(ours_steps)}..{max(ours_steps)}"]
    if p["max_steps"] != p["min_steps"]:
        lines.append(f"with Petastorm, the fastest rank stops {p['max_steps'] - p['min_steps']} step(s) early and "
                     "the others hang in their next all-reduce")
    if p["refused"]:
        lines.append(f"(Petastorm itself refuses this: fewer row groups than world_size={report['world_size']})")
    return "\n".join(lines + format_cost(report))


def _header(dataset_url, kind, text, world, batch, policy, seed) -> dict:
    return {"dataset_url": dataset_url, "predicate": {"kind": kind, "text": text}, "world_size": world,
            "batch_size": batch, "policy": policy, "seed": seed}


def _title(report: dict) -> list[str]:
    pred = report["predicate"]
    what = "none" if pred["kind"] == "none" else f"{pred['kind']}: {pred['text']}"
    head = [f"dataset {report['dataset_url']}", f"predicate {what}"]
    if "table" in report:  # a Delta/Iceberg snapshot plan
        head.insert(1, f"table {report['table']['description']}")
    if "plan_url" in report:
        head.insert(0, f"plan {report['plan_url']}")
    return head + [f"world_size {report['world_size']}, batch_size {report['batch_size']}, policy "
                   f"{report['policy']}, seed {report['seed']}"]


def _totals_line(report: dict) -> str:
    return (f"{report['matching_rows']} matching rows of {report['scanned_rows']} in {report['row_groups']} row "
            f"groups: {report['steps_per_epoch']} steps x {report['batch_size']} = {report['rows_per_rank']} rows "
            f"per rank; dropped {report['dropped_rows']}, padded {report['padded_rows']}, split row groups "
            f"{report['split_row_groups']}, read amplification {report['read_amplification']:.2f}")


def _row(*cells, widths=(6, 10, 8, 8, 11, 6, 11, 9)) -> str:
    return "  ".join(f"{str(c):>{w}}" for c, w in zip(cells, widths, strict=True)).rstrip()


def _rows_read(catalog: Catalog, pieces: balance.Pieces) -> np.ndarray:
    """(world_size,) rows each rank reads: every distinct (worker, row group) pair reads the whole row group."""
    slot = pieces.rank * pieces.num_workers + pieces.worker
    reads = np.unique(np.stack([slot, pieces.catalog_row], axis=1), axis=0)  # (reads, 2)
    totals = np.fromiter((r.total_rows for r in catalog.row_groups), dtype=np.int64, count=len(catalog.row_groups))
    return np.bincount(reads[:, 0] // pieces.num_workers, weights=totals[reads[:, 1]],
                       minlength=pieces.world_size).astype(np.int64)


def _split_per_rank(pieces: balance.Pieces, slot: np.ndarray) -> np.ndarray:
    """(world_size,) row groups of each rank whose non-padding rows also go to another slot."""
    real = ~pieces.padding
    pairs = np.unique(np.stack([pieces.catalog_row[real], slot[real]], axis=1), axis=0)  # (pairs, 2)
    groups, slots_per_group = np.unique(pairs[:, 0], return_counts=True)
    split_groups = groups[slots_per_group > 1]
    mine = pairs[np.isin(pairs[:, 0], split_groups)]
    return np.bincount(np.unique(np.stack([mine[:, 1] // pieces.num_workers, mine[:, 0]], axis=1),
                                 axis=0)[:, 0] if len(mine) else np.zeros(0, dtype=np.int64),
                       minlength=pieces.world_size)


def _ratio(num: int, den: int) -> float:
    return round(num / den, 4) if den else 0.0
