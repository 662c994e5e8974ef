"""Numpy runs of batches to the delivered batch format: one conversion per run, then views per batch.

``batch_format="torch"`` (the default) gives tensors, ``"numpy"`` numpy arrays; both cut the same way and follow the
same ``loader.schema`` (text and other list columns as Python lists). torch is imported here (and in ``device.py``)
only, and only when a torch batch is asked for: the numpy format never imports it.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import MissingDependencyError
from ..fields.schema import PADDING
from ..options import NUMPY, TORCH
from ..rows.fragments import as_list, batch_values, is_text
from ..stats import current

torch: Any = None  # the torch module once require_torch() imported it


def require_torch():
    """Import torch (once), or refuse naming what to install and the torch-free alternative."""
    global torch
    if torch is None:
        try:
            import torch as module
        except ImportError:
            raise MissingDependencyError("torch batches need torch; install it (pip install "
                                         "'petastorm-balanced[torch]'), or pass batch_format='numpy'") from None
        torch = module
    return torch



def to_torch(batch: dict, padding_mask: bool) -> dict:
    """Numeric columns as tensors (sharing the batch's memory), strings and other objects as lists."""
    return next(torch_batches(batch, _rows(batch), padding_mask))


def to_numpy(batch: dict, padding_mask: bool) -> dict:
    """Numeric columns as numpy arrays, strings and other objects as lists (``to_torch`` without torch)."""
    return next(numpy_batches(batch, _rows(batch), padding_mask))


def numpy_batches(run: dict, batch_size: int, padding_mask: bool):
    """``torch_batches`` with numpy arrays (views of the run's arrays, which may be read-only) for tensors."""
    return torch_batches(run, batch_size, padding_mask, NUMPY)


def format_batches(batch_format: str):
    """The cutter of ``batch_format``: ``(run, batch_size, padding_mask) -> iterator of batches``."""
    if batch_format == TORCH:
        require_torch()
        return torch_batches
    return numpy_batches


def format_groups(batch_format: str):
    """``(run, batch_size, padding_mask) -> iterator of lists of batches`` (``GROUP`` a list) in ``batch_format``:
    ``format_batches`` before chaining, for a loop that hands each list out in C (``Recorder.grouped``)."""
    if batch_format == TORCH:
        require_torch()
    return functools.partial(batch_groups, batch_format=batch_format)


GROUP = 32  # batches cut at a time: their parts stay few (fewer than a young GC generation holds), see below


def torch_batches(run: dict, batch_size: int, padding_mask: bool, batch_format: str = TORCH):
    """Cut a run of whole batches into dicts of tensors (views of one tensor per column) and lists; numpy arrays
    instead of tensors with ``batch_format="numpy"``.

    How each column is cut is decided once per run (``_cutter``); batches are then made ``GROUP`` at a time, one
    ``zip`` over the columns' parts, with no per-batch loop over columns. Cutting a whole window at once (a
    window of 10,000 rows in batches of 16 is 625 tensors per column) kept thousands of live objects that the
    garbage collector promoted and then scanned again and again (a third of an epoch, measured); ``GROUP``
    batches' parts die young. The batches of a run share its memory.
    """
    # chained in C: past a group's first batch, a batch costs only its dict (no generator frame of ours per batch)
    return itertools.chain.from_iterable(batch_groups(run, batch_size, padding_mask, batch_format, lazy=True))


def batch_groups(run: dict, batch_size: int, padding_mask: bool, batch_format: str = TORCH, lazy: bool = False):
    """``torch_batches``' batches as lists of ``GROUP`` batches (the last one shorter), made as each is asked for
    (``lazy``: iterators instead of lists, each batch made as it is asked for). A run with a column of lists that
    are Python lists comes in counted iterators: those lists die young only if made one batch at a time."""
    if batch_format == TORCH:
        require_torch()
    recorder = current()  # loader.stats(): cutting counts to "convert", timed per GROUP batches (not per batch)
    cell = recorder.cell() if recorder is not None else None
    start = perf_counter()
    inner = cell.inner if cell is not None else 0.0
    names: list[str] = []
    parts: list[int] = []
    cutters: list[Callable] = []
    part_of: dict[int, int] = {}  # id of a column's array -> its part: one array under two names is cut once
    for name, values in run.items():  # (``stream.slot_runs`` names a delivered cost column ``_cost`` too)
        if name == PADDING and not padding_mask:
            continue
        if id(values) not in part_of:
            part_of[id(values)] = len(cutters)
            cutters.append(_cutter(values, batch_size, batch_format))
        names.append(name)
        parts.append(part_of[id(values)])
    count = _rows(run) // batch_size
    make = batch_dicts(tuple(names), tuple(parts))

    # a run with a column of Python lists: its groups stay iterators (one batch's lists alive at a time), made as
    # they are handed out (cutting those lists then counts as the loop's time), each telling what it has left
    listed = not lazy and any(cut.__name__ == "cut_lists" for cut in cutters)

    def groups():  # one list of batch dicts per GROUP batches; cutting timed per group (not per batch)
        begin, inner_at = start, inner
        for first in range(0, count, GROUP):
            n = min(GROUP, count - first)
            group = make(*[cut(first, n) for cut in cutters])
            if listed:
                group = _Counted(group, n)
            elif not lazy:
                group = list(group)
            if cell is not None:
                cell.since("convert", begin, inner_at)
            yield group
            if cell is not None:
                begin, inner_at = perf_counter(), cell.inner
    return groups()


class _Counted:
    """An iterator of ``n`` items whose ``len`` is how many are left (``operator.length_hint``: the loader counts a
    group's batches as they leave it, ``Position.handing``)."""

    __slots__ = ("_items", "_left")

    def __init__(self, items: Iterator, n: int):
        self._items, self._left = items, n

    def __iter__(self) -> _Counted:
        return self

    def __next__(self):
        item = next(self._items)
        self._left -= 1
        return item

    def __len__(self) -> int:  # what is left (``length_hint`` asks ``len`` first): before the first batch, all
        return self._left


@functools.lru_cache(maxsize=64)
def batch_dicts(names: tuple[str, ...], parts: tuple[int, ...]):
    """``make(*columns) -> batches``: one dict per position of the columns' parts (lists or iterators of equal
    length), lazily; key ``names[i]`` holds the part of column ``parts[i]`` (two names may share one column).

    Why generated: a dict display with the keys bound once (``{k0: v0, k1: v1, ...}``) costs about a third of
    ``dict(zip(names, row))`` per batch (0.39 against 0.90 us for three columns, measured), and a batch dict is
    made for every batch. The names are values of the function's namespace, never part of its source.
    """
    count = max(parts, default=-1) + 1
    if not count:  # as zip() of no parts: no batches
        return lambda: iter(())
    values = ", ".join(f"v{i}" for i in range(count))
    columns = ", ".join(f"p{i}" for i in range(count))
    entries = ", ".join(f"k{i}: v{part}" for i, part in enumerate(parts))
    unpack = values + ("," if count == 1 else "")
    source = f"def make({columns}):\n    return ({{{entries}}} for {unpack} in zip({columns}, strict=True))\n"
    namespace: dict[str, Any] = {f"k{i}": name for i, name in enumerate(names)}
    exec(source, namespace)  # noqa: S102 - the source above holds generated identifiers only
    return namespace["make"]


def _cutter(values, batch_size: int, batch_format: str = TORCH):
    """``cut(first, n)``: the parts of batches ``first`` to ``first + n - 1`` of one column of a run."""
    if isinstance(values, pa.Array) and not is_text(values.type):
        # list columns: Python lists built per batch, so they die young instead of filling the run with thousands
        # of objects that every garbage collection scans (40% of an epoch over a list column, measured)
        lists = batch_values(values, batch_size)

        def cut_lists(first, n):  # lazily, as zip asks: one batch's lists alive at a time, not GROUP batches'
            return map(lists, range(first, first + n))
        return cut_lists
    if isinstance(values, pa.Array) or values.dtype.kind in "OUS":  # text: a group's values made at once, cut per batch
        # (text stays Arrow until here: a shuffle permutes offsets and bytes, where permuting Python strings
        # touched each one's reference count in random order, a quarter of a shuffled epoch over text columns).
        # Made a group at a time, not the whole run at once: a group's strings die before the next group's are
        # made, so they reuse the same memory (a run of 80,000 strings at once cost 1.8x as much per string)
        def cut_items(first, n):
            begin = first * batch_size
            items = as_list(values[begin:begin + n * batch_size])
            return [items[b:b + batch_size] for b in range(0, n * batch_size, batch_size)]
        return cut_items
    if values.dtype.kind in "mM":
        values = values.view(np.int64)
    if batch_format == NUMPY:  # (batches, batch_size, ...): a batch is one view
        arrays = values.reshape(len(values) // batch_size, batch_size, *values.shape[1:])

        def cut_array(first, n):
            return list(arrays[first:first + n])
        return cut_array
    if not values.flags.writeable:
        values = values.copy()  # Arrow buffers are read-only; tensors must be writable
    # (batches, batch_size, ...): a group's batches are then one unbind, about a quarter cheaper than split
    batches = torch.from_numpy(values).reshape(len(values) // batch_size, batch_size, *values.shape[1:])

    def cut_tensor(first, n):
        return batches[first:first + n].unbind(0)
    return cut_tensor


def _rows(columns: dict) -> int:
    return len(next(iter(columns.values())))
