"""One slot's epoch as a stream of numpy batches: where to start, what to read, how to batch.

Shared by ``BalancedLoader`` (fragments read by the Arrow backend's threads or a Petastorm worker pool) and
``BalancedIterableDataset`` (fragments read in the DataLoader worker itself). All hand fragments, in plan order, to
the same ``WindowBatcher``, so for the same slot they deliver the same batches, whatever the backend.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import fragments as fr
from ..io import fs as fsutil
from .batching import WindowBatcher, start_point, window_rows
from ..plan.model import Fragment, ShardPlan
from ..io.dataset import load_unischema, partition_values

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
        filesystem, root = fsutil.resolve(plan.dataset_url)
        first = plan.catalog.row_groups[0].path
        try:
            with filesystem.open_input_file(f"{root}/{first}") as handle:
                stored = pq.ParquetFile(handle).schema_arrow.names
        except (OSError, pa.ArrowException) as exc:
            raise fr.unreadable_dataset_error(plan, exc) from exc
        names, fields = [n for n in partition_values(first) if n not in stored] + list(stored), None
    names = fr.select_columns(names, schema_fields)
    if PADDING in names:
        raise ValueError(f"the dataset has a column named {PADDING!r}, which the loader uses for padding flags")
    used = tuple((k, v) for k, v in types.items() if k in names)
    return Columns(tuple(names), used, {n: fields[n] for n in names} if fields else None)


def slot_runs(fragments: Sequence[Fragment], chunks: Chunks, *, batch_size: int, shuffle: bool,
              shuffle_window: int, key: Sequence[int], batches_done: int = 0) -> Iterator[dict]:
    """Runs of whole numpy batches (with a ``PADDING`` column) of one slot, from batch ``batches_done`` on.

    Fragments wholly before the start are never read; the first one read may be cut at its head (only the rows
    of the current shuffle window, or from the next batch when not shuffling, are read and decoded).
    """
    rows = np.fromiter((f.num_rows for f in fragments), dtype=np.int64, count=len(fragments))
    total = int(rows.sum())
    size = window_rows(batch_size, shuffle_window, shuffle)
    start = start_point(rows, batch_size=batch_size, window_rows=size, batches_done=batches_done, shuffle=shuffle)
    if start.row >= total:
        return
    first = fragments[start.fragment]
    todo = [replace(first, start=first.start + start.offset)] + list(fragments[start.fragment + 1:])
    batcher = WindowBatcher(total_rows=total, batch_size=batch_size, window_rows=size, start=start,
                            key=tuple(key) if shuffle else None)
    stream = iter(chunks(todo))
    try:
        for chunk, columns in stream:
            columns[PADDING] = np.repeat([f.padding for f in chunk], [f.num_rows for f in chunk])
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
