"""A torchrun (gloo) job for ``tests/integration/test_stats_distributed.py``: every rank reads its share, steps
in lockstep (an all-reduce per batch, as DDP does), then ``gather`` names the slowest rank; rank 0 writes the
report as JSON. Usage: ``torchrun --nproc_per_node=W stats_job.py PLAN_URL OUT.json``."""
import json
import os
import sys

import torch
import torch.distributed as dist

from petastorm_balanced import make_loader
from petastorm_balanced.stats import gather


def main(plan_url: str, out: str) -> None:
    dist.init_process_group("gloo")
    loader = make_loader(plan=plan_url, batch_format="numpy", workers_count=1, reshuffle="fixed")
    one = torch.ones(1)
    for _ in range(2):  # the second epoch's figures (the first also pays one-time start-up); "fixed": same shares
        for _ in loader:
            dist.all_reduce(one)  # the step's synchronization: a fast rank waits here for the slow one
    report = gather(loader)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    # Leave without finalizing the interpreter: a gloo worker thread may still be dropping the last collective's
    # tensors, and one that asks for the GIL during finalization aborts a run that succeeded
    # (docs/distributed.md, "Clean shutdown").
    main(*sys.argv[1:3])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
