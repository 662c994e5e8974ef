"""The catalog: what planning learned about the dataset, as plain frozen values.

A catalog lists every data file (so a plan can tell later whether the dataset changed) and every row group with
at least one matching row (so balancing never sees empty work). Row groups are keyed by (path relative to the
dataset root, index in the file), never by a position in some list whose order depends on a code path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import numpy as np

from . import selection
from ..errors import InvalidValueError


@dataclass(frozen=True)
class FileInfo:
    """One data file as planning saw it: enough to notice a rewrite, an append or a truncation."""

    path: str  # relative to the dataset root, '/'-separated
    size: int
    row_group_rows: Tuple[int, ...]

    @property
    def num_rows(self) -> int:
        return sum(self.row_group_rows)


@dataclass(frozen=True)
class RowGroupMatch:
    """The matching rows of one row group: ``selection`` is empty when all ``total_rows`` match."""

    path: str
    row_group: int
    total_rows: int
    matching_rows: int
    selection: bytes = b""
    cost_sum: Optional[int] = None  # cost plans: the matching rows' cost sum and largest row cost
    cost_max: Optional[int] = None

    def positions(self) -> np.ndarray:
        return selection.decode(self.selection, self.total_rows)


@dataclass(frozen=True)
class Catalog:
    """Every data file, and every row group with a matching row, both sorted by key."""

    files: Tuple[FileInfo, ...]
    row_groups: Tuple[RowGroupMatch, ...]
    kind: str = "plain"  # 'petastorm' when the dataset carries a Unischema
    partition_columns: Tuple[str, ...] = field(default=())
    cost: Optional[str] = None  # the cost (column or Spark SQL expression) every row group has stats for

    def __post_init__(self):
        keys = [(r.path, r.row_group) for r in self.row_groups]
        if keys != sorted(keys) or len(set(keys)) != len(keys):
            raise InvalidValueError("catalog row groups must be unique and sorted by (path, row_group)")
        if self.cost is not None and any(r.cost_sum is None or r.cost_max is None for r in self.row_groups):
            raise InvalidValueError(f"catalog with cost={self.cost!r} has row groups without cost statistics")

    @property
    def total_rows(self) -> int:
        """Matching rows over the whole dataset."""
        return int(self.matching_counts().sum())

    @property
    def scanned_rows(self) -> int:
        return sum(f.num_rows for f in self.files)

    def cost_sums(self) -> np.ndarray:
        """Cost of each row group's matching rows, shape (row groups,); only for a catalog with a cost."""
        return np.fromiter((r.cost_sum for r in self.row_groups), dtype=np.int64, count=len(self.row_groups))

    @property
    def max_row_cost(self) -> Optional[int]:
        """The largest cost of one matching row (a token budget below it could never hold that row)."""
        if self.cost is None:
            return None
        return max((int(r.cost_max) for r in self.row_groups), default=0)

    def matching_counts(self) -> np.ndarray:
        # (row groups,)
        return np.fromiter((r.matching_rows for r in self.row_groups), dtype=np.int64, count=len(self.row_groups))


def full_catalog(files: Sequence[FileInfo], kind: str = "plain", partition_columns=()) -> Catalog:
    """The catalog when every row matches: one entry per non-empty row group, straight from the footers."""
    row_groups = tuple(RowGroupMatch(f.path, i, n, n) for f in sorted(files, key=lambda f: f.path)
                       for i, n in enumerate(f.row_group_rows) if n > 0)
    return Catalog(tuple(sorted(files, key=lambda f: f.path)), row_groups, kind, tuple(partition_columns))


def match_from_mask(path: str, row_group: int, mask: np.ndarray) -> Optional[RowGroupMatch]:
    """The catalog entry for a row group given its boolean match mask, or None if nothing matches."""
    positions = np.flatnonzero(np.asarray(mask, dtype=bool))
    if len(positions) == 0:
        return None
    return RowGroupMatch(path, row_group, len(mask), len(positions), selection.encode(positions, len(mask)))
