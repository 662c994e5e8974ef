"""A torchrun job over a pickled BalancedConverter (as a driver would hand it to its workers): DDP on gloo, a tiny
model, EPOCHS epochs; rank 0 writes every rank's delivered ids and batch sizes per epoch to OUT/epoch<e>.json.

Usage: torchrun --nproc_per_node=N tests/support/converter_train.py CONVERTER_PICKLE OUT EPOCHS BATCH
"""
import json
import os
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(converter_path: str, out: str, epochs: int, batch: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(converter_path, "rb") as handle:
        converter = pickle.load(handle)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with converter.make_torch_dataloader(batch_size=batch) as loader:  # rank and world from torch.distributed
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            ids, sizes = [], []
            for step in loader:
                features = torch.stack([step["x"], step["arr"][:, 0], step["arr"][:, 1]], dim=1)
                loss = model(features).pow(2).mean()  # every rank must take this step: DDP's all-reduce
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                ids.extend(step["id"].tolist())
                sizes.append(len(step["id"]))
            gathered = [None] * world
            dist.all_gather_object(gathered, {"ids": ids, "sizes": sizes, "len": len(loader)})
            if rank == 0:
                Path(out).mkdir(parents=True, exist_ok=True)
                Path(out, f"epoch{epoch}.json").write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # Leave without finalizing the interpreter: a gloo worker thread may still be dropping the last collective's
    # tensors, and one that asks for the GIL during finalization aborts a run that succeeded
    # (docs/distributed.md, "Clean shutdown").
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
