"""One slot's epoch as a stream of numpy batches: where to start, what to read, how to batch.

Shared by ``BalancedLoader`` (fragments read by a Petastorm worker pool) and ``BalancedIterableDataset``
(fragments read in the DataLoader worker itself). Both hand fragments, in plan order, to the same
``WindowBatcher``, so for the same slot they deliver the same batches.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import fragments as fr
from . import fs as fsutil
from .batching import WindowBatcher, split_batches, start_point, window_rows
from .plan import Fragment, ShardPlan
from .scan import load_unischema, partition_values

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


def slot_batches(fragments: Sequence[Fragment], chunks: Chunks, **options) -> Iterator[dict]:
    """``slot_runs`` cut into numpy batches."""
    runs = slot_runs(fragments, chunks, **options)
    try:
        for run in runs:
            yield from split_batches(run, options["batch_size"])
    finally:
        runs.close()


def inline_chunks(plan: ShardPlan, columns: Columns) -> Chunks:
    """Read fragments one after the other in this process (DataLoader workers bring their own parallelism)."""
    def chunks(todo: List[Fragment]):
        filesystem, root = fsutil.resolve(plan.dataset_url)
        files = fr.FileCache(lambda path: pq.ParquetFile(filesystem.open_input_file(f"{root}/{path}")))
        spec = columns.spec
        for chunk in fr.bundle(todo, fr.BUNDLE_ROWS):
            tables = []
            for fragment in chunk:
                try:
                    tables.append(fr.read_fragment(files.get(fragment.path), fragment, spec))
                except (OSError, pa.ArrowException) as exc:  # name the file and row group
                    raise fr.read_error(fragment, exc) from exc
            yield chunk, fr.to_columns(fr.concat_tables(tables), columns.fields)
    return chunks


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


def petastorm_chunks(plan: ShardPlan, columns: Columns, reader_options: dict,
                     slot: Optional[ReaderSlot] = None) -> Chunks:
    """Read fragments through a ``BalancedReader`` (Petastorm thread or process pool), handed back in order."""
    from .reader import ReadTask, open_reader

    def chunks(todo: List[Fragment]):
        holder = slot or ReaderSlot()
        if holder.reader is not None and holder.reader.idle:
            holder.reader.rearm(todo)
        else:
            holder.close()
            task = ReadTask("columns", columns=columns.names, partition_types=columns.partition_types)
            holder.reader = open_reader(plan, todo, task, schema_fields=[re.escape(n) for n in columns.names],
                                        **reader_options)
        reader, finished = holder.reader, False
        try:
            for sequence, payload in reader:
                yield reader.bundles[sequence], payload if isinstance(payload, dict) else fr.to_columns(payload)
            finished = True
        finally:
            if not finished or slot is None:
                holder.close()
    return chunks
