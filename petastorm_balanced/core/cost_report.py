"""Cost figures read from a plan alone (no data read): each rank's cost, and the straggler ratio they imply.

Used by ``plan.json``'s totals, ``inspect`` and ``compare``. A piece of a row group is counted at that row group's
mean cost per row: exact for whole row groups, an estimate for the at most ``slots - 1`` split ones.
"""
from __future__ import annotations

import numpy as np

from .balance import Pieces
from .catalog import Catalog


def rank_costs(catalog: Catalog, pieces: Pieces) -> np.ndarray:
    """Estimated cost each rank reads in the epoch of ``pieces``, shape (world_size,)."""
    density = catalog.cost_sums() / np.maximum(catalog.matching_counts(), 1)  # (row groups,)
    per_piece = density[pieces.catalog_row] * pieces.num_rows
    return np.bincount(pieces.rank, weights=per_piece, minlength=pieces.world_size)


def straggler_ratio(costs) -> float:
    """max / mean of per-rank costs: how long the slowest rank works against the average (1.0 is perfect)."""
    costs = np.asarray(costs, dtype=np.float64)
    mean = costs.mean() if len(costs) else 0.0
    return float(costs.max() / mean) if mean > 0 else 1.0
