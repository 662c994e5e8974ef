"""Casts to a declared numeric type that refuse to change a value's magnitude, rather than wrap or overflow.

A declared type narrower than the stored one (a Unischema's int8 over an int64 column, ``edit_fields`` float16) is
exact as long as the values fit; numpy's ``astype`` wraps (399 as int8 is -113) or overflows (1e6 as float16 is
inf) silently when they do not. These casts check what they cast, so a value that does not fit is refused by name.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidValueError


def checked_astype(values: np.ndarray, want: np.dtype, column: str, declared: str) -> np.ndarray:
    """``values`` cast to ``want``; ``InvalidValueError`` naming the column, the first value and the type when the
    cast would wrap an integer (399 as int8 is -113) or turn a finite number into an infinity (1e6 as float16).

    Why a check per batch rather than a refusal when the loader is made: the stored type is often wider than the
    values need (int64 counts under 100), and then the declared narrower type is exact and wanted."""
    with np.errstate(all="ignore"):
        cast = values.astype(want)
    if np.can_cast(values.dtype, want, casting="safe"):
        return cast
    if want.kind in "iu" and values.dtype.kind in "iub":
        info = np.iinfo(want)
        bad = (values < info.min) | (values > info.max)
    elif want.kind in "iu" and values.dtype.kind == "f":
        info = np.iinfo(want)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | (values < info.min) | (values > info.max)
    elif want.kind == "f" and values.dtype.kind in "iuf":
        with np.errstate(invalid="ignore", over="ignore"):
            bad = np.isfinite(values) & ~np.isfinite(cast)
    else:
        return cast
    if bad.any():
        at = np.flatnonzero(bad)[0]
        raise InvalidValueError(f"column {column!r} holds {values[at].item()!r} ({values.dtype}), which {declared} "
                                f"as {want}: {want} cannot hold it (the cast would give {cast[at].item()!r}); "
                                f"declare a type that holds the stored values (e.g. {values.dtype})")
    return cast


def checked_scalar(dtype: type, value, column: str, declared: str):
    """``dtype(value)`` for one cell, refused as ``checked_astype`` refuses a column (numpy 1 wraps silently)."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and \
            isinstance(dtype, type) and issubclass(dtype, (np.integer, np.floating)):
        return checked_astype(np.asarray([value]), np.dtype(dtype), column, declared)[0]
    return dtype(value)
