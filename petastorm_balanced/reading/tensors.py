"""Numpy runs of batches to torch: one conversion per run, then views per batch. torch is imported here only."""
from __future__ import annotations

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

    Converting once per run and splitting there keeps the per-batch cost to a few views, whatever the column
    count; the batches of a run share its memory.
    """
    parts = {}
    for name, values in run.items():
        if name == stream.PADDING and not padding_mask:
            continue
        if isinstance(values, pa.Array) or values.dtype.kind in "OUS":
            items = as_list(values)
            parts[name] = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
            continue
        if values.dtype.kind in "mM":
            values = values.view(np.int64)
        if not values.flags.writeable:
            values = values.copy()  # Arrow buffers are read-only; tensors must be writable
        parts[name] = torch.from_numpy(values).split(batch_size)
    names, columns = list(parts), list(parts.values())
    for i in range(_rows(run) // batch_size):
        yield dict(zip(names, [column[i] for column in columns], strict=True))


def _rows(columns: dict) -> int:
    return len(next(iter(columns.values())))
