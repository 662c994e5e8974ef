"""PyTorch Lightning with BalancedDataModule: real Trainer(strategy="ddp") jobs, 2 CPU ranks (gloo, torchrun).

One uninterrupted run writes checkpoints every few steps (mid-epoch) and at every epoch end. Checked against the
plan and against that run:
- every rank takes the same steps, and Lightning epoch e delivers exactly make_loader(rank, 2, plan, epoch=e);
- resuming from a mid-epoch and from an end-of-epoch checkpoint delivers exactly the batches the uninterrupted run
  delivered after that point (no batch replayed, none skipped);
- every validation (policy "pad", padding flagged) sees each row of the dataset exactly once over all ranks.
"""
import json
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pytorch_lightning", reason="PyTorch Lightning is not installed (requirements/frameworks.txt)")
pytestmark = pytest.mark.slow  # Lightning alone takes seconds to import; each job about 25 s

from petastorm_balanced import datagen, make_loader, plan_shards  # noqa: E402
from tests.support.jobs import ROOT, torchrun  # noqa: E402

BATCH = 64
EPOCHS = 3
EVERY = 7  # steps between mid-epoch checkpoints
SCRIPT = ROOT / "examples" / "train_lightning.py"
sys.path.insert(0, str(SCRIPT.parent))  # the example's model, for the in-process test
LOADER = dict(batch_size=BATCH, padding_mask=True, backend="arrow")  # what the example passes to make_loader


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The dataset, both plans, and the uninterrupted run (its records and checkpoints)."""
    root = tmp_path_factory.mktemp("lightning")
    info = datagen.make_plain_dataset(root / "ds", num_files=6, total_rows=3_000, seed=4, empty_files=1)
    plan = plan_shards(info.url, 2, batch_size=BATCH, seed=3, engine="local", output_url=(root / "plan").as_uri())
    plan_shards(info.url, 2, batch_size=BATCH, policy="pad", engine="local", output_url=(root / "val").as_uri())
    common = ["--plan", (root / "plan").as_uri(), "--val-plan", (root / "val").as_uri(), "--epochs", EPOCHS,
              "--batch-size", BATCH, "--backend", "arrow"]
    torchrun(2, SCRIPT, *common, "--ckpt-dir", root / "ckpt", "--every-n-steps", EVERY, "--record", root / "full")
    ids = np.sort(pq.read_table(info.path, columns=["id"]).column("id").to_numpy())
    return {"root": root, "plan": plan, "common": common, "ids": ids, "full": records(root / "full")}


def records(folder):
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_lightning_epochs_are_the_planned_epochs(job):
    steps = job["plan"].steps_per_epoch(2, BATCH)
    for rank, record in enumerate(job["full"]):
        assert record["world"] == 2
        assert len(record["seen"]) == EPOCHS * steps, "every rank takes the same steps"
        for epoch in range(EPOCHS):
            got = [ids for e, _, ids in record["seen"] if e == epoch]
            planned = [b["id"].tolist() for b in make_loader(rank, 2, plan=job["plan"], epoch=epoch, **LOADER)]
            assert got == planned, f"Lightning epoch {epoch} of rank {rank} is make_loader(epoch={epoch})"


def test_lightning_validation_sees_every_row_once(job):
    runs = [record["validation_ids"] for record in job["full"]]
    assert len(runs[0]) == EPOCHS
    for run in range(EPOCHS):
        seen = np.sort(np.concatenate([runs[rank][run] for rank in range(2)]))
        assert np.array_equal(seen, job["ids"]), "pad policy + padding mask: every row counted exactly once"
    for total, count in job["full"][0]["validations"]:
        assert (total, count) == (float(job["ids"].sum()), len(job["ids"]))


@pytest.mark.parametrize("checkpoint", ["mid-epoch=1-step=35", "end-epoch=0-step=23"])
def test_lightning_resume_delivers_what_the_uninterrupted_run_did(job, checkpoint):
    steps = job["plan"].steps_per_epoch(2, BATCH)
    step = int(checkpoint.rsplit("=", 1)[1])
    assert steps == 23, "the checkpoint names assume 23 steps per epoch"
    out = job["root"] / f"resumed-{checkpoint}"
    torchrun(2, SCRIPT, *job["common"], "--resume", job["root"] / "ckpt" / f"{checkpoint}.ckpt", "--record", out)
    for full, resumed in zip(job["full"], records(out), strict=True):
        assert resumed["seen"] == full["seen"][step:], "after resuming: exactly the batches that came next"
        assert [e for e, _, _ in resumed["seen"][:1]] == [step // steps]


@pytest.mark.parametrize("direct", ["make_loader", "dataloader"])
def test_loaders_handed_to_trainer_fit_directly(job, direct):
    """No DataModule: Lightning tells our loaders the epoch through loader.sampler.set_epoch; an end-of-epoch
    resume (where Lightning restores no loader state) serves the next epoch, not epoch 0 again."""
    root, steps = job["root"], job["plan"].steps_per_epoch(2, BATCH)
    common = ["--plan", (root / "plan").as_uri(), "--epochs", EPOCHS, "--batch-size", BATCH, "--backend", "arrow",
              "--direct", direct]
    torchrun(2, SCRIPT, *common, "--ckpt-dir", root / f"ckpt-{direct}", "--record", root / f"full-{direct}")
    full = records(root / f"full-{direct}")
    if direct == "make_loader":  # the same batches as through the DataModule
        assert [r["seen"] for r in full] == [r["seen"] for r in job["full"]]
    for record in full:
        epochs = [[ids for e, _, ids in record["seen"] if e == epoch] for epoch in range(EPOCHS)]
        assert all(len(batches) == steps for batches in epochs) and epochs[0] != epochs[1]
    out = root / f"resumed-{direct}"
    torchrun(2, SCRIPT, *common, "--resume", root / f"ckpt-{direct}" / f"end-epoch=0-step={steps}.ckpt",
             "--record", out)
    for before, after in zip(full, records(out), strict=True):
        assert after["seen"] == before["seen"][steps:], "an end-of-epoch resume continues with the next epoch"


@pytest.mark.parametrize("name", ["rank", "world", "epoch"])
def test_datamodule_refuses_what_lightning_decides(name):
    from petastorm_balanced.lightning import BalancedDataModule
    with pytest.raises(ValueError, match=f"{name}=3 is not accepted"):
        BalancedDataModule("file:///nowhere", batch_size=4, **{name: 3})


def test_datamodule_in_one_process_without_validation(job, tmp_path):
    """devices=1 in this process: rank 0 of 1 from the trainer, no val_plan, every epoch the planned one."""
    from train_lightning import TinyModel

    from petastorm_balanced.lightning import BalancedDataModule, pl
    data = BalancedDataModule(job["plan"], batch_size=BATCH, backend="arrow", padding_mask=True)
    model = TinyModel()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=data)
    for epoch in range(2):
        planned = [b["id"].tolist() for b in make_loader(0, 1, plan=job["plan"], epoch=epoch, **LOADER)]
        assert [ids for e, _, ids in model.seen if e == epoch] == planned
    assert model.validations == []
