"""The window shuffle rule: which order a slot delivers its planned rows in. Pure numpy, no I/O.

A slot (a rank, or one DataLoader worker of a rank) delivers its rows in plan order, permuted in fixed
**windows** of ``window_rows`` rows (a whole number of batches), each by a generator drawn from
``[seed, epoch, rank, slot(, stage), window]``. The readers apply it (``reading/batching.WindowBatcher``), and
the elastic arithmetic (``core/elastic.py``) reads it backwards to know which rows a stopped slot had not
delivered yet; both import it from here, so the rule lives in the core and is written once.

>>> windows = Windows.of(batch_size=4, shuffle_window=6, shuffle=True)
>>> windows.rows
8
>>> unread, rest = unread_rows(20, batch_size=4, window_rows=8, batches_done=1, key=slot_key(0, 0, 0, 0))
>>> len(unread), rest  # one batch of 4 delivered: 4 rows of the first window left, none from row 8 on
(4, 8)
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidValueError


def window_rows(batch_size: int, shuffle_window: int, shuffle: bool = True) -> int:
    """Rows per window: ``shuffle_window`` rounded up to whole batches. Without shuffling windows only group
    batches (fewer, larger conversions); they start at the next batch to deliver rather than at fixed rows."""
    return max(1, -(-shuffle_window // batch_size)) * batch_size


# Bytes a slot may hold per byte of its window. A window of numbers is held once (``reading/batching.Filling``: each
# chunk is interleaved into it as it arrives, and gathered a run of batches at a time): 3.8x its bytes at the peak
# with the reader's prefetch, the run being cut and the Arrow pool (bench_shuffle.py's peak RSS, 4M rows); text and
# list columns still hold their chunks, the window joined and a run, which the margin up to 6 covers. Lowering it
# would change the default window, and so the order of every default loader.
WINDOW_COPIES = 6
DEFAULT_BUDGET = 512 * 2**20  # default bytes of decoded rows one slot's shuffle may hold (``shuffle_budget``)


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


def window_permutation(num_rows: int, key: Sequence[int]) -> np.ndarray:
    """A permutation of ``num_rows`` drawn from ``key``, the same on every NumPy version.

    The rows are stably sorted by 48 bits of raw PCG64 words (``Generator.permutation`` is not guaranteed to stay
    the same across versions; the bit generator's stream is). A stable sort's result is defined by the keys alone,
    whatever algorithm computes it: ``_by_radix`` and ``_by_packed_keys`` give the same permutation, each where
    it is the faster one.
    """
    words = raw_words(key, num_rows)
    bits = max(1, (num_rows - 1).bit_length())
    if VECTOR_SORT or bits > 16:
        return _by_packed_keys(words, bits)
    if bits <= _TOP_DIGIT_BITS:
        return _by_top_digit(words)
    return _by_radix(words)


def vector_sort(numpy_version: str, cpu_features: Mapping[str, bool]) -> bool:
    """Whether NumPy sorts 64-bit integers with vector code: NumPy 2 does (x86-simd-sort on AVX2 and AVX-512,
    Highway on Arm); NumPy 1.25-1.26 only on AVX-512 (Skylake-X) CPUs.

    Measured with NumPy 2: 0.26 ms per 10,000 unique keys against 0.41 ms for the three radix passes, 16 ms against
    81 ms for 584,704 rows. NumPy 1.26 without AVX-512: 0.5 against 0.3 ms for 10,000 rows, 55 against 76 ms for
    584,704 (the radix passes' gathers over a large window miss the CPU caches). NumPy 1.26 with AVX-512: 0.05 ms
    per 10,000 keys, 3.2 ms per 400,000, so the cost arrangement's key sort takes 7.6 ms against 15.3 ms for the
    radix passes. Every rule gives the same order, so the choice moves only the time.

    >>> vector_sort("1.26.4", {"AVX512_SKX": True}), vector_sort("1.26.4", {"AVX2": True}), vector_sort("2.4.6", {})
    (True, False, True)
    """
    major, minor = (int(part) for part in numpy_version.split(".")[:2])
    return major >= 2 or (minor >= 25 and bool(cpu_features.get("AVX512_SKX")))


def _cpu_features() -> Mapping[str, bool]:
    """NumPy's private table of the CPU features it found (``numpy._core`` from NumPy 1.26 on); empty if absent."""
    try:
        module = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:
        return {}
    return dict(getattr(module, "__cpu_features__", {}))


VECTOR_SORT = vector_sort(np.__version__, _cpu_features())
_LOW48 = np.uint64((1 << 48) - 1)


# Up to 2**15 rows one radix pass over the top 16 bits plus a sort of the rows it leaves tied is the faster rule on
# NumPy 1.26 without AVX-512 (0.18 against 0.31 ms for 10,240 rows, 0.58 against 0.81 for 32,768); with more rows
# most rows share their top digit with another and the three passes win.
_TOP_DIGIT_BITS = 15


def _by_top_digit(words: np.ndarray) -> np.ndarray:
    """One stable 16-bit pass on the top digit of the 48-bit word, then the rows that share a top digit with a
    neighbour sorted by ``(48-bit word << 16) | row`` (unique keys, so by word and then by row, as the stable sort
    orders them). Those rows lie in runs of equal top digits, in ascending digit order, so their sorted keys fill
    the same positions. Up to 2**16 rows (a row number fits in the low 16 bits)."""
    top = (words >> np.uint64(32)).astype(np.uint16)  # bits 32-47: the cast keeps the low 16 bits of the shift
    order = np.argsort(top, kind="stable")
    ranked = top[order]
    same = ranked[1:] == ranked[:-1]
    tied = np.zeros(len(words), dtype=bool)
    tied[1:] = same
    tied[:-1] |= same
    where = np.flatnonzero(tied)
    if len(where):
        members = order[where]
        keys = ((words[members] & _LOW48) << np.uint64(16)) | members.astype(np.uint64)
        keys.sort()
        order[where] = (keys & np.uint64(0xFFFF)).astype(np.intp)
    return order


def _by_radix(words: np.ndarray) -> np.ndarray:
    """Three stable 16-bit passes, least significant first (NumPy radix-sorts 16-bit keys)."""
    order = np.argsort(words.astype(np.uint16), kind="stable")
    for shift in (16, 32):  # least significant digit first: the last pass decides, earlier ones break ties
        digits = (words >> np.uint64(shift)).astype(np.uint16)
        order = order[np.argsort(digits[order], kind="stable")]
    return order


def _by_packed_keys(words: np.ndarray, bits: int) -> np.ndarray:
    """One sort of ``(high bits of the 48-bit word << bits) | row`` (``bits`` holds every row number): the keys are
    unique, so any sort orders them by word, ties by row, as the stable sort does; the low bits are then the rows.

    Up to 2**16 rows the whole 48-bit word fits beside the row. Beyond, the key keeps the word's top ``64 - bits``
    bits, and rows whose top bits are equal (a few pairs among millions of rows) are put back in the stable sort's
    order, by the whole word and then the row.
    """
    low = np.uint64(max(0, bits - 16))  # word bits left out of the key
    # built in place: a window of the default budget holds about 600,000 rows, where each temporary array of
    # 4.8 MB costs more than a millisecond (7.4 against 12.3 ms per 400,000 rows, of which the sort takes 3.2)
    keys = words & _LOW48
    if low:
        keys >>= low
    keys <<= np.uint64(bits)
    keys |= np.arange(len(words), dtype=np.uint64)
    keys.sort()
    order = (keys & np.uint64((1 << bits) - 1)).view(np.int64).astype(np.intp, copy=False)
    if low:
        high = keys
        high >>= np.uint64(bits)
        same = np.flatnonzero(high[1:] == high[:-1])
        if len(same):
            tied = np.zeros(len(keys), dtype=bool)
            tied[same] = tied[same + 1] = True
            where = np.flatnonzero(tied)  # runs of equal top bits, each already in row order
            run = np.cumsum(np.concatenate([[True], high[where][1:] != high[where][:-1]]))
            members = order[where]
            order[where] = members[np.lexsort((members, words[members] & _LOW48, run))]
    return order


def raw_words(key: Sequence[int], count: int) -> np.ndarray:
    """The first ``count`` raw 64-bit words of the PCG64 stream seeded by ``SeedSequence(list(key))``.

    A key of 32-bit non-negative integers (every window key in practice) goes to ``SeedSequence`` as a uint32
    array: the same entropy words it makes of the list, without converting each integer (about a third of a
    generator's start, which a window of cost balance pays three times). Other keys go as the list.
    """
    values = [int(v) for v in key]
    if all(0 <= v <= 0xFFFFFFFF for v in values):
        return np.random.PCG64(np.random.SeedSequence(np.array(values, dtype=np.uint32))).random_raw(count)
    return np.random.PCG64(values).random_raw(count)


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
    order = window_permutation(size, (*key, window))
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
