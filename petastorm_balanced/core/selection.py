"""Compact encodings of the matching row positions inside one row group.

A predicate leaves, per row group, a sorted set of matching positions. We store the smallest of three encodings,
chosen per row group, so a plan costs tens of bytes per row group when whole row groups or long runs match and at
most about one bit per scanned row when matches are scattered at random:

- ``b""``: every row matches (the common case with no predicate or a partition predicate).
- ``b"R" + dtype + gaps/lengths``: runs of consecutive matches, as alternating (gap, length) integers.
- ``b"B" + packbits(mask)``: one bit per row.

>>> import numpy as np
>>> positions = np.array([0, 1, 2, 10, 11], dtype=np.int64)
>>> data = encode(positions, total_rows=100)
>>> data[:1], decode(data, 100).tolist()
(b'R', [0, 1, 2, 10, 11])
>>> encode(np.arange(5), total_rows=5)
b''
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidValueError, PlanIntegrityError

_ALL = b""
_RUNS = b"R"
_BITMAP = b"B"
_DTYPES: dict[bytes, np.dtype] = {b"2": np.dtype("<u2"), b"4": np.dtype("<u4"), b"8": np.dtype("<u8")}


def encode(positions: np.ndarray, total_rows: int) -> bytes:
    """Encode sorted, unique matching positions in ``[0, total_rows)``."""
    positions = np.asarray(positions, dtype=np.int64)
    if len(positions) == total_rows:
        return _ALL
    if len(positions) == 0:
        raise InvalidValueError("a row group with no matching row is left out of the catalog, not encoded")
    runs = _runs(positions)
    bitmap_size = 1 + (total_rows + 7) // 8
    if 2 + runs.size * runs.dtype.itemsize < bitmap_size:
        return _RUNS + str(runs.dtype.itemsize).encode() + runs.tobytes()
    mask = np.zeros(total_rows, dtype=bool)
    mask[positions] = True
    return _BITMAP + np.packbits(mask).tobytes()


def encode_mask(mask: np.ndarray) -> bytes:
    """``encode(np.flatnonzero(mask), len(mask))``, the same bytes, without the positions where the bitmap wins.

    Planning a where over millions of scattered matches spends most of its driver time turning masks into
    positions only to find the runs too many and rebuild the mask. The number of runs is one pass over the mask;
    when even the narrowest runs (two uint16 per run) cannot beat the bitmap, ``encode`` would pick the bitmap, so
    it is packed straight from the mask. Otherwise ``encode`` decides on the positions, as before."""
    mask = np.asarray(mask, dtype=bool)
    total_rows = len(mask)
    count = int(np.count_nonzero(mask))
    if count == total_rows:
        return _ALL
    if count == 0:
        raise InvalidValueError("a row group with no matching row is left out of the catalog, not encoded")
    runs = int(mask[0]) + int(np.count_nonzero(mask[1:] & ~mask[:-1]))
    if 2 + runs * 2 * _DTYPES[b"2"].itemsize >= 1 + (total_rows + 7) // 8:
        return _BITMAP + np.packbits(mask).tobytes()
    return encode(np.flatnonzero(mask), total_rows)


def decode(data: bytes, total_rows: int) -> np.ndarray:
    """The matching positions (int64, sorted) that ``encode`` stored."""
    if data == _ALL:
        return np.arange(total_rows, dtype=np.int64)
    kind = data[:1]
    if kind == _BITMAP:
        bits = np.frombuffer(data, dtype=np.uint8, offset=1)
        if len(bits) != (total_rows + 7) // 8:
            raise PlanIntegrityError(f"selection bitmap holds {len(bits)} bytes for {total_rows} rows")
        positions = np.flatnonzero(np.unpackbits(bits, count=total_rows)).astype(np.int64)
        if len(positions) == 0:
            raise PlanIntegrityError("selection bitmap selects no row; a catalog row group has at least one")
        return positions
    if kind == _RUNS and data[1:2] in _DTYPES:
        dtype = _DTYPES[data[1:2]]
        if (len(data) - 2) % (2 * dtype.itemsize):
            raise PlanIntegrityError("selection runs are truncated")
        raw = np.frombuffer(data, dtype=dtype, offset=2)
        # Bound every value before the int64 cast and the sums, so corrupt bytes cannot wrap to negative rows.
        if len(raw) == 0 or raw.max() > total_rows:
            raise PlanIntegrityError(f"selection runs are empty or reach past the row group's {total_rows} rows")
        gaps_lengths = raw.astype(np.int64).reshape(-1, 2)
        starts = np.cumsum(gaps_lengths[:, 0] + np.concatenate(([0], gaps_lengths[:-1, 1])))
        lengths = gaps_lengths[:, 1]
        if starts[-1] + lengths[-1] > total_rows or lengths.sum() == 0:
            raise PlanIntegrityError(f"selection runs select nothing or reach past the row group's {total_rows} "
                                     "rows")
        # Expand runs without a Python loop: positions = start of run + offset inside run.
        offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return np.repeat(starts, lengths) + offsets
    raise PlanIntegrityError(f"unknown selection encoding tag {data[:2]!r}")


def _runs(positions: np.ndarray) -> np.ndarray:
    """(gap before run, run length) pairs, flattened, in the narrowest unsigned dtype that holds them."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = positions[np.concatenate(([0], breaks))]
    ends = positions[np.concatenate((breaks - 1, [len(positions) - 1]))] + 1
    gaps = starts - np.concatenate(([0], ends[:-1]))
    pairs = np.stack([gaps, ends - starts], axis=1).ravel()
    for dtype in _DTYPES.values():
        if pairs.max(initial=0) <= np.iinfo(dtype).max:
            return pairs.astype(dtype)
    raise AssertionError("unreachable: uint64 holds every row position")
