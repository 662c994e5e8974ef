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
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np

from ...core import balance
from ...core.cost.spec import COST_COLUMN
from ...core.mixture import Mixture, Point, make_schedule, parse_weights
from ...core.params import check_int
from ...core.shuffle import budget_window
from ...errors import InvalidTypeError, InvalidValueError
from ...plan.model import ShardPlan
from ...world import World
from .. import state as loader_state
from ..fields.schema import batch_schema, extra_column
from ..formats.device import NO_FEED, Feed, delivered
from ..formats.tensors import TORCH, format_batches, to_numpy, to_torch
from ..options import LoaderOptions
from ..planned_view import PlannedLoader
from ..rows.columns import with_cost_source
from ..rows.fragments import as_list
from ..source import stream
from ..source.layout import Layout
from ..source.settings import EXTRA_ROW_BYTES, resolve_cost
from ..state import (
    BALANCE,
    BATCH_SIZE,
    BATCHES,
    COST_REDUCE,
    EPOCH,
    EPOCH_STEPS,
    MAX_BATCH_COST,
    PHASE,
    PLAN_CHECKSUM,
    RESHUFFLE,
    SHUFFLE,
    SHUFFLE_WINDOW,
    SOURCE_ORDER,
    SOURCES,
    WEIGHTS,
    WORLD_SIZE,
)
from . import mixture_elastic
from .mixture_elastic import Head
from .mixture_rows import SOURCE, SourceColumns, mixed_run, mixture_columns, open_sources

RUN_BATCHES = 32  # batches assembled at a time: one gather per column per run


