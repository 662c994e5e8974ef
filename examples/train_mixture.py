"""DDP training on a mixture of datasets: every batch holds each source's share, every rank the same steps.

    torchrun --nproc_per_node=2 examples/train_mixture.py --plans PLAN_A PLAN_B PLAN_C --weights 0.5,0.3,0.2 \\
        --batch-size 32 --epochs 2 [--epoch-steps S] [--checkpoint FILE --stop-after-steps N] [--resume]

The loader is ``make_loader(plan=[...], weights=[...])``: each batch holds ``floor`` or ``ceil`` of ``weight x
batch_size`` rows of each source (``batch["_source"]`` says which), and each source is read in passes over its own
rows, continuing across epochs where it stopped. The default epoch ends when the scarcest source (rows / weight)
completes a pass; ``--epoch-steps`` sets the length instead.

``--checkpoint FILE --stop-after-steps N`` saves the model and ``loader.state_dict()`` (rank 0; the state is the
same on every rank) after N steps and stops; ``--resume`` loads them and continues with exactly the batches that
would have come next. ``--weights`` may differ on resume (a curriculum): each source continues where it stood.
The resumed job may run on another number of ranks (an elastic resume): each source continues its pass with the
rows no old rank delivered, split evenly over the new ranks.
``--record DIR`` writes ``rank<R>.json``: every batch's epoch, sources and ids, for the tests.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn

from petastorm_balanced import make_loader

warnings.filterwarnings("ignore", category=FutureWarning)  # Petastorm on pyarrow 14 (legacy dataset API)
warnings.filterwarnings("ignore", category=DeprecationWarning)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", nargs="+", required=True)
    parser.add_argument("--weights", required=True, help="comma-separated, one per plan: 0.5,0.3,0.2")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--epoch-steps", type=int, default=None)
    parser.add_argument("--checkpoint")
    parser.add_argument("--stop-after-steps", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--record")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = [float(w) for w in args.weights.split(",")]
    loader = make_loader(plan=args.plans, weights=weights, batch_size=args.batch_size, epoch_steps=args.epoch_steps,
                         schema_fields=["id", "value", "label"])  # rank and world from torch.distributed
    model = nn.parallel.DistributedDataParallel(nn.Linear(1, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.resume:
        saved = torch.load(args.checkpoint, weights_only=False)
        model.module.load_state_dict(saved["model"])
        loader.load_state_dict(saved["loader"])
    steps, records = 0, []
    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed position in that epoch
        epoch_steps = len(loader)
        for batch in loader:
            loss = nn.functional.cross_entropy(model(batch["value"].float()[:, None]), batch["label"].long())
            optimizer.zero_grad()
            loss.backward()  # every rank reaches every step: DDP's all-reduce never waits for a rank that ran out
            optimizer.step()
            steps += 1
            records.append({"epoch": epoch, "source": batch["_source"].tolist(), "id": batch["id"].tolist()})
            if args.stop_after_steps is not None and steps == args.stop_after_steps:
                if rank == 0:
                    torch.save({"model": model.module.state_dict(), "loader": loader.state_dict()}, args.checkpoint)
                _finish(args, rank, records)
                return
        taken = torch.tensor([steps])
        gathered = [torch.zeros_like(taken) for _ in range(world)]
        dist.all_gather(gathered, taken)
        assert len({int(t) for t in gathered}) == 1, f"ranks took different steps: {gathered}"
        if rank == 0:
            print(f"epoch {epoch}: {epoch_steps} steps on each of {world} ranks; sources at "
                  f"{loader.state_dict()['mixture']['sources']} ([pass, row] per rank)", flush=True)
    _finish(args, rank, records)


def _finish(args, rank, records) -> None:
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        with open(os.path.join(args.record, f"rank{rank}.json"), "w") as out:
            json.dump(records, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # Leave without finalizing the interpreter: a gloo worker thread may still be dropping the last collective's
    # tensors, and one that asks for the GIL during finalization aborts a run that succeeded
    # (docs/distributed.md, "Clean shutdown").
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
