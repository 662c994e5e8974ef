"""Fixed-size batches inside one shuffle window (``arrange_sum``, ``arrange_max``; chosen by ``CostOptions``,
``options.py``; this module holds their first versions, ``one_sort.py`` the second, which new loaders use): every
rank already reads the same number of rows per epoch, in windows of the same size that start at the same steps on
every rank (``reading/batches/batching.py``), and the plan's row group order gives every rank's stretch of data about
the mean cost per row (``order.cost_order``). What is left is to arrange each window's rows into batches so that the
batches that meet in one step, one per rank, cost about the same. Each rank does that alone, from its window's
costs and a generator key, with a rule that makes every rank land near the same value:

- ``"sum"`` (packed or variable-length batches cost the sum of their rows): every batch of a window gets close to
  the window's mean batch cost. Rows are dealt in rounds, largest first; each round gives one row to every batch,
  the largest row to the batch that is lightest so far (a round-wise LPT). Since every rank's window mean is the
  global mean up to sampling noise, every rank's batches are, too. A row costlier than a mean batch (heavy tails)
  keeps its batch heavy whatever the arrangement, so batches are then ranked by cost and served in an order drawn
  from a key without the rank, like ``"max"`` below: the heavy batches of all ranks meet in the same few steps.
- ``"max"`` (padded batches cost ``rows x longest row``): batches are runs of the window's rows sorted by cost
  (little padding), and the step at which each of those quantile buckets is served is drawn from a key *without*
  the rank, ``[seed, epoch, slot, window]``: at every step all ranks serve the same quantile of similar windows.

Rows are tie-broken and batches ordered by PCG64 words (``window_permutation``), so the arrangement is a function
of the window's costs and the key alone: resuming re-reads the window and gets the same batches (G4, G6).

>>> import numpy as np
>>> costs = np.array([9, 1, 1, 1, 5, 5, 3, 3])
>>> order = arrange_sum(costs, 4, (0, 0, 0, 0, 0))
>>> [int(costs[order[i:i + 4]].sum()) for i in range(0, 8, 4)]
[14, 14]
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import InvalidValueError
from ..registry import Algorithm, Registry
from ..shuffle import raw_words, window_permutation
from . import one_sort

# Generator key tags, so the key of one use never equals the key of another.
TIE, BATCH_ORDER, ROWS_IN_BATCH, STEP_ORDER = 1, 2, 3, 4


def _rank_free(key: Sequence[int]) -> tuple[int, ...]:
    """``(seed, epoch, rank, slot, window)`` without the rank: the same on every rank for the same step."""
    seed, epoch, _rank, slot, window = key
    return (seed, epoch, slot, window)


def _words16(key: Sequence[int], tag: int, count: int) -> np.ndarray:
    """The low 16 bits of the first ``count`` raw PCG64 words drawn from ``[*key, tag]``."""
    return raw_words((*key, tag), count).astype(np.uint16)


def _shuffle_within(batches: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """Each row of ``batches`` (batches, rows) permuted by a draw from ``key``.

    Two stable radix passes over the flat array (seeded 16-bit words, then the batch index) rather than one small
    sort per batch, whose per-call overhead dominated (about 5x slower for batches of 16).
    """
    k, rows = batches.shape
    order = np.argsort(_words16(key, ROWS_IN_BATCH, k * rows), kind="stable")
    batch_of = (order // rows).astype(np.uint16 if k <= 0xFFFF else np.uint32)
    order = order[np.argsort(batch_of, kind="stable")]
    return batches.reshape(-1)[order].reshape(k, rows)


def _ascending(costs: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """Row positions by cost, cheapest first, equal costs in a seeded order.

    Least significant digit first with 16-bit stable passes (NumPy radix-sorts 16-bit keys): a pass of seeded
    words breaks ties, then one pass per 16 bits the largest cost needs; about 4x faster than sorting 64-bit keys.
    Costs below 2**16 (the common case) take their one pass on a 16-bit copy, a quarter of the memory traffic.
    """
    order = np.argsort(_words16(key, TIE, len(costs)), kind="stable")
    if not len(costs):
        return order
    top = int(costs.max())
    if top <= 0xFFFF and int(costs.min()) >= 0:
        return order[np.argsort(costs.astype(np.uint16)[order], kind="stable")]
    values = costs.astype(np.uint64)  # (a negative cost, which check_costs refuses, wraps: the old order kept)
    top = int(values.max())
    shift = 0
    while shift == 0 or top >> shift:
        digits = (values[order] >> np.uint64(shift)).astype(np.uint16)
        order = order[np.argsort(digits, kind="stable")]
        shift += 16
    return order


def descending(costs: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """Row positions by cost, largest first, equal costs in a seeded order."""
    return _ascending(costs, key)[::-1]


def arrange_sum(costs: np.ndarray, batch_size: int, key: Sequence[int]) -> np.ndarray:
    """A permutation of the window's rows whose consecutive ``batch_size`` runs have near-equal cost sums."""
    costs = np.asarray(costs, dtype=np.int64)
    k = len(costs) // batch_size
    if k * batch_size != len(costs):
        raise InvalidValueError(f"a window of {len(costs)} rows is not whole batches of {batch_size}")
    # rounds: (batch_size, k), round j holds the j-th k largest rows, largest first
    rounds = descending(costs, key).reshape(batch_size, k)
    round_costs = costs[rounds]
    loads = np.zeros(k, dtype=np.int64)
    lightest = np.empty((batch_size, k), dtype=np.intp)  # lightest[j]: the batches of round j, lightest first
    for j in range(batch_size):  # the largest row of a round -> the lightest batch so far (ties: lower batch)
        lightest[j] = np.argsort(loads, kind="stable") if j else np.arange(k)
        loads[lightest[j]] += round_costs[j]
    # Batches by load, heaviest first (a few hold a row costlier than the mean batch: no arrangement evens those
    # out), then served in an order drawn without the rank, so the heavy ones of every rank meet in the same steps.
    served = np.argsort(-loads, kind="stable")[window_permutation(k, (*_rank_free(key), STEP_ORDER))]
    place = np.empty(k, dtype=np.intp)
    place[served] = np.arange(k)  # place[b]: the step at which batch b is served
    members = np.empty((k, batch_size), dtype=np.int64)  # (steps, rows)
    members[place[lightest], np.arange(batch_size)[:, None]] = rounds
    return _shuffle_within(members, key).reshape(-1)


