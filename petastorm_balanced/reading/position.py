"""What both loaders share: checked settings, the position of the next batch, and what they say about themselves.

The position is the whole resume state (G6): an epoch and a count of delivered batches; everything else is derived
from the plan. See ``Position`` for when an epoch advances (only delivered batches and ``set_epoch`` move it, so
frameworks that probe or re-create iterators cannot shift an epoch). After an elastic resume (a state saved at
another world size, G10) the position also lists the worlds that served the pass before (``elastic.Stage``, four
ints each; the keys are declared in ``state.py``).
"""
from __future__ import annotations

import warnings

from ..core import balance as balance_module
from ..core.cost.spec import COST_COLUMN
from ..core.elastic import Stage
from ..core.params import check_int
from ..core.shuffle import budget_window
from ..errors import InvalidTypeError, InvalidValueError, ShuffleQualityWarning
from ..plan.model import ShardPlan
from ..world import World
from . import layout, stream, transform
from . import state as loader_state
from .layout import Layout
from .options import LoaderOptions, resolve_cost, resolve_plan
from .schema import BatchSchema, batch_schema, extra_column

EXTRA_ROW_BYTES = 9.0  # the padding flag and the cost column the batcher carries beside the dataset's columns


class Settings(Layout):
    """Checked loader settings shared by BalancedLoader and BalancedIterableDataset."""

    def __init__(self, plan, world: World, options: LoaderOptions):
        self.plan: ShardPlan = resolve_plan(plan)
        self.options = options
        self.rank, self.world_size = world.rank, world.size
        batch_size, shuffle, shuffle_window = options.batch_size, options.shuffle, options.shuffle_window
        # cost balancing (None: rows only); with a token budget batches have no fixed size
        self.cost = resolve_cost(self.plan, balance=options.balance, cost_reduce=options.cost_reduce,
                                 max_batch_cost=options.max_batch_cost, batch_size=batch_size, shuffle=shuffle)
        budget = self.cost is not None and self.cost.budget is not None
        self.batch_size = None if budget else self.plan.batch_size if batch_size is None else batch_size
        if self.batch_size is None and not budget:
            raise InvalidValueError("batch_size=None and the plan was made without one; pass batch_size=")
        if budget and options.partition_epoch != 1:
            raise InvalidValueError(f"partition_epoch={options.partition_epoch} with max_batch_cost: a token budget "
                                    "packs each window's rows into batches, so sub-epochs are not supported with it; "
                                    "leave partition_epoch=1 or use batch_size")
        rows_batch = 1 if budget else self.batch_size  # a token budget assigns rows one by one, then packs them
        balance_module.check_fills_a_step(self.plan.total_rows, self.world_size, check_int(
            "batch_size", rows_batch, minimum=1))
        # columns read: the requested ones, plus the cost's source column (dropped after use: ``self.drop``)
        self.columns, self.drop = stream.with_cost_source(stream.dataset_columns(self.plan, options.schema_fields),
                                                          self.plan, self.cost)
        self.shuffle_budget = options.shuffle_budget
        if options.shuffle_window is None:  # as many rows as the budget holds (G16)
            shuffle_window = budget_window(options.shuffle_budget, self.columns.row_bytes + EXTRA_ROW_BYTES,
                                           rows_batch)
        Layout.__init__(self, self.plan, self.world_size, self.rank, batch_size=rows_batch, shuffle=shuffle,
                        shuffle_window=shuffle_window, reshuffle=options.reshuffle,
                        partition_epoch=options.partition_epoch,
                        balance_by="rows" if self.cost is None else "cost")
        self.batch_size = None if budget else rows_batch
        if budget and self.cost is not None:
            self.steps = self.cost.budget_steps(self.plan.rows_per_rank(self.world_size, 1), shuffle_window)
        self.padding_mask = options.padding_mask
        if shuffle:
            warn_stored_order(self.columns.clustered, self.plan.rows_per_rank(self.world_size, rows_batch),
                              self.shuffle_window)
        extras = ([extra_column(stream.PADDING, "bool")] if self.padding_mask else []) + \
            ([extra_column(COST_COLUMN, "int64")] if self.cost is not None else [])
        # transform_spec (transform.py): applied where the rows are decoded; its declared columns are the schema's
        self.transform = transform.bind(options.transform_spec, self.columns.schemas, self.columns.fields)
        if self.transform is not None and self.cost is not None:
            raise InvalidValueError("transform_spec with a cost plan balanced by cost: the per-row costs come from the "
                                    "columns read, before any transform; pass balance='rows', or apply the function "
                                    "to the batches in the training loop")
        if self.transform is not None:
            self.schema = batch_schema(self.transform.outputs, extras)
        else:
            self.schema = self.columns.batch_schema(self.drop, extras)  # loader.schema: what every batch holds (G13)
        self._checksum: str | None = None

    def fragments(self, epoch: int, num_workers: int = 1, stages=()):
        return self.plan.assignment(self.rank, **self.pieces_args(epoch, num_workers, stages))

    def identity(self) -> dict:
        """What a saved position is only valid for."""
        if self._checksum is None:
            self._checksum = self.plan.checksum
        values = (self._checksum, self.world_size, self.batch_size, self.shuffle, self.shuffle_window, self.reshuffle)
        cost = {} if self.cost is None else {loader_state.BALANCE: "cost", loader_state.COST_REDUCE:
                                             self.cost.reduce, loader_state.MAX_BATCH_COST: self.cost.budget}
        return {**dict(zip(Position.IDENTITY_KEYS, values, strict=True)), **cost}


