"""Row costs, in one module: what a cost is and how its values are checked, the one ``balance="auto"`` rule, the
row group order of a cost plan, the per-rank cost figures, and the arrangement of each shuffle window's rows into
batches. Pure (numpy and Arrow arrays, no I/O): the statistics a plan records are read by the planner
(``planner/cost_stats.py``, ``planner/engines/spark_cost.py``) and the loader's arguments are checked at the
boundary (``reading/options.resolve_cost``).

**What a cost is** (``parse_cost``, ``evaluate``, ``check_costs``): a column, or a Spark SQL expression. A cost is a
non-negative integer per row: tokens, characters, bytes, frames. Integers because planning sums them per row group in
Spark tasks or in this process, and the plan's checksum must be the same either way (G8): integer sums do not depend
on the order of addition, floating point ones do.

The loader needs each row's cost at run time to arrange batches, and the plan cannot store one cost per row within
its size budget (about 1 bit per scanned row). So the loader recomputes the cost from the columns it reads, which
it can do for a column and for the forms in ``FUNCTIONS`` applied to a column (``length(text)``, ``size(tokens)``).
Any other Spark SQL expression plans fine (per-row-group sums, the largest row cost, ``inspect``), but a loader
balancing by it refuses and says to store the expression as a column.

>>> spec = parse_cost("length(text)")
>>> (spec.function, spec.column, spec.loader_evaluable)
('length', 'text', True)
>>> parse_cost("tokens * 2 + 1").loader_evaluable
False

**The one "auto" rule** (``resolve_balance``): ``balance="auto"`` balances cost whenever the plan has a cost, and
rows otherwise, whatever the reader's other settings (shuffle, a budget). ``make_loader``,
``BalancedIterableDataset``, ``make_reader`` and ``verify`` all ask ``ShardPlan.resolve_balance``, which asks this
function, so every reader of a cost plan delivers the same rows in the same cost-dealt order.

>>> resolve_balance("auto", has_cost=True), resolve_balance("auto", has_cost=False)
('cost', 'rows')

**The row group order of a cost plan** (``cost_order``): the seeded order, re-dealt so every stretch of it carries
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

**Per-rank cost** (``rank_costs``, ``straggler_ratio``), read from a plan alone (no data read): each rank's cost, and
the straggler ratio they imply.

Used by ``plan.json``'s totals, ``inspect`` and ``compare``. A piece of a row group is counted at that row group's
mean cost per row: exact for whole row groups, an estimate for the at most ``slots - 1`` split ones.

**Batches inside one shuffle window** (``arrange_sum``, ``arrange_max``, ``arrange_budget``; chosen by
``CostOptions``): every rank already reads the same number of rows per epoch, in windows of the same size that start
at the same steps on every rank (``reading/batching.py``), and the plan's row group order gives every rank's stretch
of data about the mean cost per row (``cost_order`` above). What is left is to arrange each window's rows into batches
so that the batches that meet in one step, one per rank, cost about the same. Each rank does that alone, from its
window's costs and a generator key, with a rule that makes every rank land near the same value:

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

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidValueError
from .balance import Pieces, epoch_order
from .catalog import Catalog
from .registry import Algorithm, Registry
from .shuffle import StartPoint, raw_words, window_permutation

#: Spark SQL functions of one column the loader evaluates the same way Spark does (characters for strings,
#: bytes for binary, elements for arrays).
FUNCTIONS = ("length", "char_length", "character_length", "octet_length", "size", "cardinality")
COST_COLUMN = "_cost"  # the per-row cost column batches carry when a loader balances by cost
_NAME = r"`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*)"
_COLUMN_RE = re.compile(rf"^\s*(?:{_NAME})\s*$")
_CALL_RE = re.compile(rf"^\s*([A-Za-z_]+)\s*\(\s*(?:{_NAME})\s*\)\s*$")


@dataclass(frozen=True)
class CostSpec:
    """A parsed cost: ``column`` alone, or ``function(column)``; ``column`` is None for other SQL expressions."""

    text: str
    column: str | None = None
    function: str | None = None

    @property
    def kind(self) -> str:
        """``"column"`` (a numeric column), else ``"expression"`` (Spark SQL)."""
        return "column" if self.column is not None and self.function is None else "expression"

    @property
    def loader_evaluable(self) -> bool:
        return self.column is not None


def parse_cost(text) -> CostSpec:
    """The cost spec of ``cost=``; a ``ValueError`` names the parameter when it is not a non-empty string."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidValueError(f"cost={text!r} must be a column name or a Spark SQL numeric expression such as "
                                "'length(text)'")
    match = _COLUMN_RE.match(text)
    if match:
        return CostSpec(text, match.group(1) or match.group(2))
    match = _CALL_RE.match(text)
    if match and match.group(1).lower() in FUNCTIONS:
        return CostSpec(text, match.group(2) or match.group(3), match.group(1).lower())
    return CostSpec(text)


