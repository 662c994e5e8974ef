"""The row group order of a cost plan: the seeded order, re-dealt so every stretch of it carries average cost.

Why: ranks (and DataLoader workers, and the shuffle windows inside them) take consecutive stretches of the
delivery sequence (``balance.assign``). If long rows cluster in some row groups (files written by length, by
source, by date), the ranks that draw those stretches are slower in every step, and no arrangement inside a rank
can fix that without moving rows between ranks. Dealing the seeded order so that the running cost tracks the
running row count times the mean cost per row keeps every stretch's cost density close to the mean (off by about
one row group's excess at most), so rank totals and, window by window, rank workloads agree. Every rank computes
this from the plan's per-row-group sums alone: no communication. Pure numpy, no I/O.

>>> import numpy as np
>>> counts, sums = np.array([10, 10, 10, 10]), np.array([100, 100, 10, 10])
>>> order = cost_order(counts, sums, seed=0, epoch=0)
>>> [int(sums[order[:2]].sum()), int(sums[order[2:]].sum())]
[110, 110]
"""
from __future__ import annotations

import numpy as np

from .balance import epoch_order

NAME = "density-tracking"
VERSION = 1


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
