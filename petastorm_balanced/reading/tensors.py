"""Numpy runs of batches to torch: one conversion per run, then views per batch. torch is imported here only."""
from __future__ import annotations

from itertools import islice

import numpy as np
import pyarrow as pa

from ..errors import MissingDependencyError
from . import stream
from .fragments import as_list

try:
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]  # no torch on this stack: require_torch refuses


def require_torch():
    if torch is None:
        raise MissingDependencyError("make_loader needs torch; install it (pip install 'petastorm-balanced[torch]')")


def to_torch(batch: dict, padding_mask: bool) -> dict:
    """Numeric columns as tensors (sharing the batch's memory), strings and other objects as lists."""
    return next(torch_batches(batch, _rows(batch), padding_mask))


def torch_batches(run: dict, batch_size: int, padding_mask: bool):
    """Cut a run of whole batches into dicts of tensors (views of one tensor per column) and lists.

    The plan of each column is made once per run: numeric columns become one tensor split into views, text (an
    object array) one list cut per batch; list columns (Arrow arrays) get their Python lists per batch, so they
    die with the batch (``fragments.objects_of`` says why). Per batch that leaves one dict of ready parts; the
    batches of a run share its memory.
    """
    names, parts, lazy = [], [], []
    for name, values in run.items():
        if name == stream.PADDING and not padding_mask:
            continue
        names.append(name)
        if isinstance(values, pa.Array):
            lazy.append(len(parts))
            parts.append(values)
            continue
        if values.dtype.kind in "OUS":
            items = values.tolist()
            parts.append([items[i:i + batch_size] for i in range(0, len(items), batch_size)])
            continue
        if values.dtype.kind in "mM":
            values = values.view(np.int64)
        if not values.flags.writeable:
            values = values.copy()  # Arrow buffers are read-only; tensors must be writable
        parts.append(torch.from_numpy(values).split(batch_size))
    count = _rows(run) // batch_size
    if parts and not lazy:  # count items in each part (islice: an empty tensor splits into one empty view)
        for row in islice(zip(*parts, strict=False), count):
            yield dict(zip(names, row, strict=True))
        return
    for i in range(count):
        row = [part if isinstance(part, pa.Array) else part[i] for part in parts]
        for j in lazy:
            row[j] = as_list(parts[j].slice(i * batch_size, batch_size))
        yield dict(zip(names, row, strict=True))


def _rows(columns: dict) -> int:
    return len(next(iter(columns.values())))
