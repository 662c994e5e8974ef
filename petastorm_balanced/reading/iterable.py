"""``BalancedIterableDataset`` for ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=K)``.

Each DataLoader worker is a slot of the plan (``plan.assignment(rank, num_workers=K)``): it reads only its own
fragments, in its own process, and yields whole batches. The DataLoader takes batches from its workers round
robin, worker 0 first, and a worker that runs out is skipped; the balancer gives the first ``steps % K`` slots one
batch more than the others, so the rank's batch ``j`` is always batch ``j // K`` of slot ``j % K`` and the total is
``steps_per_epoch`` for any ``K``.

Resuming after ``k`` batches: the DataLoader starts again with worker 0, so worker ``w`` plays slot ``(w + k) % K``
and skips that slot's first ``(k + w) // K`` batches; the round robin then continues exactly at batch ``k``.

The DataLoader's main process never sees the dataset iterate, so only it can count delivered batches:
``ds.dataloader(num_workers=K)`` (a ``BalancedDataLoader``, a real ``DataLoader``) counts them, advances the
epoch on every new ``iter()`` and makes ``state_dict()`` exact. With a plain ``DataLoader`` call
``ds.set_epoch(e)`` before every epoch, as with ``DistributedSampler``.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import stream
from .arrow_backend import arrow_chunks
from .options import resolve_backend
from .batching import split_batches
from .fragments import as_list
from .position import PlannedView, Position, Settings
from .tensors import require_torch, to_torch, torch, torch_batches
from ..world import resolve_world

_Base = torch.utils.data.IterableDataset if torch is not None else object


class BalancedIterableDataset(PlannedView, _Base):
    """Batches of rank ``rank`` (default: ``World.detect()``), split over the DataLoader's workers.

    Pass it to ``DataLoader(ds, batch_size=None, num_workers=K)`` or use ``ds.dataloader(num_workers=K)``.
    Iterated directly (or with ``num_workers=0``) it is a single slot and gives the same batches as
    ``make_loader(..., shuffle_window=...)`` with the same settings.
    """

    # state_dict keys
    EPOCH, BATCHES, IDENTITY_KEYS = Position.EPOCH, Position.BATCHES, Position.IDENTITY_KEYS
    NUM_WORKERS = "num_workers"

    def __init__(self, plan, rank=None, world=None, *, batch_size: Optional[int] = None, epoch: int = 0,
                 shuffle: bool = True, reshuffle: str = "epoch", shuffle_window: int = stream.SHUFFLE_WINDOW,
                 schema_fields=None, padding_mask: bool = False, backend: str = "auto", balance: str = "auto",
                 cost_reduce: str = "sum"):
        require_torch()
        self.backend = resolve_backend(backend)
        # Token budgets (max_batch_cost) are make_loader's: DataLoader workers would need equal budget steps each.
        self._settings = Settings(plan, resolve_world(rank, world), batch_size=batch_size, shuffle=shuffle,
                                   reshuffle=reshuffle, shuffle_window=shuffle_window, schema_fields=schema_fields,
                                   padding_mask=padding_mask, balance=balance, cost_reduce=cost_reduce)
        self._position = Position(self._settings, epoch)
        self._num_workers = 1  # slots of the tracked iteration (set by BalancedDataLoader)
        self._numpy_out = False  # yield numpy batches (BalancedDataLoader's workers; see there)

    def __iter__(self):
        """This worker's batches; the position is read now, not at the first ``next()``."""
        info = torch.utils.data.get_worker_info()
        num_workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        epoch, done = self._position.current()
        return self._slot(epoch, done, num_workers, worker, self._numpy_out)

    def _slot(self, epoch, done, num_workers, worker, numpy_out):
        settings = self._settings
        slot = (worker + done) % num_workers
        fragments = [f for f in settings.fragments(epoch, num_workers) if f.worker == slot]
        if self.backend == "arrow":
            chunks = arrow_chunks(settings.plan, settings.columns, reader_pool_type="dummy")
        else:  # Petastorm's reader, in this process: the DataLoader's workers are the parallelism
            from .petastorm_backend import petastorm_chunks
            chunks = petastorm_chunks(settings.plan, settings.columns, {"reader_pool_type": "dummy"})
        runs = stream.slot_runs(fragments, chunks,
                                batch_size=settings.batch_size, shuffle=settings.shuffle,
                                shuffle_window=settings.shuffle_window, key=settings.key(epoch, slot),
                                batches_done=(done + worker) // num_workers, cost=settings.cost,
                                drop=settings.drop)
        for run in runs:
            if numpy_out:  # BalancedDataLoader makes the tensors in the main process
                # Arrow slices pickle their whole parent buffers: send each run's strings as objects instead.
                keep = {k: v if isinstance(v, np.ndarray) else np.array(as_list(v), dtype=object)
                        for k, v in run.items() if k != stream.PADDING or settings.padding_mask}
                yield from split_batches(keep, settings.batch_size)
            else:
                yield from torch_batches(run, settings.batch_size, settings.padding_mask)

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` next; a position loaded for the same epoch is kept (see ``BalancedLoader.set_epoch``)."""
        self._position.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The position counted by ``BalancedDataLoader`` (or set by ``set_epoch``/``load_state_dict``)."""
        return self._position.state_dict({self.NUM_WORKERS: self._num_workers})

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state``; the DataLoader must have the same number of workers as when it was saved."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        if self.NUM_WORKERS not in state:
            raise KeyError(f"state is missing [{self.NUM_WORKERS!r}]; pass a dict saved by "
                           "BalancedIterableDataset.state_dict()")
        workers = state[self.NUM_WORKERS]
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"state[{self.NUM_WORKERS!r}]={workers!r} must be an int >= 1")
        self._position.load_state_dict(state, {self.NUM_WORKERS: workers})
        self._num_workers = workers

    def dataloader(self, num_workers: int = 0, **kwargs) -> "BalancedDataLoader":
        """A ``BalancedDataLoader`` over this dataset: counts batches for ``state_dict``, one epoch per iter."""
        return BalancedDataLoader(self, num_workers=num_workers, **kwargs)


_Loader = torch.utils.data.DataLoader if torch is not None else object


class BalancedDataLoader(_Loader):
    """A ``torch.utils.data.DataLoader`` that tracks its ``BalancedIterableDataset``'s position.

    Each ``iter()`` is the next epoch (or the rest of a resumed one); ``state_dict()`` / ``load_state_dict()``
    resume exactly, provided ``num_workers`` is the same. Batching, sampling and worker persistence belong to the
    dataset, so ``batch_size``, ``sampler``, ``shuffle``, ``persistent_workers`` and ``in_order=False`` are refused.
    """

    def __init__(self, dataset: BalancedIterableDataset, num_workers: int = 0, **kwargs):
        if not isinstance(dataset, BalancedIterableDataset):
            raise TypeError(f"dataset must be a BalancedIterableDataset, got {type(dataset).__name__}")
        for name, allowed in (("batch_size", None), ("sampler", None), ("batch_sampler", None),
                              ("shuffle", None), ("persistent_workers", False), ("in_order", True),
                              ("drop_last", False)):
            if name in kwargs and kwargs[name] != allowed:
                raise ValueError(f"{name}={kwargs[name]!r} is not accepted: the dataset yields whole, planned batches "
                                 f"in a fixed order (leave {name} at {allowed!r})")
            kwargs.pop(name, None)
        # Tensors cross from DataLoader workers through one shared-memory segment each, which costs far more than
        # pickling a batch's small numpy arrays; so workers send numpy and tensors are made here (zero copy).
        self._tensors_here = kwargs.get("collate_fn") is None and not kwargs.get("pin_memory", False)
        if self._tensors_here:
            kwargs["collate_fn"] = _as_is
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)

    def __iter__(self):
        dataset = self.dataset
        slots = max(1, self.num_workers)
        if dataset._position.resumed and dataset._num_workers != slots:
            raise ValueError(f"the loaded state was saved with num_workers={dataset._num_workers}; resume with the "
                             f"same number of DataLoader workers (this loader has {self.num_workers})")
        dataset._num_workers = slots
        # Workers copy the dataset while the base iterator starts: they must see the position this iteration
        # starts at (the pending one; a new iter() never continues an abandoned one), and read it eagerly.
        dataset._position.live = None
        dataset._numpy_out = self._tensors_here
        try:
            batches = super().__iter__()
        finally:
            dataset._numpy_out = False
        run = dataset._position.begin()
        return _Counted(batches, run, self._tensors_here)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)


def _as_is(batch):
    return batch


class _Counted:
    def __init__(self, batches, run, to_tensors):
        self._batches, self._run, self._to_tensors = batches, run, to_tensors

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._batches)
        self._run[1] += 1
        return to_torch(batch, True) if self._to_tensors else batch

    def __len__(self):
        return len(self._batches)
