"""``Settings``: a loader's settings, checked once against the plan, shared by ``BalancedLoader`` and
``BalancedIterableDataset``.

Settings are made of small resolved parts: the plan as a source (``resolve.Source``: the cost arrangement, None
balancing rows, and the columns read), what every batch holds (``loader.schema``), and the ``Layout`` (which rows
each slot delivers, in what order, in how many steps).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction

from ...core import shuffle as shuffle_rule
from ...core.cost.options import CostOptions
from ...core.cost.spec import COST_COLUMN
from ...core.params import check_int
from ...core.shuffle import MEMORY_ADVICE
from ...errors import InvalidValueError, ShuffleQualityWarning
from ...plan.model import ShardPlan
from ...world import World
from .. import state as loader_state
from ..batches import packing
from ..batches.spare_matrices import SpareMatrices
from ..fields.schema import batch_schema, extra_column
from ..options import LoaderOptions
from ..windows import window_budget
from . import stream
from .resolve import resolve_source


class Settings:
    """A loader's settings, checked against its plan: the options given (``options``), the plan as a source
    (``source``: the cost arrangement ``cost``, None: rows only; the columns read, ``columns`` and ``drop``), the
    batches' schema (``transform``, ``schema``) and the ``layout`` (which rows each slot delivers). Shared by
    ``BalancedLoader`` and ``BalancedIterableDataset``; ``plan`` is resolved where the loader is made."""

    def __init__(self, plan: ShardPlan, world: World, options: LoaderOptions):
        self.plan, self.options = plan, options
        self.rank, self.world_size = world.rank, world.size
        # the cost (with a token budget or packing batches have no fixed size), the columns read with its source
        self.source = source = resolve_source(plan, options,
                                              batch_size=None if options.pack is not None else options.batch_size)
        budget = self.cost is not None and self.cost.per_window
        rows_batch = _rows_batch(plan, options, budget)  # a token budget assigns rows one by one, then packs them
        rank_rows = source.rank_rows(self.world_size, rows_batch)  # a rank's rows per pass, padding included
        self.shuffle_budget = int(options.shuffle_budget)  # bytes (parsed by LoaderOptions)
        self.shuffle_spill_budget = int(options.shuffle_spill_budget)
        shuffle_window = options.shuffle_window
        if shuffle_window is None:  # as many rows as the budget holds (G16); unshuffled, windows only group batches
            shuffle_window = window_budget.window_rows(options, self.row_bytes, rows_batch, rank_rows)
        steps = None
        if budget and self.cost is not None:
            steps = self.cost.budget_steps(rank_rows, shuffle_window)
        self.layout = source.layout(self.world_size, self.rank, batch_size=None if budget else rows_batch,
                                    shuffle_window=shuffle_window, steps=steps,
                                    epoch_steps=None if self.packing is None else self._packed_steps)
        self._packings: dict[tuple, CostOptions] = {}  # (epoch, stages) -> that epoch's CostOptions (packing)
        self.padding_mask = options.padding_mask
        # Rank 0 says it (every rank has as many rows and the same window); a shuffle_window given is what was asked.
        if options.shuffle and options.shuffle_window is None and self.rank == 0:
            warn_stored_order(self.columns.clustered, rank_rows, shuffle_window, self.shuffle_budget,
                              0.0 if window_budget.spilled(options) else self.row_bytes)  # a folder: no more to say
        extras = ([extra_column(stream.PADDING, "bool")] if self.padding_mask else []) + \
            ([extra_column(COST_COLUMN, "int64")] if self.cost is not None else [])
        # transform_spec (transform.py): applied where the rows are decoded; its declared columns are the schema's
        if self.transform is not None:
            self.schema = batch_schema(self.transform.outputs, extras)
        else:
            self.schema = self.columns.batch_schema(self.drop, extras)  # loader.schema: what every batch holds (G13)
        if self.packing is not None:  # (S, L) sequences instead of rows
            target = self.columns.target
            self.schema = packing.packed_schema(self.packing, self.schema, None if target is None or self.packing.column
                                                not in target.names else target.field(self.packing.column).type)
        self._checksum: str | None = None

    weights = (Fraction(1),)  # one plan is a mixture of one source (``loader.weights``)

    # the source's answers (``resolve.Source``)
    cost = property(lambda self: self.source.cost, doc="the cost arrangement; None: balanced by rows")
    packing = property(lambda self: self.source.packing, doc="pack=: how each window's documents become sequences")
    columns = property(lambda self: self.source.columns, doc="the columns read (the cost's source column included)")
    drop = property(lambda self: self.source.drop, doc="columns read only to compute the cost")
    cost_lengths = property(lambda self: self.source.cost_lengths, doc="a padded list cost column's lengths column")
    row_bytes = property(lambda self: self.source.row_bytes, doc="decoded bytes per row, as windows are sized")
    transform = property(lambda self: self.source.transform, doc="transform_spec bound to the columns read")

    # the layout's answers, which the loaders and their position ask for
    batch_size = property(lambda self: self.layout.batch_size, doc="rows per batch; None: a token budget")
    shuffle = property(lambda self: self.layout.shuffle)
    shuffle_window = property(lambda self: self.layout.shuffle_window, doc="rows per shuffle window (resolved)")
    reshuffle = property(lambda self: self.layout.reshuffle)
    partition_epoch = property(lambda self: self.layout.partition_epoch)

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

    def slot_runs(self, chunks: stream.Chunks, epoch: int, stages=(), *, batches_done: int, slot: int = 0,
                  num_workers: int = 1, spares: SpareMatrices | None = None):
        """Runs of whole numpy batches of slot ``slot`` of ``num_workers`` on this rank in ``epoch`` (after
        ``stages``: an elastic resume's earlier worlds), from batch ``batches_done`` on, read by ``chunks`` (a
        backend's): ``stream.slot_runs`` with this loader's layout, cost and columns, and a new placement of the
        slot's windows (``window_budget.placement``); ``spares``: the caller's window matrices (``SpareMatrices``)."""
        fragments = [f for f in self.plan.assignment(self.rank, **self.layout.pieces_args(epoch, num_workers, stages))
                     if f.worker == slot]
        return stream.slot_runs(fragments, chunks, batch_size=self.batch_size, shuffle=self.shuffle,
                                shuffle_window=self.shuffle_window, key=self.layout.key(epoch, slot, len(stages)),
                                batches_done=batches_done, cost=self.cost_of(epoch, stages), drop=self.drop,
                                cost_lengths=self.cost_lengths, placement=window_budget.placement(self.options,
                                                                                                  num_workers),
                                spares=spares)

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

