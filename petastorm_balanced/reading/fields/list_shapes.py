"""How list columns of numbers are delivered: as tensors, decided once before the first batch (pure, no I/O).

Why tensors: Spark writes every array column (embeddings, feature vectors, token ids) as a Parquet ``list``, and a
training step wants ``model(batch["vec"])`` on a ``(batch, k)`` tensor, as Petastorm's ``BatchedDataLoader`` gives,
not a Python list per row (building those lists was most of an epoch over such a column). Why decided before the
first batch, over every planned row: a representation chosen from the rows of one batch would change from one step
to the next (G13), so the lengths come from a pass over the planned files when the loader is made (``list_scan``),
or from shapes the user declares (``list_shapes``), and every batch is checked against them.

``list_format`` (per loader, or per column as a dict) picks the form:

- ``"auto"`` (default): a list column of numbers whose rows all have one length (at every level) is a
  ``(batch, k, ...)`` tensor; any other list column is a list of Python lists.
- ``"tensor"``: the same tensors, but a column of other lengths is refused when the loader is made.
- ``"padded"``: ``(batch, max_length, ...)`` values padded with 0 plus ``<name>__lengths`` (``int64``, items per
  row), as ``torch.nn.utils.rnn.pad_sequence`` and torchrec's ``lengths`` take; the outer length may vary.
- ``"python"``: lists of Python lists (``to_pylist()``), every list column.

Nulls are never shown as values (G13): a null row is NaN in a floating tensor, else False in a ``<name>__valid``
mask (padded columns always use the mask, their null rows have length 0); a null item is NaN in a floating
list; a null item in an integer list, or a null inner list, has no tensor form: ``"auto"`` keeps such a column as
Python lists, the other forms refuse it naming the column and the fix.

>>> import pyarrow as pa
>>> numeric_list_levels(pa.list_(pa.list_(pa.float32(), 3)))
((None, 3), DataType(float))
>>> options = ListOptions.of("auto", {"vec": (4,)})
>>> list_column("vec", pa.list_(pa.float32()), nullable=False, options=options, stats=None).shape
(4,)
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ...core.params import check_choice
from ...errors import InvalidTypeError, InvalidValueError
from .schema import MASK_SUFFIX, TENSOR, ColumnSchema, tensor_dtype

LIST_FORMATS = ("auto", "tensor", "padded", "python")
LENGTHS_SUFFIX = "__lengths"
FIX = "pass list_format='padded' (values plus lengths) or 'python' (lists of lists) for it"


@dataclass(frozen=True)
class ListOptions:
    """The user's choice: a form for every list column (``default``), per-column overrides, declared shapes."""

    default: str = "auto"
    formats: tuple[tuple[str, str], ...] = ()
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def of(cls, list_format: Any = "auto", list_shapes: Any = None) -> ListOptions:
        """``list_format`` (a form, or ``{column: form}``) and ``list_shapes`` (``{column: shape}``) checked."""
        default, formats = "auto", {}
        if isinstance(list_format, Mapping):
            formats = {_name("list_format", k): _form(v) for k, v in list_format.items()}
        else:
            default = _form(list_format)
        shapes = {}
        if list_shapes is not None:
            if not isinstance(list_shapes, Mapping):
                raise InvalidTypeError(f"list_shapes={list_shapes!r} must be a dict of column name to shape, e.g. "
                                       "{'vec': (4,)}")
            shapes = {_name("list_shapes", k): _shape(k, v) for k, v in list_shapes.items()}
        for name in shapes:
            if formats.get(name, default) == "python":
                raise InvalidValueError(f"list_shapes declares a shape for {name!r}, whose list_format is 'python' "
                                        "(lists of lists); drop one of the two")
        return cls(default, tuple(sorted(formats.items())), tuple(sorted(shapes.items())))

    def format_of(self, name: str) -> str:
        return dict(self.formats).get(name, self.default)

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        return dict(self.shapes).get(name)

    def named(self) -> set[str]:
        """Columns named in ``list_format`` or ``list_shapes``."""
        return {n for n, _ in self.formats} | {n for n, _ in self.shapes}


PYTHON_LISTS = ListOptions("python")


def _form(value: Any) -> str:
    return check_choice("list_format", value, LIST_FORMATS, "'auto' (equal-length lists of numbers as tensors, "
                        "others as Python lists), 'tensor' (refuse other lengths), 'padded' (values padded to the "
                        "longest list, plus <name>__lengths), 'python'")


def _name(parameter: str, name: Any) -> str:
    if not isinstance(name, str):
        raise InvalidTypeError(f"{parameter} keys must be column names (str), got {name!r}")
    return name


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    if not isinstance(shape, (tuple, list)) or not shape or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise InvalidValueError(f"list_shapes[{name!r}]={shape!r} must be a tuple of ints >= 0, one per list level, "
                                "e.g. (4,) for list<float> of 4 items or (3, 4) for a list of 3 lists of 4")
    return tuple(shape)


