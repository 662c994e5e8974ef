"""``petastorm-balanced inspect PLAN_A PLAN_B --weights 0.7,0.3``: what a mixture of plans serves, before training.

Computed from the plans alone with the loaders' own arithmetic (``core/mixture.py``): the steps of each epoch, and
for every source its rows per batch, its rows per epoch (per rank and in all), the passes an epoch covers and where
each epoch starts in the source's passes.
"""
from __future__ import annotations

from ..core import balance
from ..core.mixture import Mixture, make_schedule, parse_weights
from ..errors import InvalidValueError
from ..plan.model import ShardPlan


def mixture_report(plans: list[ShardPlan], urls: list[str], weights, *, world_size: int | None = None,
                   batch_size: int | None = None, epoch: int = 0, epochs: int = 3,
                   epoch_steps: int | None = None, num_workers: int = 1) -> dict:
    """With ``num_workers`` DataLoader workers each worker reads its own share of every source (a rank of a world
    of ``world_size x num_workers`` slots, ``MixtureSettings.slots``), so the mixture is that world's, an epoch
    ``num_workers`` times its slot's steps, and a rank reads each of its rows once (``read_per_rank``)."""
    world = world_size or plans[0].world_size
    if batch_size is None:
        sizes = {p.batch_size for p in plans}
        batch_size = sizes.pop() if len(sizes) == 1 else None
        if batch_size is None:
            raise InvalidValueError("the plans have different (or no) batch sizes; pass --batch-size")
    if epoch_steps is not None and epoch_steps % num_workers:
        raise InvalidValueError(f"--epoch-steps {epoch_steps} with --workers {num_workers}: each worker takes "
                                "epoch_steps / workers batches; pass a multiple of the workers")
    parsed = parse_weights(weights, len(plans))
    slots = world * num_workers
    per_pass = []
    for plan in plans:
        balance.check_fills_a_step(plan.total_rows, slots, 1)
        per_pass.append(plan.rows_per_rank(slots, 1))
    mixture = Mixture(make_schedule(parsed, batch_size), tuple(per_pass),
                      None if epoch_steps is None else epoch_steps // num_workers)
    shown = []
    point = mixture.start(epoch)
    for e in range(epoch, epoch + epochs):
        end = mixture.advance(point, mixture.remaining(point))
        taken = [(b - a) * num_workers for a, b in zip(point.counters, end.counters, strict=True)]
        shown.append({"epoch": e, "steps": mixture.steps_of(point) * num_workers,
                      "sources": [{"start": list(divmod(c, n)), "rows_per_rank": t, "rows": t * world,
                                   "read_per_rank": t, "passes": round(t / (n * num_workers), 3)}
                                  for c, n, t in zip(point.counters, per_pass, taken, strict=True)]})
        point = mixture.next_epoch(point)
    sources = [{"plan_url": url, "dataset_url": plan.dataset_url, "matching_rows": plan.total_rows,
                "weight": str(w), "rows_per_batch": float(w * batch_size), "rows_per_pass_per_rank": n * num_workers,
                "left_out_per_pass": plan.total_rows - n * slots if plan.policy == "drop" else 0}
               for plan, url, w, n in zip(plans, urls, parsed, per_pass, strict=True)]
    return {"kind": "mixture", "world_size": world, "batch_size": batch_size, "epoch_steps": epoch_steps,
            "workers": num_workers,
            "scarcest_source": mixture.scarcest, "schedule_period": mixture.schedule.period, "sources": sources,
            "epochs": shown}


def format_mixture(report: dict) -> str:
    lines = [f"mixture of {len(report['sources'])} plans, world_size {report['world_size']}, batch_size "
             f"{report['batch_size']}; " + (f"epochs of {report['epoch_steps']} steps" if report["epoch_steps"]
                                            else f"an epoch ends when source {report['scarcest_source']} (the "
                                                 "scarcest) completes a pass")]
    for i, s in enumerate(report["sources"]):
        lines.append(f"  source {i}: {s['plan_url']}  weight {s['weight']} = {s['rows_per_batch']:g} rows per batch, "
                     f"{s['matching_rows']} rows ({s['rows_per_pass_per_rank']} per rank per pass, "
                     f"{s['left_out_per_pass']} left out per pass)")
    lines.append(f"  {'epoch':>5} {'steps':>7}  " + "  ".join(f"source {i}: rows/epoch passes start[pass,row]"
                                                             for i in range(len(report["sources"]))))
    for e in report["epochs"]:
        cells = [f"{s['rows']:>16} {s['passes']:>6} {str(s['start']):>12}" for s in e["sources"]]
        lines.append(f"  {e['epoch']:>5} {e['steps']:>7}  " + "  ".join(cells))
    if report["workers"] > 1:
        lines.append(f"  {report['workers']} DataLoader workers per rank: each reads its own share of every source "
                     f"(one of world_size x {report['workers']} slots), so a rank reads each row it delivers once "
                     "(read_per_rank); [pass,row] counts a slot's rows")
    return "\n".join(lines)
