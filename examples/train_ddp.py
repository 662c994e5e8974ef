"""DistributedDataParallel over a balanced plan: every rank takes the same steps, and each epoch proves it.

    torchrun --nproc_per_node=2 examples/train_ddp.py --plan PLAN_URL --epochs 2 --batch-size 32 [--workers 2]

Rank and world size come from ``World.detect()`` (torchrun's RANK / WORLD_SIZE), so the same script serves any
world size, including one the plan was not made for (G9). The backend is nccl when CUDA is there, else gloo.

After every epoch the ranks ``all_gather`` their step counts and the ids they delivered, and rank 0 checks
- G1: every rank took exactly ``len(loader)`` steps of exactly ``batch_size`` rows;
- G2: no id was delivered twice (except rows flagged as padding) and fewer than ``world * batch_size`` of the
  plan's matching rows were left out (none with policy "pad").
Every rank judges the same gathered data, rank 0 prints ``CHECK ... OK|FAILED`` lines, and any failure exits 1
on every rank. A rank that
stops early cannot hide: the others time out in the next collective (``--pg-timeout`` seconds) and exit non-zero.

``--ids-out DIR`` makes rank 0 write ``epoch<E>.json`` (steps and ids of every rank) for tests to compare with
the dataset itself.

Elastic restart (G10): ``--checkpoint FILE --stop-after-steps N`` stops every rank after N steps of the first
epoch (a preemption), and rank 0 saves the loader state, the model and the count of rows consumed so far. A job
started with ``--checkpoint FILE --resume`` on any number of ranks continues that epoch with the rows no rank had
consumed, split evenly over its ranks (``len(loader)`` is the steps left), then trains whole epochs:

    torchrun --nproc_per_node=4 examples/train_ddp.py --plan P --batch-size 16 --checkpoint ck.pt --stop-after-steps 20
    torchrun --nproc_per_node=3 examples/train_ddp.py --plan P --batch-size 16 --checkpoint ck.pt --resume

Shutdown is ordered (see ``docs/distributed.md``): stop the loader's reader threads, drop the DDP wrapper,
barrier, then ``destroy_process_group``, so no rank tears its gloo connections down while a peer still talks; the
process then leaves with ``os._exit``, as a gloo thread may still be freeing tensors that need the interpreter.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from petastorm_balanced import World, load_plan, make_loader
from petastorm_balanced.tools.coverage import Check, coverage_check, steps_check

# Petastorm 0.12.1 on pyarrow 14 warns about the legacy dataset API on every reader; keep the log readable.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

# Columns the small model reads: an id to check coverage, a feature and a class label. Both datagen kinds have
# ``id`` and ``label``; plain Parquet has a scalar ``value``, Petastorm datasets a float32 (4,) ``vec``.
FEATURES = {"plain": ("value", 1), "petastorm": ("vec", 4)}
NUM_CLASSES = 10


def build_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every training example takes (train_horovod.py adds its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--plan", required=True, help="plan URL written by plan_shards / spark_jobs/plan_shards.py")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2, help="Petastorm reader threads per rank")
    parser.add_argument("--backend", choices=("auto", "arrow", "petastorm"), default="auto",
                        help="who reads the row groups (make_loader(backend=...)); batches are the same")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--pg-timeout", type=float, default=300.0,
                        help="seconds a collective may wait for a peer before the job fails")
    parser.add_argument("--ids-out", help="folder where rank 0 writes epoch<E>.json (steps and ids per rank)")
    parser.add_argument("--checkpoint", help="file rank 0 writes at --stop-after-steps and --resume reads")
    parser.add_argument("--stop-after-steps", type=int, help="stop after this many steps of the first epoch and "
                        "checkpoint (simulates a preemption); needs --checkpoint")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint, on any world size")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if (args.stop_after_steps is not None or args.resume) and not args.checkpoint:
        parser.error("--stop-after-steps and --resume need --checkpoint FILE")
    return args


def log(rank: int, message: str) -> None:
    say(f"[rank {rank}] {message}")


def say(line: str) -> None:
    """Write ``line`` whole, in one write: the ranks share stdout, and print's separate writes of the text and of
    the newline let another rank's line land in between (``...loss=2.3440[rank 0] epoch 0...``)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check_epoch(steps: list, expected_steps: int, ids: list, padding: list, *, matching_rows: int,
                batch_size: int, policy: str) -> list:
    """(name, ok, detail) for G1 and G2 over every rank's delivered ids of one epoch, judged by the package's one
    coverage checker. Pure: no collective."""
    world = len(steps)
    sizes = [[batch_size] * (len(i) // batch_size) + ([len(i) % batch_size] if len(i) % batch_size else [])
             for i in ids]
    checks = [Check("equal steps", all(s == expected_steps for s in steps),
                    f"steps per rank {steps}, len(loader)={expected_steps}"),
              steps_check(sizes, steps=expected_steps, batch_size=batch_size, name="full batches"),
              coverage_check(ids, padding, expected=matching_rows, policy=policy, global_batch=world * batch_size,
                             name="coverage")]
    return [(c.name, c.ok, c.detail) for c in checks]


def report(rank: int, epoch: int, checks: list) -> list:
    """Rank 0 prints every check; all ranks return the failed ones."""
    if rank == 0:
        for name, ok, detail in checks:
            say(f"CHECK epoch {epoch} {name}: {'OK' if ok else 'FAILED'} ({detail})")
    return [(epoch, name) for name, ok, _ in checks if not ok]


def write_epoch(folder: str, epoch: int, steps_per_epoch: int, batch_size: int, gathered: list) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"epoch{epoch}.json"), "w") as out:
        json.dump({"epoch": epoch, "world": len(gathered), "batch_size": batch_size,
                   "steps_per_epoch": steps_per_epoch, "steps": [g[0] for g in gathered],
                   "ids": [g[1].tolist() for g in gathered], "padding": [g[2].tolist() for g in gathered]}, out)


