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

from ...errors import InvalidValueError
from ..batches.batching import split_batches
from ..formats import worker_packets
from ..formats.tensors import format_batches
from .mixture import WORKER_STATES, MixturePosition, numpy_runs


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
            raise InvalidValueError(WORKER_STATES)
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
    batch_size, padding_mask = settings.batch_size, settings.padding_mask
    cut = format_batches(settings.options.batch_format)  # (as the mixture's loader cuts its runs)
    for numpy_run in numpy_runs(settings, position.point(slot), count, heads=position.heads):
        batches = split_batches(worker_packets.picklable(numpy_run, padding_mask), batch_size) if numpy_out \
            else cut(numpy_run, batch_size, padding_mask)
        for batch in batches:
            if run is not None:
                run.delivered()
            elif progress is not None:
                progress[2] += 1
            yield batch