class MixtureSettings:
    """Checked settings of a mixture loader: the plans, the schedule, the columns and how sources are read."""

    def __init__(self, plans: Sequence[ShardPlan], weights, world: World, options: LoaderOptions, *,
                 epoch_steps: int | None = None, backend: str = "arrow", reader_options: Mapping | None = None):
        """``plans`` and ``backend`` as ``request.resolve_request`` resolved them (``request.mixture_settings``)."""
        self.plans = tuple(plans)
        mixture_elastic.refuse_twice(self.plans, options.shuffle)
        self.plan = self.plans  # what ``loader.plan`` shows
        self.weights = parse_weights(weights, len(self.plans))
        self.rank, self.world_size = world.rank, world.size
        self.options = options
        _refuse(options)
        self.shuffle, self.shuffle_window, self.reshuffle = options.shuffle, options.shuffle_window, options.reshuffle
        self.shuffle_budget = int(options.shuffle_budget)  # bytes, shared by the sources
        self.padding_mask = options.padding_mask
        self.batch_size = self._batch_size(options.batch_size)
        self.epoch_steps = None if epoch_steps is None else check_int("epoch_steps", epoch_steps, minimum=1)
        self.backend = backend
        self.reader_options = dict(reader_options or {})
        rows = []
        for plan in self.plans:
            balance.check_fills_a_step(plan.total_rows, self.world_size, 1)
            rows.append(plan.rows_per_rank(self.world_size, 1))
        self.mixture = Mixture(make_schedule(self.weights, self.batch_size), tuple(rows), self.epoch_steps)
        self.sources, schemas = mixture_columns(self.plans, options.schema_fields, options.lists)
        self.sources = [self._with_cost(i, source) for i, source in enumerate(self.sources)]
        self.balanced_cost = [s.cost for s in self.sources if s.cost is not None]
        if self.shuffle_window is None:  # the budget shared by the sources, each read as a slot with its own window
            row = max(source.columns.row_bytes for source in self.sources) + EXTRA_ROW_BYTES
            self.shuffle_window = budget_window(int(options.shuffle_budget) // len(self.plans), row, 1)
        extras = ([extra_column(stream.PADDING, "bool")] if self.padding_mask else []) + \
            [extra_column(SOURCE, "int64")]
        self.schema = batch_schema(schemas, extras, (COST_COLUMN,) if self.balanced_cost else ())
        self.layouts = [Layout(plan, self.world_size, self.rank, batch_size=1, shuffle=self.shuffle,
                               shuffle_window=self.shuffle_window, reshuffle=self.reshuffle,
                               balance_by="rows" if source.cost is None else "cost")
                        for plan, source in zip(self.plans, self.sources, strict=True)]
        self.names = tuple(n for n in self.schema.names if n not in (stream.PADDING, SOURCE))

    def _with_cost(self, index: int, source: SourceColumns) -> SourceColumns:
        """A source balanced by cost (``balance="auto"`` and a plan with a cost, or ``"cost"``): its cost's
        source column read along, each window arranged into the pieces its batches take."""
        plan, options = self.plans[index], self.options
        try:
            cost = resolve_cost(plan, balance=options.balance, cost_reduce=options.cost_reduce, max_batch_cost=None,
                                batch_size=self.batch_size, shuffle=self.shuffle)
        except InvalidValueError as exc:
            raise InvalidValueError(f"source {index} ({plan.dataset_url}): {exc}") from None
        if cost is None:
            return source
        columns, drop = with_cost_source(source.columns, plan, cost)
        return replace(source, columns=columns, cost=cost, drop=tuple(drop))

    def _batch_size(self, batch_size: int | None) -> int:
        if batch_size is not None:
            return check_int("batch_size", batch_size, minimum=1)
        sizes = {p.batch_size for p in self.plans}
        size = sizes.pop() if len(sizes) == 1 else None
        if size is None:
            raise InvalidValueError(f"the mixture's plans have batch sizes {sorted(map(str, sizes | {size}))}; pass "
                                    "batch_size=")
        return size

    def layout(self, index: int) -> Layout:
        """How source ``index`` is read by every rank: its plan at one row per batch, a pass being the layout's
        epoch ``mixture_elastic.plan_epoch(pass)``, with the single plan's elastic stages."""
        return self.layouts[index]

    def identity(self) -> dict:
        """What a saved position is only valid for (the weights and ``epoch_steps`` may change: a curriculum)."""
        cost = {} if not self.balanced_cost else {BALANCE: "cost", COST_REDUCE: self.balanced_cost[0].reduce,
                                                  MAX_BATCH_COST: None}
        return {PLAN_CHECKSUM: [p.checksum for p in self.plans], WORLD_SIZE: self.world_size,
                BATCH_SIZE: self.batch_size, SHUFFLE: self.shuffle, SHUFFLE_WINDOW: self.shuffle_window,
                RESHUFFLE: self.reshuffle, **cost}


def _refuse(options: LoaderOptions) -> None:
    if options.partition_epoch != 1:
        raise InvalidValueError(f"partition_epoch={options.partition_epoch} with a mixture: its epochs are already "
                                "set by the scarcest source or epoch_steps=; pass epoch_steps= instead")
    if options.max_batch_cost is not None:
        raise InvalidValueError("max_batch_cost with a mixture: a batch's rows are decided by the weights; pass "
                                "batch_size=")
    if options.pack is not None:
        raise InvalidValueError(f"pack={options.pack!r} with a mixture (plan=[...]) is not supported: each source's "
                                "share would have to be counted in tokens, which a step's documents decide; pack "
                                "one plan (a plan over all sources' files, mixed when writing them)")
    if options.transform_spec is not None:
        raise InvalidValueError("transform_spec with a mixture is not supported; apply the function to the batches "
                                "in the training loop")
    if options.shuffle_spill_dir not in (None, False):
        raise InvalidValueError(f"shuffle_spill_dir={options.shuffle_spill_dir!r} with a mixture is not supported yet "
                                "(each source's window is sized from the memory budget); leave shuffle_spill_dir=None, "
                                "or give each source a shuffled copy (petastorm_balanced.spark.make_shuffled_copy)")


class MixturePosition:
    """Where the next batch comes from: a point of the mixture (``core/mixture.Point``) in the current epoch, and
    batches delivered since. The epoch rules are ``position.Position``'s: only delivered batches and ``set_epoch``
    move it; ``set_epoch(e)`` keeps a position just loaded for epoch ``e``."""

    def __init__(self, settings: MixtureSettings, epoch: int):
        self.settings = settings
        self.mixture = settings.mixture
        self.anchor = self.mixture.start(check_int("epoch", epoch, minimum=0))
        self.batches = 0  # batch of the epoch the next delivery is
        self._steps = self.mixture.steps_of(self.anchor)
        self.resumed = False
        self._owner: MixtureRun | None = None
        # each source's elastic rest after a resume at another world size (``mixture_elastic.py``), or None
        self.heads: tuple[Head | None, ...] = (None,) * len(settings.plans)

    def point(self) -> Point:
        return self.mixture.advance(self.anchor, self.batches - self.anchor.batch)

    def _roll(self) -> None:
        if self.batches >= self._steps:  # the epoch is over: its end is the next one's start
            end = self.point()
            self.anchor = replace(end, epoch=end.epoch + 1, batch=0)
            self.batches, self._steps = 0, self.mixture.steps_of(self.anchor)

    def begin(self) -> MixtureRun:
        self._roll()
        run = MixtureRun(self, self.point(), self._steps, self.heads)
        self._owner = run
        return run

    def delivered(self, run: MixtureRun) -> None:
        if self._owner is not run:
            return
        self.resumed = False
        self.batches += 1
        self._roll()

    def current(self) -> tuple[int, int]:
        self._roll()
        return self.anchor.epoch, self.batches

    def steps(self) -> int:
        """Steps of the epoch the next batch belongs to."""
        self._roll()
        return self._steps

    def rebase(self, workers: int) -> None:
        """Every DataLoader worker reads the rank's whole sequence: the worker count changes nothing."""

    def set_epoch(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, minimum=0)
        current, batch = self.current()
        if not (self.resumed and epoch == current):
            if epoch == current and batch == 0:
                pass
            elif epoch > current:
                self.anchor = self.mixture.next_epoch(self.point(), epoch - current)
            else:  # a fresh timeline from the first pass: no elastic rest applies
                self.anchor = self.mixture.start(epoch)
                self.heads = (None,) * len(self.heads)
            self.batches, self._steps, self.resumed = 0, self.mixture.steps_of(self.anchor), False
        self._owner = None

    def values(self, extra: dict | None = None) -> dict:
        epoch, batch = self.current()
        point = self.point()
        rows = self.mixture.rows_per_pass
        return {EPOCH: epoch, BATCHES: batch, **self.settings.identity(), **(extra or {}),
                WEIGHTS: [str(w) for w in self.settings.weights], EPOCH_STEPS: self.settings.epoch_steps,
                PHASE: point.phase, SOURCES: [mixture_elastic.encode(c, h, r) for c, h, r in
                                              zip(point.counters, self.heads, rows, strict=True)],
                SOURCE_ORDER: mixture_elastic.ORDER_VERSION}

    def state_dict(self, extra: dict | None = None) -> dict:
        return loader_state.nest(self.values(extra))

    def load_state_dict(self, state: dict, extra: dict | None = None, *, workers: int = 1) -> None:
        """Strict about keys and settings, except the world size: a state saved at another one continues every
        source's pass elastically (``mixture_elastic.py``); ``workers`` (slots the state was saved with) changes
        nothing here."""
        if not isinstance(state, dict):
            raise InvalidTypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        state = loader_state.flat(state)
        expected = {**self.settings.identity(), **(extra or {})}
        if isinstance(state.get(PLAN_CHECKSUM), str):
            raise InvalidValueError("state was saved by a loader of one plan; a mixture loader (plan=[...]) resumes "
                                    "only a mixture's state")
        saved_balance, balance_now = state.get(BALANCE, "rows"), expected.get(BALANCE, "rows")
        if saved_balance != balance_now:  # which rows a window delivered first depends on the arrangement
            raise InvalidValueError(f"state[{BALANCE!r}]={saved_balance!r} but this mixture balances "
                                    f"{balance_now!r} (sources with a cost balance it under balance='auto'); pass "
                                    f"balance={saved_balance!r} to resume that position")
        loader_state.require(state, (EPOCH, BATCHES, *expected, WEIGHTS, PHASE, SOURCES))
        updated = mixture_elastic.updated_plans(state[PLAN_CHECKSUM], state[SOURCES], self.settings.plans)
        for key, value in expected.items():
            if state[key] == value:
                continue
            if key == WORLD_SIZE or (key == PLAN_CHECKSUM and updated):
                continue  # another world size: an elastic resume, below; updated plans: checked in updated_plans
            raise InvalidValueError(f"state[{key!r}]={state[key]!r} but this loader has {key}={value!r}; a saved "
                                    "position only resumes a loader with the same plans and settings")
        sources = state[SOURCES]
        rows = self.mixture.rows_per_pass
        if not isinstance(sources, list) or len(sources) != len(rows):
            raise InvalidValueError(f"state[{SOURCES!r}]={sources!r} must be [pass, row] for each of the "
                                    f"{len(rows)} sources")
        mixture_elastic.check_order(state.get(SOURCE_ORDER, 1), sources)
        saved_world = check_int(f"state[{WORLD_SIZE!r}]", state[WORLD_SIZE], minimum=1)
        counters, heads = [], []
        for i, entry in enumerate(sources):
            counter, head = mixture_elastic.resume(entry, i, SOURCES, self.settings.layout(i), saved_world,
                                                   len(sources))
            counters.append(counter)
            heads.append(head)
        epoch = check_int(f"state[{EPOCH!r}]", state[EPOCH], minimum=0)
        batch = check_int(f"state[{BATCHES!r}]", state[BATCHES], minimum=0)
        same = [str(w) for w in self.settings.weights] == state[WEIGHTS]
        if not same and self.settings.balanced_cost:
            raise InvalidValueError(f"state[{WEIGHTS!r}]={state[WEIGHTS]!r} but this mixture has weights "
                                    f"{[str(w) for w in self.settings.weights]} and balances cost: a source's "
                                    "window is arranged into the pieces its batches take, which the weights decide, "
                                    "so a changed mixture would re-arrange the window in progress; resume with the "
                                    "saved weights and change them at a pass start, or pass balance='rows'")
        period = self.mixture.schedule.period
        # the same weights continue their schedule; other ones (a curriculum) start theirs here
        phase = check_int(f"state[{PHASE!r}]", state[PHASE], minimum=0,
                          maximum=period - 1) if same else 0
        self.anchor = Point(epoch, batch, phase, tuple(counters))
        self.heads = tuple(heads)
        self.batches, self._steps = batch, self.mixture.steps_of(self.anchor)
        self._owner, self.resumed = None, True


class MixtureRun:
    """One iteration: where it started; ``delivered()`` counts its batches into the position."""

    __slots__ = ("position", "point", "steps", "heads")

    def __init__(self, position: MixturePosition, point: Point, steps: int, heads: tuple):
        self.position, self.point, self.steps, self.heads = position, point, steps, heads

    def delivered(self) -> None:
        self.position.delivered(self)


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


def worker_batches(settings: MixtureSettings, point: Point, count: int, num_workers: int, worker: int,
                   numpy_out: bool, heads=None) -> Iterator[dict]:
    """The batches of DataLoader worker ``worker`` of ``num_workers`` among ``count`` from ``point``: every
    ``num_workers``-th, from the ``worker``-th (the DataLoader takes them round robin). Each worker reads the rank's
    whole sequence of every source and keeps its own batches, so the batches are exactly ``make_loader``'s."""
    batch = settings.batch_size
    index = 0
    for run in numpy_runs(settings, point, count, heads=heads):
        rows = len(run[SOURCE])
        for begin in range(0, rows, batch):
            if index % num_workers == worker:
                one = {k: v[begin:begin + batch] for k, v in run.items()
                       if k != stream.PADDING or settings.padding_mask}
                if numpy_out:  # Arrow slices pickle their parent buffers: text and lists go as objects
                    yield {k: v if isinstance(v, np.ndarray) else np.fromiter(as_list(v), dtype=object, count=len(v))
                           for k, v in one.items()}
                elif settings.options.batch_format == TORCH:
                    yield to_torch(one, settings.padding_mask)
                else:
                    yield to_numpy(one, settings.padding_mask)
            index += 1


def mixture_slot(position: MixturePosition, num_workers: int, worker: int, numpy_out: bool,
                 progress: list[int] | None, worker_state: bool = False,
                 begun: Callable[[int], None] | None = None) -> Iterator[dict]:
    """``BalancedIterableDataset.__iter__`` over a mixture: this worker's batches from ``position``. Inside a
    DataLoader worker (``progress``, a list the dataset keeps: filled with ``[epoch, batch, batches delivered]``
    here) from the position copied when the workers started, a loaded worker state (``worker_state``) refused; in
    this process (``progress`` None) counted as delivered, ``begun(epoch)`` called when it takes the position (the
    dataset's figures, ``reading/stats.py``)."""
    if progress is not None:
        if worker_state:
            raise InvalidValueError("a DataLoader worker's own state (torchdata StatefulDataLoader) is not supported "
                                    "for a mixture; use ds.dataloader(num_workers=K) and its state_dict()")
        position.current()
        point, steps, run, heads = position.point(), position.steps(), None, position.heads
        progress[:] = [point.epoch, point.batch, 0]
    else:
        run = position.begin()
        point, steps, heads = run.point, run.steps, run.heads
        if begun is not None:
            begun(point.epoch)
    for batch in worker_batches(position.settings, point, steps - point.batch, num_workers, worker, numpy_out,
                                heads):
        if run is not None:
            run.delivered()
        elif progress is not None:
            progress[2] += 1
        yield batch
