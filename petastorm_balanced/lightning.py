"""``BalancedDataModule``: balanced loaders for PyTorch Lightning, with Lightning's epoch in charge.

Importing this module imports Lightning (``pytorch_lightning``, or ``lightning.pytorch`` when only that is
installed or already imported); the rest of the package never does.

What Lightning does with an iterable, and why each step stays exact here:

- it calls ``iter()`` once to probe any loader that is not a ``DataLoader``, and creates each epoch's iterator
  before telling the epoch: our iterations take their position at the first ``next()``, so neither shifts anything
  (``reading.position.Position``);
- it tells the epoch only through ``loader.sampler.set_epoch(e)``: our loaders' ``sampler.set_epoch`` is their
  ``set_epoch``, so Lightning epoch ``e`` is ``make_loader(..., epoch=e)`` even after resuming from an end-of-epoch
  checkpoint (for which Lightning restores no loader state). The same holds for ``make_loader(...)`` or
  ``ds.dataloader(...)`` handed to ``Trainer.fit`` directly; the DataModule adds rank and world from the trainer
  and a validation loader;
- mid-epoch it saves and restores the loader through ``state_dict``/``load_state_dict``, and then calls
  ``set_epoch(e)``, which keeps a position just loaded for epoch ``e``.

GPU feeding: ``BalancedDataModule(plan, pin_memory=True, device="trainer")`` gives each rank's loaders
``device=trainer.strategy.root_device`` (its own GPU under DDP), so batches are pinned and copied ahead on a side
CUDA stream (``reading/formats/device.py``); Lightning's own transfer then finds them on the device already.

Input statistics: ``Trainer(callbacks=[InputStatsLogger()])`` gathers every rank's ``loader.stats()`` at each
training epoch's end (``petastorm_balanced.stats.gather``), logs the slowest rank and its limiting stage, and puts
``input/wait_s``, ``input/slowest_rank`` and ``input/spread`` in the module's logged metrics (docs/stats.md).

Validation serves epoch 0 of ``val_plan`` at every validation run (the rows of every epoch are the same; a fixed
epoch makes runs comparable). Plan it with ``policy="pad"`` and pass ``padding_mask=True`` for exact metrics: every
row is delivered once, and the repeated rows are flagged in ``batch["_padding"]``.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from .errors import InvalidValueError, MissingDependencyError
from .plan.model import ShardPlan
from .reading.front.loader import BalancedLoader, make_loader


def _lightning_module() -> Any:
    if "lightning.pytorch" in sys.modules and "pytorch_lightning" not in sys.modules:
        return sys.modules["lightning.pytorch"]
    try:
        import pytorch_lightning
        return pytorch_lightning
    except ImportError:
        pass
    try:
        import lightning.pytorch
        return lightning.pytorch
    except ImportError:
        raise MissingDependencyError("petastorm_balanced.lightning needs PyTorch Lightning: pip install "
                                     "pytorch-lightning (see requirements/frameworks.txt for the tested version)"
                                     ) from None


pl: Any = _lightning_module()  # pytorch_lightning or lightning.pytorch, whichever is installed

TRAINER_DEVICE = "trainer"  # device="trainer": the trainer's root device, resolved per rank

# Arguments the DataModule owns: Lightning decides them.
OWNED = {
    "rank": "the trainer's global_rank is used",
    "world": "the trainer's world_size is used",
    "epoch": "Lightning's epoch is passed on every epoch (Lightning epoch e is make_loader(..., epoch=e))",
}


class BalancedDataModule(pl.LightningDataModule):
    """``make_loader(rank, world, plan=plan, batch_size=batch_size, **make_loader_kwargs)`` for training (and
    ``plan=val_plan`` for validation), with rank and world from the trainer and the epoch from Lightning.

    Every rank takes the same steps; checkpoints (mid-epoch or at the end of an epoch) resume exactly. The loaders
    are built in ``train_dataloader()``/``val_dataloader()``, when the trainer's processes exist.
    """

    def __init__(self, plan: ShardPlan | str, *, batch_size: int | None = None, val_plan: ShardPlan | str | None = None,
                 **make_loader_kwargs: Any):
        super().__init__()
        for name, why in OWNED.items():
            if name in make_loader_kwargs:
                raise InvalidValueError(f"{name}={make_loader_kwargs[name]!r} is not accepted by BalancedDataModule: "
                                        f"{why}")
        self.plan, self.val_plan, self.batch_size = plan, val_plan, batch_size
        self.make_loader_kwargs = dict(make_loader_kwargs)

    def _loader(self, plan: ShardPlan | str) -> BalancedLoader:
        trainer = self.trainer
        rank, world = (None, None) if trainer is None else (trainer.global_rank, trainer.world_size)
        kwargs = dict(self.make_loader_kwargs)
        if isinstance(kwargs.get("device"), str) and kwargs["device"] == TRAINER_DEVICE:
            if trainer is None:
                raise InvalidValueError(f"device={TRAINER_DEVICE!r} needs the DataModule attached to a Trainer "
                                        "(Trainer.fit(model, datamodule=...)); or pass the device itself")
            kwargs["device"] = trainer.strategy.root_device
        return make_loader(rank, world, plan=plan, batch_size=self.batch_size, **kwargs)

    def train_dataloader(self) -> BalancedLoader:
        return self._loader(self.plan)  # its sampler.set_epoch is its set_epoch: Lightning's epoch reaches it

    def val_dataloader(self) -> FixedEpochLoader | list:
        if self.val_plan is None:
            return []  # Lightning runs no validation for an empty list
        return FixedEpochLoader(self._loader(self.val_plan), epoch=0)


class FixedEpochLoader:
    """The same epoch at every ``iter()`` (validation); no state is saved, since every run starts afresh."""

    def __init__(self, loader: BalancedLoader, epoch: int):
        self.loader, self.epoch = loader, epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.loader.set_epoch(self.epoch)  # also restarts a run Lightning abandoned (sanity check, limits)
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class InputStatsLogger(pl.Callback):
    """At each training epoch's end, every rank's input-pipeline statistics gathered (a collective: the callback
    runs on every rank), the slowest rank and its limit logged, and a few figures logged as metrics.
    ``folder``: where ranks exchange files without torch.distributed (``stats.gather``); ``report``: the last one."""

    def __init__(self, folder: str | None = None):
        super().__init__()
        self.folder = folder
        self.report: dict | None = None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        from .stats import gather
        loader = _with_stats(getattr(trainer, "train_dataloader", None))
        if loader is None:
            return
        report = self.report = gather(loader, folder=self.folder)
        pl_module.log_dict({"input/wait_s": float(report["wait_s"][report["slowest_rank"]]),
                            "input/slowest_rank": float(report["slowest_rank"]),
                            "input/spread": float(report["spread"])}, rank_zero_only=True)


def _with_stats(loader: Any) -> Any:
    """Our loader inside what the trainer holds (the loader itself, a FixedEpochLoader, a DataLoader over our
    dataset, a CombinedLoader's iterables), or None."""
    for inner in (loader, getattr(loader, "loader", None), getattr(loader, "dataset", None)):
        if inner is not None and callable(getattr(inner, "stats", None)):
            return inner
    iterables = getattr(loader, "iterables", None)
    if isinstance(iterables, dict):
        iterables = list(iterables.values())
    if isinstance(iterables, (list, tuple)):
        for item in iterables:
            found = _with_stats(item)
            if found is not None:
                return found
    return None
