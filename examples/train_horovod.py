"""Horovod over a balanced plan: the DDP example with ``hvd.rank()`` / ``hvd.size()`` and Horovod's optimizer.

    horovodrun -np 2 --gloo python examples/train_horovod.py --plan PLAN_URL --epochs 2 --batch-size 32

Horovod is optional (see ``docs/distributed.md`` for installing it). Every rank takes ``len(loader)`` steps, each
one an allreduce inside ``hvd.DistributedOptimizer``; after every epoch the ranks ``allgather`` their step counts
and ids, and every rank runs the same checks as ``train_ddp.py`` (equal steps, no id twice, fewer than
``world * batch_size`` matching rows left out). Any failure exits 1.

``--data-only`` runs the same data path without Horovod: rank and world come from ``World.detect()`` (which reads
``HOROVOD_RANK``/``HOROVOD_SIZE``, or ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` under ``mpirun``), each
rank reads its epochs with no collective and writes ``rank<R>.json`` (steps and ids per epoch) to ``--ids-out``
for a checker to compare. This is how the tests exercise the Horovod environment where Horovod is not installed.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

# The shared pieces of the DDP example (this folder is on sys.path when a script in it runs).
from train_ddp import (
    FEATURES,
    build_model,
    build_parser,
    check_epoch,
    log,
    parse_args,
    report,
    train_epoch,
    write_epoch,
)

from petastorm_balanced import World, load_plan, make_loader


def data_only(args) -> int:
    """Read every epoch as this rank would under Horovod, without Horovod: no model, no collective."""
    who = World.detect()
    plan = load_plan(args.plan)
    loader = make_loader(plan=plan, batch_size=args.batch_size, workers_count=args.workers,
                         schema_fields=["id"], padding_mask=True, backend=args.backend)  # rank/world detected too
    if (loader.rank, loader.world_size) != (who.rank, who.size):
        raise RuntimeError(f"make_loader detected rank {loader.rank}/{loader.world_size}, World.detect() "
                           f"{who.rank}/{who.size}")
    epochs = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        steps, ids, pads, _ = train_epoch(loader, None, None, "id", None)
        log(who.rank, f"epoch {epoch}: steps={steps} rows={len(ids)} (data only, world={who.size})")
        epochs.append({"epoch": epoch, "steps": steps, "ids": ids.tolist(), "padding": pads.tolist()})
    loader.close()
    if args.ids_out:
        os.makedirs(args.ids_out, exist_ok=True)
        with open(os.path.join(args.ids_out, f"rank{who.rank}.json"), "w") as out:
            json.dump({"rank": who.rank, "world": who.size, "batch_size": args.batch_size,
                       "steps_per_epoch": len(loader), "matching_rows": plan.total_rows, "policy": plan.policy,
                       "epochs": epochs}, out)
    return 0


def train(args) -> int:
    try:
        import horovod.torch as hvd
    except ImportError:
        sys.exit("train_horovod.py needs Horovod with PyTorch support; see docs/distributed.md to install it, "
                 "or run with --data-only")
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    plan = load_plan(args.plan)
    column, width = FEATURES[plan.catalog.kind]
    loader = make_loader(rank, world, plan=plan, batch_size=args.batch_size, workers_count=args.workers,
                         schema_fields=["id", column, "label"], padding_mask=True, backend=args.backend)
    device = torch.device("cpu")
    model = build_model(width, plan.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    log(rank, f"world={world} plan world_size={plan.world_size} policy={plan.policy} matching_rows="
              f"{plan.total_rows} batch_size={args.batch_size} steps_per_epoch={len(loader)} "
              f"reader={loader.backend} (horovod)")

    failed = []
    started = time.monotonic()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        steps, ids, pads, loss = train_epoch(loader, model, optimizer, column, device)
        log(rank, f"epoch {epoch}: steps={steps} rows={len(ids)} mean loss={loss:.4f}")
        gathered = hvd.allgather_object((steps, ids, pads))
        checks = check_epoch([g[0] for g in gathered], len(loader), [g[1] for g in gathered],
                             [g[2] for g in gathered], matching_rows=plan.total_rows, batch_size=args.batch_size,
                             policy=plan.policy)
        failed += report(rank, epoch, checks)
        if rank == 0 and args.ids_out:
            write_epoch(args.ids_out, epoch, len(loader), args.batch_size, gathered)
    elapsed = time.monotonic() - started
    loader.close()
    hvd.join()  # every rank is here before Horovod's background thread stops
    hvd.shutdown()
    if rank == 0:
        print(("ALL CHECKS PASSED" if not failed else f"CHECKS FAILED: {failed}")
              + f" ({args.epochs} epochs, world={world}, {elapsed:.1f} s, horovod)", flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = build_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--data-only", action="store_true",
                        help="no Horovod: read each rank's epochs (rank from HOROVOD_*/OMPI_* env) into --ids-out")
    args = parse_args(parser, argv)
    return data_only(args) if args.data_only else train(args)


if __name__ == "__main__":
    sys.exit(main())
