"""A torchrun job for tests/integration/test_accelerate.py: ``accelerator.prepare()`` of a plain ``DataLoader`` over a
``BalancedIterableDataset`` (the unsupported pattern). Each rank records the ids it got, or the error it raised,
in ``RECORD/rank{R}.json``; a rank that raised exits 3 so torchrun ends the job (a dispatching rank 0 that fails
leaves the others waiting for its broadcast).

    torchrun --nproc_per_node=2 tests/support/accelerate_plain_job.py PLAN RECORD BATCH WORKERS DISPATCH(none|false)
"""
import json
import os
import sys
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

from petastorm_balanced import BalancedIterableDataset


def main(plan, record, batch, workers, dispatch):
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        dispatch_batches=None if dispatch == "none" else False))
    dataset = BalancedIterableDataset(plan, batch_size=int(batch), backend="arrow")
    prepared = accelerator.prepare(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=int(workers)))
    out = {"rank": accelerator.process_index, "ids": [], "error": None, "type": None}
    try:
        for batch_ in prepared:
            out["ids"].extend(batch_["id"].tolist())
    except Exception as exc:  # noqa: BLE001 - recorded for the test, which says which errors are right
        out["error"], out["type"] = str(exc), type(exc).__name__
    os.makedirs(record, exist_ok=True)
    # written whole, then renamed: another rank counts the files to know when to end the job, and must not end it
    # while this one is half-written (torchrun would kill this rank with an empty file)
    path = os.path.join(record, f"rank{accelerator.process_index}.json")
    with open(path + ".part", "w") as handle:
        json.dump(out, handle)
    os.replace(path + ".part", path)
    if out["error"] is not None:
        # Before ending the job, give the other ranks up to 30 s to record theirs: a rank that fails first (rank 1
        # seeing the broadcast connection drop) must not make torchrun kill rank 0 before rank 0 has recorded.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len([n for n in os.listdir(record) if n.endswith(".json")]) < \
                accelerator.num_processes:
            time.sleep(0.2)
        sys.stdout.flush()
        os._exit(3)


if __name__ == "__main__":
    main(*sys.argv[1:])
