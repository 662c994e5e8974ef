"""Cost-balanced batches inside one shuffle window: pure numpy, no I/O, no torch, no communication.

Every rank already reads the same number of rows per epoch, in windows of the same size that start at the same
steps on every rank (``batching.py``), and the plan's row group order gives every rank's stretch of data about the
mean cost per row (``core/cost_order.py``). What is left is to arrange each window's rows into batches so that the
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
- Token budgets (``max_batch_cost=C``, batches of varying rows): each window of ``R`` rows becomes exactly
  ``k = ceil(R x mean cost per row x 1.03 / C)`` batches (``k`` depends only on the plan, so it is the same on every
  rank),
  filled worst-fit-decreasing (each row, largest first, into the emptiest batch), so batches are both full and
  alike. A row that fits in no batch is left out of this epoch; the cost left out of a window is at most
  ``max(0, window cost - k x (C - largest row cost))``.

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
from dataclasses import dataclass

import numpy as np

from ..core.params import check_int
from ..errors import InvalidValueError
from .batching import StartPoint, window_permutation

REDUCES = ("sum", "max")
# Generator key tags, so the key of one use never equals the key of another.
_TIE, _BATCH_ORDER, _ROWS_IN_BATCH, _STEP_ORDER = 1, 2, 3, 4


def _rank_free(key: Sequence[int]) -> tuple[int, ...]:
    """``(seed, epoch, rank, slot, window)`` without the rank: the same on every rank for the same step."""
    seed, epoch, _rank, slot, window = key
    return (seed, epoch, slot, window)


def _shuffle_within(batches: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """Each row of ``batches`` (batches, rows) permuted by a draw from ``key``.

    Two stable radix passes over the flat array (seeded 16-bit words, then the batch index) rather than one small
    sort per batch, whose per-call overhead dominated (about 5x slower for batches of 16).
    """
    k, rows = batches.shape
    words = np.random.Generator(np.random.PCG64([*key, _ROWS_IN_BATCH])).bit_generator.random_raw(k * rows)
    order = np.argsort(words.astype(np.uint16), kind="stable")
    batch_of = (order // rows).astype(np.uint16 if k <= 0xFFFF else np.uint32)
    order = order[np.argsort(batch_of, kind="stable")]
    return batches.reshape(-1)[order].reshape(k, rows)


def _ascending(costs: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """Row positions by cost, cheapest first, equal costs in a seeded order.

    Least significant digit first with 16-bit stable passes (NumPy radix-sorts 16-bit keys): a pass of seeded
    words breaks ties, then one pass per 16 bits the largest cost needs; about 4x faster than sorting 64-bit keys.
    """
    words = np.random.Generator(np.random.PCG64([*key, _TIE])).bit_generator.random_raw(len(costs))
    order = np.argsort(words.astype(np.uint16), kind="stable")
    values = costs.astype(np.uint64)
    top = int(values.max()) if len(values) else 0
    shift = 0
    while shift == 0 or top >> shift:
        digits = (values[order] >> np.uint64(shift)).astype(np.uint16)
        order = order[np.argsort(digits, kind="stable")]
        shift += 16
    return order


def _descending(costs: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """Row positions by cost, largest first, equal costs in a seeded order."""
    return _ascending(costs, key)[::-1]


def arrange_sum(costs: np.ndarray, batch_size: int, key: Sequence[int]) -> np.ndarray:
    """A permutation of the window's rows whose consecutive ``batch_size`` runs have near-equal cost sums."""
    costs = np.asarray(costs, dtype=np.int64)
    k = len(costs) // batch_size
    if k * batch_size != len(costs):
        raise InvalidValueError(f"a window of {len(costs)} rows is not whole batches of {batch_size}")
    # rounds: (batch_size, k), round j holds the j-th k largest rows, largest first
    rounds = _descending(costs, key).reshape(batch_size, k)
    loads = np.zeros(k, dtype=np.int64)
    members = np.empty((k, batch_size), dtype=np.int64)  # (batches, rows)
    for j in range(batch_size):
        lightest = np.argsort(loads, kind="stable")  # largest row of the round -> lightest batch so far
        members[lightest, j] = rounds[j]
        loads[lightest] += costs[rounds[j]]
    # Batches by load, heaviest first (a few hold a row costlier than the mean batch: no arrangement evens those
    # out), then served in an order drawn without the rank, so the heavy ones of every rank meet in the same steps.
    members = members[np.argsort(-loads, kind="stable")]
    members = members[window_permutation(k, (*_rank_free(key), _STEP_ORDER))]
    return _shuffle_within(members, key).reshape(-1)


