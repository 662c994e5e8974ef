"""Hugging Face accelerate: prepare() gives back our loaders untouched, or our dataset refuses to be re-sharded.

Real ``Accelerator`` jobs over torchrun (2 CPU ranks, gloo) for ``make_loader`` and for ``ds.dataloader()`` with
DataLoader workers, compared with the plan (every rank's epoch e is exactly its planned epoch, so no row is lost
to a second sharding) and with an uninterrupted run (``save_state``/``load_state`` with
``register_for_checkpointing(loader)`` resumes exactly). A plain ``DataLoader`` over the dataset, which accelerate
would rebuild and shard again, raises with the fix instead.
"""
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("accelerate", reason="accelerate is not installed (requirements/frameworks.txt)")
pytestmark = pytest.mark.slow  # real jobs; accelerate alone takes seconds to import

from petastorm_balanced import BalancedIterableDataset, datagen, make_loader, plan_shards  # noqa: E402
from jobs import ROOT, torchrun  # noqa: E402

BATCH = 64
EPOCHS = 3
SAVE_AT = 30  # steps: inside the second epoch
SCRIPT = ROOT / "examples" / "train_accelerate.py"
LOADERS = {"make_loader": lambda plan, rank, epoch: make_loader(rank, 2, plan=plan, batch_size=BATCH, epoch=epoch,
                                                                backend="arrow"),
           "dataloader": lambda plan, rank, epoch: BalancedIterableDataset(
               plan, rank, 2, batch_size=BATCH, epoch=epoch, backend="arrow").dataloader(num_workers=2)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("accelerate")
    info = datagen.make_plain_dataset(root / "ds", num_files=6, total_rows=3_000, seed=4, empty_files=1)
    plan = plan_shards(info.url, 2, batch_size=BATCH, seed=3, engine="local", output_url=(root / "plan").as_uri())
    ids = np.sort(pq.read_table(info.path, columns=["id"]).column("id").to_numpy())
    return root, plan, ids


def run(root, kind, name, *extra):
    out = root / f"{kind}-{name}"
    torchrun(2, SCRIPT, "--plan", (root / "plan").as_uri(), "--epochs", EPOCHS, "--batch-size", BATCH,
             "--loader", kind, "--workers", 2, "--backend", "arrow", "--record", out, *extra)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_prepared_loader_is_exact_and_resumes(data, kind):
    root, plan, ids = data
    steps = plan.steps_per_epoch(2, BATCH)
    full = run(root, kind, "full", "--save-at", SAVE_AT, "--state-dir", root / f"{kind}-state")
    for epoch in range(EPOCHS):
        delivered = []
        for rank, record in enumerate(full):
            got = [batch for e, batch in record["seen"] if e == epoch]
            assert len(got) == steps, "every rank takes the planned steps (no second sharding)"
            assert got == [b["id"].tolist() for b in LOADERS[kind](plan, rank, epoch)], "the rank's planned batches"
            delivered.extend(i for batch in got for i in batch)
        assert len(set(delivered)) == len(delivered), "no row twice"
        assert len(ids) - len(delivered) < 2 * BATCH, "policy drop leaves out fewer than world x batch rows"

    resumed = run(root, kind, "resumed", "--resume", root / f"{kind}-state")
    for rank in range(2):
        assert resumed[rank]["seen"] == full[rank]["seen"][SAVE_AT:], "load_state resumes at the next batch"


@pytest.mark.parametrize("dispatch", [None, False])
def test_plain_dataloader_over_the_dataset_is_refused(data, dispatch):
    """accelerate rebuilds a plain DataLoader (dispatching or sharding it again): the dataset says what to do."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    root, plan, _ = data
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    dataset = BalancedIterableDataset(plan, 0, 2, batch_size=BATCH, backend="arrow")
    prepared = accelerator.prepare(torch.utils.data.DataLoader(dataset, batch_size=None))
    with pytest.raises(RuntimeError, match=r"re-shards.*ds\.dataloader\(num_workers=K\)"):
        next(iter(prepared))
    loader = dataset.dataloader()
    assert accelerator.prepare(loader) is loader
