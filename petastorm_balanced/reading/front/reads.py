"""``PlanReads``: one plan's readers for ``BalancedLoader`` (a mixture's: ``mixture.MixtureReads``)."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..backends import BACKENDS
from ..backends.reader_keeper import ReaderKeeper
from ..batches import packing
from ..batches.spare_matrices import SpareMatrices
from ..source.position import Position, Run
from ..source.settings import Settings


class PlanReads:
    """One plan's readers for ``BalancedLoader``: the backend's pool, which lives from epoch to epoch, and the last
    shuffle window's matrices, filled again by the next window (``SpareMatrices``)."""

    def __init__(self, settings: Settings, position: Position, backend: str, reader_options: Mapping[str, Any]):
        self.settings, self.position = settings, position
        self.backend, self.reader_options = backend, dict(reader_options)
        self.keeper = ReaderKeeper()
        self.spares = SpareMatrices()

    def begin(self) -> tuple[Run, Iterator[dict]]:
        """An iteration from the position on, and its runs of numpy batches."""
        settings, run = self.settings, self.position.begin()
        chunks = BACKENDS[self.backend].run(settings.plan, settings.columns, self.reader_options, self.keeper,
                                            transform=settings.transform)
        runs = settings.slot_runs(chunks, run.epoch, run.stages, batches_done=run.start, spares=self.spares)
        if settings.packing is not None:  # each step's documents as (S, L) sequences (reading/batches/packing.py)
            runs = packing.packed_runs(runs, settings.packing, settings.schema)
        return run, runs

    def close(self) -> None:
        self.keeper.close()
        self.spares.give([])  # a closed loader holds no window matrix
