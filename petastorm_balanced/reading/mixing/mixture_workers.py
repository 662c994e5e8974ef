"""A mixture read by DataLoader workers: each worker mixes from its own share of every source.

A rank's ``K`` workers are the ``K`` slots of ``MixtureSettings.slots``: slot ``s`` is rank ``rank x K + s`` of
the same mixture read by ``world_size x K`` ranks, so it reads only its share of every source, each row once per
pass, as a single plan's worker reads its slot. Every slot takes the same rows of every source at every batch, so
the slots stay one point of the mixture apart by at most one batch, and the position is the rank's batch count
(``MixturePosition``): the DataLoader takes the workers' batches round robin, rank batch ``b`` being slot
``(b - start) % K``'s.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ...errors import InvalidValueError
from ..formats.tensors import TORCH, to_numpy, to_torch
from ..rows.fragments import as_list
from ..source import stream
from .mixture import MixturePosition, numpy_runs
from .mixture_rows import SOURCE


def mixture_slot(position: MixturePosition, num_workers: int, worker: int, numpy_out: bool,
                 progress: list[int] | None, worker_state: bool = False,
                 begun: Callable[[int], None] | None = None) -> Iterator[dict]:
    """``BalancedIterableDataset.__iter__`` over a mixture: this worker's batches from ``position``. Inside a
    DataLoader worker (``progress``, a list the dataset keeps: filled with ``[epoch, batch, batches delivered]``
    here) from the position copied when the workers started, a loaded worker state (``worker_state``) refused; in
    this process (``progress`` None) counted as delivered, ``begun(epoch)`` called when it takes the position (the
    dataset's figures, ``reading/stats.py``)."""
    position.to_workers(num_workers)  # (a plain DataLoader's worker: its copy, in the workers' layout)
    if progress is not None:
        if worker_state:
            raise InvalidValueError("a DataLoader worker's own state (torchdata StatefulDataLoader) is not supported "
                                    "for a mixture; use ds.dataloader(num_workers=K) and its state_dict()")
        epoch, first = position.current()
        steps, run = position.steps(), None
        progress[:] = [epoch, first, 0]
    else:
        run = position.begin()
        epoch, first, steps = run.point.epoch, position.batches, run.steps
        if begun is not None:
            begun(epoch)
    slot = (first + worker - position.start) % num_workers
    count = len(range(first + worker, steps, num_workers))  # rank batches first + worker, + K, ... of the epoch
    settings = position.base.slots(num_workers, slot)
    batch_size = settings.batch_size
    for numpy_run in numpy_runs(settings, position.point(slot), count, heads=position.heads):
        for begin in range(0, len(numpy_run[SOURCE]), batch_size):
            one = {k: v[begin:begin + batch_size] for k, v in numpy_run.items()
                   if k != stream.PADDING or settings.padding_mask}
            if numpy_out:  # Arrow slices pickle their parent buffers: text and lists go as objects
                batch = {k: v if isinstance(v, np.ndarray) else np.fromiter(as_list(v), dtype=object, count=len(v))
                         for k, v in one.items()}
            elif settings.options.batch_format == TORCH:
                batch = to_torch(one, settings.padding_mask)
            else:
                batch = to_numpy(one, settings.padding_mask)
            if run is not None:
                run.delivered()
            elif progress is not None:
                progress[2] += 1
            yield batch