def arrange_max(costs: np.ndarray, batch_size: int, key: Sequence[int]) -> np.ndarray:
    """A permutation whose batches are cost-sorted buckets, served in an order every rank draws alike."""
    costs = np.asarray(costs, dtype=np.int64)
    k = len(costs) // batch_size
    if k * batch_size != len(costs):
        raise InvalidValueError(f"a window of {len(costs)} rows is not whole batches of {batch_size}")
    buckets = _ascending(costs, key).reshape(k, batch_size)  # bucket q: the q-th cheapest run
    buckets = buckets[window_permutation(k, (*_rank_free(key), STEP_ORDER))]
    return _shuffle_within(buckets, key).reshape(-1)


# How a window's rows become fixed-size batches, by version and ``cost_reduce`` (token budgets are
# ``arrange_budget``). Versions deliver other batches for the same window, so the loader state records the version
# (``reading/state.py``: ``cost_arrangement``) and a position resumes only under the version that saved it.
ARRANGEMENTS = {
    1: Registry("cost arrangement", "cost_reduce", {
        "sum": Algorithm("round-lpt", 1, arrange_sum),
        "max": Algorithm("sorted-buckets", 1, arrange_max),
    }),
    2: Registry("cost arrangement", "cost_reduce", {
        "sum": Algorithm("round-lpt", 2, one_sort.arrange_sum),
        "max": Algorithm("sorted-buckets", 2, one_sort.arrange_max),
    }),
}
ARRANGEMENT_VERSION = 2  # what new loaders arrange with (``one_sort.py``: one sort and one random stream a window)
REDUCES = ARRANGEMENTS[ARRANGEMENT_VERSION].names
REDUCES_MEANING = "'sum' for packed batches, 'max' for padded ones (batch_size x longest row)"
