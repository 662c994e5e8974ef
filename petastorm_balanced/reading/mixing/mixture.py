"""Mixtures (G17): ``make_loader(plan=[a, b, c], weights=[...])`` and ``BalancedIterableDataset(plan=[...])``.

Every batch holds each source's share of ``batch_size`` rows (``core/mixture.py``: floor or ceil of ``weight x
batch_size``, the running count within one row of the weights), with ``_source`` naming each row's source. Each
source is read in passes over its own rows, each pass in that source's seeded order and balanced over the ranks as
its plan is (``mixture_rows.py``), and continues across epochs where it stopped, so no row of a source repeats
before every row of its pass was delivered (G2's drop allowance: the plan's fewer than ``world_size`` rows per pass
at one row per rank). Every rank takes the same rows of every source at every batch: equal steps (G1) with no
communication.

**The position** is the epoch and batch, as for one plan, plus each source's pass and row and the schedule's
phase (``state["mixture"]``): resuming reads only each source's current shuffle window again (G6), with no replay.
Loading a state saved with other weights (a curriculum) keeps every source where it stood and starts the new
weights' schedule there: no row of a source repeats in its pass. A state saved at another world size continues
every source's pass elastically (``mixture_elastic.py``: the rows of it no old rank delivered, cut for the new
world; G10).

**Cost balance.** A source whose plan has a cost (under ``balance="auto"`` or ``"cost"``) reads its plan's
cost-dealt row group order and arranges each shuffle window into the pieces its batches take
(``core/cost/pieces.py``), so every rank's part of a batch from it costs about the same.

What a mixture does not take, refused when it is built: ``partition_epoch`` (use ``epoch_steps``), token budgets
(``max_batch_cost``: a batch's rows are decided by the weights), ``transform_spec``.
"""
from __future__ import annotations

import weakref
from collections.abc import Generator
from fractions import Fraction
from typing import Any

from ...core.mixture import Point
from ..formats.device import NO_FEED, Feed, delivered
from ..formats.tensors import format_batches
from ..planned_view import PlannedLoader
from .mixture_position import MixturePosition
from .mixture_rows import mixed_run, open_sources
from .mixture_settings import MixtureSettings

RUN_BATCHES = 32  # batches assembled at a time: one gather per column per run


def numpy_runs(settings: MixtureSettings, point: Point, count: int, sources=None,
               heads=None) -> Generator[dict, None, None]:
    """Runs of whole numpy batches, ``count`` batches from ``point`` on (``RUN_BATCHES`` per run), read from
    ``sources`` (``SourceRows`` at ``point``'s counters, left open) or from sources opened (with ``heads``, each
    source's elastic rest) and closed here."""
    own = sources is None
    if sources is None:
        sources = open_sources(settings, point.counters, heads=heads, phase=point.phase)
    schedule = settings.mixture.schedule
    try:
        done = 0
        while done < count:
            n = min(RUN_BATCHES, count - done)
            phase = point.phase + done
            yield mixed_run(sources, schedule.counts(phase, phase + n), settings.names)
            done += n
    finally:
        if own:
            for source in sources:
                source.close()


class MixtureLoader(PlannedLoader[MixtureSettings, MixturePosition]):
    """Batches of one rank over a mixture of plans; made by ``make_loader(plan=[...], weights=[...])``.

    The loader's interface is ``BalancedLoader``'s (``len``, ``set_epoch``, ``state_dict``, ``load_state_dict``,
    ``schema``, ``close``); ``loader.plan`` is the tuple of plans. Each source is read by its own reader (the
    backend's threads or pool), so the loader's memory is about one shuffle window and the prefetch per source.
    """

    def __init__(self, settings: MixtureSettings, epoch: int = 0, feeding: Feed = NO_FEED):
        self._cut = format_batches(settings.options.batch_format)  # imports torch for torch batches
        self._settings = settings
        self._position = MixturePosition(settings, epoch)
        self.backend = settings.backend
        self._feed = feeding
        from ..backends.reader_keeper import ReaderKeeper
        self._keepers = [ReaderKeeper() for _ in settings.plans]
        # the sources' streams live from epoch to epoch: an epoch that ends inside a source's shuffle window hands
        # the window, already read, to the next one (reopened only where an iteration was left mid-way)
        self._sources: list = []
        self._finalizer = weakref.finalize(self, _close_all, self._keepers, self._sources)

    def _run(self) -> Generator[dict[str, Any], None, None]:
        settings = self._settings
        run = self._position.begin()
        schedule, point = settings.mixture.schedule, run.point
        self.recorder.begin(point.epoch)
        wanted = [(c, h, None if s.cost is None else schedule.origin(i, point.phase, c))
                  for i, (c, h, s) in enumerate(zip(point.counters, run.heads, settings.sources, strict=True))]
        if [(s.counter, s.head, s.origin) for s in self._sources] != wanted:
            _close_all([], self._sources)
            self._sources[:] = open_sources(settings, point.counters, self._keepers, run.heads, point.phase)
        runs = numpy_runs(settings, run.point, run.steps - run.point.batch, self._sources)

        def tensors():
            for numpy_run in runs:
                yield from self._cut(numpy_run, settings.batch_size, settings.padding_mask)

        yield from delivered(tensors(), self._feed, run, runs)

    @property
    def weights(self) -> tuple[Fraction, ...]:
        """The weights as read: fractions summing to 1."""
        return self._settings.weights

    def _close_readers(self) -> None:
        _close_all(self._keepers, self._sources)


def _close_all(keepers, sources) -> None:
    for source in sources:
        source.close()
    sources.clear()
    for keeper in keepers:
        keeper.close()
