"""ShardPlan and Fragment: the user-facing view of a plan.

A plan holds the catalog and the planning parameters; every assignment (any epoch, world size, worker count,
batch size) is computed from them on demand by the pure balancer, so one scan serves elastic restarts (G9) and
every rank derives the same assignment without talking to the others (G5).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..core import balance, elastic, selection
from ..core.catalog import Catalog
from ..core.cost.order import ROW_GROUP_ORDERS
from ..core.cost.spec import resolve_balance
from ..errors import InvalidValueError
from ..io.location import DatasetLocation
from ..io.tables import TableRef
from ..unischema.storage import load_unischema
from ..world import check_rank_world

if TYPE_CHECKING:
    from os import PathLike
from ..core.predicate_info import PredicateInfo
from ..core.shuffle import Windows


@dataclass(frozen=True)
class Fragment:
    """A run of one row group's matching rows delivered to one slot."""

    path: str
    row_group: int
    padding: bool
    worker: int
    start: int  # slice of the row group's matching rows
    stop: int
    total_rows: int  # rows in the row group, as planned (the reader checks it against the file)
    selection: bytes = field(repr=False, default=b"")

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def row_indices(self) -> np.ndarray:
        """Row positions inside the row group, in the plan's delivery order (the loader may shuffle further)."""
        if not self.selection:
            return np.arange(self.start, self.stop, dtype=np.int64)
        return selection.decode(self.selection, self.total_rows)[self.start:self.stop]