def evaluate(spec: CostSpec, values) -> np.ndarray:
    """The raw cost of each row from the source column ``values`` (Arrow array, chunked array or numpy array), as
    a numpy array that may hold NaN, None or negatives (``check_costs`` refuses those)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if spec.function is None:
        if isinstance(values, pa.Array):
            if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
                raise InvalidValueError(f"cost={spec.text!r}: column {spec.column!r} is {values.type}, not numeric; "
                                        "pass a numeric column or an expression such as 'length(text)'")
            return values.to_numpy(zero_copy_only=False)
        values = np.asarray(values)
        if values.dtype.kind not in "iuf":
            raise InvalidValueError(f"cost={spec.text!r}: column {spec.column!r} is {values.dtype}, not numeric")
        return values
    if isinstance(values, pa.Array):
        kind = values.type
        if spec.function in ("size", "cardinality") and (pa.types.is_list(kind) or pa.types.is_large_list(kind)
                                                         or pa.types.is_fixed_size_list(kind)):
            return pc.list_value_length(values).to_numpy(zero_copy_only=False)
        if spec.function in ("length", "char_length", "character_length") and (
                pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return utf8_lengths(values)
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_string(kind) or \
                pa.types.is_large_string(kind):
            if spec.function != "size":
                return pc.binary_length(values).to_numpy(zero_copy_only=False)
        raise InvalidValueError(f"cost={spec.text!r}: {spec.function}() does not apply to column {spec.column!r} of "
                                f"type {kind}")
    # numpy: a list column the reader turned into arrays, or decoded Unischema cells
    values = np.asarray(values)
    if values.ndim == 2:  # fixed-size lists came back as a 2-D array
        return np.full(len(values), values.shape[1], dtype=np.int64)
    return np.array([np.nan if v is None else len(v) for v in values], dtype=np.float64)


def utf8_lengths(values: pa.Array) -> np.ndarray:
    """Characters per row of a string array, as ``pc.utf8_length`` counts them (bytes that are not UTF-8
    continuation bytes), read from the offsets and data buffers: about 13x faster for ASCII text, which is one
    subtraction per row once a scan finds no byte >= 0x80, and still exact otherwise (a running count of the bytes
    that start a character). Arrays with nulls keep ``pc.utf8_length``, whose nulls ``check_costs`` refuses."""
    if values.null_count or len(values) == 0:
        return pc.utf8_length(values).to_numpy(zero_copy_only=False)
    width = np.int64 if pa.types.is_large_string(values.type) else np.int32
    _, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=width, count=len(values) + 1,
                            offset=values.offset * np.dtype(width).itemsize).astype(np.int64)
    begin, end = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(data_buffer, dtype=np.uint8)[begin:end] if data_buffer is not None else np.zeros(0, np.uint8)
    if data.size == 0 or int(data.max()) < 0x80:
        return np.diff(offsets)
    starts = np.zeros(len(data) + 1, dtype=np.int64)  # starts[i]: characters begun in data[:i]
    np.cumsum((data & 0xC0) != 0x80, out=starts[1:])
    return starts[offsets[1:] - begin] - starts[offsets[:-1] - begin]


def check_costs(raw: np.ndarray, where: str) -> np.ndarray:
    """``raw`` as int64, or a ``ValueError`` naming ``where`` (file and row group) for a NULL, NaN, negative or
    fractional cost."""
    raw = np.asarray(raw)
    if raw.dtype == object:
        nulls = np.fromiter((v is None for v in raw), dtype=bool, count=len(raw))
        if nulls.any():
            raise InvalidValueError(f"cost is NULL in {where} (row {int(np.argmax(nulls))}); costs must be "
                                    "non-negative integers: fill or filter those rows (where=...)")
        raw = raw.astype(np.float64)
    if raw.dtype.kind == "f":
        bad = np.isnan(raw)
        if bad.any():
            raise InvalidValueError(f"cost is NULL in {where} (row {int(np.argmax(bad))}); costs must be non-negative "
                                    "integers: fill or filter those rows (where=...)")
        fractional = raw != np.floor(raw)
        if fractional.any():
            raise InvalidValueError(f"cost {raw[fractional][0]!r} in {where} is not an integer; costs are integer "
                                    "counts (tokens, bytes): round them, e.g. cost='ceil(x)' with the Spark engine")
    if raw.dtype.kind not in "iuf" and len(raw):
        raise InvalidValueError(f"cost values in {where} are {raw.dtype}, not numbers")
    negative = raw < 0
    if negative.any():
        raise InvalidValueError(f"cost {raw[negative][0]!r} in {where} is negative; costs must be >= 0")
    return raw.astype(np.int64, copy=False)


def row_group_stats(costs: np.ndarray):
    """``(sum, max)`` of one row group's matching rows' costs, as Python ints (what the catalog records)."""
    if len(costs) == 0:
        return 0, 0
    return int(costs.sum()), int(costs.max())

BALANCE = ("auto", "cost", "rows")


def resolve_balance(balance_by: str, *, has_cost: bool) -> str:
    """``"cost"`` or ``"rows"``: the one ``"auto"`` rule (cost whenever the plan has a cost); ``"cost"`` on a plan
    without one is refused, naming the parameter."""
    if balance_by not in BALANCE:
        raise InvalidValueError(f"balance={balance_by!r} is not one of {BALANCE}: 'cost' balances each step's "
                                "cost (needs a plan made with cost=), 'rows' only rows, 'auto' cost when the "
                                "plan has one")
    if balance_by == "auto":
        return "cost" if has_cost else "rows"
    if balance_by == "cost" and not has_cost:
        raise InvalidValueError("balance='cost' needs a plan made with a cost: plan_shards(..., "
                                "cost='length(text)'); or pass balance='rows'")
    return balance_by


# ---------------------------------------------------------------------------- the row group order of a cost plan



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


# ---------------------------------------------------------------------------- per-rank cost, from the plan alone

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

# ----------------------------------------------------------------------------- batches inside one shuffle window

# Generator key tags, so the key of one use never equals the key of another.
_TIE, _BATCH_ORDER, _ROWS_IN_BATCH, _STEP_ORDER = 1, 2, 3, 4


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
    order = np.argsort(_words16(key, _ROWS_IN_BATCH, k * rows), kind="stable")
    batch_of = (order // rows).astype(np.uint16 if k <= 0xFFFF else np.uint32)
    order = order[np.argsort(batch_of, kind="stable")]
    return batches.reshape(-1)[order].reshape(k, rows)


def _ascending(costs: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """Row positions by cost, cheapest first, equal costs in a seeded order.

    Least significant digit first with 16-bit stable passes (NumPy radix-sorts 16-bit keys): a pass of seeded
    words breaks ties, then one pass per 16 bits the largest cost needs; about 4x faster than sorting 64-bit keys.
    Costs below 2**16 (the common case) take their one pass on a 16-bit copy, a quarter of the memory traffic.
    """
    order = np.argsort(_words16(key, _TIE, len(costs)), kind="stable")
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
    round_costs = costs[rounds]
    loads = np.zeros(k, dtype=np.int64)
    lightest = np.empty((batch_size, k), dtype=np.intp)  # lightest[j]: the batches of round j, lightest first
    for j in range(batch_size):  # the largest row of a round -> the lightest batch so far (ties: lower batch)
        lightest[j] = np.argsort(loads, kind="stable") if j else np.arange(k)
        loads[lightest[j]] += round_costs[j]
    # Batches by load, heaviest first (a few hold a row costlier than the mean batch: no arrangement evens those
    # out), then served in an order drawn without the rank, so the heavy ones of every rank meet in the same steps.
    served = np.argsort(-loads, kind="stable")[window_permutation(k, (*_rank_free(key), _STEP_ORDER))]
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
    buckets = buckets[window_permutation(k, (*_rank_free(key), _STEP_ORDER))]
    return _shuffle_within(buckets, key).reshape(-1)


# How a window's rows become fixed-size batches, by ``cost_reduce`` (token budgets are ``arrange_budget``).
ARRANGEMENTS = Registry("cost arrangement", "cost_reduce", {
    "sum": Algorithm("round-lpt", 1, arrange_sum),
    "max": Algorithm("sorted-buckets", 1, arrange_max),
})
REDUCES = ARRANGEMENTS.names


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
    words = raw_words((*key, _ROWS_IN_BATCH), len(rows))
    batch_of = np.repeat(np.arange(batches), lengths)
    order = rows[np.lexsort((words, batch_of))]
    return order, lengths


@dataclass(frozen=True)
class CostOptions:
    """How a loader arranges batches by cost; built once, from the loader's checked arguments, by
    ``reading/options.resolve_cost``."""

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
        return ARRANGEMENTS[self.reduce].run(costs, batch_size, key), None

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
