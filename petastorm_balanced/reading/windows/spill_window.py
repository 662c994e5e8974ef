"""A shuffle window assembled under a ``spill.Placement``: its rows in memory up to the slot's measured budget,
the rest in files on local disk; served by ``batching.Window``'s gathers in the same order either way.

``batching.Filling`` sizes nothing: it holds whatever the window's rows weigh. This one counts the decoded bytes it
holds as the chunks arrive (the fixed-width columns when the window starts: their bytes per row are exact; the
Arrow columns chunk by chunk: their strings and lists are what footers and samples misjudge) and sends what would
go beyond ``Placement.memory`` to disk. The window's rows, and so the order of every batch, are decided before
(``core/shuffle.py``); only where the rows wait depends on what was measured.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..batches.batching import (
    _GROUPED_KINDS,
    ROW_MAJOR_BYTES,
    ColumnArrays,
    Filling,
    Window,
    _all_false,
    _concat,
    _num_rows,
    grouped_views,
)
from ..batches.spare_matrices import SpareMatrices
from .spill import BlockColumn, DiskArray, Placement, SpilledColumn, nbytes, spillable

_BLOCK = 4096  # rows interleaved at a time into a row-major matrix (as ``batching.Filling``)


def filling_for(placement: Placement, spares: SpareMatrices | None = None):
    """``WindowBatcher``'s ``filling``: ``batching.Filling`` for a window of fixed-width columns that fits the
    placement's memory (its bytes are exact: nothing to measure or place; its matrices from ``spares``), else a
    ``SpillFilling``."""
    def filling(size: int, first: ColumnArrays):
        fixed = all(isinstance(v, np.ndarray) and not v.dtype.hasobject for v in first.values())
        row = sum(v.dtype.itemsize * math.prod(v.shape[1:]) for v in first.values()) if fixed else 0
        if fixed and size * row <= placement.memory:
            return Filling(size, first, spares)
        return SpillFilling(size, first, placement)
    return filling


class SpillFilling:
    """``batching.Filling``'s interface (``add``, ``rows``, ``window()``) for a window of ``size`` rows placed by
    ``placement``. Fixed-width numpy columns are written into arrays made for the whole window when it starts
    (row-major matrices per item size where the window is large or on disk, as ``Filling``'s), in memory or
    memory-mapped; Arrow columns keep their chunks in memory until the budget is reached, then go to IPC files."""

    def __init__(self, size: int, first: ColumnArrays, placement: Placement):
        self.rows = 0
        self._placement = placement
        self._names = list(first)
        self._dtypes = {name: values.dtype for name, values in first.items() if isinstance(values, np.ndarray)}
        fixed = {name: values for name, values in first.items()
                 if isinstance(values, np.ndarray) and not values.dtype.hasobject}
        row_fixed = sum(v.dtype.itemsize * math.prod(v.shape[1:]) for v in fixed.values())
        large = size * row_fixed >= ROW_MAJOR_BYTES or size * row_fixed > placement.memory
        by_size: dict[int, list[str]] = {}
        for name, values in fixed.items():
            if large and values.dtype.kind in _GROUPED_KINDS and values.dtype.itemsize in (1, 2, 4, 8) \
                    and values.ndim == 1:
                by_size.setdefault(values.dtype.itemsize, []).append(name)
        by_size = {itemsize: names for itemsize, names in by_size.items() if len(names) > 1}
        self._files: list[str] = []  # this window's spill files, deleted once it is served
        self._blocks: dict = {}  # (dtype, columns) -> a block of rows interleaved before it is written
        self.held = 0  # bytes of this window in memory
        self.on_disk = 0  # bytes of this window in spill files
        self._groups: list = []
        for itemsize, names in by_size.items():
            self._groups.append((names, self._allocate((size, len(names)), f"u{itemsize}")))
        grouped = {name for names, _ in self._groups for name in names}
        # boolean columns with no True so far (the padding flags of a window without padding), as ``Filling``'s:
        # neither stored nor gathered (a window larger than the caches paid a cache miss per row for each, 8 ms
        # per 1,000,000 rows); stored from their first True on, the rows before it written as False then
        self._false = {name: size for name, values in fixed.items() if name not in grouped
                       and values.dtype == np.bool_ and values.ndim == 1}
        self._arrays = {name: self._allocate((size, *values.shape[1:]), values.dtype)
                        for name, values in fixed.items() if name not in grouped and name not in self._false}
        self._parts: dict[str, list] = {name: [] for name in self._names if name not in grouped | set(self._arrays)}
        self._spilled: dict[str, SpilledColumn] = {}
        self.row_major = large

    def _block(self, dtype, columns: int) -> np.ndarray:
        block = self._blocks.get((dtype, columns))
        if block is None:
            block = self._blocks[(dtype, columns)] = np.empty((_BLOCK, columns), dtype=dtype)
        return block

    def _allocate(self, shape: tuple, dtype):
        array = self._placement.allocate(shape, dtype, self.held)
        if isinstance(array, DiskArray):
            self.on_disk += array.nbytes
            self._files.append(array.path)
        else:
            self.held += array.nbytes
        return array

    def add(self, part: ColumnArrays) -> None:
        rows = _num_rows(part)
        begin_row, end_row = self.rows, self.rows + rows
        for names, matrix in self._groups:
            columns = grouped_views(part, names, self._dtypes, matrix.dtype)
            for begin in range(0, rows, _BLOCK):
                end = min(begin + _BLOCK, rows)
                if isinstance(matrix, DiskArray):  # interleaved in a block reused for every write
                    block = self._block(matrix.dtype, len(names))[:end - begin]
                    matrix.write(begin_row + begin, np.stack([c[begin:end] for c in columns], axis=1, out=block))
                else:
                    np.stack([c[begin:end] for c in columns], axis=1, out=matrix[begin_row + begin:begin_row + end])
        for name in [name for name in self._false if not _all_false(part[name])]:
            array = self._arrays[name] = self._allocate((self._false.pop(name),), np.bool_)
            if begin_row:
                array[0:begin_row] = np.zeros(begin_row, dtype=np.bool_)
        for name, array in self._arrays.items():
            values = part[name]
            if values.dtype != array.dtype or values.shape[1:] != tuple(array.shape[1:]):
                raise RuntimeError(f"column {name!r} came as {values.dtype} of shape {values.shape} after "
                                   f"{array.dtype} rows of shape {array.shape[1:]}: the reader changed a column's "
                                   "type within a window")
            array[begin_row:end_row] = values
        for name, parts in self._parts.items():
            self._add_part(name, parts, part[name])
        self.rows = end_row

    def _add_part(self, name: str, parts: list, values) -> None:
        spilled = self._spilled.get(name)
        if spilled is not None:
            spilled.write(values)
            self._count_disk(nbytes(values))
            return
        size = nbytes(values)
        if self._placement.folder is not None and spillable(values) and self.held + size > self._placement.memory:
            assert self._placement.folder is not None
            spilled = self._spilled[name] = SpilledColumn(self._placement.folder.file(".arrow"), values)
            self._files.append(spilled.path)
            for held in parts:  # this column's chunks so far go too: its memory is free for the other columns
                spilled.write(held)
                self.held -= nbytes(held)
                self._count_disk(nbytes(held))
            parts.clear()
            spilled.write(values)
            self._count_disk(size)
            return
        parts.append(values)
        self.held += size

    def _count_disk(self, size: int) -> None:
        self.on_disk += size
        self._placement.count(size)

    def window(self) -> SpilledWindow:
        columns: dict = {name: a.mapped() if isinstance(a, DiskArray) else a for name, a in self._arrays.items()}
        columns.update({name: np.zeros(self.rows, dtype=np.bool_) for name in self._false})
        groups = [(names, m.mapped() if isinstance(m, DiskArray) else m) for names, m in self._groups]
        for name, parts in self._parts.items():
            if name in self._spilled:
                columns[name] = BlockColumn(self._spilled[name].chunks())
            elif len(parts) == 1:
                columns[name] = parts[0]
            elif spillable(parts[0]) and self.held > self._placement.memory // 2:  # no joined copy of it
                columns[name] = BlockColumn(parts)
            else:
                columns[name] = _concat(parts)
        return SpilledWindow(self._names, self._dtypes, groups, columns, self.row_major, self._placement,
                             self.on_disk, self._files, (self.held + self.on_disk) / max(1, self.rows),
                             frozenset(self._false))


class SpilledWindow(Window):
    """``batching.Window`` over columns some of which are memory-mapped; ``release()`` gives its disk back."""

    def __init__(self, names, dtypes, groups, columns, row_major, placement: Placement, on_disk: int,
                 files: list[str], row_bytes: float, false: frozenset = frozenset()):
        super().__init__(names, dtypes, groups, columns, row_major, false)
        self._placement, self._on_disk, self._files = placement, on_disk, files
        self._row_bytes = row_bytes  # decoded bytes per row, as measured while the window filled

    def run_rows(self, batch_size: int, size: int) -> int:
        """Whole batches of at most the placement's memory (measured bytes), at least one batch, and never more
        than ``batching.Window`` gathers: a run is gathered into anonymous memory (twice over for an Arrow column
        taken chunk by chunk), so a window of rows far larger than its footers said is served in runs its budget
        holds, not in one gather of the whole window."""
        held = max(1, int(self._placement.memory // max(self._row_bytes, 1.0)) // batch_size) * batch_size
        return min(super().run_rows(batch_size, size), held)

    def __getitem__(self, name: str):
        values = super().__getitem__(name)
        return values.combined() if isinstance(values, BlockColumn) else values

    def release(self) -> None:
        """Delete this window's files and drop their maps (the space is free once the last map goes)."""
        self._columns, self._groups = {}, []
        for path in self._files:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._files = []
        self._placement.release(self._on_disk)
