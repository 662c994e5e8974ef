"""PyTorch Lightning over a balanced plan: ``BalancedDataModule`` with ``Trainer(strategy="ddp")``.

    torchrun --nproc_per_node=2 examples/train_lightning.py --plan PLAN_URL --val-plan VAL_PLAN_URL \\
        --epochs 3 --batch-size 32 --ckpt-dir out/ckpt [--every-n-steps 5] [--resume out/ckpt/X.ckpt]

Launch with torchrun: Lightning then joins torchrun's processes (on CPU the gloo backend) instead of re-running
the script itself. Every rank takes the same steps; Lightning epoch ``e`` is ``make_loader(rank, world,
plan=..., epoch=e)``; checkpoints taken every ``--every-n-steps`` steps (mid-epoch) and at the end of every epoch
resume exactly with ``--resume``. Validation runs over ``--val-plan`` (plan it with ``policy="pad"``): the loss is
weighted by ``~batch["_padding"]`` and summed over ranks, so the metric counts every row exactly once.

``--direct make_loader|dataloader`` hands a loader to ``Trainer.fit`` without the DataModule (no validation): our
loaders' ``sampler.set_epoch`` is how Lightning tells them the epoch, so this is exact too.

``--record DIR`` writes ``rank<R>.json`` per rank (the ids of every training batch by epoch and batch index, and
each validation's real ids, and their sum and count over all ranks) for the tests to compare with an
uninterrupted run and with the plan.
"""
from __future__ import annotations

import argparse
import json
import os
import warnings

import torch
from torch import nn

from petastorm_balanced import BalancedIterableDataset, make_loader
from petastorm_balanced.lightning import BalancedDataModule, pl

warnings.filterwarnings("ignore", category=FutureWarning)  # Petastorm on pyarrow 14 (legacy dataset API)
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", ".*does not have many workers.*")  # our loaders read with their own threads


class TinyModel(pl.LightningModule):
    """A linear model on the ``value`` column; it records what it sees so runs can be compared."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.lr = lr
        self.seen = []  # [epoch, batch index, ids] of every training batch
        self.validations = []  # [sum of ids, count] of every validation run (all ranks together)
        self.validation_ids = []  # this rank's real (not padding) ids of every validation run
        self._val, self._val_ids = None, None

    def training_step(self, batch, batch_idx):
        self.seen.append([self.current_epoch, batch_idx, batch["id"].tolist()])
        x = batch["value"].float().unsqueeze(1)
        return nn.functional.mse_loss(self.layer(x), torch.zeros_like(x))

    def on_validation_epoch_start(self):
        self._val, self._val_ids = torch.zeros(2, dtype=torch.float64), []

    def validation_step(self, batch, batch_idx):
        real = ~batch["_padding"]  # rows repeated by policy "pad" are flagged: they count for nothing
        self._val += torch.stack([batch["id"][real].double().sum(), real.double().sum()])
        self._val_ids.extend(batch["id"][real].tolist())
        x = batch["value"].float().unsqueeze(1)
        losses = nn.functional.mse_loss(self.layer(x), torch.zeros_like(x), reduction="none").squeeze(1)
        self.log("val_loss", (losses * real).sum() / real.sum().clamp(min=1), sync_dist=True,
                 batch_size=len(real))

    def on_validation_epoch_end(self):
        total = self.all_gather(self._val).reshape(-1, 2).sum(0)
        if not self.trainer.sanity_checking:  # the sanity check reads only a few batches
            self.validations.append([float(total[0]), int(total[1])])
            self.validation_ids.append(self._val_ids)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--val-plan")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2, help="reader threads per rank")
    parser.add_argument("--backend", default="auto", help="reading backend: auto, arrow or petastorm")
    parser.add_argument("--ckpt-dir", help="write checkpoints here: every --every-n-steps and every epoch end")
    parser.add_argument("--every-n-steps", type=int, default=0)
    parser.add_argument("--resume", help="a checkpoint written by a previous run")
    parser.add_argument("--record", help="write rank<R>.json here (what every rank saw)")
    parser.add_argument("--direct", choices=["make_loader", "dataloader"],
                        help="no DataModule: hand make_loader(...) or ds.dataloader(num_workers=2) to Trainer.fit")
    args = parser.parse_args(argv)

    if args.direct == "make_loader":  # rank and world from torchrun's environment
        data = {"train_dataloaders": make_loader(plan=args.plan, batch_size=args.batch_size, backend=args.backend,
                                                 workers_count=args.workers, padding_mask=True)}
    elif args.direct == "dataloader":
        dataset = BalancedIterableDataset(args.plan, batch_size=args.batch_size, backend=args.backend,
                                          padding_mask=True)
        data = {"train_dataloaders": dataset.dataloader(num_workers=2)}
    else:
        data = {"datamodule": BalancedDataModule(args.plan, val_plan=args.val_plan, batch_size=args.batch_size,
                                                 workers_count=args.workers, backend=args.backend,
                                                 padding_mask=True)}
    callbacks = []
    if args.ckpt_dir:
        if args.every_n_steps:
            callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.ckpt_dir, filename="mid-{epoch}-{step}",
                                                          every_n_train_steps=args.every_n_steps, save_top_k=-1))
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.ckpt_dir, filename="end-{epoch}-{step}",
                                                      every_n_epochs=1, save_on_train_epoch_end=True, save_top_k=-1))
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), strategy="ddp",
                         max_epochs=args.epochs, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=2, enable_checkpointing=bool(callbacks),
                         default_root_dir=args.ckpt_dir or None)
    model = TinyModel()
    trainer.fit(model, **data, ckpt_path=args.resume)
    rank = trainer.global_rank
    print(f"[rank {rank}] {len(model.seen)} training steps, validations (id sum, rows): {model.validations}")
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        with open(os.path.join(args.record, f"rank{rank}.json"), "w") as out:
            json.dump({"seen": model.seen, "validations": model.validations,
                       "validation_ids": model.validation_ids, "world": trainer.world_size}, out)


if __name__ == "__main__":
    main()
