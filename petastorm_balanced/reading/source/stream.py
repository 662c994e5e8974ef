"""One slot's epoch as a stream of numpy batches: where to start, what to read, how to batch.

Shared by ``BalancedLoader`` (fragments read by the Arrow backend's threads or a Petastorm worker pool) and
``BalancedIterableDataset`` (fragments read in the DataLoader worker itself). All hand fragments, in plan order, to
the same ``WindowBatcher``, so for the same slot they deliver the same batches, whatever the backend.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

import numpy as np

from ...core.cost.options import CostOptions
from ...core.cost.spec import COST_COLUMN, CostSpec, check_costs, evaluate
from ...core.shuffle import window_rows
from ...errors import InvalidValueError
from ...plan.model import Fragment
from ..batches.batching import WindowBatcher, start_point
from ..batches.packing_check import warn_left_out
from ..batches.spare_matrices import SpareMatrices
from ..fields.schema import MASK_SUFFIX, PADDING
from ..stats import current
from ..windows.spill import Placement
from ..windows.spill_window import filling_for

# Reads fragments in order and yields (the fragments of the chunk, their rows as columns).
Chunks = Callable[[list[Fragment]], Iterable[tuple[list[Fragment], dict]]]


def slot_runs(fragments: Sequence[Fragment], chunks: Chunks, *, batch_size: int | None, shuffle: bool,
              shuffle_window: int, key: Sequence[int], batches_done: int = 0,
              cost: CostOptions | None = None, drop: Sequence[str] = (),
              cost_lengths: str | None = None, placement: Placement | None = None,
              spares: SpareMatrices | None = None) -> Iterator[dict]:
    """Runs of whole numpy batches (with a ``PADDING`` column) of one slot, from batch ``batches_done`` on.

    Fragments wholly before the start are never read; the first one read may be cut at its head (only the rows
    of the current shuffle window, or from the next batch when not shuffling, are read and decoded).
    With ``cost`` every chunk gets a ``COST_COLUMN`` computed from the columns read, each window is arranged by
    ``core/cost/options.CostOptions`` instead of permuted, and ``drop`` names columns read only to compute the cost.
    ``batch_size=None`` (token budgets) makes every batch its own run. ``cost_lengths``: the lengths column of a
    padded list cost column (``size()`` is its lengths, not the padded width). ``placement``: where windows hold
    their rows (memory up to a measured budget, then local disk: ``spill.py``); its files are gone when this ends.
    ``spares``: window matrices kept from the caller's last window for its next (``spare_matrices.py``).
    """
    rows = np.fromiter((f.num_rows for f in fragments), dtype=np.int64, count=len(fragments))
    total = int(rows.sum())
    budget = cost is not None and cost.per_window
    step = 1 if budget else batch_size  # rows per batcher step: a token budget or packing cuts batches row by row
    if step is None:
        raise ValueError("slot_runs: batch_size=None needs a cost with a token budget")
    size = window_rows(step, shuffle_window, shuffle)
    if cost is not None and cost.per_window:
        start = cost.budget_start(total, size, rows, batches_done)
    else:
        start = start_point(rows, batch_size=step, window_rows=size, batches_done=batches_done, shuffle=shuffle)
    if start.row >= total:
        return
    first = fragments[start.fragment]
    todo = [replace(first, start=first.start + start.offset)] + list(fragments[start.fragment + 1:])
    # A cost that is a delivered int64 column as it is (cost="n_tokens") travels once: the window and its runs hold
    # that column alone, and each run names it COST_COLUMN too (one array, one tensor per batch; a copy of it cost
    # a gather per window and a tensor per batch, about a tenth of an epoch over a few numeric columns).
    alias: list[bool] = []  # decided by the first chunk: [True] while the cost is the column itself
    arrange = None
    if cost is not None:
        def arrange(window, window_key):
            costs = window[cost.column if alias[0] else COST_COLUMN]
            arranged = cost.arrange(costs, batch_size, window_key)
            if cost.pack is not None:  # never silent: documents a packed window left out (reading/batches/packing.py)
                warn_left_out(cost.pack, costs, arranged[0], window_key)
            return arranged
    filling = None if placement is None else filling_for(placement, spares)
    batcher = WindowBatcher(total_rows=total, batch_size=step, window_rows=size, start=start,
                            key=tuple(key) if shuffle else None, arrange=arrange, filling=filling, spares=spares)
    spec = None if cost is None else CostSpec(cost.cost, cost.column, cost.function)
    recorder = current()  # loader.stats(): windows shuffled and cut into batches count to "batch"
    push = batcher.push if recorder is None else lambda columns: recorder.timed(batcher.push(columns), "batch")
    stream = iter(chunks(todo))
    try:
        for chunk, columns in stream:
            columns[PADDING] = np.repeat([f.padding for f in chunk], [f.num_rows for f in chunk])
            if recorder is not None:  # a slow first window (remote storage) says how far it got
                recorder.filling(len(columns[PADDING]), min(size, total))
            if cost is not None and spec is not None:  # spec.column is cost.column, a loader cost's column
                where = f"{chunk[0].path!r} row group {chunk[0].row_group}" + (" and after" if len(chunk) > 1 else "")
                raw = columns[cost_lengths] if cost_lengths is not None and spec.function in ("size", "cardinality") \
                    else evaluate(spec, columns[cost.column])
                valid = columns.get(cost.column + MASK_SUFFIX)
                if valid is not None and not valid.all():  # a null cost: refused by check_costs, not taken as 0
                    raw = raw.astype(object)
                    raw[~valid] = None
                costs = check_costs(raw, where)
                same = costs is columns[cost.column] and cost.column not in drop
                if not alias:
                    alias.append(same)
                elif alias[0] != same:  # the column's type changed between row groups
                    raise InvalidValueError(f"column {cost.column!r} (the cost) is {columns[cost.column].dtype} in "
                                            f"{where} and of another type before it; rewrite the dataset with one "
                                            "type for that column")
                if not same:
                    columns[COST_COLUMN] = costs
                for name in drop:
                    del columns[name]
                    columns.pop(name + MASK_SUFFIX, None)
            if alias and alias[0] and cost is not None:  # alias is decided only with a cost
                for run in push(columns):
                    run[COST_COLUMN] = run[cost.column]
                    yield run
            else:
                yield from push(columns)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        if placement is not None:  # the end of the epoch, or the loop left: no spill file stays
            placement.close()
    batcher.finish()