@dataclass(frozen=True)
class ListStats:
    """What a pass over a list column's planned rows learned: per list level the (min, max) number of items of its
    non-null lists (None: no list seen), and where nulls are. ``odd`` names the first row whose length differs from
    the first row's (file, row group, row), for messages."""

    lengths: tuple[tuple[int, int] | None, ...]
    null_rows: bool = False
    inner_nulls: bool = False
    null_items: bool = False
    odd: str = ""

    def merge(self, other: ListStats) -> ListStats:
        lengths = tuple(b if a is None else a if b is None else (min(a[0], b[0]), max(a[1], b[1]))
                        for a, b in zip(self.lengths, other.lengths, strict=True))
        return ListStats(lengths, self.null_rows or other.null_rows, self.inner_nulls or other.inner_nulls,
                         self.null_items or other.null_items, self.odd or other.odd)


def numeric_list_levels(t: pa.DataType) -> tuple[tuple[int | None, ...], pa.DataType] | None:
    """``((size or None per list level, outermost first), leaf type)`` for a list (at any depth, ``list`` or
    ``fixed_size_list``) of integers, floats or booleans; None for any other type."""
    levels: list[int | None] = []
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        levels.append(t.list_size if pa.types.is_fixed_size_list(t) else None)
        t = t.value_type
    if not levels or not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return None
    return tuple(levels), t


def needs_scan(name: str, t: pa.DataType, options: ListOptions) -> bool:
    """Whether the column's lengths must be learned from its rows: a list of numbers with a variable level, whose
    form is not ``python`` and whose shape is not declared."""
    found = numeric_list_levels(t)
    return (found is not None and None in found[0] and options.format_of(name) != "python"
            and options.shape_of(name) is None)


def list_column(name: str, t: pa.DataType, *, nullable: bool, options: ListOptions,
                stats: ListStats | None) -> ColumnSchema | None:
    """The tensor form of list column ``name`` (delivered type ``t``), or None to keep the usual form
    (``schema.column_schema``: Python lists, or the fixed-size-list tensors it already gives)."""
    form, declared = options.format_of(name), options.shape_of(name)
    explicit = name in options.named()
    found = numeric_list_levels(t)
    if found is None:
        if explicit:
            raise InvalidValueError(f"list_format/list_shapes name column {name!r}, which is {t}, not a list of "
                                    "numbers; leave it out of them")
        return None
    levels, leaf = found
    if form == "python" or (None not in levels and form != "padded" and declared is None):
        return None  # fixed_size_list only: column_schema's tensors, as without list_format
    if declared is not None or None not in levels:  # null items are then checked on every batch
        shape = _declared(name, declared, levels) if declared is not None else tuple(d or 0 for d in levels)
        return _schema(name, t, leaf, shape, nullable, padded=form == "padded")
    if stats is None or any(level is None for level in stats.lengths):
        if form == "auto":
            return None
        raise InvalidValueError(f"column {name!r} holds no non-null list to learn its length from; declare it: "
                                f"list_shapes={{{name!r}: (...)}}, or pass list_format='python'")
    problem = _problem(name, stats, leaf, padded=form == "padded")
    if problem:
        if form == "auto":
            return None
        raise InvalidValueError(f"list_format={form!r}: {problem}; {FIX if form == 'tensor' else _PYTHON}")
    shape = tuple(level[1] if level is not None else 0 for level in stats.lengths)
    # the pass read every planned row: its nulls, not the footers' counts (which count empty lists too); a padded
    # column masks null rows only (its null float items are NaN)
    nullable = stats.null_rows or (stats.null_items and form != "padded")
    return _schema(name, t, leaf, shape, nullable, padded=form == "padded")


_PYTHON = "pass list_format='python' for it, or fill the nulls when writing"


def _problem(name: str, stats: ListStats, leaf: pa.DataType, *, padded: bool) -> str:
    """Why the column has no tensor form (empty: it has one)."""
    varying = [i for i, level in enumerate(stats.lengths) if level is not None and level[0] != level[1]
               and (i > 0 or not padded)]
    if varying:
        i = varying[0]
        low, high = stats.lengths[i] or (0, 0)
        where = f"; first at {stats.odd}" if stats.odd and i == 0 else ""
        inner = "" if i == 0 else f" at list level {i + 1} (padded pads the outer level only)"
        return f"column {name!r} holds lists of {low} to {high} items{inner}{where}"
    if stats.inner_nulls:
        return f"column {name!r} holds null inner lists, which no tensor can show"
    if stats.null_items and not pa.types.is_floating(leaf):
        return f"column {name!r} holds null items in lists of {leaf}, which no {leaf} tensor can show"
    return ""


def _declared(name: str, shape: tuple[int, ...], levels: tuple[int | None, ...]) -> tuple[int, ...]:
    if len(shape) != len(levels) or any(s is not None and s != d for s, d in zip(levels, shape, strict=True)):
        described = tuple("n" if s is None else s for s in levels)
        raise InvalidValueError(f"list_shapes[{name!r}]={shape} does not fit the column's list levels {described} "
                                "(n: any length); give one int per level, equal to the fixed ones")
    return shape


def _schema(name: str, t: pa.DataType, leaf: pa.DataType, shape: tuple[int, ...], nullable: bool, *,
            padded: bool) -> ColumnSchema:
    dtype = tensor_dtype(leaf)
    if padded:
        nulls = "mask" if nullable else "never"
    else:
        nulls = "never" if not nullable else "nan" if pa.types.is_floating(leaf) else "mask"
    return ColumnSchema(name, str(t), TENSOR, dtype, shape, nullable, nulls,
                        name + MASK_SUFFIX if nulls == "mask" else None,
                        lengths=name + LENGTHS_SUFFIX if padded else None)