def build_model(width: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))


def features(batch: dict, column: str, device) -> tuple:
    x = batch[column].to(device=device, dtype=torch.float32).reshape(len(batch["id"]), -1)
    y = batch["label"].to(device=device, dtype=torch.int64) % NUM_CLASSES
    return x, y


def train_epoch(loader, model, optimizer, column: str, device, max_steps=None) -> tuple:
    """One epoch (or its first ``max_steps`` steps): (steps taken, ids delivered, their padding flags, mean loss).
    ``model``/``optimizer`` may be None to only read (the data path without a framework)."""
    steps, ids, pads, loss_sum = 0, [], [], 0.0
    for batch in loader:
        if model is not None:
            x, y = features(batch, column, device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
        ids.append(batch["id"].numpy().astype(np.int64))
        pads.append(batch["_padding"].numpy().astype(bool))
        steps += 1
        if steps == max_steps:  # stop right after a step: the loader counts every batch it handed out
            break
    ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    pads = np.concatenate(pads) if pads else np.zeros(0, bool)
    return steps, ids, pads, loss_sum / max(steps, 1)


def gather(obj, world: int) -> list:
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def main(argv=None) -> int:
    args = parse_args(build_parser(__doc__.split("\n\n")[0]), argv)
    who = World.detect()  # torchrun env before init; a missing environment is an error, never rank 0
    cuda = torch.cuda.is_available()
    if cuda:  # one GPU per rank: torchrun's LOCAL_RANK picks it
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", who.rank % torch.cuda.device_count())))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=who.rank, world_size=who.size,
                            timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank, world = who.rank, who.size

    plan = load_plan(args.plan)  # checked against the dataset once per rank (G7)
    column, width = FEATURES[plan.catalog.kind]
    loader = make_loader(rank, world, plan=plan, batch_size=args.batch_size, shuffle=True,
                         workers_count=args.workers, schema_fields=["id", column, "label"], padding_mask=True,
                         backend=args.backend)
    model = DistributedDataParallel(build_model(width, plan.seed).to(device),
                                    device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    log(rank, f"world={world} plan world_size={plan.world_size} policy={plan.policy} matching_rows="
              f"{plan.total_rows} batch_size={args.batch_size} steps_per_epoch={len(loader)} backend="
              f"{dist.get_backend()} reader={loader.backend}")

    failed = []
    first_epoch, consumed = 0, 0  # consumed: real rows of first_epoch delivered before a resume
    if args.resume:
        checkpoint = torch.load(args.checkpoint, map_location="cpu")
        loader.load_state_dict(checkpoint["loader"])  # saved at any world size: an elastic resume
        model.module.load_state_dict(checkpoint["model"])
        first_epoch, consumed = checkpoint["loader"]["epoch"], checkpoint["consumed_rows"]
        log(rank, f"resumed epoch {first_epoch} saved by {checkpoint['loader']['layout']['world_size']} ranks after "
                  f"{checkpoint['loader']['batches']} steps: {len(loader)} steps left on each of {world} ranks")
    started = time.monotonic()
    for epoch in range(first_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a loaded position in that epoch
        expected = len(loader)  # this epoch's steps (after a resume: the steps left)
        stop = args.stop_after_steps if epoch == first_epoch and not args.resume else None
        steps, ids, pads, loss = train_epoch(loader, model, optimizer, column, device, max_steps=stop)
        log(rank, f"epoch {epoch}: steps={steps} rows={len(ids)} mean loss={loss:.4f}")
        gathered = gather((steps, ids, pads), world)
        if rank == 0 and args.ids_out:
            write_epoch(args.ids_out, epoch, expected, args.batch_size, gathered)
        if stop is not None and stop < expected:
            if rank == 0:  # the loader state is the same on every rank
                rows = sum(int((~g[2]).sum()) for g in gathered)
                torch.save({"loader": loader.state_dict(), "model": model.module.state_dict(),
                            "consumed_rows": rows}, args.checkpoint)
                say(f"STOPPED after {stop} of {expected} steps of epoch {epoch}: checkpoint {args.checkpoint}")
            break
        # Every rank judges the same gathered data with the same pure function, so all agree on the exit code.
        checks = check_epoch([g[0] for g in gathered], expected, [g[1] for g in gathered],
                             [g[2] for g in gathered], matching_rows=plan.total_rows - consumed,
                             batch_size=args.batch_size, policy=plan.policy)
        consumed = 0
        failed += report(rank, epoch, checks)

    elapsed = time.monotonic() - started
    loader.close()  # join the reader threads before the process group goes away
    del model, optimizer
    dist.barrier()  # nobody tears down connections while a peer may still be sending
    dist.destroy_process_group()
    if rank == 0:
        say(("ALL CHECKS PASSED" if not failed else f"CHECKS FAILED: {failed}")
            + f" ({args.epochs} epochs, world={world}, {elapsed:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    # Leave without finalizing the interpreter: a gloo worker thread may still be dropping the last collective's
    # tensors, and one that asks for the GIL during finalization aborts a run that succeeded
    # (docs/distributed.md, "Clean shutdown").
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
