"""A mixture's settings (``MixtureSettings``), checked once when the loader is made: the plans, the weights and their
schedule, the columns every source delivers, each source's cost arrangement and ``Layout`` (its plan at one row
per batch), and the slots DataLoader workers read (``slots``). What a mixture does not take is refused here.
"""
from __future__ import annotations

import copy as _copy
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ...core import balance
from ...core.cost.spec import COST_COLUMN
from ...core.mixture import Mixture, make_schedule, parse_weights
from ...core.params import check_int
from ...core.shuffle import budget_window
from ...errors import InvalidValueError
from ...plan.model import ShardPlan
from ...world import World
from ..fields.schema import batch_schema, extra_column
from ..options import LoaderOptions
from ..rows.columns import with_cost_source
from ..source import stream
from ..source.layout import Layout
from ..source.settings import EXTRA_ROW_BYTES, resolve_cost
from ..state import (
    BALANCE,
    BATCH_SIZE,
    COST_REDUCE,
    MAX_BATCH_COST,
    PLAN_CHECKSUM,
    RESHUFFLE,
    SHUFFLE,
    SHUFFLE_WINDOW,
    WORLD_SIZE,
)
from . import mixture_elastic
from .mixture_rows import SOURCE, SourceColumns, mixture_columns


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
        self.workers = 1  # DataLoader workers this rank's batches are split over (``slots``)
        self._place(make_schedule(self.weights, self.batch_size))
        self.sources, schemas = mixture_columns(self.plans, options.schema_fields, options.lists)
        self.sources = [self._with_cost(i, source) for i, source in enumerate(self.sources)]
        self.balanced_cost = [s.cost for s in self.sources if s.cost is not None]
        if self.shuffle_window is None:  # the budget shared by the sources, each read as a slot with its own window
            row = max(source.columns.row_bytes for source in self.sources) + EXTRA_ROW_BYTES
            self.shuffle_window = budget_window(int(options.shuffle_budget) // len(self.plans), row, 1)
        extras = ([extra_column(stream.PADDING, "bool")] if self.padding_mask else []) + \
            [extra_column(SOURCE, "int64")]
        self.schema = batch_schema(schemas, extras, (COST_COLUMN,) if self.balanced_cost else ())
        self.layouts = self._layouts()
        self.names = tuple(n for n in self.schema.names if n not in (stream.PADDING, SOURCE))

    def _place(self, schedule, epoch_steps: int | None = None) -> None:
        """Each source's rows per pass at ``self.world_size`` ranks, and the mixture over them."""
        for index, plan in enumerate(self.plans):
            try:
                balance.check_fills_a_step(plan.total_rows, self.world_size, 1)
            except InvalidValueError as exc:
                if self.workers == 1:
                    raise
                raise InvalidValueError(f"source {index} with num_workers={self.workers} (each DataLoader worker "
                                        f"reads its own share of every source): {exc}; use fewer workers") from None
        rows = tuple(plan.rows_per_rank(self.world_size, 1) for plan in self.plans)
        self.mixture = Mixture(schedule, rows, self.epoch_steps if epoch_steps is None else epoch_steps)

    def _layouts(self) -> list[Layout]:
        assert self.shuffle_window is not None  # resolved in __init__
        return [Layout(plan, self.world_size, self.rank, batch_size=1, shuffle=self.shuffle,
                       shuffle_window=self.shuffle_window, reshuffle=self.reshuffle,
                       balance_by="rows" if source.cost is None else "cost")
                for plan, source in zip(self.plans, self.sources, strict=True)]

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
        copy._place(self.mixture.schedule, None if self.epoch_steps is None else self.epoch_steps // workers)
        copy.layouts = copy._layouts()
        return copy

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
        return {PLAN_CHECKSUM: [p.checksum for p in self.plans], WORLD_SIZE: self.world_size // self.workers,
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
