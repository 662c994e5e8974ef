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
*runs* of whole batches (a permuted window, or up to ``RUN_ROWS`` rows of a large one gathered at a time, see
``Window``; the whole batches buffered so far when not shuffling) and callers cut them into batches, so per-batch
work is a slice, and conversions (to tensors) happen once per run.

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

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from ...core.shuffle import StartPoint, row_order
from ...errors import InvalidValueError
from ..rows.convert import concat_arrays
from .spare_matrices import SpareMatrices

# The window shuffle rule (``row_order``, ``window_rows``) lives in the core (``core/shuffle.py``), which the
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
    window plus the chunk being pushed. Shuffled numeric batches are writable arrays; unshuffled ones are views of
    the chunks pushed where a chunk holds whole batches (writable where the chunk's arrays are).
    """

    def __init__(self, *, total_rows: int, batch_size: int, window_rows: int, start: StartPoint,
                 key: Sequence[int] | None, arrange: Callable | None = None, filling: Callable | None = None,
                 spares: SpareMatrices | None = None):
        if window_rows % batch_size:
            raise InvalidValueError(f"window_rows={window_rows} must be a multiple of batch_size={batch_size}")
        self._total, self._batch, self._window_rows, self._key = total_rows, batch_size, window_rows, key
        # arrange(window columns, key) -> (order, lengths): cost balancing (``CostOptions``) in place of the plain
        # permutation; ``lengths`` (rows per batch, token budgets) makes every batch its own run, and then the start
        # point's ``skip_rows`` counts batches. Like the permutation it must depend on the window and key alone.
        self._arrange = arrange
        # filling(size, first chunk) -> a window being assembled (``Filling``, or ``spill_window.SpillFilling``,
        # which places rows in memory or on disk; the rows and their order are the same)
        self._make_filling = filling or (Filling if spares is None else
                                         lambda size, first: Filling(size, first, spares))
        self._spares = spares  # window matrices kept for the next window (``spare_matrices.py``): given back here
        self._window = start.window
        self._row = start.row  # slot row where the window being filled starts
        self._skip = start.skip_rows
        self._parts: list[ColumnArrays] = []  # unshuffled: the chunks not yet handed out
        self._filling: Filling | None = None  # shuffled: the window being assembled
        self._buffered = 0

    @property
    def done(self) -> bool:
        return self._row >= self._total

    def push(self, columns: ColumnArrays) -> Iterator[ColumnArrays]:
        """Add the next chunk of rows (all columns the same length) and yield the runs of whole batches it
        completes, in order (cut them with ``split_batches``)."""
        rows = _num_rows(columns)
        if rows == 0:
            return
        if self._buffered + rows > self._total - self._row:
            raise RuntimeError(f"received {self._buffered + rows} rows where the slot has "
                               f"{self._total - self._row} left; the reader delivered more rows than planned")
        self._buffered += rows
        if self._key is None:
            yield from self._unshuffled(columns, rows)
            return
        while rows:  # each chunk goes into its window as it comes (its memory is then free for the next one)
            size = min(self._window_rows, self._total - self._row)
            if self._filling is None:
                self._filling = self._make_filling(size, columns)
            take = min(rows, size - self._filling.rows)
            self._filling.add(columns if take == rows else {name: values[:take] for name, values in columns.items()})
            columns = {name: values[take:] for name, values in columns.items()} if take < rows else {}
            rows -= take
            if self._filling.rows == size:
                window, self._filling = self._filling.window(), None
                self._buffered -= size
                yield from self._shuffled(window, size)

    def finish(self) -> None:
        """Raise if the pushed rows did not add up to the slot's rows: a batch would be short or missing."""
        if not self.done or self._buffered:
            raise RuntimeError(f"the reader ended {self._total - self._row - self._buffered} rows short of the "
                               f"slot's {self._total} planned rows; the dataset changed while reading?")

    def _shuffled(self, window: Window, size: int) -> Iterator[ColumnArrays]:
        skip, self._skip = self._skip, 0
        key = (*(self._key or ()), self._window)
        lengths = None
        if self._arrange is not None:
            order, lengths = self._arrange(window, key)
        else:
            order = row_order(size, key)
        self._window += 1
        self._row += size
        if lengths is not None:  # batches of varying rows, each its own run; skip counts batches
            ends = np.cumsum(lengths)
            for end, rows in zip(ends[skip:], lengths[skip:], strict=True):
                yield window.gather(order[end - rows:end])
        else:  # runs of whole batches, each gathered when asked for: batch j is rows order[j*B:(j+1)*B]
            step = window.run_rows(self._batch, size)
            for begin in range(skip, size, step):
                yield window.gather(order[begin:begin + step])
        release = getattr(window, "release", None)  # a window with files on disk deletes them once served
        if release is not None:
            release()
        if self._spares is not None and type(window) is Window:  # served whole (a window in memory, no spill
            self._spares.give(window.matrices)                    # files): its matrices for the next window

    def _unshuffled(self, columns: ColumnArrays, rows: int) -> Iterator[ColumnArrays]:
        """Runs in plan order, cut as soon as the chunks pushed hold whole batches: where a chunk holds them, the
        run is a view of it (no copy: its batches are views of the decoded arrays); only small chunks (gathered up
        to ``RUN_ROWS`` rows, so runs stay long enough to convert cheaply) and the batch that straddles two chunks
        are concatenated. The rows and batches are those of any other cut."""
        if self._skip:  # the first chunk's rows before the start
            skip = min(self._skip, rows)
            self._skip -= skip
            self._row += skip
            self._buffered -= skip
            columns, rows = {name: values[skip:] for name, values in columns.items()}, rows - skip
            if not rows:
                return
        self._parts.append(columns)
        held, end = self._buffered, self._row + self._buffered >= self._total
        if not end and held < max(RUN_ROWS, self._batch):
            return
        parts, self._parts = self._parts, []
        if len(parts) > 1 and rows >= max(RUN_ROWS, self._batch):  # a large chunk after a few rows: the straddling
            need = (rows - held) % self._batch                       # batch alone, then views of the chunk
            head = parts[:-1] + ([{name: values[:need] for name, values in columns.items()}] if need else [])
            yield from self._hand_out({name: _concat([p[name] for p in head]) for name in columns}, held - rows + need)
            parts = [{name: values[need:] for name, values in columns.items()} if need else columns]
            held = rows - need
        run = parts[0] if len(parts) == 1 else {name: _concat([p[name] for p in parts]) for name in parts[0]}
        whole = held if end else held // self._batch * self._batch
        if whole:
            yield from self._hand_out(run if whole == held else {name: v[:whole] for name, v in run.items()}, whole)
        if whole < held:
            self._parts = [{name: values[whole:] for name, values in run.items()}]

    def _hand_out(self, run: ColumnArrays, rows: int) -> Iterator[ColumnArrays]:
        self._row += rows
        self._buffered -= rows
        yield run


# Rows gathered at a time from a row-major window (rounded to whole batches): no permuted copy of the whole window
# is held, and runs stay long enough that cutting them into tensors (a few microseconds per column and run) costs
# little: runs of 4,096 rows cost more there than the smaller gathers saved (measured).
RUN_ROWS = 32768
# Windows whose 1-D fixed-width columns hold fewer bytes than this stay column by column: a column of such a window
# stays in the CPU caches while it is gathered, and interleaving would be one copy more (measured 0.6-0.8x at
# 10,000 rows of 34 columns).
ROW_MAJOR_BYTES = 16 << 20
_BLOCK = 4096  # rows interleaved at a time into a window's row-major matrix (a block of rows stays in cache)
_GROUPED_KINDS = "biufmM"


class Filling:
    """A shuffle window being assembled from the chunks of ``size`` rows that make it, in order.

    In a window of ``ROW_MAJOR_BYTES`` or more, the 1-D fixed-width columns of each item size are interleaved into
    one row-major ``(rows, columns)`` matrix as each chunk arrives (that copy replaces the concatenation, and the
    chunk's memory is free for the next one); other columns (text, lists, shaped arrays) keep their chunks until the
    window is full, and are then concatenated, as every column of a smaller window is.
    """

    def __init__(self, size: int, first: ColumnArrays, spares: SpareMatrices | None = None):
        self.rows = 0
        self._names = list(first)
        self._dtypes = {name: values.dtype for name, values in first.items() if isinstance(values, np.ndarray)}
        by_size: dict[int, list[str]] = {}
        for name, dtype in self._dtypes.items():
            if dtype.kind in _GROUPED_KINDS and dtype.itemsize in (1, 2, 4, 8) and first[name].ndim == 1:
                by_size.setdefault(dtype.itemsize, []).append(name)
        self.row_major = size * sum(itemsize * len(names) for itemsize, names in by_size.items()) >= ROW_MAJOR_BYTES
        make = np.empty if spares is None else spares.take  # a matrix's every row is written before it is read
        self._groups = [(names, make((size, len(names)), f"u{itemsize}"))
                        for itemsize, names in by_size.items() if len(names) > 1 and self.row_major]
        grouped = {name for names, _ in self._groups for name in names}
        self._parts: dict[str, list] = {name: [] for name in self._names if name not in grouped}
        # boolean columns with no True so far (the padding flags of a window without padding): gathered as zeros
        self._false = {name for name in self._parts if name in self._dtypes and self._dtypes[name] == np.bool_
                       and first[name].ndim == 1}

    def add(self, part: ColumnArrays) -> None:
        rows = _num_rows(part)
        for names, matrix in self._groups:
            columns = grouped_views(part, names, self._dtypes, matrix.dtype)
            for begin in range(0, rows, _BLOCK):  # a block of rows stays in cache
                end = min(begin + _BLOCK, rows)
                np.stack([c[begin:end] for c in columns], axis=1, out=matrix[self.rows + begin:self.rows + end])
        for name, parts in self._parts.items():
            parts.append(part[name])
        for name in [name for name in self._false if not _all_false(part[name])]:
            self._false.discard(name)
        self.rows += rows

    def window(self) -> Window:
        columns = {name: np.zeros(self.rows, dtype=np.bool_) if name in self._false else
                   parts[0] if len(parts) == 1 else _concat(parts) for name, parts in self._parts.items()}
        return Window(self._names, self._dtypes, self._groups, columns, self.row_major, frozenset(self._false))


class Window(Mapping):
    """One shuffle window's rows, held for gathers in any order; ``window[name]`` is a column as one array.

    Why row-major (``Filling``): a permutation of a window larger than the CPU caches reads each row from anywhere
    in it, and a column-by-column gather then fetches one cache line per value (34 float columns of 584k rows:
    0.15-0.4 s, twice what the same rows cost in 10,000-row windows); from a row-major matrix a gather fetches a
    row's values of all its columns in a line or two, and the small gathered block is transposed back into columns
    in cache. The rows and their order are the same either way.
    """

    def __init__(self, names: list[str], dtypes: dict, groups: list, columns: ColumnArrays, row_major: bool,
                 false: frozenset = frozenset()):
        self._names, self._dtypes, self._groups, self._columns = names, dtypes, groups, columns
        self.row_major = row_major
        self._false = false  # boolean columns that hold no True: their gathers are zeros, not read

    @property
    def matrices(self) -> list[np.ndarray]:
        """The row-major matrices the window holds (none where it is held column by column)."""
        return [matrix for _, matrix in self._groups]

    def __getitem__(self, name: str):
        if name in self._columns:
            return self._columns[name]
        for names, matrix in self._groups:
            if name in names:
                return np.ascontiguousarray(matrix[:, names.index(name)]).view(self._dtypes[name])
        raise KeyError(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def run_rows(self, batch_size: int, size: int) -> int:
        """Rows gathered at a time (whole batches): ``RUN_ROWS`` from a row-major window, else the whole window."""
        return max(1, RUN_ROWS // batch_size) * batch_size if self.row_major else size

    def gather(self, order: np.ndarray) -> ColumnArrays:
        """The rows ``order`` (no row twice) as fresh writable columns, in the window's column order."""
        out = {name: np.zeros(len(order), dtype=np.bool_) if name in self._false else _gather(values, order)
               for name, values in self._columns.items()}
        for names, matrix in self._groups:
            block = gather_columns(matrix, order)  # (columns, rows): each column one contiguous row
            for i, name in enumerate(names):
                out[name] = block[i].view(self._dtypes[name])
        return {name: out[name] for name in self._names}


def gather_columns(matrix: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Rows ``order`` of a row-major ``(rows, columns)`` matrix, transposed: ``(columns, len(order))``, each column
    contiguous. Taken and transposed ``_BLOCK`` rows at a time, so the block being transposed stays in cache (one
    take of a whole run, then its transposed copy, read the run's rows back from memory column by column: 1.3 ms
    against 1.8 ms for 32,768 rows of 32 four-byte columns, measured)."""
    out = np.empty((matrix.shape[1], len(order)), dtype=matrix.dtype)
    for begin in range(0, len(order), _BLOCK):
        out[:, begin:begin + _BLOCK] = np.take(matrix, order[begin:begin + _BLOCK], axis=0).T
    return out


def _all_false(values) -> bool:
    return isinstance(values, np.ndarray) and values.dtype == np.bool_ and values.ndim == 1 and not values.any()


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


def grouped_views(part: ColumnArrays, names, dtypes, dtype) -> list[np.ndarray]:
    """Columns ``names`` of ``part`` viewed as ``dtype`` words, to interleave into a row-major matrix; a column
    whose type changed within a window is an error."""
    columns = []
    for name in names:
        values = part[name]
        if values.dtype != dtypes[name] or values.ndim != 1:
            raise RuntimeError(f"column {name!r} came as {values.dtype} of shape {values.shape} after "
                               f"{dtypes[name]}: the reader changed a column's type within a window")
        columns.append(values.view(dtype))
    return columns


def _num_rows(columns: ColumnArrays) -> int:
    lengths = {len(values) for values in columns.values()}
    if len(lengths) != 1:
        raise InvalidValueError(f"columns of one chunk have different lengths {sorted(lengths)}")
    return lengths.pop()
