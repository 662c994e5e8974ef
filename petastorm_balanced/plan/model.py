"""ShardPlan and Fragment: the user-facing view of a plan.

A plan holds the catalog and the planning parameters; every assignment (any epoch, world size, worker count,
batch size) is computed from them on demand by the pure balancer, so one scan serves elastic restarts (G9) and
every rank derives the same assignment without talking to the others (G5).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import List, Optional

import numpy as np

from . import balance, selection
from .catalog import Catalog
from .predicate import PredicateInfo


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
    batch_size: Optional[int]
    policy: str = "drop"
    seed: int = 0
    predicate: PredicateInfo = PredicateInfo()
    dataset_fingerprint: str = ""

    def __post_init__(self):
        balance.check_params(world_size=self.world_size, seed=self.seed,
                             **({} if self.batch_size is None else {"batch_size": self.batch_size}))
        balance.check_policy(self.policy)

    @property
    def total_rows(self) -> int:
        """Matching rows (after the predicate)."""
        return self.catalog.total_rows

    def rows_per_rank(self, world_size: Optional[int] = None, batch_size: Optional[int] = None) -> int:
        """Rows each rank delivers per epoch, padding included."""
        return self.steps_per_epoch(world_size, batch_size) * self._batch(batch_size)

    def steps_per_epoch(self, world_size: Optional[int] = None, batch_size: Optional[int] = None) -> int:
        world = self.world_size if world_size is None else world_size
        batch = self._batch(batch_size)
        balance.check_params(world_size=world, batch_size=batch)
        return balance.steps_per_rank(self.total_rows, world, batch, self.policy)

    def pieces(self, *, epoch: int = 0, world_size: Optional[int] = None, num_workers: int = 1,
               batch_size: Optional[int] = None, reshuffle: str = "epoch", rank: Optional[int] = None
               ) -> balance.Pieces:
        """Every slot's row ranges for one epoch, as arrays (only rank ``rank``'s when given)."""
        return balance.assign(self._counts, world_size=self.world_size if world_size is None else world_size,
                              batch_size=self._batch(batch_size), policy=self.policy, seed=self.seed,
                              epoch=epoch, num_workers=num_workers, reshuffle=reshuffle, rank=rank)

    def assignment(self, rank: int, *, epoch: int = 0, world_size: Optional[int] = None, num_workers: int = 1,
                   batch_size: Optional[int] = None, reshuffle: str = "epoch") -> List[Fragment]:
        """The fragments rank ``rank`` reads in ``epoch``, worker by worker, in delivery order."""
        world = self.world_size if world_size is None else world_size
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
            raise ValueError(f"rank={rank!r} must be an int in [0, world_size={world})")
        mine = self.pieces(epoch=epoch, world_size=world, num_workers=num_workers, batch_size=batch_size,
                           reshuffle=reshuffle, rank=int(rank))
        groups = self.catalog.row_groups  # columns: only this rank's row groups become objects
        return [Fragment(groups[c].path, groups[c].row_group, bool(p), int(w), int(s), int(e),
                         groups[c].total_rows, groups[c].selection)
                for c, w, s, e, p in zip(mine.catalog_row, mine.worker, mine.start, mine.stop, mine.padding)]

    def save(self, output_url: str) -> str:
        """Write the plan directory (``plan.json`` last, so a partial write is never loadable)."""
        from .format import write_plan
        return write_plan(self, output_url)

    @property
    def checksum(self) -> str:
        """sha256 over the plan's content; equal plans have equal checksums, whichever engine made them."""
        from .format import content_checksum
        return content_checksum(self)

    @cached_property
    def _counts(self) -> np.ndarray:
        return self.catalog.matching_counts()

    def _batch(self, batch_size: Optional[int]) -> int:
        batch = self.batch_size if batch_size is None else batch_size
        if batch is None:
            raise ValueError("batch_size=None: this plan was made without a batch size; pass batch_size=")
        return batch
