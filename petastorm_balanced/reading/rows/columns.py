"""``Columns``: which columns a loader reads and the type each is delivered as, decided once per loader.

The one home of "which columns, which types" on the loader's side: the columns requested (``schema_fields``), in
dataset order, each with one delivered representation (``schema.ColumnSchema``) from every planned file's footer
(``dataset_schema``), hive partition values and the Unischema; a cost's source column added when balancing by it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ...core.cost.options import CostOptions
from ...errors import InvalidTypeError, InvalidValueError
from ...io.partitions import partition_values
from ...plan.model import ShardPlan
from ..fields.dataset_schema import Deferred, partition_columns, read_footers, stored_names
from ..fields.dataset_schema import stored_columns as columns_of_footers
from ..fields.list_scan import scan_lists
from ..fields.list_shapes import PYTHON_LISTS, ListOptions, list_column, needs_scan
from ..fields.schema import BatchSchema, ColumnSchema, batch_schema, column_schema, unischema_column
from . import fragments as fr


@dataclass(frozen=True)
class Columns:
    """The columns a loader reads, in dataset order, with their delivered types and representations (decided once,
    ``dataset_schema``), and the Unischema fields that decode them."""

    names: tuple[str, ...]
    partition_types: tuple[tuple[str, str], ...]
    fields: dict | None = None  # Unischema fields by name (Petastorm datasets only)
    target: pa.Schema | None = field(default=None, compare=False)  # delivered Arrow types of stored columns
    schemas: tuple[ColumnSchema, ...] = ()  # one per name
    row_bytes: float = field(default=0.0, compare=False)  # estimated decoded bytes per row (sizes shuffle windows)
    # columns stored in order -> their spread (computed when first asked: ``dataset_schema.Deferred``)
    clustered: Mapping = field(default_factory=dict, compare=False)

    @property
    def spec(self) -> fr.ReadSpec:
        return fr.ReadSpec(self.names, self.partition_types, self.fields, self.target)

    def batch_schema(self, drop: Sequence[str] = (), extras: Sequence[ColumnSchema] = ()) -> BatchSchema:
        """What every batch holds: these columns but ``drop`` (with their masks), then ``extras``."""
        return batch_schema([c for c in self.schemas if c.name not in set(drop)], extras)


def dataset_columns(plan: ShardPlan, schema_fields=None, lists: ListOptions = PYTHON_LISTS,
                    others: Sequence[ShardPlan] = ()) -> Columns:
    """The requested columns in dataset order (the Unischema's order, or partition folders then the footer's),
    with one delivered type and representation each, from every planned file's footer (read here, once); list
    columns of numbers as ``lists`` says (``list_shapes``: their lengths read here, once, where needed). With
    ``others`` (the other sources of a mixture, whose rows share the same batches) the lengths are learned over
    their rows too, so every source decides the same form: one tensor shape, one longest padded list."""
    paths = [f.path for f in plan.catalog.files]
    groups = plan.catalog.row_groups  # the files holding planned row groups (from the columns: no object per group)
    read = sorted(groups.paths[i] for i in np.unique(groups.path_index).tolist()) or paths[:1]
    try:
        footers = read_footers(plan.location, read)  # each footer once, side by side
        if plan.catalog.kind == "petastorm":
            unischema = plan.unischema
            names, fields = list(unischema.fields), dict(unischema.fields)
        else:
            stored = stored_names(footers)  # a Delta table's added columns included
            names, fields = [n for n in partition_values(read[0]) if n not in stored] + list(stored), None
        names = select_columns(names, schema_fields)
        hive = partition_columns(paths, names, plan.table)
        stored_columns = columns_of_footers(footers, [n for n in names if n not in hive])
        plain = [n for n in names if n not in hive and not (fields and n in fields)]
        unknown = sorted(lists.named() - set(plain))
        if unknown:
            raise InvalidValueError(f"list_format/list_shapes name {unknown[0]!r}, which is not a list column read "
                                    f"from the files; the columns read are {names}")
        scanned = {n: stored_columns.schema.field(n).type for n in plain
                   if needs_scan(n, stored_columns.schema.field(n).type, lists)}
        stats = scan_lists(plan, scanned) if scanned else {}
        for other in others if scanned else ():
            stats = {n: found.merge(stats[n]) for n, found in scan_lists(other, scanned).items()}
    except (OSError, pa.ArrowException) as exc:
        raise fr.unreadable_dataset_error(plan, exc) from exc
    fields = {n: fields[n] for n in names} if fields else None
    schemas = []
    for name in names:
        if name in hive:
            schemas.append(hive[name][1])
        elif fields is not None and name in fields:
            schemas.append(unischema_column(fields[name], stored_columns.schema.field(name).type,
                                            stored_columns.nullable[name], fr.is_scalar(fields[name])))
        else:
            arrow_type, nullable = stored_columns.schema.field(name).type, stored_columns.nullable[name]
            schemas.append(list_column(name, arrow_type, nullable=nullable, options=lists, stats=stats.get(name))
                           or column_schema(name, arrow_type, nullable=nullable))
    used = tuple((k, kind) for k, (kind, _) in hive.items())
    # a hive partition column holds one value per file: stored clustered wherever it takes several values
    clustered = Deferred(lambda: {**stored_columns.clustered,
                                  **{k: 0.0 for k in hive if len(_distinct_partition(paths, k)) > 1}})
    return Columns(tuple(names), used, fields, stored_columns.schema, tuple(schemas),
                   stored_columns.row_bytes + 8.0 * len(hive) + _decoded_bytes(fields), clustered)


def _distinct_partition(paths: Sequence[str], name: str) -> set:
    return {partition_values(path).get(name) for path in paths}


def _decoded_bytes(fields: dict | None) -> float:
    """Bytes per row that Unischema codecs add when they decode cells of a known shape (an image, an ndarray)."""
    total = 0.0
    for unischema_field in (fields or {}).values():
        shape = tuple(getattr(unischema_field, "shape", ()) or ())
        if shape and all(isinstance(n, int) for n in shape) and not fr.is_scalar(unischema_field):
            total += float(np.prod(shape)) * np.dtype(unischema_field.numpy_dtype).itemsize
    return total


def with_cost_source(columns: Columns, plan: ShardPlan, cost: CostOptions | None) -> tuple[Columns, tuple]:
    """The columns to read when balancing by ``cost`` (its source column added if not requested), and the names
    to drop after computing the cost."""
    if cost is None or cost.column in columns.names:
        return columns, ()
    source = dataset_columns(plan, [re.escape(cost.column)])
    fields = None if columns.fields is None else {**columns.fields, **(source.fields or {})}
    target = columns.target
    if target is not None and source.target is not None:
        target = pa.schema(list(target) + [f for f in source.target if f.name not in target.names])
    return Columns(columns.names + source.names, columns.partition_types + source.partition_types, fields, target,
                   columns.schemas + source.schemas, columns.row_bytes + source.row_bytes,
                   Deferred(lambda: {**columns.clustered, **source.clustered})), source.names


def select_columns(available: Sequence[str], schema_fields) -> list[str]:
    """Resolve ``schema_fields`` like Petastorm: names, regular expressions matching a whole name, or
    UnischemaFields; ``None`` means every column. Keeps the dataset's column order."""
    if schema_fields is None:
        return list(available)
    if isinstance(schema_fields, (str, bytes)) or not hasattr(schema_fields, "__iter__"):
        raise InvalidTypeError(f"schema_fields={schema_fields!r} must be a list of column names or patterns")
    wanted = set()
    schema_fields = list(schema_fields)
    if not schema_fields:
        raise InvalidValueError("schema_fields=[] selects no column; pass None for every column, or name some")
    for item in schema_fields:
        name = getattr(item, "name", item)
        if not isinstance(name, str):
            raise InvalidTypeError(f"schema_fields item {item!r} is neither a column name nor a UnischemaField")
        try:
            matches = [c for c in available if c == name or re.fullmatch(name, c)]
        except re.error as exc:
            raise InvalidValueError(f"schema_fields item {name!r} is not a column name and not a valid regular "
                                    f"expression ({exc}); escape it with re.escape or name the column exactly"
                                    ) from None
        if not matches:
            raise InvalidValueError(f"schema_fields item {name!r} matches no column; the dataset has {list(available)}")
        wanted.update(matches)
    return [c for c in available if c in wanted]
