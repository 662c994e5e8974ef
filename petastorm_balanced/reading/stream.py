"""One slot's epoch as a stream of numpy batches: where to start, what to read, how to batch.

Shared by ``BalancedLoader`` (fragments read by the Arrow backend's threads or a Petastorm worker pool) and
``BalancedIterableDataset`` (fragments read in the DataLoader worker itself). All hand fragments, in plan order, to
the same ``WindowBatcher``, so for the same slot they deliver the same batches, whatever the backend.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import fragments as fr
from ..io import fs as fsutil
from .batching import WindowBatcher, start_point, window_rows
from .cost_batching import CostOptions
from ..plan.cost import COST_COLUMN, CostSpec, check_costs, evaluate
from ..plan.model import Fragment, ShardPlan
from ..io.dataset import dataset_root, load_unischema, partition_values
from ..errors import InvalidValueError

PADDING = "_padding"  # the padding flag column; delivered only with padding_mask=True
SHUFFLE_WINDOW = 10_000  # default rows per shuffle window (rounded up to whole batches)

# Reads fragments in order and yields (the fragments of the chunk, their rows as columns).
Chunks = Callable[[List[Fragment]], Iterable[Tuple[List[Fragment], dict]]]


@dataclass(frozen=True)
class Columns:
    """The columns a loader delivers, in dataset order, and the Unischema fields that decode them."""

    names: Tuple[str, ...]
    partition_types: Tuple[Tuple[str, str], ...]
    fields: Optional[dict] = None  # Unischema fields by name (Petastorm datasets only)

    @property
    def spec(self) -> fr.ReadSpec:
        return fr.ReadSpec(self.names, self.partition_types, self.fields)


def dataset_columns(plan: ShardPlan, schema_fields=None) -> Columns:
    """The requested columns in dataset order: the Unischema's order, or partition folders then the footer's."""
    types = fr.partition_types([f.path for f in plan.catalog.files])
    if plan.catalog.kind == "petastorm":
        unischema = load_unischema(plan.dataset_url)
        names, fields = list(unischema.fields), dict(unischema.fields)
    else:
        filesystem, root = dataset_root(plan.dataset_url)
        first = plan.catalog.row_groups[0].path
        try:
            with filesystem.open_input_file(fsutil.join(root, first)) as handle:
                stored = pq.ParquetFile(handle).schema_arrow.names
        except (OSError, pa.ArrowException) as exc:
            raise fr.unreadable_dataset_error(plan, exc) from exc
        names, fields = [n for n in partition_values(first) if n not in stored] + list(stored), None
    names = fr.select_columns(names, schema_fields)
    if PADDING in names:
        raise InvalidValueError(f"the dataset has a column named {PADDING!r}, which the loader uses for padding flags")
    used = tuple((k, v) for k, v in types.items() if k in names)
    return Columns(tuple(names), used, {n: fields[n] for n in names} if fields else None)


def with_cost_source(columns: Columns, plan: ShardPlan, cost: Optional[CostOptions]) -> Tuple[Columns, tuple]:
    """The columns to read when balancing by ``cost`` (its source column added if not requested), and the names
    to drop after computing the cost."""
    if cost is not None and COST_COLUMN in columns.names:
        raise InvalidValueError(f"the dataset has a column named {COST_COLUMN!r}, which a loader balancing cost adds; "
                                "rename the column, or pass balance='rows'")
    if cost is None or cost.column in columns.names:
        return columns, ()
    source = dataset_columns(plan, [re.escape(cost.column)])
    fields = None if columns.fields is None else {**columns.fields, **(source.fields or {})}
    return Columns(columns.names + source.names, columns.partition_types + source.partition_types, fields), \
        source.names


def slot_runs(fragments: Sequence[Fragment], chunks: Chunks, *, batch_size: Optional[int], shuffle: bool,
              shuffle_window: int, key: Sequence[int], batches_done: int = 0,
              cost: Optional[CostOptions] = None, drop: Sequence[str] = ()) -> Iterator[dict]:
    """Runs of whole numpy batches (with a ``PADDING`` column) of one slot, from batch ``batches_done`` on.

    Fragments wholly before the start are never read; the first one read may be cut at its head (only the rows
    of the current shuffle window, or from the next batch when not shuffling, are read and decoded).
    With ``cost`` every chunk gets a ``COST_COLUMN`` computed from the columns read, each window is arranged by
    ``cost_batching`` instead of permuted, and ``drop`` names columns read only to compute the cost.
    ``batch_size=None`` (token budgets) makes every batch its own run.
    """
    rows = np.fromiter((f.num_rows for f in fragments), dtype=np.int64, count=len(fragments))
    total = int(rows.sum())
    budget = cost is not None and cost.budget is not None
    size = window_rows(1 if budget else batch_size, shuffle_window, shuffle)
    if budget:
        start = cost.budget_start(total, size, rows, batches_done)
    else:
        start = start_point(rows, batch_size=batch_size, window_rows=size, batches_done=batches_done,
                            shuffle=shuffle)
    if start.row >= total:
        return
    first = fragments[start.fragment]
    todo = [replace(first, start=first.start + start.offset)] + list(fragments[start.fragment + 1:])
    arrange = None
    if cost is not None:
        def arrange(window, window_key):
            return cost.arrange(window[COST_COLUMN], batch_size, window_key)
    batcher = WindowBatcher(total_rows=total, batch_size=1 if budget else batch_size, window_rows=size,
                            start=start, key=tuple(key) if shuffle else None, arrange=arrange)
    spec = None if cost is None else CostSpec(cost.cost, cost.column, cost.function)
    stream = iter(chunks(todo))
    try:
        for chunk, columns in stream:
            columns[PADDING] = np.repeat([f.padding for f in chunk], [f.num_rows for f in chunk])
            if spec is not None:
                where = f"{chunk[0].path!r} row group {chunk[0].row_group}" + (" and after" if len(chunk) > 1 else "")
                columns[COST_COLUMN] = check_costs(evaluate(spec, columns[spec.column]), where)
                for name in drop:
                    del columns[name]
            yield from batcher.push(columns)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    batcher.finish()


class ReaderSlot:
    """Keeps one rank's ``BalancedReader`` between epochs, so the next epoch re-arms it instead of paying for a
    new one (listing, footers, pool start). A reader left mid-epoch is stopped and replaced."""

    def __init__(self):
        self.reader = None

    def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.stop()
            reader.join()
