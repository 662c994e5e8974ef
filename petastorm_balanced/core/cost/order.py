"""The row group order of a cost plan (``cost_order``): the seeded order, re-dealt so every stretch of it carries
average cost.

Why: ranks (and DataLoader workers, and the shuffle windows inside them) take consecutive stretches of the
delivery sequence (``balance.assign``). If long rows cluster in some row groups (files written by length, by
source, by date), the ranks that draw those stretches are slower in every step, and no arrangement inside a rank
can fix that without moving rows between ranks. Dealing the seeded order so that the running cost tracks the
running row count times the mean cost per row keeps every stretch's cost density close to the mean (off by about
one row group's excess at most), so rank totals and, window by window, rank workloads agree. Every rank computes
this from the plan's per-row-group sums alone: no communication.

>>> import numpy as np
>>> counts, sums = np.array([10, 10, 10, 10]), np.array([100, 100, 10, 10])
>>> order = cost_order(counts, sums, seed=0, epoch=0)
>>> [int(sums[order[:2]].sum()), int(sums[order[2:]].sum())]
[110, 110]

Per-rank cost (``rank_costs``, ``straggler_ratio``), read from a plan alone (no data read): each rank's cost, and
the straggler ratio they imply.

Used by ``plan.json``'s totals, ``inspect`` and ``compare``. A piece of a row group is counted at that row group's
mean cost per row: exact for whole row groups, an estimate for the at most ``slots - 1`` split ones.
"""
from __future__ import annotations

import numpy as np

from ..balance import Pieces, epoch_order
from ..catalog import Catalog
from ..registry import Algorithm, Registry


def cost_order(counts: np.ndarray, sums: np.ndarray, *, seed: int, epoch: int) -> np.ndarray:
    """A permutation of catalog rows: the ``[seed, epoch]`` order, split into row groups denser and lighter than
    the mean (each keeping its seeded order), then merged greedily: take a dense one while the running cost is
    below target, else a light one."""
    counts = np.asarray(counts, dtype=np.int64)
    sums = np.asarray(sums, dtype=np.int64)
    base = epoch_order(len(counts), seed, epoch)
    total_rows, total_cost = int(counts.sum()), int(sums.sum())
    if total_cost == 0 or len(counts) < 2:
        return base
    # dense: cost per row >= mean, compared exactly in integers (sums * total_rows >= total_cost * counts)
    dense_mask = sums[base] * total_rows >= total_cost * counts[base]
    dense, light = base[dense_mask].tolist(), base[~dense_mask].tolist()
    order = np.empty(len(counts), dtype=np.int64)
    d = l_ = 0
    excess = 0  # (running cost) * total_rows - (running rows) * total_cost: the running deviation, exact
    count_list, sum_list = counts.tolist(), sums.tolist()
    for i in range(len(counts)):
        if (excess <= 0 and d < len(dense)) or l_ >= len(light):
            row = dense[d]
            d += 1
        else:
            row = light[l_]
            l_ += 1
        order[i] = row
        excess += sum_list[row] * total_rows - count_list[row] * total_cost
    return order

def seeded_order(counts: np.ndarray, sums: np.ndarray, *, seed: int, epoch: int) -> np.ndarray:
    """The ``[seed, epoch]`` order of a row-balanced plan (``balance.epoch_order``); ``sums`` is not used."""
    return epoch_order(len(counts), seed, epoch)


# How a plan orders its row groups each pass, by ``balance`` (resolved: "rows" or "cost"). A cost plan stamps its
# order's name and version in plan.json (``cost.order``, ``cost.order_version``); a reader of another refuses it.
ROW_GROUP_ORDERS = Registry("row group order", "balance", {
    "rows": Algorithm("seeded", 1, seeded_order),
    "cost": Algorithm("density-tracking", 1, cost_order),
})
ORDER_NAME, ORDER_VERSION = ROW_GROUP_ORDERS["cost"].name, ROW_GROUP_ORDERS["cost"].version


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
