"""One slot's epoch as a stream of numpy batches: where to start, what to read, how to batch.

Shared by ``BalancedLoader`` (fragments read by the Arrow backend's threads or a Petastorm worker pool) and
``BalancedIterableDataset`` (fragments read in the DataLoader worker itself). All hand fragments, in plan order, to
the same ``WindowBatcher``, so for the same slot they deliver the same batches, whatever the backend.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from ..core.cost.options import CostOptions
from ..core.cost.spec import COST_COLUMN, CostSpec, check_costs, evaluate
from ..core.shuffle import window_rows
from ..errors import InvalidValueError
from ..io.partitions import partition_values
from ..plan.model import Fragment, ShardPlan
from ..unischema.storage import load_unischema
from . import fragments as fr
from .batching import WindowBatcher, start_point
from .dataset_schema import partition_columns, read_footers, stored_names
from .dataset_schema import stored_columns as columns_of_footers
from .list_scan import scan_lists
from .list_shapes import PYTHON_LISTS, ListOptions, list_column, needs_scan
from .schema import MASK_SUFFIX, BatchSchema, ColumnSchema, batch_schema, column_schema, unischema_column

PADDING = "_padding"  # the padding flag column; delivered only with padding_mask=True

# Reads fragments in order and yields (the fragments of the chunk, their rows as columns).
Chunks = Callable[[list[Fragment]], Iterable[tuple[list[Fragment], dict]]]


@dataclass(frozen=True)
class Columns:
    """The columns a loader reads, in dataset order, with their delivered types and representations (decided once,
    ``dataset_schema``), and the Unischema fields that decode them."""

    names: tuple[str, ...]
    partition_types: tuple[tuple[str, str], ...]
    fields: dict | None = None  # Unischema fields by name (Petastorm datasets only)
    target: pa.Schema | None = field(default=None, compare=False)  # delivered Arrow types of stored columns
    schemas: tuple[ColumnSchema, ...] = ()  # one per name
    row_bytes: float = field(default=0.0, compare=False)  # estimated decoded bytes per row (sizes shuffle windows)
    clustered: dict = field(default_factory=dict, compare=False)  # columns stored in order -> their spread

    @property
    def spec(self) -> fr.ReadSpec:
        return fr.ReadSpec(self.names, self.partition_types, self.fields, self.target)

    def batch_schema(self, drop: Sequence[str] = (), extras: Sequence[ColumnSchema] = ()) -> BatchSchema:
        """What every batch holds: these columns but ``drop`` (with their masks), then ``extras``."""
        return batch_schema([c for c in self.schemas if c.name not in set(drop)], extras)


def dataset_columns(plan: ShardPlan, schema_fields=None, lists: ListOptions = PYTHON_LISTS) -> Columns:
    """The requested columns in dataset order (the Unischema's order, or partition folders then the footer's),
    with one delivered type and representation each, from every planned file's footer (read here, once); list
    columns of numbers as ``lists`` says (``list_shapes``: their lengths read here, once, where needed)."""
    paths = [f.path for f in plan.catalog.files]
    read = sorted({g.path for g in plan.catalog.row_groups}) or paths[:1]
    try:
        footers = read_footers(plan.dataset_url, read)  # each footer once, side by side
        if plan.catalog.kind == "petastorm":
            unischema = load_unischema(plan.dataset_url)
            names, fields = list(unischema.fields), dict(unischema.fields)
        else:
            stored = stored_names(footers)  # a Delta table's added columns included
            names, fields = [n for n in partition_values(read[0]) if n not in stored] + list(stored), None
        names = fr.select_columns(names, schema_fields)
        if PADDING in names:
            raise InvalidValueError(f"the dataset has a column named {PADDING!r}, which the loader uses for padding "
                                    "flags")
        hive = partition_columns(paths, names, plan.table)
        stored_columns = columns_of_footers(footers, [n for n in names if n not in hive])
        plain = [n for n in names if n not in hive and not (fields and n in fields)]
        unknown = sorted(lists.named() - set(plain))
        if unknown:
            raise InvalidValueError(f"list_format/list_shapes name {unknown[0]!r}, which is not a list column read "
                                    f"from the files; the columns read are {names}")
        scanned = {n: stored_columns.schema.field(n).type for n in plain
                   if needs_scan(n, stored_columns.schema.field(n).type, lists)}
        stats = scan_lists(plan, scanned) if scanned else {}
    except (OSError, pa.ArrowException) as exc:
        raise fr.unreadable_dataset_error(plan, exc) from exc
    fields = {n: fields[n] for n in names} if fields else None
    schemas = []
    for name in names:
        if name in hive:
            schemas.append(hive[name][1])
        elif fields is not None and name in fields:
            schemas.append(unischema_column(fields[name], stored_columns.schema.field(name).type,
                                            stored_columns.nullable[name], fr.is_scalar(fields[name])))
        else:
            arrow_type, nullable = stored_columns.schema.field(name).type, stored_columns.nullable[name]
            schemas.append(list_column(name, arrow_type, nullable=nullable, options=lists, stats=stats.get(name))
                           or column_schema(name, arrow_type, nullable=nullable))
    used = tuple((k, kind) for k, (kind, _) in hive.items())
    # a hive partition column holds one value per file: stored clustered wherever it takes several values
    clustered = {**stored_columns.clustered, **{k: 0.0 for k in hive if len(_distinct_partition(paths, k)) > 1}}
    return Columns(tuple(names), used, fields, stored_columns.schema, tuple(schemas),
                   stored_columns.row_bytes + 8.0 * len(hive) + _decoded_bytes(fields), clustered)


def _distinct_partition(paths: Sequence[str], name: str) -> set:
    return {partition_values(path).get(name) for path in paths}


def _decoded_bytes(fields: dict | None) -> float:
    """Bytes per row that Unischema codecs add when they decode cells of a known shape (an image, an ndarray)."""
    total = 0.0
    for unischema_field in (fields or {}).values():
        shape = tuple(getattr(unischema_field, "shape", ()) or ())
        if shape and all(isinstance(n, int) for n in shape) and not fr.is_scalar(unischema_field):
            total += float(np.prod(shape)) * np.dtype(unischema_field.numpy_dtype).itemsize
    return total


def with_cost_source(columns: Columns, plan: ShardPlan, cost: CostOptions | None) -> tuple[Columns, tuple]:
    """The columns to read when balancing by ``cost`` (its source column added if not requested), and the names
    to drop after computing the cost."""
    if cost is not None and COST_COLUMN in columns.names:
        raise InvalidValueError(f"the dataset has a column named {COST_COLUMN!r}, which a loader balancing cost adds; "
                                "rename the column, or pass balance='rows'")
    if cost is None or cost.column in columns.names:
        return columns, ()
    source = dataset_columns(plan, [re.escape(cost.column)])
    fields = None if columns.fields is None else {**columns.fields, **(source.fields or {})}
    target = columns.target
    if target is not None and source.target is not None:
        target = pa.schema(list(target) + [f for f in source.target if f.name not in target.names])
    return Columns(columns.names + source.names, columns.partition_types + source.partition_types, fields, target,
                   columns.schemas + source.schemas, columns.row_bytes + source.row_bytes,
                   {**columns.clustered, **source.clustered}), source.names


def slot_runs(fragments: Sequence[Fragment], chunks: Chunks, *, batch_size: int | None, shuffle: bool,
              shuffle_window: int, key: Sequence[int], batches_done: int = 0,
              cost: CostOptions | None = None, drop: Sequence[str] = (),
              cost_lengths: str | None = None) -> Iterator[dict]:
    """Runs of whole numpy batches (with a ``PADDING`` column) of one slot, from batch ``batches_done`` on.

    Fragments wholly before the start are never read; the first one read may be cut at its head (only the rows
    of the current shuffle window, or from the next batch when not shuffling, are read and decoded).
    With ``cost`` every chunk gets a ``COST_COLUMN`` computed from the columns read, each window is arranged by
    ``core/cost/options.CostOptions`` instead of permuted, and ``drop`` names columns read only to compute the cost.
    ``batch_size=None`` (token budgets) makes every batch its own run. ``cost_lengths``: the lengths column of a
    padded list cost column (``size()`` is its lengths, not the padded width).
    """
    rows = np.fromiter((f.num_rows for f in fragments), dtype=np.int64, count=len(fragments))
    total = int(rows.sum())
    budget = cost is not None and cost.budget is not None
    step = 1 if budget else batch_size  # rows per batcher step: a token budget cuts batches row by row
    if step is None:
        raise ValueError("slot_runs: batch_size=None needs a cost with a token budget")
    size = window_rows(step, shuffle_window, shuffle)
    if cost is not None and cost.budget is not None:
        start = cost.budget_start(total, size, rows, batches_done)
    else:
        start = start_point(rows, batch_size=step, window_rows=size, batches_done=batches_done, shuffle=shuffle)
    if start.row >= total:
        return
    first = fragments[start.fragment]
    todo = [replace(first, start=first.start + start.offset)] + list(fragments[start.fragment + 1:])
    arrange = None
    if cost is not None:
        def arrange(window, window_key):
            return cost.arrange(window[COST_COLUMN], batch_size, window_key)
    batcher = WindowBatcher(total_rows=total, batch_size=step, window_rows=size,
                            start=start, key=tuple(key) if shuffle else None, arrange=arrange)
    spec = None if cost is None else CostSpec(cost.cost, cost.column, cost.function)
    stream = iter(chunks(todo))
    try:
        for chunk, columns in stream:
            columns[PADDING] = np.repeat([f.padding for f in chunk], [f.num_rows for f in chunk])
            if cost is not None and spec is not None:  # spec.column is cost.column, a loader cost's column
                where = f"{chunk[0].path!r} row group {chunk[0].row_group}" + (" and after" if len(chunk) > 1 else "")
                raw = columns[cost_lengths] if cost_lengths is not None and spec.function in ("size", "cardinality") \
                    else evaluate(spec, columns[cost.column])
                valid = columns.get(cost.column + MASK_SUFFIX)
                if valid is not None and not valid.all():  # a null cost: refused by check_costs, not taken as 0
                    raw = raw.astype(object)
                    raw[~valid] = None
                columns[COST_COLUMN] = check_costs(raw, where)
                for name in drop:
                    del columns[name]
                    columns.pop(name + MASK_SUFFIX, None)
            yield from batcher.push(columns)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    batcher.finish()


class ReaderKeeper:
    """Keeps one rank's ``BalancedReader`` between epochs, so the next epoch re-arms it instead of paying for a
    new one (listing, footers, pool start). A reader left mid-epoch is stopped and replaced."""

    def __init__(self):
        self.reader = None

    def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.stop()
            reader.join()
