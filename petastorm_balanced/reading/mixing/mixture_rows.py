"""The rows of a mixture: one stream of rows per source on a rank, and runs of mixed batches cut from them.

Each source is read by the loaders' own per-slot machinery (``stream.slot_runs``) over that source's pass, with a
batch size of one row: the pass's rows for this rank (``plan.assignment`` at ``batch_size=1``, balanced over the
ranks as any plan), read in plan order and permuted in shuffle windows keyed by ``[seed, plan epoch, rank]``
(``mixture_elastic.plan_epoch``: the pass and the source's place, so a plan given twice reads two orders). A
``SourceRows`` hands them out ``k`` rows at a time and opens the next pass when one ends, so its position is one
counter (``divmod(counter, rows_per_pass)`` is the pass and row) and resuming at any row reads only that row's
shuffle window again. ``mixed_run`` takes a run of batches' rows from every source at once and interleaves them
into whole batches with one gather per column: per-batch work stays a slice, as in the single-plan loaders.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import pyarrow as pa

from ...core.cost.options import CostOptions
from ...core.cost.pieces import arrange_pieces, window_pieces
from ...core.shuffle import window_rows
from ...errors import InvalidValueError
from ...plan.model import ShardPlan
from ..backends import BACKENDS
from ..fields.list_shapes import PYTHON_LISTS, ListOptions
from ..fields.schema import MASK_SUFFIX, ColumnSchema
from ..formats.device import close_iterator
from ..rows.columns import Columns, dataset_columns
from ..rows.convert import concat_arrays
from ..source import stream
from ..source.layout import Layout
from ..source.resolve import Source
from ..windows.spill import Placement
from .mixture_elastic import Head, plan_epoch

SOURCE = "_source"  # the column naming each row's source (its index in plan=[...])


@dataclass(frozen=True)
class PieceCost(CostOptions):
    """A source's cost arrangement inside a mixture: each window into the pieces its batches take
    (``core/cost/pieces.py``); ``pieces(window, rows)`` gives their sizes."""

    pieces: Callable[[int, int], np.ndarray] | None = None

    def arrange(self, costs: np.ndarray, batch_size: int | None, key: Sequence[int]):
        assert self.pieces is not None
        return arrange_pieces(costs, self.pieces(int(key[-1]), len(costs)), self.reduce, key), None


def mixture_columns(plans: Sequence[ShardPlan], schema_fields, lists: ListOptions = PYTHON_LISTS) -> list[Columns]:
    """Each source's columns read: those named by ``schema_fields`` (every source must have them), else those all
    sources share. List columns of numbers take ``lists`` (``list_format``, ``list_shapes``) as one plan does, their
    lengths learned over every source's rows."""
    if schema_fields is None:
        each = [dataset_columns(plan) for plan in plans]
        shared = [n for n in each[0].names if all(n in c.names for c in each[1:])]
        if not shared:
            raise InvalidValueError("the plans of the mixture share no column name; pass schema_fields= with columns "
                                    "every source has")
        names = shared
    else:
        first = dataset_columns(plans[0], schema_fields)
        names = list(first.names)
    picked = [re.escape(n) for n in names]
    each = []
    for index, plan in enumerate(plans):
        try:
            each.append(dataset_columns(plan, picked, lists, [*plans[:index], *plans[index + 1:]]))
        except InvalidValueError as exc:
            raise InvalidValueError(f"source {index} ({plan.dataset_url}): {exc}") from None
    return each


