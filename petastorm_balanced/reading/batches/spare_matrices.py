"""Row-major window matrices kept from one shuffle window to the next of the same shape (``batching.Filling``).

Why: a large window's 1-D number columns are interleaved into one fresh ``(rows, columns)`` matrix per window, and
memory that large comes straight from the system each time: every page of it is faulted in and zeroed before the
rows are copied in (a window of 2M rows of two int64 columns, 32 MiB: 528 page faults, 9.5-11 ms against 6 ms
filling a matrix already held, measured on both stacks). A loader keeps one ``SpareMatrices`` for its life, so its
next window, in this epoch or the next, fills the same matrix.

Why it is safe: a window's batches never alias its matrix (``Window.gather`` copies the rows it takes, and a column
read whole from a window is a contiguous copy), and a matrix is given back only once its window served its last
run; every row of a matrix taken again is written before its window is made. Memory: a spare of another shape is
dropped before a new matrix is made, so a slot never holds more window matrices than it did without spares (the
spare kept between two windows or epochs is the one the next window takes); between epochs the loader holds its
last window's matrices.
"""
from __future__ import annotations

import numpy as np


class SpareMatrices:
    """The window matrices a slot's last shuffle window filled, for its next window (one slot at a time: a loader's
    epochs run one after another)."""

    def __init__(self) -> None:
        self._spare: list[np.ndarray] = []

    def take(self, shape: tuple[int, int], dtype: str) -> np.ndarray:
        """A matrix of ``shape`` and ``dtype`` (its content left over: the caller writes every row): a spare one,
        else a new one, the spares of other shapes dropped first (they would be held beside it)."""
        wanted = np.dtype(dtype)
        for i, matrix in enumerate(self._spare):
            if matrix.shape == shape and matrix.dtype == wanted:
                return self._spare.pop(i)
        self._spare.clear()
        return np.empty(shape, dtype=wanted)

    def give(self, matrices: list[np.ndarray]) -> None:
        """``matrices`` (of a window that served its last run) kept for the next window, in place of any spare
        that window did not take."""
        self._spare = list(matrices)

    def __len__(self) -> int:
        return len(self._spare)
