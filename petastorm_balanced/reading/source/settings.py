"""``Settings``: a loader's settings, checked once against the plan, shared by ``BalancedLoader`` and
``BalancedIterableDataset``.

Settings are made of small resolved parts: the cost arrangement (``resolve_cost``: None balances rows), the
columns read and what every batch holds (``columns.Columns``, ``loader.schema``), and the ``Layout`` (which rows
each slot delivers, in what order, in how many steps).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace

from ...core import balance as balance_module
from ...core import shuffle as shuffle_rule
from ...core.cost import arrangement
from ...core.cost.arrangement import REDUCES, REDUCES_MEANING
from ...core.cost.options import CostOptions
from ...core.cost.spec import COST_COLUMN, parse_cost
from ...core.params import check_choice, check_int
from ...core.shuffle import budget_window
from ...errors import InvalidValueError, ShuffleQualityWarning
from ...plan.model import ShardPlan
from ...world import World
from .. import state as loader_state
from ..batches import packing
from ..fields.schema import batch_schema, extra_column
from ..options import LoaderOptions
from ..rows import columns, transform
from ..windows import window_budget
from ..windows.window_budget import (
    EXTRA_ROW_BYTES,  # the padding flag and the cost column's bytes (mixture.py reads it)
)
from . import stream
from .layout import Layout


class Settings:
    """A loader's settings, checked against its plan: the options given (``options``), the cost arrangement
    (``cost``, None: rows only), the columns read and the batches' schema (``columns``, ``drop``, ``transform``,
    ``schema``) and the ``layout`` (which rows each slot delivers). Shared by ``BalancedLoader`` and
    ``BalancedIterableDataset``; ``plan`` is resolved where the loader is made."""

    def __init__(self, plan: ShardPlan, world: World, options: LoaderOptions):
        self.plan, self.options = plan, options
        self.rank, self.world_size = world.rank, world.size
        # cost balancing (None: rows only); with a token budget batches have no fixed size
        self.cost = resolve_cost(plan, balance=options.balance, cost_reduce=options.cost_reduce,
                                 max_batch_cost=options.max_batch_cost, shuffle=options.shuffle,
                                 batch_size=None if options.pack is not None else options.batch_size)
        self.packing = None if options.pack is None else packing.resolve(plan, options, self.cost)
        if self.cost is not None and self.packing is not None:  # (resolve refuses a plan without a cost)
            self.cost = replace(self.cost, pack=self.packing)
        budget = self.cost is not None and self.cost.per_window
        rows_batch = _rows_batch(plan, options, budget)  # a token budget assigns rows one by one, then packs them
        balance_module.check_fills_a_step(plan.total_rows, self.world_size, rows_batch)
        rank_rows = plan.rows_per_rank(self.world_size, rows_batch)  # a rank's rows per pass, padding included
        # columns read: the requested ones, plus the cost's source column (dropped after use: ``self.drop``)
        self.columns, self.drop = columns.with_cost_source(columns.dataset_columns(plan, options.schema_fields,
                                                                                   options.lists), plan, self.cost)
        # a padded list as the cost column: size() is its lengths column (stream.slot_runs)
        self.cost_lengths = next((c.lengths for c in self.columns.schemas
                                  if self.cost is not None and c.name == self.cost.column), None)
        self.shuffle_budget = int(options.shuffle_budget)  # bytes (parsed by LoaderOptions)
        self.shuffle_spill_budget = int(options.shuffle_spill_budget)
        shuffle_window = options.shuffle_window
        self.row_bytes = self.columns.row_bytes + EXTRA_ROW_BYTES  # decoded bytes per row (measured when sizing)
        if shuffle_window is None and options.shuffle:  # as many rows as the budget holds (G16)
            shuffle_window, self.row_bytes = window_budget.window_rows(plan, self.columns, options, rows_batch,
                                                                       rank_rows)
            # the estimate caps the reader's first bundles (read_ahead.py measures the rest); never a batch
            self.columns = replace(self.columns, row_bytes=self.row_bytes - EXTRA_ROW_BYTES)
        elif shuffle_window is None:  # unshuffled windows only group batches: the footers' estimate is enough
            shuffle_window = budget_window(self.shuffle_budget, self.row_bytes, rows_batch)
        steps = None
        if budget and self.cost is not None:
            steps = self.cost.budget_steps(rank_rows, shuffle_window)
        self.layout = Layout(plan, self.world_size, self.rank, batch_size=None if budget else rows_batch,
                             shuffle=options.shuffle, shuffle_window=shuffle_window, reshuffle=options.reshuffle,
                             partition_epoch=options.partition_epoch,
                             balance_by="rows" if self.cost is None else "cost", steps=steps,
                             epoch_steps=None if self.packing is None else self._packed_steps)
        self._packings: dict[tuple, CostOptions] = {}  # (epoch, stages) -> that epoch's CostOptions (packing)
        self.padding_mask = options.padding_mask
        # Rank 0 says it (every rank has as many rows and the same window); a shuffle_window given is what was asked.
        if options.shuffle and options.shuffle_window is None and self.rank == 0:
            spilled = options.shuffle_spill_dir not in (None, False)  # a spill folder: nothing more to offer
            warn_stored_order(self.columns.clustered, rank_rows, shuffle_window, self.shuffle_budget,
                              0.0 if spilled else self.row_bytes)
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
        if self.packing is not None:  # (S, L) sequences instead of rows
            target = self.columns.target
            self.schema = packing.packed_schema(self.packing, self.schema, None if target is None or self.packing.column
                                                not in target.names else target.field(self.packing.column).type)
        self._checksum: str | None = None

    # the layout's answers, which the loaders and their position ask for
    batch_size = property(lambda self: self.layout.batch_size, doc="rows per batch; None: a token budget")
    shuffle = property(lambda self: self.layout.shuffle)
    shuffle_window = property(lambda self: self.layout.shuffle_window, doc="rows per shuffle window (resolved)")
    reshuffle = property(lambda self: self.layout.reshuffle)
    partition_epoch = property(lambda self: self.layout.partition_epoch)

    def placement(self, num_workers: int = 1):
        """Where a slot keeps its windows' rows (``window_budget.placement``): a new one per epoch's iteration."""
        return window_budget.placement(self.options, num_workers)

    def key(self, epoch: int, slot: int = 0, stage: int = 0):
        return self.layout.key(epoch, slot, stage)

    def steps_of(self, epoch: int, stages=()) -> int:
        return self.layout.steps_of(epoch, stages)

    def cost_of(self, epoch: int, stages=()) -> CostOptions | None:
        """The cost arrangement of ``epoch``: with packing, its windows' steps, from every rank's pieces (the same
        on every rank, ``reading/batches/packing.of_epoch``)."""
        if self.packing is None or self.cost is None:
            return self.cost
        key = (epoch, tuple(stages))
        if key not in self._packings:
            pieces = self.plan.pieces(**self.layout.pieces_args(epoch, 1, stages))
            self._packings = {key: replace(self.cost, pack=packing.of_epoch(self.packing, self.plan, pieces,
                                                                            self.shuffle_window))}  # the last one
        return self._packings[key]

    def _packed_steps(self, epoch: int) -> int:
        cost = self.cost_of(epoch)
        return 0 if cost is None or cost.pack is None else sum(cost.pack.window_steps or ())

    def fragments(self, epoch: int, num_workers: int = 1, stages=()):
        return self.plan.assignment(self.rank, **self.layout.pieces_args(epoch, num_workers, stages))

    def identity(self) -> dict:
        """What a saved position is only valid for."""
        if self._checksum is None:
            self._checksum = self.plan.checksum
        values = (self._checksum, self.world_size, self.batch_size, self.shuffle, self.shuffle_window, self.reshuffle)
        cost = {} if self.cost is None else {loader_state.BALANCE: "cost", loader_state.COST_REDUCE:
                                             self.cost.reduce, loader_state.MAX_BATCH_COST: self.cost.budget}
        if self.cost is not None and self.cost.budget is None and self.shuffle:  # which batches a window makes
            cost[loader_state.COST_ARRANGEMENT] = self.cost.version  # (unshuffled: the plan's order, no window)
        if self.shuffle and self.cost is None:  # which rows a window's batches hold (with a cost: its arrangement)
            cost[loader_state.SHUFFLE_ORDER] = shuffle_rule.ORDER_VERSION
        if self.packing is not None:  # which documents a window's steps hold
            cost.update({loader_state.PACK: self.packing.column, loader_state.SEQ_LEN: self.packing.seq_len,
                         loader_state.SEQUENCES: self.packing.sequences, loader_state.PACKING: self.packing.version,
                         loader_state.LONG_DOCUMENTS: self.packing.long_documents})
        return {**dict(zip(loader_state.IDENTITY_KEYS, values, strict=True)), **cost}


def _rows_batch(plan: ShardPlan, options: LoaderOptions, budget: bool) -> int:
    """Rows the balancer assigns per step: the batch size (the plan's unless given), or 1 under a token budget."""
    if budget:
        if options.partition_epoch != 1:
            raise InvalidValueError(f"partition_epoch={options.partition_epoch} with max_batch_cost: a token budget "
                                    "packs each window's rows into batches, so sub-epochs are not supported with it; "
                                    "leave partition_epoch=1 or use batch_size")
        return 1
    batch_size = plan.batch_size if options.batch_size is None else options.batch_size
    if batch_size is None:
        raise InvalidValueError("batch_size=None and the plan was made without one; pass batch_size=")
    return check_int("batch_size", batch_size, minimum=1)


MEMORY_ADVICE = 4 * 2**30  # a shuffle_budget past this is no advice: a spill folder (local disk) holds the window


def warn_stored_order(clustered: Mapping[str, float], rank_rows: int, window: int, budget: int,
                      row_bytes: float = 0.0) -> None:
    """A ``ShuffleQualityWarning`` when rows are stored in order and a rank's rows need more than the one window
    that ``budget`` (the ``shuffle_budget``) holds: its shuffled batches then mix only nearby row groups, measurably
    less random than the uniform permutation a shuffle asks for. It names one fix: the budget that holds a rank's
    rows, or past ``MEMORY_ADVICE`` a spill folder and the disk it takes (``row_bytes``: decoded bytes per row; 0
    when a spill folder is already given), else a shuffled copy. Every rank has as many rows and the same window,
    so rank 0 alone says it; a ``shuffle_window`` given is the window asked for, and is not warned about."""
    if rank_rows <= window or not clustered:  # (clustered is computed when first asked)
        return
    name, spread = min(clustered.items(), key=lambda item: item[1])
    need = -(-budget * rank_rows // window)  # bytes
    disk = rank_rows * row_bytes
    if need <= MEMORY_ADVICE:
        fix = f"pass shuffle_budget=\"{-(-need // 2**20)}MiB\" to hold them in one"
    elif row_bytes:
        fix = ("pass shuffle_spill_dir=<local disk> to hold them in one there (about "
               + (f"{disk / 2**30:.1f} GiB" if disk >= 2**30 else f"{disk / 2**20:.0f} MiB") + " for this rank)")
    else:
        fix = "write a shuffled copy once (petastorm_balanced.spark.make_shuffled_copy)"
    warnings.warn(ShuffleQualityWarning(
        f"rows are stored sorted by {name!r} (a row group spans {spread:.0%} of its range) and this rank's "
        f"{rank_rows:,} rows need {-(-rank_rows // window)} shuffle windows of {window:,} rows, so shuffled batches "
        f"mix only nearby row groups: {fix}"), stacklevel=4)


def resolve_cost(plan, *, balance: str, cost_reduce: str, max_batch_cost, batch_size, shuffle: bool
                 ) -> CostOptions | None:
    """The loader's cost arrangement, or None for row balance; every bad combination is refused here, when the
    loader is built, naming the parameter."""
    chosen = plan.resolve_balance(balance)  # the one "auto" rule (the plan's); refuses "cost" without a cost
    check_choice("cost_reduce", cost_reduce, REDUCES, REDUCES_MEANING)
    if max_batch_cost is not None:
        max_batch_cost = check_int("max_batch_cost", max_batch_cost, minimum=1, hint=" (the cost budget per batch)")
        if batch_size is not None:
            raise InvalidValueError(f"max_batch_cost={max_batch_cost} sets the rows of each batch; pass "
                                    f"batch_size=None (not {batch_size})")
        if chosen == "rows":
            raise InvalidValueError("max_batch_cost needs balance='cost' (or 'auto') and a plan made with cost=")
        if not shuffle:
            raise InvalidValueError("max_batch_cost packs each shuffle window's rows into batches and needs "
                                    "shuffle=True; pass batch_size= to read in plan order")
        if cost_reduce != "sum":
            raise InvalidValueError("max_batch_cost works with cost_reduce='sum' (a batch's cost is its rows' sum); "
                                    "padded budgets (cost_reduce='max') are not supported")
    if chosen == "rows":
        return None
    # Without shuffle there are no windows to arrange: the rows come in the plan's cost-dealt order, with ``_cost``.
    spec = parse_cost(plan.cost)
    if spec.column is None:  # not spec.loader_evaluable
        raise InvalidValueError(f"the plan's cost {plan.cost!r} is a Spark SQL expression the loader cannot evaluate "
                                "per row (it evaluates a column or length/octet_length/size of a column); store it as "
                                "a column and re-plan with cost='that_column', or pass balance='rows'")
    mean = 0.0
    if max_batch_cost is not None:
        if max_batch_cost < plan.max_row_cost:
            raise InvalidValueError(f"max_batch_cost={max_batch_cost} is below the plan's largest row cost "
                                    f"{plan.max_row_cost}: that row could never be delivered; raise max_batch_cost to "
                                    f"at least {plan.max_row_cost} or filter long rows when planning (where=)")
        mean = float(plan.catalog.cost_sums().sum()) / plan.total_rows
    return CostOptions(plan.cost, spec.column, spec.function, cost_reduce, max_batch_cost, mean,
                       version=arrangement.ARRANGEMENT_VERSION)
