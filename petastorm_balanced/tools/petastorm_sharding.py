"""What plain Petastorm sharding (``cur_shard`` / ``shard_count``) gives each rank: the problem we fix.

Petastorm 0.12.1 (``Reader._partition_row_groups``) lists every row group of the dataset as a "piece": files in
sorted path order, each file's row groups in file order (``etl/dataset_metadata.load_row_groups``). Rank ``r`` of
``W`` keeps the pieces whose *index in that list* is ``r`` modulo ``W``. The optional ``seed`` shuffles the list
first but the filter still tests the piece's index, not its position, so the seed changes only the reading order,
never which rows a rank gets. A predicate does not move pieces between ranks either: it is applied afterwards,
row by row, inside each rank's own pieces. So from the catalog (every file's row group sizes, and the matching
rows of each row group) we know exactly how many rows each rank would see, without starting a reader.

Petastorm's ``DataLoader`` then yields ``ceil(rows / batch_size)`` batches, the last one short; ranks with fewer
rows run out first and the others hang in their next all-reduce.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.balance import check_params
from ..core.catalog import Catalog


@dataclass(frozen=True)
class PetastormShards:
    """Per-rank outcome of ``make_reader(..., cur_shard=r, shard_count=W)`` over a catalog."""

    world_size: int
    batch_size: int
    rows: np.ndarray  # (world_size,) matching rows each rank reads
    row_groups: np.ndarray  # (world_size,) row groups (pieces) each rank opens, matching or not
    rows_read: np.ndarray  # (world_size,) rows of those row groups, before the predicate

    @property
    def steps(self) -> np.ndarray:
        """Batches Petastorm's DataLoader yields per rank (the last one may be short)."""
        return -(-self.rows // self.batch_size)

    @property
    def full_steps(self) -> np.ndarray:
        """Full batches per rank: what a training loop that drops the short last batch takes."""
        return self.rows // self.batch_size


def piece_keys(catalog: Catalog) -> tuple[tuple[str, int, int], ...]:
    """Petastorm's piece list as ``(path, row group, rows)``: sorted files, row groups in file order."""
    return tuple((f.path, i, n) for f in sorted(catalog.files, key=lambda f: f.path)
                 for i, n in enumerate(f.row_group_rows))


def petastorm_shards(catalog: Catalog, world_size: int, batch_size: int = 1) -> PetastormShards:
    """Rows, steps and row groups each of ``world_size`` ranks gets from Petastorm's own sharding."""
    check_params(world_size=world_size, batch_size=batch_size)
    matching: dict[tuple[str, int], int] = {(r.path, r.row_group): r.matching_rows for r in catalog.row_groups}
    pieces = piece_keys(catalog)
    # (pieces,) arrays: the rank of each piece, its matching rows and its total rows
    rank = np.arange(len(pieces)) % world_size
    rows = np.fromiter((matching.get((p, i), 0) for p, i, _ in pieces), dtype=np.int64, count=len(pieces))
    total = np.fromiter((n for _, _, n in pieces), dtype=np.int64, count=len(pieces))
    return PetastormShards(world_size, batch_size,
                           rows=np.bincount(rank, weights=rows, minlength=world_size).astype(np.int64),
                           row_groups=np.bincount(rank, minlength=world_size).astype(np.int64),
                           rows_read=np.bincount(rank, weights=total, minlength=world_size).astype(np.int64))