def delivered_columns(sources: Sequence[Source]) -> tuple[list[Source], list[ColumnSchema]]:
    """(the sources with the masks each must add, the columns delivered): the columns each source's rows arrive
    with (``Source.delivered``: after its ``transform_spec``, bound to its own columns as one plan's is), in the
    first source's order; one delivered type each, or an error naming the source and the column. A column nullable
    in some sources only is delivered as nullable (all-True masks added where a source has none), decided after
    the transform, so a column it drops or declares needs none."""
    each = [{c.name: c for c in source.delivered} for source in sources]
    transformed = sources[0].transform is not None
    fix = ("declare the column's type in transform_spec's edit_fields and convert it in func, cast one of the "
           "datasets, or leave the column out (removed_fields, schema_fields=)" if transformed else
           "cast one of the datasets to the other's type, or leave the column out with schema_fields=")
    schemas: list[ColumnSchema] = []
    fills: list[list[str]] = [[] for _ in sources]
    for name in each[0]:  # every source has the same names: the same spec over the same names read
        per_source = [columns[name] for columns in each]
        chosen = next((s for s in per_source if s.nullable), per_source[0])
        for index, column in enumerate(per_source):
            if _shape_of(column) != _shape_of(chosen):
                raise InvalidValueError(
                    f"column {name!r} is {_describe(column)} in source {index} ({sources[index].plan.dataset_url}) "
                    f"but {_describe(chosen)} in source {per_source.index(chosen)}: {fix}")
            if chosen.mask is not None and column.mask is None:
                fills[index].append(name)
        schemas.append(chosen)
    return [replace(s, fill_masks=tuple(f)) for s, f in zip(sources, fills, strict=True)], schemas


def _shape_of(column: ColumnSchema) -> tuple:
    return (column.arrow_type, column.kind, column.dtype, column.shape, column.item)


def _describe(column: ColumnSchema) -> str:
    if column.kind == "tensor":
        return f"{column.arrow_type} (a {column.dtype} tensor, shape {column.shape})"
    return f"{column.arrow_type} (a list of {column.item})"


class SourceRows:
    """One source's rows on one rank, from ``counter`` on (rows of it this rank delivered since its first pass)."""

    def __init__(self, source: Source, layout: Layout, *, counter: int, backend: str, reader_options: dict,
                 keeper=None, head: Head | None = None, cuts: Callable[[int, int], np.ndarray] | None = None,
                 origin: int | None = None, place: int = 0, sources: int = 1,
                 placement: Callable[[], Placement | None] | None = None):
        self.plan, self.source, self.layout = layout.plan, source, layout  # the plan at one row per batch
        self.place, self.sources = place, sources  # the source's index in plan=[...], and how many there are
        # a source balanced by cost: ``cuts(lo, hi)``, its batch boundaries on the timeline of ``origin``
        self.cuts, self.origin = cuts, origin
        self.head = head  # inside an elastic rest (``mixture_elastic.py``): where its counters begin
        self.rows_per_pass = layout.steps
        self.backend, self.reader_options, self.keeper = backend, reader_options, keeper
        self.placement = placement  # a new ``spill.Placement`` for each pass (its files go when the pass's stream does)
        self.counter = counter  # rows handed out (``take``)
        self.pass_index, self.row = divmod(counter, self.rows_per_pass)  # where reading stands (rows buffered ahead)
        self._runs: Iterator[dict] | None = None
        self._parts: list[dict] = []
        self._buffered = 0

    def _open(self):
        source, layout = self.source, self.layout
        cost = source.cost
        head = self.head if self.head is not None and self.head.pass_index == self.pass_index else None
        stages = () if head is None else head.stages
        # inside an elastic rest, the row counts from the rest's first row (its counter ``head.begin``)
        done = self.row if head is None else self.row - (head.begin - self.pass_index * self.rows_per_pass)
        epoch = plan_epoch(self.pass_index, self.place, self.sources)
        fragments = self.plan.assignment(layout.rank, **layout.pieces_args(epoch, 1, stages))
        chunks = BACKENDS[self.backend].run(self.plan, source.columns, self.reader_options, self.keeper,
                                            transform=source.transform)
        if cost is not None and self.cuts is not None:
            size = window_rows(1, layout.shuffle_window, layout.shuffle)
            base = self.pass_index * self.rows_per_pass if head is None else head.begin  # counter of slot row 0
            cuts = self.cuts

            def pieces(window: int, rows: int) -> np.ndarray:
                first = base + window * size
                return window_pieces(first, first + rows, cuts(first, first + rows))

            cost = PieceCost(cost.cost, cost.column, cost.function, cost.reduce, pieces=pieces)
        return stream.slot_runs(fragments, chunks, batch_size=1, shuffle=layout.shuffle,
                                shuffle_window=layout.shuffle_window,
                                key=layout.key(epoch, 0, len(stages)),
                                batches_done=done, cost=cost, drop=source.drop, cost_lengths=source.cost_lengths,
                                placement=None if self.placement is None else self.placement())

    def take(self, rows: int) -> dict:
        """The next ``rows`` rows as one chunk of columns (crossing into the next pass where this one ends)."""
        self.counter += rows
        while self._buffered < rows or not self._parts:  # a part buffered: even 0 rows need the columns' types
            if self._runs is None:
                self._runs = self._open()
            run = next(self._runs, None)
            if run is None:  # the pass is over: the next one, in its own order
                self._runs = None
                self.pass_index, self.row = self.pass_index + 1, 0
                continue
            n = len(run[stream.PADDING])
            self.row += n
            for name in self.source.fill_masks:
                run[name + MASK_SUFFIX] = np.ones(n, dtype=bool)
            self._parts.append(run)
            self._buffered += n
        return self._cut(rows)

    def _cut(self, rows: int) -> dict:
        taken, need = [], rows
        while need:
            part = self._parts[0]
            n = len(part[stream.PADDING])
            if n <= need:
                taken.append(self._parts.pop(0))
                need -= n
            else:
                taken.append({k: v[:need] for k, v in part.items()})
                self._parts[0] = {k: v[need:] for k, v in part.items()}
                need = 0
        self._buffered -= rows
        if not taken:
            return {k: v[:0] for k, v in self._parts[0].items()}
        if len(taken) == 1:
            return taken[0]
        return {k: _concat([t[k] for t in taken]) for k in taken[0]}

    def close(self) -> None:
        if self._runs is not None:
            close_iterator(self._runs)
            self._runs = None


