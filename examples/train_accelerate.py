"""Hugging Face accelerate over a balanced plan: ``prepare()`` hands our loaders back untouched.

    torchrun --nproc_per_node=2 examples/train_accelerate.py --plan PLAN_URL --epochs 2 --batch-size 32 \\
        [--loader make_loader|dataloader] [--save-at STEP --state-dir DIR] [--resume DIR]

Launch with torchrun (``accelerate launch --multi_gpu`` works too on GPUs; ``accelerate launch --cpu`` may start a
single process with no distributed environment). Build the loader after ``Accelerator()``: rank and world are
detected from the process group it starts.

The supported pattern: pass ``make_loader(...)`` or ``BalancedIterableDataset(...).dataloader(...)`` to
``accelerator.prepare`` (both come back as they are: accelerate must not re-shard rows that are already one
rank's), move batches to ``accelerator.device`` yourself, call ``loader.set_epoch(epoch)`` at the top of every
epoch, and ``accelerator.register_for_checkpointing(loader)`` so that ``save_state``/``load_state`` carry the
loader's position: a resumed run delivers exactly the batches that would have come next.

``--record DIR`` writes ``rank<R>.json`` (the ids of every batch, with its epoch) for the tests.
"""
from __future__ import annotations

import argparse
import json
import os
import warnings

import torch
from accelerate import Accelerator
from torch import nn

from petastorm_balanced import BalancedIterableDataset, make_loader

warnings.filterwarnings("ignore", category=FutureWarning)  # Petastorm on pyarrow 14 (legacy dataset API)
warnings.filterwarnings("ignore", category=DeprecationWarning)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--loader", choices=["make_loader", "dataloader"], default="make_loader")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (--loader dataloader)")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--save-at", type=int, default=0, help="save_state after this many steps")
    parser.add_argument("--state-dir")
    parser.add_argument("--resume", help="a folder written by accelerator.save_state")
    parser.add_argument("--record")
    args = parser.parse_args(argv)

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if args.loader == "make_loader":
        loader = make_loader(plan=args.plan, batch_size=args.batch_size, backend=args.backend)
    else:
        dataset = BalancedIterableDataset(args.plan, batch_size=args.batch_size, backend=args.backend)
        loader = dataset.dataloader(num_workers=args.workers)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader, "accelerate must hand our loader back untouched"
    accelerator.register_for_checkpointing(loader)
    if args.resume:
        accelerator.load_state(args.resume)

    seen, step = [], 0
    for epoch in range(loader.state_dict()["epoch"], args.epochs):  # the epoch of the next batch
        loader.set_epoch(epoch)  # keeps a position just loaded for this epoch
        for batch in loader:
            seen.append([epoch, batch["id"].tolist()])
            x = batch["value"].float().unsqueeze(1).to(accelerator.device)
            loss = nn.functional.mse_loss(model(x), torch.zeros_like(x))
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == args.save_at:
                accelerator.save_state(args.state_dir)
    print(f"[rank {accelerator.process_index}] {len(seen)} steps")
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        with open(os.path.join(args.record, f"rank{accelerator.process_index}.json"), "w") as out:
            json.dump({"seen": seen, "world": accelerator.num_processes}, out)
    accelerator.end_training()


if __name__ == "__main__":
    main()
