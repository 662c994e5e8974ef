"""Sorting random 48-bit words into a permutation, fast on every NumPy and CPU: the kernels the window shuffle
(``shuffle.window_permutation``) and the cost arrangement (``cost/one_sort.py``) share, and the CPU-feature check
that picks among them. Pure numpy, no I/O.

A stable sort's result is defined by its keys alone, so every kernel here gives the same order for the same words;
which one runs moves only the time (figures beside each rule).
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping

import numpy as np


def stable_order(words: np.ndarray) -> np.ndarray:
    """The stable argsort of the low 48 bits of ``words`` (uint64), by the kernel that is fastest here."""
    bits = max(1, (len(words) - 1).bit_length())
    if _BUCKET_MIN_BITS <= bits <= 32:
        return _by_buckets(words, bits)
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


# From 2**17 rows on, ``_by_buckets``: one sort of a window's keys spans several MB, and its passes over them miss the
# CPU caches (2,097,152 rows: 125-157 ms against 159-193 for ``_by_packed_keys``, 600,000: 25-29 against 36-46,
# NumPy 1.26 and 2, measured on a loaded 2-core VM).
_BUCKET_MIN_BITS = 17
_BUCKET_ROWS_BITS = 11  # about 2**11 rows per bucket or more: its keys sort in the L1/L2 cache


def _by_buckets(words: np.ndarray, bits: int) -> np.ndarray:
    """The stable sort by 48-bit word in two levels: rows put in ``2**d`` buckets by the word's top ``d`` bits (a
    stable counting sort, one 8-bit pass up to 2**24 rows, which keeps each bucket's rows in row order), then each
    bucket sorted by ``(the word's other 48 - d bits << bits) | row``, keys that are unique and fit 64 bits
    (``d >= bits - 16``), so the buckets in turn give rows by word and then by row: the stable sort's order. Each
    bucket's keys fit the CPU caches, where one sort of all keys spans several MB. Up to 2**32 rows."""
    d = max(bits - 16, min(8, bits - _BUCKET_ROWS_BITS))
    rest = np.uint64(48 - d)
    top = ((words >> rest) & np.uint64((1 << d) - 1)).astype(np.uint16 if d > 8 else np.uint8)  # bits 48-d to 47
    order = np.argsort(top, kind="stable")  # (rows,): rows by bucket, each bucket in row order
    keys = words[order]
    keys &= np.uint64((1 << (48 - d)) - 1)
    keys <<= np.uint64(bits)
    keys |= order.view(np.uint64)
    begin = 0
    for end in np.cumsum(np.bincount(top, minlength=1 << d)).tolist():
        if end - begin > 1:
            keys[begin:end].sort()
        begin = end
    keys &= np.uint64((1 << bits) - 1)
    return keys.view(np.int64).astype(np.intp, copy=False)


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