def _concat(parts):
    return concat_arrays(parts) if isinstance(parts[0], pa.Array) else np.concatenate(parts)


def mixed_run(sources: Sequence[SourceRows], counts: np.ndarray, names: Sequence[str]) -> dict:
    """Whole batches (``counts``: (batches, sources) rows of each source per batch), batch after batch, each
    holding its sources' rows in source order, with ``SOURCE`` and ``stream.PADDING``; keys in ``names`` order."""
    batches, k = counts.shape
    blocks = [src.take(int(counts[:, i].sum())) for i, src in enumerate(sources)]
    totals = counts.sum(axis=0)  # (sources,)
    offsets = np.concatenate(([0], np.cumsum(totals)[:-1]))  # where each source's block starts
    before = np.cumsum(counts, axis=0) - counts  # (batches, sources): rows of the source in earlier batches
    starts = (offsets[None, :] + before).ravel()  # batch-major, then source
    lengths = counts.ravel()
    out_starts = np.cumsum(lengths) - lengths
    total = int(lengths.sum())
    index = np.arange(total, dtype=np.int64) + np.repeat(starts - out_starts, lengths)
    # one gather per column: Arrow columns (text, lists) by one ``take`` of the joined blocks (a quarter less CPU
    # than joining the batches' slices of each block, measured on text runs of 8192 rows), numpy by indexing
    arrow_index = None
    run = {}
    for name in (*names, stream.PADDING):
        if isinstance(blocks[0][name], pa.Array):
            if arrow_index is None:
                arrow_index = pa.array(index)
            run[name] = concat_arrays([b[name] for b in blocks]).take(arrow_index)
        else:
            run[name] = _concat([b[name] for b in blocks])[index]
    run[SOURCE] = np.repeat(np.tile(np.arange(k, dtype=np.int64), batches), lengths)
    return run


def open_sources(settings, counters: Sequence[int], keepers=None, heads=None, phase: int = 0) -> list[SourceRows]:
    """A ``SourceRows`` per source of ``settings`` (a ``MixtureSettings``) at ``counters`` (``heads``: each
    source's elastic rest, or None), batch ``phase`` of the schedule starting there."""
    heads = heads or (None,) * len(counters)
    schedule = settings.mixture.schedule

    def timeline(i: int, counter: int) -> dict:
        if settings.sources[i].cost is None:
            return {}
        origin = schedule.origin(i, phase, counter)
        return {"origin": origin, "cuts": lambda lo, hi: schedule.cuts(i, origin, lo, hi)}

    return [SourceRows(source, settings.layouts[i], counter=counter, backend=settings.backend,
                       reader_options=settings.reader_options, keeper=None if keepers is None else keepers[i],
                       head=head, place=i, sources=len(counters), placement=partial(settings.placement, i),
                       **timeline(i, counter))
            for i, (source, counter, head) in enumerate(zip(settings.sources, counters, heads, strict=True))]