def warn_stored_order(clustered: dict[str, float], rank_rows: int, window: int) -> None:
    """A ``ShuffleQualityWarning`` when rows are stored in order and a rank's rows need more than one window."""
    if not clustered or rank_rows <= window:
        return
    name, spread = min(clustered.items(), key=lambda item: item[1])
    warnings.warn(ShuffleQualityWarning(
        f"rows are stored sorted or clustered by {name!r} (a row group spans {spread:.0%} of its range) and this "
        f"rank's {rank_rows:,} rows need {-(-rank_rows // window)} shuffle windows of {window:,} rows: a batch mixes "
        "only the row groups of its window, so batches are further from i.i.d. than a uniform permutation's. Raise "
        f"shuffle_budget (about {rank_rows / window:.1f}x for one window), read fewer columns, or write a shuffled "
        "copy once (petastorm_balanced.spark.make_shuffled_copy); `petastorm-balanced inspect PLAN "
        f"--shuffle-quality {name}` measures it"), stacklevel=4)


class Position:
    """Where the next batch comes from: the epoch, and batches of it already delivered.

    Shared by both loaders: ``state_dict`` and ``load_state_dict`` are strict (every key must be there, and the
    settings a position depends on must match), ``set_epoch`` works like ``DistributedSampler.set_epoch``.

    When the epoch advances (frameworks probe, re-create and abandon iterators; none of that may shift an epoch):

    - only a delivered batch moves the position; the batch that finishes an epoch moves it to the next epoch's
      first batch. An ``iter()`` abandoned before its first batch consumes nothing, and one abandoned after ``k``
      batches leaves the position at batch ``k``: the next ``iter()`` serves the rest of that epoch;
    - ``set_epoch(e)`` moves it to the start of epoch ``e``, except right after ``load_state_dict`` of a position
      in epoch ``e`` (the training loop's ``set_epoch`` keeps a resumed position);
    - so ``state_dict()`` always names the epoch and batch the next iteration will serve.

    An iteration takes the position when its first batch is asked for (``begin``); a later ``begin``,
    ``set_epoch`` or ``load_state_dict`` supersedes it, and a superseded iteration no longer moves the position.
    """

    # state_dict keys (declared in ``state.py``)
    EPOCH, BATCHES = loader_state.EPOCH, loader_state.BATCHES
    PLAN_CHECKSUM, WORLD_SIZE, BATCH_SIZE = (loader_state.PLAN_CHECKSUM, loader_state.WORLD_SIZE,
                                             loader_state.BATCH_SIZE)
    SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE = (loader_state.SHUFFLE, loader_state.SHUFFLE_WINDOW,
                                          loader_state.RESHUFFLE)
    IDENTITY_KEYS = (PLAN_CHECKSUM, WORLD_SIZE, BATCH_SIZE, SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE)

    STAGES, PARTITION_EPOCH = loader_state.STAGES, loader_state.PARTITION_EPOCH  # optional on load

    def __init__(self, settings: Settings, epoch: int):
        epoch = check_int("epoch", epoch, minimum=0)
        self.settings = settings
        self.epoch, self.batches = epoch, 0  # the next batch served
        self.stages: tuple[Stage, ...] = ()  # worlds that served this epoch's pass before this one (elastic)
        self.resumed = False  # came from load_state_dict and no batch was delivered since
        self._owner: Run | None = None  # the iteration allowed to move the position
        self._steps_key: tuple | None = None  # (epoch, stages) whose steps _steps holds (``delivered``)
        self._steps = 0

    def begin(self) -> Run:
        """An iteration starting at the position now (call it when its first batch is about to be read).

        A loaded position at the very end of its epoch (an elastic resume that left fewer rows than one step of the
        new world) is served as that epoch's empty rest, so ``for e in ...: set_epoch(e)`` loops stay in step."""
        if self.resumed and self.batches >= self.settings.steps_of(self.epoch, self.stages):
            run = Run(self, self.epoch, self.batches, self.stages)
            self.epoch, self.batches, self.stages = self.where()
            self.resumed = False
        else:
            self.epoch, self.batches, self.stages = self.where()
            run = Run(self, self.epoch, self.batches, self.stages)
        self._owner = run
        return run

    def delivered(self, run: Run) -> None:
        """``run`` handed out one more batch."""
        if self._owner is not run:
            return
        self.resumed = False
        self.batches += 1
        # where() only changes anything at the epoch's end: compare with the epoch's steps, counted once per epoch
        # (steps_of costs several us: once per batch it was about 6% of a numeric epoch, profiled)
        key = (self.epoch, self.stages)
        if key != self._steps_key:
            self._steps_key, self._steps = key, self.settings.steps_of(self.epoch, self.stages)
        if self.batches >= self._steps:
            self.epoch, self.batches, self.stages = self.where()

    def where(self) -> tuple[int, int, tuple[Stage, ...]]:
        """(epoch, batches, stages) of the next batch: at the end of an epoch (or of what an elastic resume left
        of it, which may be nothing), the next epoch's start."""
        if self.batches >= self.settings.steps_of(self.epoch, self.stages):
            return (self.epoch + 1, 0, layout.carry(self.stages, self.epoch, self.epoch + 1,
                                                              self.settings.partition_epoch))
        return self.epoch, self.batches, self.stages

    def current(self):
        return self.where()[:2]

    def steps(self) -> int:
        """Steps of the epoch (or what is left of it after an elastic resume) the next batch belongs to."""
        epoch, _, stages = self.where()
        return self.settings.steps_of(epoch, stages)

    def rebase(self, workers: int) -> None:
        """The position, saved with ``workers`` slots per rank, for this loader's other slot layout."""
        self.epoch, self.batches, self.stages = layout.restage(
            self.epoch, self.batches, self.stages, self.settings.world_size, workers, self.settings.partition_epoch)

    def set_epoch(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, minimum=0)
        if not (self.resumed and epoch == self.epoch):  # the loaded epoch itself keeps a loaded position
            before, _, stages = self.where()
            self.stages = layout.carry(stages, before, epoch, self.settings.partition_epoch, strict=True)
            self.epoch, self.batches, self.resumed = epoch, 0, False
        self._owner = None

    def values(self, extra: dict | None = None) -> dict:
        """Every state key at the top (``state.nest`` files them under their components)."""
        epoch, batches, stages = self.where()
        return {self.EPOCH: epoch, self.BATCHES: batches, **self.settings.identity(), **(extra or {}),
                self.PARTITION_EPOCH: self.settings.partition_epoch, self.STAGES: [s.as_list() for s in stages]}

    def state_dict(self, extra: dict | None = None) -> dict:
        return loader_state.nest(self.values(extra))

    def load_state_dict(self, state: dict, extra: dict | None = None, *, workers: int = 1) -> None:
        """Strict about keys (``state.flat``) and settings, except the world size: a state saved at another one
        resumes elastically (G10); ``workers`` is the number of slots per rank the state was saved with."""
        if not isinstance(state, dict):
            raise InvalidTypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        state = loader_state.flat(state)  # strict: unknown keys refused; a state saved before the nesting is migrated
        expected = {**self.settings.identity(), **(extra or {})}
        loader_state.require(state, (self.EPOCH, self.BATCHES, *expected))
        for key, value in expected.items():
            if key == self.WORLD_SIZE:
                continue  # another world size is an elastic resume, checked below
            if key == self.SHUFFLE_WINDOW and state[key] != value and self.settings.options.shuffle_window is None:
                raise InvalidValueError(f"state[{key!r}]={state[key]!r} rows but this loader's shuffle_budget gives "
                                        f"windows of {value} rows; pass shuffle_window={state[key]!r} to resume "
                                        "that position exactly (its windows decide which rows come next)")
            if state[key] != value:
                raise InvalidValueError(f"state[{key!r}]={state[key]!r} but this loader has {key}={value!r}; a saved "
                                        "position only resumes a loader with the same plan and settings")
        self.epoch, self.batches, self.stages = layout.loaded(self.settings, state, workers)
        self._owner, self.resumed = None, True


