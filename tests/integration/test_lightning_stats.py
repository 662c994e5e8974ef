"""``InputStatsLogger``: at each training epoch's end a real Trainer logs the slowest rank and its limit."""
import logging
import sys

import pytest

pytest.importorskip("pytorch_lightning")
pytestmark = pytest.mark.slow  # Lightning alone takes seconds to import

from petastorm_balanced import datagen, plan_shards  # noqa: E402
from tests.support.jobs import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "examples"))  # the example's model


def test_the_callback_logs_every_epoch(tmp_path, caplog):
    from train_lightning import TinyModel

    from petastorm_balanced.lightning import BalancedDataModule, InputStatsLogger, pl
    info = datagen.make_plain_dataset(tmp_path / "ds", num_files=4, total_rows=2_000, seed=4)
    plan = plan_shards(info.url, 1, batch_size=64, engine="local")
    callback = InputStatsLogger()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         callbacks=[callback])
    with caplog.at_level(logging.INFO, logger="petastorm_balanced.stats"):
        trainer.fit(TinyModel(), datamodule=BalancedDataModule(plan, batch_size=64, backend="arrow",
                                                               padding_mask=True))
    lines = [r.getMessage() for r in caplog.records if r.name == "petastorm_balanced.stats"]
    assert len(lines) == 2 and all("slowest rank 0" in line for line in lines), lines
    report = callback.report
    assert report["epoch_index"] == 1 and report["ranks"][0]["batches"] == plan.steps_per_epoch(1)
    assert "input/wait_s" in trainer.callback_metrics
