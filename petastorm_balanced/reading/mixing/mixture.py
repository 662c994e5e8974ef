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

**A spill folder** (``shuffle_spill_dir``): each source's window is its whole share of a pass where the spill
budget holds it (``window_budget.mixture_windows``), its rows beyond its part of the memory budget on local disk.
Without one, as for one plan, rows beyond that part (larger than the footers said) wait in the system temp folder.

**A transform** (``transform_spec``) is bound to each source's columns and applied where its rows are decoded, as
for one plan (``resolve.Source.transform``); the sources' outputs are the mixture's columns.

What a mixture does not take, refused when it is built: ``partition_epoch`` (use ``epoch_steps``), token budgets
(``max_batch_cost``: a batch's rows are decided by the weights).
"""
from __future__ import annotations

import copy as _copy
from collections.abc import Generator, Mapping, Sequence
from dataclasses import replace

from ...core import shuffle as shuffle_rule
from ...core.cost.spec import COST_COLUMN
from ...core.mixture import Mixture, Point, make_schedule, parse_weights
from ...core.params import check_int
from ...errors import InvalidTypeError, InvalidValueError
from ...plan.model import ShardPlan
from ...world import World
from .. import state as loader_state
from ..backends.reader_keeper import ReaderKeeper
from ..fields.schema import batch_schema, extra_column
from ..options import LoaderOptions
from ..rows.columns import Columns
from ..source import stream
from ..source.position import Counting, check_arrangement
from ..source.resolve import Source, resolve_source
from ..state import (
    BALANCE,
    BATCH_SIZE,
    BATCHES,
    COST_REDUCE,
    EPOCH,
    EPOCH_STEPS,
    MAX_BATCH_COST,
    NUM_WORKERS,
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
from ..windows import window_budget
from . import mixture_elastic
from .mixture_elastic import Head
from .mixture_rows import SOURCE, delivered_columns, mixed_run, mixture_columns, open_sources

RUN_BATCHES = 32  # batches assembled at a time: one gather per column per run
WORKER_STATES = ("a DataLoader worker's own state (torchdata StatefulDataLoader) is not supported for a mixture; "
                 "use ds.dataloader(num_workers=K) and its state_dict()")


class MixtureSettings:
    """Checked settings of a mixture loader: its plans, each resolved as one plan is (``sources``: a
    ``resolve.Source`` each, read at one row per batch through its ``layouts``), plus the schedule that mixes them
    (``mixture``) and the columns every source delivers (``schema``)."""

    def __init__(self, plans: Sequence[ShardPlan], weights, world: World, options: LoaderOptions, *,
                 epoch_steps: int | None = None, backend: str = "arrow", reader_options: Mapping | None = None):
        """``plans`` and ``backend`` as ``request.resolve_request`` resolved them (``pipeline.pipeline``)."""
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
        self.workers = 1  # DataLoader workers this rank's batches are split over (``slots``)
        schedule = make_schedule(self.weights, self.batch_size)
        # every source read as one plan is (``resolve.Source``), its columns those every source delivers
        each = mixture_columns(self.plans, options.schema_fields, options.lists)
        self.sources, schemas = delivered_columns([self._source(i, c) for i, c in enumerate(each)])
        self.transform = self.sources[0].transform  # every source's transform_spec (what a spawned worker pickles)
        self.mixture = Mixture(schedule, tuple(s.rank_rows(self.world_size, 1) for s in self.sources),
                               self.epoch_steps)
        self.balanced_cost = [s.cost for s in self.sources if s.cost is not None]
        self.shuffle_spill_budget = int(options.shuffle_spill_budget)
        # the budget shared by the sources, each read as a slot with its own window; with a spill folder, its whole
        # share where the disk holds it, else an equal part of the spill budget for rows larger than measured
        self.shuffle_window, windows, self.spill_bytes = window_budget.mixture_windows(
            options, [s.row_bytes for s in self.sources], self.mixture.rows_per_pass,
            [plan.rows_per_rank(1, 1) for plan in self.plans])
        extras = ([extra_column(stream.PADDING, "bool")] if self.padding_mask else []) + \
            [extra_column(SOURCE, "int64")]
        self.schema = batch_schema(schemas, extras, (COST_COLUMN,) if self.balanced_cost else ())
        # how each source is read by every rank: its plan at one row per batch, a pass being the layout's epoch
        # ``mixture_elastic.plan_epoch(pass)``, with the single plan's elastic stages
        self.layouts = [source.layout(self.world_size, self.rank, batch_size=1, shuffle_window=window)
                        for source, window in zip(self.sources, windows, strict=True)]
        self.names = tuple(n for n in self.schema.names if n not in (stream.PADDING, SOURCE))

    def slots(self, workers: int, slot: int = 0) -> MixtureSettings:
        """The settings of DataLoader worker slot ``slot`` of ``workers`` on this rank: the same mixture read by
        ``world_size x workers`` ranks, slot ``slot`` being rank ``rank x workers + slot`` there. So each worker
        reads only its own share of every source, as a single plan's worker reads its slot, and every slot takes
        the same rows of every source at every batch (one counter per source, as for ranks), in epochs of
        ``epoch_steps / workers`` batches each; the rank's batches are the slots' taken round robin."""
        if workers == self.workers and slot == 0:
            return self
        if self.epoch_steps is not None and self.epoch_steps % workers:
            raise InvalidValueError(f"epoch_steps={self.epoch_steps} with num_workers={workers}: each DataLoader "
                                    "worker reads its own share of every source for epoch_steps / num_workers "
                                    f"batches; pass epoch_steps= a multiple of {workers}, or num_workers= one of "
                                    "its divisors")
        assert self.workers == 1, "slots() of a rank's settings"
        copy = _copy.copy(self)
        copy.rank, copy.world_size, copy.workers = self.rank * workers + slot, self.world_size * workers, workers
        rows = []
        for index, source in enumerate(self.sources):
            try:
                rows.append(source.rank_rows(copy.world_size, 1))
            except InvalidValueError as exc:
                raise InvalidValueError(f"source {index} with num_workers={workers} (each DataLoader worker reads "
                                        f"its own share of every source): {exc}; use fewer workers") from None
        copy.mixture = Mixture(self.mixture.schedule, tuple(rows),
                               None if self.epoch_steps is None else self.epoch_steps // workers)
        copy.layouts = [layout.moved(copy.world_size, copy.rank) for layout in self.layouts]
        return copy

    def _source(self, index: int, columns: Columns) -> Source:
        """Source ``index`` read as one plan is, at one row per batch: a source balanced by cost (``balance="auto"``
        and a plan with a cost, or ``"cost"``) reads its cost's source column along, each window arranged into the
        pieces its batches take."""
        plan = self.plans[index]
        try:
            return resolve_source(plan, self.options, batch_size=self.batch_size, columns=columns)
        except InvalidValueError as exc:
            raise InvalidValueError(f"source {index} ({plan.dataset_url}): {exc}") from None

    def _batch_size(self, batch_size: int | None) -> int:
        if batch_size is not None:
            return check_int("batch_size", batch_size, minimum=1)
        sizes = {p.batch_size for p in self.plans}
        size = sizes.pop() if len(sizes) == 1 else None
        if size is None:
            raise InvalidValueError(f"the mixture's plans have batch sizes {sorted(map(str, sizes | {size}))}; pass "
                                    "batch_size=")
        return size

    def placement(self, index: int):
        """Where source ``index``'s window holds its rows in this slot, by one plan's rule (``window_budget``): memory
        up to its part of the window memory, the rest in a folder of its own under the spill folder (the system temp
        folder without ``shuffle_spill_dir``: only rows larger than measured go there then), within its part of the
        spill budget; a new one for each pass it reads; None with ``shuffle_spill_dir=False`` or unshuffled."""
        return window_budget.placement(self.options, self.workers, sources=len(self.plans),
                                       disk=self.spill_bytes[index])

    def identity(self) -> dict:
        """What a saved position is only valid for (the weights and ``epoch_steps`` may change: a curriculum)."""
        cost = {} if not self.balanced_cost else {BALANCE: "cost", COST_REDUCE: self.balanced_cost[0].reduce,
                                                  MAX_BATCH_COST: None}
        # which rows the windows' batches hold (a source with a cost: its arrangement)
        shuffled = self.shuffle and any(s.cost is None for s in self.sources)
        order = {loader_state.SHUFFLE_ORDER: shuffle_rule.ORDER_VERSION} if shuffled else {}
        windows = [layout.shuffle_window for layout in self.layouts]  # one number where the sources' agree
        return {PLAN_CHECKSUM: [p.checksum for p in self.plans], WORLD_SIZE: self.world_size // self.workers,
                BATCH_SIZE: self.batch_size, SHUFFLE: self.shuffle,
                SHUFFLE_WINDOW: windows[0] if len(set(windows)) == 1 else windows,
                RESHUFFLE: self.reshuffle, **cost, **order}


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


class MixturePosition(Counting):
    """Where the next batch comes from: a point of the mixture (``core/mixture.Point``) in the current epoch, and
    batches delivered since. The epoch rules are ``position.Position``'s: only delivered batches and ``set_epoch``
    move it; ``set_epoch(e)`` keeps a position just loaded for epoch ``e``.

    With ``workers`` DataLoader workers (``MixtureSettings.slots``) the rank's batch ``b`` of an epoch is slot
    ``b % workers``'s batch ``b // workers``: ``anchor`` is where every slot stood at rank batch ``start`` (all
    slots alike), ``batches`` the rank's batches of the epoch; a state names the point of the slots behind."""

    def __init__(self, settings: MixtureSettings, epoch: int, workers: int = 1):
        self.base = settings  # the rank's settings (what a state is valid for)
        self.resumed = False
        self._owner: MixtureRun | None = None
        self._begin(check_int("epoch", epoch, minimum=0), workers)

    def _begin(self, epoch: int, workers: int) -> None:
        """The start of ``epoch`` on the timeline where every source starts its first pass at epoch 0."""
        self.settings = self.base.slots(workers)  # slot 0 of ``workers``: the mixture every slot follows
        self.workers = workers
        self.mixture = self.settings.mixture
        self.anchor = self.mixture.start(epoch)
        self.batches = self.start = 0  # the rank's batch of the epoch the next delivery is; where ``anchor`` is
        self._steps = self._rank_steps()
        self.fresh = True  # nothing delivered or loaded since: another slot layout starts its own timeline
        # each source's elastic rest after a resume at another world size (``mixture_elastic.py``), or None
        self.heads: tuple[Head | None, ...] = (None,) * len(self.base.plans)

    def _rank_steps(self) -> int:
        return self.start + self.workers * self.mixture.remaining(self.anchor)

    def point(self, slot: int | None = None) -> Point:
        """Where slot ``slot`` stands (None: the slots behind, which a state names)."""
        done = self.batches - self.start
        local = done // self.workers if slot is None else (done - slot + self.workers - 1) // self.workers
        return self.mixture.advance(self.anchor, local)

    def _roll(self) -> None:
        self._settle()  # batches handed out of a list so far
        if self.batches >= self._steps:  # the epoch is over: its end is the next one's start
            end = self.point()
            self.anchor = replace(end, epoch=end.epoch + 1, batch=0)
            self.batches = self.start = 0
            self._steps = self._rank_steps()

    def begin(self) -> MixtureRun:
        self._roll()
        run = MixtureRun(self, self.point(), self._steps, self.heads)
        self._owner = run
        return run

    def _count(self, run: MixtureRun, count: int) -> None:
        if self._owner is not run:
            return
        self.resumed = self.fresh = False
        self.batches += count
        self._roll()

    def current(self) -> tuple[int, int]:
        self._roll()
        return self.anchor.epoch, self.batches

    def steps(self) -> int:
        """Steps of the epoch the next batch belongs to."""
        self._roll()
        return self._steps

    def to_workers(self, workers: int, saved: int | None = None) -> None:
        """The position for ``workers`` DataLoader workers (slots; ``saved`` is not needed: the position knows its
        own): a fresh one starts their timeline at its epoch, else it continues elastically (the slots are the
        ranks of a larger world)."""
        self._settle()
        if workers == self.workers:
            return
        resumed = self.resumed
        if self.fresh:
            self._begin(self.anchor.epoch, workers)
        else:
            self.load_state_dict(self.values(), workers=self.workers, into=workers)
        self.resumed = resumed

    def set_epoch(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, minimum=0)
        current, batch = self.current()
        if not (self.resumed and epoch == current):
            if epoch == current and batch == 0:
                pass
            elif epoch > current:
                self.anchor = self.mixture.next_epoch(self.point(), epoch - current)
            else:  # a fresh timeline from the first pass: no elastic rest applies
                self._begin(epoch, self.workers)
            self.batches = self.start = 0
            self._steps, self.resumed = self._rank_steps(), False
        self._owner = None

    def values(self, extra: dict | None = None) -> dict:
        if extra and NUM_WORKERS in extra:  # the workers this position's slots are laid out for
            extra = {**extra, NUM_WORKERS: self.workers}
        epoch, batch = self.current()
        point = self.point()
        rows = self.mixture.rows_per_pass
        return {EPOCH: epoch, BATCHES: batch, **self.base.identity(), **(extra or {}),
                WEIGHTS: [str(w) for w in self.base.weights], EPOCH_STEPS: self.base.epoch_steps,
                PHASE: point.phase, SOURCES: [mixture_elastic.encode(c, h, r) for c, h, r in
                                              zip(point.counters, self.heads, rows, strict=True)],
                SOURCE_ORDER: mixture_elastic.ORDER_VERSION}

    def state_dict(self, extra: dict | None = None) -> dict:
        return loader_state.nest(self.values(extra))

    def worker_state(self, *_) -> dict:
        """Refused: the slots' counters are the rank's, which only the DataLoader's main process counts."""
        raise InvalidValueError(WORKER_STATES)

    def load_state_dict(self, state: dict, extra: dict | None = None, *, workers: int | None = None,
                        into: int | None = None) -> None:
        """Strict about keys and settings, except the world size and the DataLoader workers: a state saved with
        others continues every source's pass elastically (``mixture_elastic.py``). The slots the state was saved
        with are its ``num_workers`` (else ``workers``, else 1); ``into``: this position's slots from now on
        (``workers`` unless given, else this position's)."""
        if not isinstance(state, dict):
            raise InvalidTypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        self._settle()
        state = loader_state.flat(state)
        settings = self.base
        expected = {**settings.identity(), **(extra or {})}
        if isinstance(state.get(PLAN_CHECKSUM), str):
            raise InvalidValueError("state was saved by a loader of one plan; a mixture loader (plan=[...]) resumes "
                                    "only a mixture's state")
        saved_balance, balance_now = state.get(BALANCE, "rows"), expected.get(BALANCE, "rows")
        if saved_balance != balance_now:  # which rows a window delivered first depends on the arrangement
            raise InvalidValueError(f"state[{BALANCE!r}]={saved_balance!r} but this mixture balances "
                                    f"{balance_now!r} (sources with a cost balance it under balance='auto'); pass "
                                    f"balance={saved_balance!r} to resume that position")
        entries = state.get(SOURCES)  # every source at a pass start: no window of theirs served yet
        check_arrangement(state, expected, fresh=isinstance(entries, list) and all(
            isinstance(e, list) and len(e) == 2 and e[1] == 0 for e in entries), restart="restart the sources' passes: "
            f"set each of state['mixture'][{SOURCES!r}] to [pass, 0] (their rows served so far come again)")
        loader_state.require(state, (EPOCH, BATCHES, *expected, WEIGHTS, PHASE, SOURCES))
        updated = mixture_elastic.updated_plans(state[PLAN_CHECKSUM], state[SOURCES], settings.plans)
        for key, value in expected.items():
            if state[key] == value:
                continue
            if key in (WORLD_SIZE, NUM_WORKERS) or (key == PLAN_CHECKSUM and updated):
                continue  # another world or workers: an elastic resume, below; updated plans: checked in updated_plans
            raise InvalidValueError(f"state[{key!r}]={state[key]!r} but this loader has {key}={value!r}; a saved "
                                    "position only resumes a loader with the same plans and settings")
        sources = state[SOURCES]
        if not isinstance(sources, list) or len(sources) != len(settings.plans):
            raise InvalidValueError(f"state[{SOURCES!r}]={sources!r} must be [pass, row] for each of the "
                                    f"{len(settings.plans)} sources")
        order = state.get(SOURCE_ORDER, 1)
        mixture_elastic.check_order(order, sources)
        saved_world = check_int(f"state[{WORLD_SIZE!r}]", state[WORLD_SIZE], minimum=1)
        epoch = check_int(f"state[{EPOCH!r}]", state[EPOCH], minimum=0)
        batch = check_int(f"state[{BATCHES!r}]", state[BATCHES], minimum=0)
        into = into or workers or self.workers
        workers = check_int(f"state[{NUM_WORKERS!r}]", state.get(NUM_WORKERS, workers or 1), minimum=1)
        # the slots the sources were counted in: ranks x workers (before this release, ranks: every worker read
        # the rank's whole sequence, so all stood at one point)
        round_ = workers if order == mixture_elastic.ORDER_VERSION else 1
        now = settings.slots(into)
        if saved_world * round_ != now.world_size or round_ != into:
            _check_relayout(batch, saved_world, workers, round_, settings, into)
        counters, heads = [], []
        for i, entry in enumerate(sources):
            counter, head = mixture_elastic.resume(entry, i, SOURCES, now.layouts[i], saved_world, len(sources),
                                                   round_)
            counters.append(counter)
            heads.append(head)
        same = [str(w) for w in settings.weights] == state[WEIGHTS]
        if not same and settings.balanced_cost:
            raise InvalidValueError(f"state[{WEIGHTS!r}]={state[WEIGHTS]!r} but this mixture has weights "
                                    f"{[str(w) for w in settings.weights]} and balances cost: a source's "
                                    "window is arranged into the pieces its batches take, which the weights decide, "
                                    "so a changed mixture would re-arrange the window in progress; resume with the "
                                    "saved weights and change them at a pass start, or pass balance='rows'")
        period = self.mixture.schedule.period
        # the same weights continue their schedule; other ones (a curriculum) start theirs here
        phase = check_int(f"state[{PHASE!r}]", state[PHASE], minimum=0,
                          maximum=period - 1) if same else 0
        self.settings, self.workers, self.mixture = now, into, now.mixture
        # the slots behind stood at the round's first batch; with the same slots the others are one batch ahead
        self.start = batch - batch % round_
        self.anchor = Point(epoch, self.start // into, phase, tuple(counters))
        self.heads = tuple(heads)
        self.batches = batch
        self._steps = self._rank_steps()
        self._owner, self.resumed, self.fresh = None, True, False


def _check_relayout(batch: int, world: int, workers: int, round_: int, settings: MixtureSettings,
                    into: int) -> None:
    """A state continues in another layout of slots (world size x DataLoader workers) only where every slot it
    was saved with stood at one point, and with ``epoch_steps`` where the epoch's rest splits evenly over the new
    slots; refused naming the fix."""
    fix = (f"resume at world_size={world} with num_workers={workers}, or from a state saved after a multiple of "
           f"{{}} batches of the epoch")
    if batch % round_:
        raise InvalidValueError(
            f"state[{BATCHES!r}]={batch} was saved inside a round of its num_workers={workers} DataLoader workers, "
            "each of which reads its own share of every source, so they did not all take the same batches and only "
            f"that layout continues them: {fix.format(workers)}")
    if settings.epoch_steps is not None and batch % into:
        raise InvalidValueError(
            f"state[{BATCHES!r}]={batch} with epoch_steps={settings.epoch_steps} and num_workers={into}: the rest "
            f"of the epoch does not split evenly over the workers (each takes epoch_steps / num_workers batches "
            f"of it): {fix.format(into)}")


class MixtureRun:
    """One iteration: where it started; ``delivered()`` counts its batches into the position."""

    __slots__ = ("position", "point", "steps", "heads")

    def __init__(self, position: MixturePosition, point: Point, steps: int, heads: tuple):
        self.position, self.point, self.steps, self.heads = position, point, steps, heads

    @property
    def epoch(self) -> int:
        return self.point.epoch

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


class MixtureReads:
    """A mixture's readers for ``BalancedLoader``: a reader per source (the backend's threads or pool, so the
    loader's memory is about one shuffle window and the prefetch per source), and the sources' streams, which live
    from epoch to epoch: an epoch that ends inside a source's shuffle window hands the window, already read, to
    the next one (reopened only where an iteration was left mid-way)."""

    def __init__(self, settings: MixtureSettings, position: MixturePosition):
        self.settings, self.position = settings, position
        self.keepers = [ReaderKeeper() for _ in settings.plans]
        self.sources: list = []

    def begin(self) -> tuple[MixtureRun, Generator[dict, None, None]]:
        """An iteration from the position on, and its runs of numpy batches."""
        settings, run = self.settings, self.position.begin()
        schedule, point = settings.mixture.schedule, run.point
        wanted = [(c, h, None if s.cost is None else schedule.origin(i, point.phase, c))
                  for i, (c, h, s) in enumerate(zip(point.counters, run.heads, settings.sources, strict=True))]
        if [(s.counter, s.head, s.origin) for s in self.sources] != wanted:
            _close_all([], self.sources)
            self.sources[:] = open_sources(settings, point.counters, self.keepers, run.heads, point.phase)
        return run, numpy_runs(settings, point, run.steps - point.batch, self.sources)

    def close(self) -> None:
        _close_all(self.keepers, self.sources)


def _close_all(keepers, sources) -> None:
    for source in sources:
        source.close()
    sources.clear()
    for keeper in keepers:
        keeper.close()