@dataclass(frozen=True)
class ShardPlan:
    """A balanced shard plan for one dataset and predicate."""

    dataset_url: str
    catalog: Catalog = field(repr=False)
    world_size: int
    batch_size: int | None
    policy: str = "drop"
    seed: int = 0
    predicate: PredicateInfo = PredicateInfo()
    dataset_fingerprint: str = ""
    table: TableRef | None = None  # the Delta/Iceberg snapshot planned (io/tables.py); None: a Parquet folder
    # The checksums of the plans this one updates (``plan_shards(update=)``), oldest first: their catalogs are parts
    # of this one, so a loader state saved on them resumes here at an epoch boundary. Not part of the content (the
    # checksum equals planning from scratch), so not compared either.
    extends: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        balance.check_params(world_size=self.world_size, seed=self.seed,
                             **({} if self.batch_size is None else {"batch_size": self.batch_size}))
        balance.check_policy(self.policy)

    @property
    def total_rows(self) -> int:
        """Matching rows (after the predicate)."""
        return self.catalog.total_rows

    def rows_per_rank(self, world_size: int | None = None, batch_size: int | None = None) -> int:
        """Rows each rank delivers per epoch, padding included."""
        return self.steps_per_epoch(world_size, batch_size) * self._batch(batch_size)

    def steps_per_epoch(self, world_size: int | None = None, batch_size: int | None = None) -> int:
        world = self.world_size if world_size is None else world_size
        batch = self._batch(batch_size)
        balance.check_params(world_size=world, batch_size=batch)
        return balance.steps_per_rank(self.total_rows, world, batch, self.policy)

    @property
    def cost(self) -> str | None:
        """The cost (a column or a Spark SQL expression) the plan has per-row-group statistics for, or None."""
        return self.catalog.cost

    @property
    def max_row_cost(self) -> int | None:
        return self.catalog.max_row_cost

    def resolve_balance(self, balance_by: str = "auto") -> str:
        """``"cost"`` or ``"rows"``: the one ``"auto"`` rule, which every reader follows (``make_loader``,
        ``BalancedIterableDataset``, ``make_reader``, ``verify``): a plan with a cost balances cost, whatever the
        reader's other settings, so every reader of a plan delivers the same rows in the same cost-dealt order
        (``core/cost/spec.resolve_balance``)."""
        return resolve_balance(balance_by, has_cost=self.cost is not None)

    def pieces(self, *, epoch: int = 0, world_size: int | None = None, num_workers: int = 1,
               batch_size: int | None = None, reshuffle: str = "epoch", partition_epoch: int = 1,
               stages: Sequence[elastic.Stage] = (), windows: Windows | None = None,
               balance_by: str = "auto") -> balance.Pieces:
        """Every slot's row ranges for one epoch, as arrays (what ``assignment`` slices per rank).

        ``partition_epoch=P``: ``epoch`` is part ``epoch % P`` of pass ``epoch // P``. ``stages``: the worlds that
        served this pass before an elastic resume (``elastic.py``), with ``windows`` saying how their slots shuffled
        (so which rows they had not delivered yet). Cost balance deals the pass's row group order so every rank's
        stretch carries average cost (``core/cost/order.ROW_GROUP_ORDERS``).
        """
        world = self.world_size if world_size is None else world_size
        balance_by = self.resolve_balance(balance_by)
        by_cost = balance_by == "cost"
        if stages:
            if by_cost:
                raise InvalidValueError("an elastic resume (a state saved at another world size or worker count) of a "
                                        "cost-balanced loader is not supported: its rows per old rank follow the cost "
                                        "order; resume at the same world size, or finish the epoch, or use "
                                        "balance='rows'")
            if windows is None:
                raise InvalidValueError("stages need windows= (how the old slots shuffled their rows, "
                                        "shuffle.Windows)")
            return elastic.stage_pieces(self._counts, stages=stages, world_size=world, num_workers=num_workers,
                                        batch_size=self._batch(batch_size), policy=self.policy, seed=self.seed,
                                        epoch=epoch, windows=windows, reshuffle=reshuffle,
                                        partition_epoch=partition_epoch)
        balance.check_params(epoch=epoch, partition_epoch=partition_epoch)  # before the pass is computed from them
        pass_index = 0 if reshuffle == "fixed" else balance.split_epoch(epoch, partition_epoch)[0]
        sums = self.catalog.cost_sums() if by_cost else self._counts  # a row order reads no cost
        order = ROW_GROUP_ORDERS[balance_by].run(self._counts, sums, seed=self.seed, epoch=pass_index)
        return balance.BALANCER.run(self._counts, world_size=world, batch_size=self._batch(batch_size),
                                    policy=self.policy, seed=self.seed, epoch=epoch, num_workers=num_workers,
                                    reshuffle=reshuffle, partition_epoch=partition_epoch, order=order)

    def assignment(self, rank: int, *, epoch: int = 0, world_size: int | None = None, num_workers: int = 1,
                   batch_size: int | None = None, reshuffle: str = "epoch", partition_epoch: int = 1,
                   stages: Sequence[elastic.Stage] = (), windows: Windows | None = None,
                   balance_by: str = "auto") -> list[Fragment]:
        """The fragments rank ``rank`` reads in ``epoch``, worker by worker, in delivery order."""
        world = self.world_size if world_size is None else world_size
        check_rank_world(rank, world)
        mine = self.pieces(epoch=epoch, world_size=world, num_workers=num_workers, batch_size=batch_size,
                           reshuffle=reshuffle, partition_epoch=partition_epoch, stages=stages,
                           windows=windows, balance_by=balance_by).of_rank(rank)
        groups = self.catalog.row_groups
        rows = np.asarray(mine.catalog_row, dtype=np.int64)
        # the catalog's columns taken for these rows at once (one RowGroupMatch per fragment cost most of this)
        paths = [groups.paths[i] for i in groups.path_index[rows].tolist()]
        numbers, totals = groups.row_group[rows].tolist(), groups.total_rows[rows].tolist()
        selections = groups.selection.take(pa.array(rows)).to_pylist()
        fragments = []
        for i, (w, s, e, p) in enumerate(zip(np.asarray(mine.worker).tolist(), np.asarray(mine.start).tolist(),
                                             np.asarray(mine.stop).tolist(), np.asarray(mine.padding).tolist(),
                                             strict=True)):
            if mine.subset is not None and mine.subset[i] >= 0:  # scattered rows left by an elastic resume
                matching = mine.matching_rows(i)
                raw = matching if not selections[i] else selection.decode(selections[i], totals[i])[matching]
                fragments.append(Fragment(paths[i], numbers[i], bool(p), w, 0, len(raw), totals[i],
                                          selection.encode(raw, totals[i])))
            else:
                fragments.append(Fragment(paths[i], numbers[i], bool(p), w, s, e, totals[i], selections[i]))
        return fragments

    def save(self, output_url: str | PathLike[str]) -> str:
        """Write the plan directory (``plan.json`` last, so a partial write is never loadable)."""
        from .format import write_plan
        return write_plan(self, output_url)

    @property
    def checksum(self) -> str:
        """sha256 over the plan's content; equal plans have equal checksums, whichever engine made them."""
        from .format import content_checksum
        return content_checksum(self)

    @cached_property
    def location(self) -> DatasetLocation:
        """The dataset's filesystem and root, resolved once for this plan in this process (``io/location.py``): the
        loader's schema pass, its list scan and every epoch's readers share it. Not pickled (``__getstate__``)."""
        return DatasetLocation.of(self.dataset_url)

    @cached_property
    def unischema(self):
        """The dataset's stored Unischema (None for plain Parquet), loaded once for this plan through the allow-list
        (``unischema/storage.load_unischema``): ``load_plan`` checks it, the loader's columns read it. Not pickled."""
        return load_unischema(self.location.url) if self.catalog.kind == "petastorm" else None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for resolved in ("location", "unischema"):  # of this process (a filesystem); the receiver resolves its own
            state.pop(resolved, None)
        return state

    @cached_property
    def _counts(self) -> np.ndarray:
        return self.catalog.matching_counts()

    def _batch(self, batch_size: int | None) -> int:
        batch = self.batch_size if batch_size is None else batch_size
        if batch is None:
            raise InvalidValueError("batch_size=None: this plan was made without a batch size; pass batch_size=")
        return batch
