"""Batches under a token budget (``max_batch_cost=C``, batches of varying rows; ``arrange_budget``): each window of
``R`` rows becomes exactly ``k = ceil(R x mean cost per row x 1.03 / C)`` batches (``k`` depends only on the plan, so
it is the same on every rank), filled worst-fit-decreasing (each row, largest first, into the emptiest batch), so
batches are both full and alike. A row that fits in no batch is left out of this epoch; the cost left out of a window
is at most ``max(0, window cost - k x (C - largest row cost))``.

Rows are tie-broken and batches ordered by PCG64 words (``window_permutation``), as in ``arrangement.py``: the
batches are a function of the window's costs and the key alone, so resuming re-reads the window and gets the same
batches (G4, G6).
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from ...errors import InvalidValueError
from ..shuffle import raw_words, window_permutation
from .arrangement import BATCH_ORDER, ROWS_IN_BATCH, STEP_ORDER, descending

BUDGET_SLACK = 0.03  # room for windows costlier than the mean: fewer rows left out, about 3% less fill


def budget_batches(num_rows: int, mean_cost: float, budget: int) -> int:
    """Batches a window of ``num_rows`` rows becomes under a token budget: enough for the window's expected cost
    plus ``BUDGET_SLACK`` (every rank computes the same from the plan), at least one, never more than its rows."""
    if num_rows == 0:
        return 0
    expected = int(np.ceil(num_rows * mean_cost * (1 + BUDGET_SLACK)))
    return int(min(num_rows, max(1, -(-expected // budget))))


def arrange_budget(costs: np.ndarray, batches: int, budget: int, key: Sequence[int]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(order, lengths)``: ``batches`` batches of at most ``budget`` total cost, filled worst-fit-decreasing;
    ``order`` lists the kept rows batch after batch, ``lengths`` the rows of each batch. Rows that fit nowhere are
    left out. Every batch holds at least one row when every row costs at most ``budget``."""
    costs = np.asarray(costs, dtype=np.int64)
    if costs.size and int(costs.max()) > budget:
        raise InvalidValueError(f"a row costs {int(costs.max())}, more than max_batch_cost={budget}")
    loads = [0] * batches
    members: list[list[int]] = [[] for _ in range(batches)]
    # a heap of (load, tie, batch) keeps the emptiest batch on top
    tie = window_permutation(batches, (*key, BATCH_ORDER))
    heap = [(0, int(tie[b]), b) for b in range(batches)]
    heapq.heapify(heap)
    for row in descending(costs, key).tolist():
        load, t, b = heap[0]
        cost = int(costs[row])
        if load + cost > budget:
            continue  # the emptiest batch cannot take it: no batch can
        members[b].append(row)
        loads[b] = load + cost
        heapq.heapreplace(heap, (load + cost, t, b))
    groups = [np.asarray(m, dtype=np.int64) for m in members]
    served = window_permutation(batches, (*key, STEP_ORDER))
    groups = [groups[i] for i in served]
    lengths = np.fromiter((len(g) for g in groups), dtype=np.int64, count=batches)
    rows = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
    # rows inside each batch in a seeded order
    words = raw_words((*key, ROWS_IN_BATCH), len(rows))
    batch_of = np.repeat(np.arange(batches), lengths)
    order = rows[np.lexsort((words, batch_of))]
    return order, lengths
