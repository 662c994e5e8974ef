"""``Source``: what one plan's rows are read with, resolved once from the loader's options.

A source is one plan read by one slot: its cost arrangement (``resolve_cost``: None balances rows; with ``pack=``
its packing), the columns read (the requested ones plus the cost's source column, dropped after use) and the
``transform_spec`` bound to them, the lengths column a padded list cost is sized by, its decoded bytes per row
(what sizes its windows), and the ``Layout`` its slots follow. One plan's ``Settings`` holds one source; a
mixture's ``MixtureSettings`` holds one per plan, each resolved here the same way, plus the schedule that mixes
them, so every concern of reading a plan has one implementation.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ...core import balance
from ...core.cost import arrangement
from ...core.cost.arrangement import REDUCES, REDUCES_MEANING
from ...core.cost.options import CostOptions
from ...core.cost.spec import parse_cost
from ...core.packing import Packing
from ...core.params import check_choice, check_int
from ...core.shuffle import EXTRA_ROW_BYTES
from ...errors import InvalidValueError
from ...plan.model import ShardPlan
from ..batches import packing
from ..fields.schema import ColumnSchema
from ..options import LoaderOptions
from ..rows import transform as transforms
from ..rows.columns import Columns, dataset_columns, with_cost_source
from .layout import Layout


@dataclass(frozen=True)
class Source:
    """One plan as a loader reads it (``resolve_source``). ``transform``: ``transform_spec`` bound to the columns
    read, applied where its rows are decoded. ``fill_masks``: columns a mixture delivers as nullable that this
    source delivers without nulls (all-True masks are added to its rows)."""

    plan: ShardPlan
    options: LoaderOptions
    columns: Columns  # the columns read: the requested ones, plus the cost's source column
    cost: CostOptions | None = None  # None: balanced by rows
    drop: tuple[str, ...] = ()  # columns read only to compute the cost
    cost_lengths: str | None = None  # a padded list as the cost column: size() is its lengths column
    packing: Packing | None = None  # pack=: (S, L) sequences of each window's documents
    fill_masks: tuple[str, ...] = ()
    transform: transforms.Transform | None = None

    @property
    def delivered(self) -> tuple[ColumnSchema, ...]:
        """The columns its rows arrive with: the transform's outputs, else those read less the cost's own."""
        if self.transform is not None:
            return self.transform.outputs
        return tuple(c for c in self.columns.schemas if c.name not in self.drop)

    @property
    def row_bytes(self) -> float:
        """Decoded bytes per row for sizing windows: the footers' estimate and what the batcher carries beside."""
        return self.columns.row_bytes + EXTRA_ROW_BYTES

    def rank_rows(self, world_size: int, rows_batch: int) -> int:
        """A rank's rows per pass at ``rows_batch`` rows per step, padding included (refused when the plan cannot
        give every rank a step)."""
        balance.check_fills_a_step(self.plan.total_rows, world_size, rows_batch)
        return self.plan.rows_per_rank(world_size, rows_batch)

    def layout(self, world_size: int, rank: int, *, batch_size: int | None, shuffle_window: int,
               steps: int | None = None, epoch_steps: Callable[[int], int] | None = None) -> Layout:
        """Which rows each slot of ``world_size`` ranks delivers, in what order (the options' shuffle, reshuffle and
        sub-epochs; the plan's cost order where balanced by cost)."""
        options = self.options
        return Layout(self.plan, world_size, rank, batch_size=batch_size, shuffle=options.shuffle,
                      shuffle_window=shuffle_window, reshuffle=options.reshuffle,
                      partition_epoch=options.partition_epoch, balance_by="rows" if self.cost is None else "cost",
                      steps=steps, epoch_steps=epoch_steps)


def resolve_source(plan: ShardPlan, options: LoaderOptions, *, batch_size: int | None, columns: Columns | None = None
                   ) -> Source:
    """``plan`` read with ``options``: its cost (``batch_size``: the rows of a batch, None under a token budget or
    packing), its packing, ``columns`` (default: those ``options`` request) with the cost's source column, and
    ``transform_spec`` bound to them (``transform.bind``; refused with a cost, which comes from the columns read)."""
    cost = resolve_cost(plan, balance=options.balance, cost_reduce=options.cost_reduce,
                        max_batch_cost=options.max_batch_cost, batch_size=batch_size, shuffle=options.shuffle)
    packed = None if options.pack is None else packing.resolve(plan, options, cost)
    if cost is not None and packed is not None:  # (resolve refuses a plan without a cost)
        cost = replace(cost, pack=packed)
    if columns is None:
        columns = dataset_columns(plan, options.schema_fields, options.lists)
    columns, drop = with_cost_source(columns, plan, cost)
    lengths = next((c.lengths for c in columns.schemas if cost is not None and c.name == cost.column), None)
    transform = transforms.bind(options.transform_spec, columns.schemas, columns.fields)
    if transform is not None and cost is not None:
        raise InvalidValueError("transform_spec with a cost plan balanced by cost: the per-row costs come from the "
                                "columns read, before any transform; pass balance='rows', or apply the function "
                                "to the batches in the training loop")
    return Source(plan, options, columns, cost, tuple(drop), lengths, packed, transform=transform)


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
