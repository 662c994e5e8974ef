"""The window shuffle rule: which order a slot delivers its planned rows in. Pure numpy, no I/O.

A slot (a rank, or one DataLoader worker of a rank) delivers its rows in plan order, permuted in fixed
**windows** of ``window_rows`` rows (a whole number of batches), each by a generator drawn from
``[seed, epoch, rank, slot(, stage), window]`` (``row_order``). The readers apply it
(``reading/batches/batching.WindowBatcher``), and the elastic arithmetic (``core/elastic.py``) reads it backwards
to know which rows a stopped slot had not delivered yet; both import it from here, so the rule lives in the core
and is written once.

>>> windows = Windows.of(batch_size=4, shuffle_window=6, shuffle=True)
>>> windows.rows
8
>>> unread, rest = unread_rows(20, batch_size=4, window_rows=8, batches_done=1, key=slot_key(0, 0, 0, 0))
>>> len(unread), rest  # one batch of 4 delivered: 4 rows of the first window left, none from row 8 on
(4, 8)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidValueError
from . import fisher_yates, sorting


def window_rows(batch_size: int, shuffle_window: int, shuffle: bool = True) -> int:
    """Rows per window: ``shuffle_window`` rounded up to whole batches. Without shuffling windows only group
    batches (fewer, larger conversions); they start at the next batch to deliver rather than at fixed rows."""
    return max(1, -(-shuffle_window // batch_size)) * batch_size


# Bytes a slot may hold per byte of its window. A window of numbers is held once (``reading/batches/batching.Filling``:
# each
# chunk is interleaved into it as it arrives, and gathered a run of batches at a time): 3.8x its bytes at the peak
# with the reader's prefetch, the run being cut and the Arrow pool (bench_shuffle.py's peak RSS, 4M rows); text and
# list columns still hold their chunks, the window joined and a run, which the margin up to 6 covers. Lowering it
# would change the default window, and so the order of every default loader.
WINDOW_COPIES = 6
DEFAULT_BUDGET = 512 * 2**20  # default bytes of decoded rows one slot's shuffle may hold (``shuffle_budget``)
EXTRA_ROW_BYTES = 9.0  # what a loader carries beside each row's columns (the padding flag, the cost): sizes windows
MEMORY_ADVICE = 4 * 2**30  # a shuffle_budget past this is no advice: a spill folder (local disk) holds the window


def budget_window(budget_bytes: int, row_bytes: float, batch_size: int) -> int:
    """Rows per window that a shuffle budget of ``budget_bytes`` holds for rows of ``row_bytes`` decoded bytes:
    whole batches, at least one.

    Why a budget rather than a fixed row count: a batch can only mix rows that share its window, and data is
    usually stored sorted (by time, label, user), so a window of a few row groups gives batches of a few labels.
    The largest window memory allows is the best one; a slot whose rows fit in it delivers batches cut from one
    uniform permutation of all its rows, whatever the stored order (G16).

    >>> budget_window(512 * 2**20, 144.0, 256)
    621312
    """
    rows = int(budget_bytes // (WINDOW_COPIES * max(float(row_bytes), 1.0)))
    return max(1, rows // batch_size) * batch_size


def spill_window(spill_bytes: int, row_bytes: float, batch_size: int, slot_rows: int) -> int:
    """Rows per window when windows may live on local disk: a slot's whole share (``slot_rows``, rounded up to
    whole batches) if ``spill_bytes`` of decoded rows hold it, else as many rows as they hold; at least a batch.

    One window per slot and epoch is what makes a batch a sample of a uniform permutation of the slot's rows, and
    each row is still read from storage once. On disk a window is held once (no copies to cover, unlike
    ``budget_window``): it is written as it fills and read back memory-mapped.

    >>> spill_window(64 * 2**30, 144.0, 256, 1_000_000), spill_window(2**30, 4096.0, 256, 1_000_000)
    (1000192, 262144)
    """
    rows = min(-(-max(int(slot_rows), 1) // batch_size) * batch_size, int(spill_bytes // max(float(row_bytes), 1.0)))
    return max(1, rows // batch_size) * batch_size


# The rule that orders a shuffled window's rows (``row_order``), saved in a loader's state (``shuffle_order``): another
# rule delivers other rows in each batch, so a position saved under one does not continue under another.
# 1: the stable sort of 48-bit words (``window_permutation``); 2: a Fisher-Yates shuffle (``fisher_yates.py``), at
# a quarter of the cost.
ORDER_VERSION = 2


def row_order(num_rows: int, key: Sequence[int]) -> np.ndarray:
    """The order a shuffled window of ``num_rows`` rows delivers them in, drawn from its key: a uniform
    permutation, the same on every NumPy version, under the rule ``ORDER_VERSION`` names."""
    if ORDER_VERSION == 1:
        return window_permutation(num_rows, key)
    return fisher_yates.permutation(num_rows, key)


def window_permutation(num_rows: int, key: Sequence[int]) -> np.ndarray:
    """A permutation of ``num_rows`` drawn from ``key``, the same on every NumPy version: the cost arrangement's
    and packing's orders, the readers' row order within a fragment, and windows' rows under ``ORDER_VERSION`` 1.

    The rows are stably sorted by 48 bits of raw PCG64 words (``Generator.permutation`` is not guaranteed to stay
    the same across versions; the bit generator's stream is). A stable sort's result is defined by the keys alone,
    whatever algorithm computes it: the kernels of ``sorting.py`` give the same permutation, each where it is the
    faster one.
    """
    return sorting.stable_order(raw_words(key, num_rows))


def raw_words(key: Sequence[int], count: int) -> np.ndarray:
    """The first ``count`` raw 64-bit words of the PCG64 stream seeded by ``SeedSequence(list(key))``
    (``fisher_yates.bit_generator``)."""
    return fisher_yates.bit_generator(key).random_raw(count)


def slot_key(seed: int, epoch: int, rank: int, slot: int, stage: int = 0) -> tuple[int, ...]:
    """The window key prefix of a slot; a stage after an elastic resume (``stage > 0``) gets its own."""
    key = (seed, epoch, rank, slot)
    return key + (stage,) if stage else key


def unread_rows(total_rows: int, *, batch_size: int, window_rows: int, batches_done: int,
                key: Sequence[int] | None) -> tuple[np.ndarray, int]:
    """Which of a slot's rows are not delivered after ``batches_done`` batches (what an elastic resume needs).

    Returns the sorted slot positions of the undelivered rows of the window in progress, and the position from
    which no row was delivered (the end of that window; without shuffling, the next batch's first row). This is
    ``WindowBatcher``'s order read backwards: batch ``j`` of window ``w`` is rows ``perm[j*B:(j+1)*B]`` of it.
    """
    done = batches_done * batch_size
    if done > total_rows or batches_done < 0:
        raise InvalidValueError(f"batches_done={batches_done} is outside this slot's {total_rows // batch_size} "
                                "batches")
    if key is None or done == total_rows:
        return np.empty(0, dtype=np.int64), done
    window = done // window_rows
    row = window * window_rows
    size = min(window_rows, total_rows - row)
    order = row_order(size, (*key, window))
    return np.sort(order[done - row:]).astype(np.int64) + row, row + size


@dataclass(frozen=True)
class StartPoint:
    """Where reading starts when ``batches_done`` batches of the slot were already delivered."""

    fragment: int  # index of the first fragment to read; the ones before it are never opened
    offset: int  # rows at the head of that fragment to leave unread
    window: int  # index of the first window (counted from the slot's first row)
    row: int  # slot row at which the first window starts
    skip_rows: int  # rows (whole batches) of the first window to drop after permuting


@dataclass(frozen=True)
class Windows:
    """How a loader's slots shuffled: rows per window, and whether windows were permuted at all."""

    rows: int
    shuffled: bool

    @classmethod
    def of(cls, *, batch_size: int, shuffle_window: int, shuffle: bool) -> Windows:
        return cls(window_rows(batch_size, shuffle_window, shuffle), bool(shuffle))

    def unread(self, rows: int, *, batch_size: int, batches_done: int, seed: int, epoch: int, rank: int, slot: int,
               stage: int) -> tuple[np.ndarray, int]:
        """``unread_rows`` for slot ``slot`` of rank ``rank`` in ``stage`` of ``epoch``, with its own key."""
        key = slot_key(seed, epoch, rank, slot, stage) if self.shuffled else None
        return unread_rows(rows, batch_size=batch_size, window_rows=self.rows, batches_done=batches_done, key=key)
