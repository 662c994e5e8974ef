"""``pipeline``: the stages a ``LoaderRequest`` asks for, built in one place for one plan or a mixture: the settings,
the position (the whole state) and the readers (``PlanReads``: one plan's; ``mixture.MixtureReads``: a mixture's).
``make_loader`` and ``BalancedIterableDataset`` build from it (docs/architecture.md, "The loader's pipeline")."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from ..backends import BACKENDS
from ..backends.reader_keeper import ReaderKeeper
from ..batches import packing
from ..batches.spare_matrices import SpareMatrices
from ..mixing.mixture import MixturePosition, MixtureReads, MixtureSettings
from ..source.position import Position, Run
from ..source.settings import Settings
from .request import LoaderRequest


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


class Pipeline(NamedTuple):
    """What a loader runs: its settings, its position (the whole state) and, for ``BalancedLoader``, its readers."""

    settings: Settings | MixtureSettings
    position: Position | MixturePosition
    reads: PlanReads | MixtureReads


def pipeline(request: LoaderRequest, epoch: int, **reader_options: Any) -> Pipeline:
    """The pipeline ``request`` asks for: one plan's, or a mixture's (its sources read with ``reader_options``
    where given, else the request's reader arguments)."""
    if not request.mixture:
        settings = Settings(request.plan, request.world, request.options)
        position = Position(settings, epoch)
        return Pipeline(settings, position, PlanReads(settings, position, request.backend, request.reader_options))
    mixture = MixtureSettings(request.plans, request.weights, request.world, request.options,
                              epoch_steps=request.epoch_steps, backend=request.backend,
                              reader_options=reader_options or request.reader_options)
    mixed = MixturePosition(mixture, epoch)
    return Pipeline(mixture, mixed, MixtureReads(mixture, mixed))
