"""What a cost is (``parse_cost``, ``evaluate``, ``check_costs``): a column, or a Spark SQL expression. A cost is a
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

The one "auto" rule (``resolve_balance``): ``balance="auto"`` balances cost whenever the plan has a cost, and
rows otherwise, whatever the reader's other settings (shuffle, a budget). ``make_loader``,
``BalancedIterableDataset``, ``make_reader`` and ``verify`` all ask ``ShardPlan.resolve_balance``, which asks this
function, so every reader of a cost plan delivers the same rows in the same cost-dealt order.

>>> resolve_balance("auto", has_cost=True), resolve_balance("auto", has_cost=False)
('cost', 'rows')
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import InvalidValueError
from ..params import check_choice

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
BALANCE_MEANING = ("'cost' balances each step's cost (needs a plan made with cost=), 'rows' only rows, 'auto' cost "
                   "when the plan has one")


def resolve_balance(balance_by: str, *, has_cost: bool) -> str:
    """``"cost"`` or ``"rows"``: the one ``"auto"`` rule (cost whenever the plan has a cost); ``"cost"`` on a plan
    without one is refused, naming the parameter."""
    check_choice("balance", balance_by, BALANCE, BALANCE_MEANING)
    if balance_by == "auto":
        return "cost" if has_cost else "rows"
    if balance_by == "cost" and not has_cost:
        raise InvalidValueError("balance='cost' needs a plan made with a cost: plan_shards(..., "
                                "cost='length(text)'); or pass balance='rows'")
    return balance_by
