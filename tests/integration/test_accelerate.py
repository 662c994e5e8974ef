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
from petastorm_balanced.tools.coverage import coverage_check, steps_check  # noqa: E402
from tests.support.jobs import ROOT, torchrun  # noqa: E402

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
            assert got == [b["id"].tolist() for b in LOADERS[kind](plan, rank, epoch)], "the rank's planned batches"
            delivered.append(got)
        g1 = steps_check([[len(b) for b in got] for got in delivered], steps=steps, batch_size=BATCH, name="G1")
        assert g1.ok, g1.detail  # every rank the planned steps: no second sharding
        g2 = coverage_check([np.array([i for b in got for i in b], dtype=np.int64) for got in delivered],
                            [np.zeros(sum(map(len, got)), bool) for got in delivered], expected=ids, policy="drop",
                            global_batch=2 * BATCH, name="G2")
        assert g2.ok, g2.detail

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


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dispatch", ["none", "false"])
def test_prepare_of_a_plain_dataloader_under_torchrun_is_refused_whatever_the_workers(data, workers, dispatch):
    """Two ranks under torchrun: accelerate either dispatches rank 0's batches to both ranks (rank 1's planned rows
    were never read: half the rows lost) or wraps the dataset in IterableDatasetShard. With DataLoader workers the
    dataset is iterated in other processes; it still finds accelerate (the forked worker's stack, or the stack at
    pickling for spawned ones) and refuses with the fix before a batch is delivered."""
    import subprocess
    import sys

    from tests.support.jobs import free_port, job_env
    root, plan, _ = data
    record = root / f"plain-{workers}-{dispatch}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(ROOT / "tests" / "support" / "accelerate_plain_job.py"),
           (root / "plan").as_uri(), str(record), str(BATCH), str(workers), dispatch]
    done = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode != 0, "the job must fail, not train on half the rows"
    records = [json.loads(p.read_text()) for p in sorted(record.glob("rank*.json"))]
    assert records, done.stderr[-3000:]
    for rec in records:  # every rank that iterated refused before its first batch
        assert rec["ids"] == [], rec
        if dispatch == "none" and rec["rank"] != 0:
            continue  # it waited for rank 0's broadcast; it may see the connection drop before torchrun ends it
        if (dispatch, rec["type"]) == ("false", "TypeError"):
            # IterableDatasetShard multiplies DataLoader(batch_size=None) by the world size and fails itself
            # before it iterates us: loud, if not ours
            assert "NoneType" in rec["error"], rec
            continue
        assert rec["type"] == "RuntimeError" and "ds.dataloader(num_workers=K)" in rec["error"], rec
    if dispatch == "none":
        assert any(r["rank"] == 0 for r in records)  # rank 0 reads for everyone in dispatch mode


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dispatched_plain_dataloader_with_workers_is_refused_in_process(data, context):
    """accelerate's DataLoaderDispatcher over DataLoader workers: forked workers see it on their inherited stack,
    spawned ones learn it from the stack at pickling."""
    import torch
    from accelerate import Accelerator
    root, plan, _ = data
    accelerator = Accelerator(cpu=True)  # dispatch_batches defaults to True for an IterableDataset
    dataset = BalancedIterableDataset(plan, 0, 2, batch_size=BATCH, backend="arrow")
    prepared = accelerator.prepare(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                                               multiprocessing_context=context))
    with pytest.raises(RuntimeError, match=r"DataLoaderDispatcher.*ds\.dataloader\(num_workers=K\)"):
        next(iter(prepared))