def arrange_max(costs: np.ndarray, batch_size: int, key: Sequence[int]) -> np.ndarray:
    """A permutation whose batches are cost-sorted buckets, served in an order every rank draws alike."""
    costs = np.asarray(costs, dtype=np.int64)
    k = len(costs) // batch_size
    if k * batch_size != len(costs):
        raise InvalidValueError(f"a window of {len(costs)} rows is not whole batches of {batch_size}")
    buckets = _ascending(costs, key).reshape(k, batch_size)  # bucket q: the q-th cheapest run
    buckets = buckets[window_permutation(k, (*_rank_free(key), _STEP_ORDER))]
    return _shuffle_within(buckets, key).reshape(-1)


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
    import heapq
    tie = window_permutation(batches, (*key, _BATCH_ORDER))
    heap = [(0, int(tie[b]), b) for b in range(batches)]
    heapq.heapify(heap)
    for row in _descending(costs, key).tolist():
        load, t, b = heap[0]
        cost = int(costs[row])
        if load + cost > budget:
            continue  # the emptiest batch cannot take it: no batch can
        members[b].append(row)
        loads[b] = load + cost
        heapq.heapreplace(heap, (load + cost, t, b))
    groups = [np.asarray(m, dtype=np.int64) for m in members]
    served = window_permutation(batches, (*key, _STEP_ORDER))
    groups = [groups[i] for i in served]
    lengths = np.fromiter((len(g) for g in groups), dtype=np.int64, count=batches)
    rows = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
    # rows inside each batch in a seeded order
    words = np.random.Generator(np.random.PCG64([*key, _ROWS_IN_BATCH])).bit_generator.random_raw(len(rows))
    batch_of = np.repeat(np.arange(batches), lengths)
    order = rows[np.lexsort((words, batch_of))]
    return order, lengths


@dataclass(frozen=True)
class CostOptions:
    """How a loader arranges batches by cost; built once by ``resolve_cost`` from the loader's arguments."""

    cost: str  # the plan's cost text
    column: str  # the source column the loader reads to compute it
    function: str | None
    reduce: str  # "sum" | "max"
    budget: int | None = None  # max_batch_cost: batches of varying rows
    mean_cost: float = 0.0  # the plan's cost per matching row (token budgets)

    def arrange(self, costs: np.ndarray, batch_size: int | None, key: Sequence[int]):
        """``(order, lengths)`` for one window: lengths is None for fixed-size batches."""
        if self.budget is not None:
            return arrange_budget(costs, budget_batches(len(costs), self.mean_cost, self.budget), self.budget, key)
        if batch_size is None:
            raise AssertionError("fixed-size cost batches need a batch_size")
        if self.reduce == "sum":
            return arrange_sum(costs, batch_size, key), None
        return arrange_max(costs, batch_size, key), None

    def budget_steps(self, rows: int, window_rows: int) -> int:
        """Batches of a slot of ``rows`` rows under the budget: the same on every rank with the same rows."""
        full, rest = divmod(rows, window_rows)
        budget = self._budget()
        return full * budget_batches(window_rows, self.mean_cost, budget) + budget_batches(rest, self.mean_cost, budget)

    def _budget(self) -> int:
        if self.budget is None:  # the budget_* methods serve max_batch_cost loaders only
            raise AssertionError("a budget method called on fixed-size cost batches (max_batch_cost=None)")
        return self.budget

    def budget_start(self, rows: int, window_rows: int, fragment_rows: np.ndarray, batches_done: int) -> StartPoint:
        """Where a slot resumes under the budget: the start of the window holding batch ``batches_done``;
        ``skip_rows`` then counts *batches* of that window to drop."""
        per_window = budget_batches(window_rows, self.mean_cost, self._budget())
        steps = self.budget_steps(rows, window_rows)
        if batches_done < 0 or batches_done > steps:
            raise InvalidValueError(f"batches_done={batches_done} is outside this slot's {steps} batches")
        window = min(batches_done // per_window, -(-rows // window_rows))
        row = min(window * window_rows, rows)
        ends = np.cumsum(np.asarray(fragment_rows, dtype=np.int64))
        fragment = int(np.searchsorted(ends, row, side="right"))
        offset = row - (int(ends[fragment - 1]) if fragment else 0)
        return StartPoint(fragment, offset, window, row, batches_done - window * per_window)


def resolve_cost(plan, *, balance: str, cost_reduce: str, max_batch_cost, batch_size, shuffle: bool
                 ) -> CostOptions | None:
    """The loader's cost arrangement, or None for row balance; every bad combination is refused here, when the
    loader is built, naming the parameter."""
    from ..core.cost import parse_cost
    chosen = plan.resolve_balance(balance)  # the one "auto" rule (the plan's); refuses "cost" without a cost
    if cost_reduce not in REDUCES:
        raise InvalidValueError(f"cost_reduce={cost_reduce!r} is not one of {REDUCES}: 'sum' for packed batches, 'max' "
                                "for padded ones (batch_size x longest row)")
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
    return CostOptions(plan.cost, spec.column, spec.function, cost_reduce, max_batch_cost, mean)