class Run:
    """One iteration: where it started; ``delivered()`` counts its batches into the position it came from."""

    __slots__ = ("position", "epoch", "start", "stages")

    def __init__(self, position: Position, epoch: int, start: int, stages: tuple[Stage, ...] = ()):
        self.position, self.epoch, self.start, self.stages = position, epoch, start, stages

    def delivered(self) -> None:
        self.position.delivered(self)


class EpochSampler:
    """What frameworks that tell only samplers the epoch find at ``loader.sampler``: its ``set_epoch`` is the
    loader's. Lightning calls nothing but ``loader.sampler.set_epoch(e)`` at the start of every epoch."""

    def __init__(self, owner):
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


class PlannedView:
    """What both loaders say about themselves, read from their settings and position."""

    _settings: Settings  # set by the loader's __init__
    _position: Position

    plan = property(lambda self: self._settings.plan)
    rank = property(lambda self: self._settings.rank)
    world_size = property(lambda self: self._settings.world_size)
    batch_size = property(lambda self: self._settings.batch_size)
    shuffle_window = property(lambda self: self._settings.shuffle_window, doc="rows per shuffle window (resolved)")
    shuffle_budget = property(lambda self: self._settings.shuffle_budget, doc="bytes a slot's shuffle may hold")

    @property
    def schema(self) -> BatchSchema:
        """What every batch of every epoch holds, decided before the first one from the dataset's Arrow types and
        its footers' null counts: each key's tensor dtype and shape, or list of Python values, and how nulls are
        shown (docs/loader.md, "Batch schema")."""
        return self._settings.schema

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._position.current()[0]

    def __len__(self) -> int:
        """Steps of the epoch the next batch belongs to (after an elastic resume: the steps left in it)."""
        return self._position.steps()
