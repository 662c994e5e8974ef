"""One slot's rows cut into shuffle windows and batches: pure numpy, no I/O, no torch.

A slot (a rank, or one DataLoader worker of a rank) delivers its fragments' rows in plan order, ``steps x
batch_size`` rows in all. Shuffling happens in fixed **windows**: consecutive runs of ``window_rows`` rows of that
sequence (a whole number of batches), each permuted by a generator drawn from ``[seed, epoch, rank, slot,
window]``. Why fixed windows rather than Petastorm's sliding shuffle buffer: the content of a sliding buffer
depends on everything read before it, so resuming exactly would mean replaying the epoch. With fixed windows the
row at any position is a function of the position alone, so resuming at batch ``k`` reads from the start of
``k``'s window (skipping every earlier fragment without opening it) and drops the batches before ``k`` inside it.

Columns travel as ``{name: numpy array}`` with rows on axis 0, or a ``pyarrow`` array for text and list columns
(permuted inside Arrow, turned into Python values only for the rows handed out, ``tensors.torch_batches``). The
batcher hands out
*runs* of whole batches (a permuted window, or the whole batches buffered so far when not shuffling) and callers
cut them into batches, so per-batch work is a slice, and conversions (to tensors) happen once per run.

>>> import numpy as np
>>> start = start_point(np.array([5, 7]), batch_size=4, window_rows=4, batches_done=1, shuffle=False)
>>> (start.fragment, start.offset, start.skip_rows)
(0, 4, 0)
>>> batcher = WindowBatcher(total_rows=12, batch_size=4, window_rows=4, start=start, key=None)
>>> [run["id"].tolist() for run in batcher.push({"id": np.arange(4, 5)})]
[]
>>> [b["id"].tolist() for run in batcher.push({"id": np.arange(100, 107)}) for b in split_batches(run, 4)]
[[4, 100, 101, 102], [103, 104, 105, 106]]
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..core.shuffle import StartPoint, window_permutation
from ..errors import InvalidValueError
from .convert import concat_arrays

# The window shuffle rule (``window_permutation``, ``window_rows``) lives in the core (``core/shuffle.py``), which the
# elastic arithmetic reads backwards; the readers import it from there.

ColumnArrays = dict[str, np.ndarray]  # one chunk's columns: name -> numpy array (or pyarrow array), rows on axis 0


def start_point(fragment_rows: np.ndarray, *, batch_size: int, window_rows: int, batches_done: int,
                shuffle: bool) -> StartPoint:
    """Where to start so that the next batch is batch ``batches_done`` of the slot.

    Shuffled windows must be read from their first row (the permutation mixes the whole window); unshuffled
    reading starts exactly at the next batch's first row.
    """
    fragment_rows = np.asarray(fragment_rows, dtype=np.int64)
    total = int(fragment_rows.sum())
    next_row = batches_done * batch_size
    if batches_done < 0 or next_row > total:
        raise InvalidValueError(f"batches_done={batches_done} is outside this slot's {total // batch_size} batches")
    window = next_row // window_rows if shuffle else 0
    row = window * window_rows if shuffle else next_row
    ends = np.cumsum(fragment_rows)  # (fragments,)
    fragment = int(np.searchsorted(ends, row, side="right"))
    offset = row - (int(ends[fragment - 1]) if fragment else 0)
    return StartPoint(fragment, offset, window, row, next_row - row)


class WindowBatcher:
    """Turns column chunks pushed in delivery order into batches of exactly ``batch_size`` rows.

    ``key`` is the generator key prefix ``(seed, epoch, rank, slot)``; ``None`` means no shuffling. Memory is one
    window plus the chunk being pushed. Numeric batches are writable arrays.
    """

    def __init__(self, *, total_rows: int, batch_size: int, window_rows: int, start: StartPoint,
                 key: Sequence[int] | None, arrange: Callable | None = None):
        if window_rows % batch_size:
            raise InvalidValueError(f"window_rows={window_rows} must be a multiple of batch_size={batch_size}")
        self._total, self._batch, self._window_rows, self._key = total_rows, batch_size, window_rows, key
        # arrange(window columns, key) -> (order, lengths): cost balancing (``CostOptions``) in place of the plain
        # permutation; ``lengths`` (rows per batch, token budgets) makes every batch its own run, and then the start
        # point's ``skip_rows`` counts batches. Like the permutation it must depend on the window and key alone.
        self._arrange = arrange
        self._window = start.window
        self._row = start.row  # slot row where the window being filled starts
        self._skip = start.skip_rows
        self._parts: list[ColumnArrays] = []
        self._buffered = 0

    @property
    def done(self) -> bool:
        return self._row >= self._total

    def push(self, columns: ColumnArrays) -> Iterator[ColumnArrays]:
        """Add the next chunk of rows (all columns the same length) and yield the runs of whole batches it
        completes, in order (cut them with ``split_batches``; one run per window when shuffling)."""
        rows = _num_rows(columns)
        if rows == 0:
            return
        if self._buffered + rows > self._total - self._row:
            raise RuntimeError(f"received {self._buffered + rows} rows where the slot has "
                               f"{self._total - self._row} left; the reader delivered more rows than planned")
        self._parts.append(columns)
        self._buffered += rows
        while not self.done and self._buffered >= min(self._window_rows, self._total - self._row):
            yield from self._emit(min(self._window_rows, self._total - self._row))

    def finish(self) -> None:
        """Raise if the pushed rows did not add up to the slot's rows: a batch would be short or missing."""
        if not self.done or self._buffered:
            raise RuntimeError(f"the reader ended {self._total - self._row - self._buffered} rows short of the "
                               f"slot's {self._total} planned rows; the dataset changed while reading?")

    def _emit(self, size: int) -> Iterator[ColumnArrays]:
        window = self._take(size)
        lengths = None
        if self._key is not None:
            if self._arrange is not None:
                order, lengths = self._arrange(window, (*self._key, self._window))
            else:
                order = window_permutation(size, (*self._key, self._window))
            window = {name: _gather(values, order) for name, values in window.items()}
        else:  # batches are writable arrays (torch needs that); one copy per window, not one per batch
            window = {name: values if isinstance(values, pa.Array) or values.flags.writeable
                      or values.dtype == object else values.copy() for name, values in window.items()}
        skip, self._skip = self._skip, 0
        if lengths is not None:  # batches of varying rows, each its own run; skip counts batches
            ends = np.cumsum(lengths)
            for end, rows in zip(ends[skip:], lengths[skip:], strict=True):
                yield {name: values[end - rows:end] for name, values in window.items()}
        elif skip < size:
            yield {name: values[skip:] for name, values in window.items()} if skip else window
        self._window += 1
        self._row += size

    def _take(self, size: int) -> ColumnArrays:
        """The first ``size`` buffered rows as one chunk; views when they sit in a single part."""
        taken, need = [], size
        while need:
            part = self._parts[0]
            rows = _num_rows(part)
            if rows <= need:
                taken.append(part)
                self._parts.pop(0)
                need -= rows
            else:
                taken.append({name: values[:need] for name, values in part.items()})
                self._parts[0] = {name: values[need:] for name, values in part.items()}
                need = 0
        self._buffered -= size
        if len(taken) == 1:
            return taken[0]
        return {name: _concat([t[name] for t in taken]) for name in taken[0]}


def _concat(parts):
    return concat_arrays(parts) if isinstance(parts[0], pa.Array) else np.concatenate(parts)


def _gather(values, order: np.ndarray):
    # ``order`` never repeats a row, so an Arrow result holds at most the window's bytes: it fits its offsets
    # (pyarrow 14's take does not check them)
    return values.take(order) if isinstance(values, pa.Array) else values[order]


def split_batches(run: ColumnArrays, batch_size: int) -> Iterator[ColumnArrays]:
    """The batches of a run (views)."""
    for begin in range(0, _num_rows(run), batch_size):
        yield {name: values[begin:begin + batch_size] for name, values in run.items()}


def _num_rows(columns: ColumnArrays) -> int:
    lengths = {len(values) for values in columns.values()}
    if len(lengths) != 1:
        raise InvalidValueError(f"columns of one chunk have different lengths {sorted(lengths)}")
    return lengths.pop()
