"""Updating a plan for files added since it was made (``plan_shards(..., update=OLD_PLAN)``).

Datasets grow: a new ``date=`` partition, a Delta commit or an Iceberg append adds files and changes none. A plan's
catalog is keyed by file path and row group, and every file's entries depend on that file alone (its footer, its
rows, the predicate, the cost), so the catalog of the grown dataset is the old catalog plus the catalog of the added
files. An update therefore reads footers, evaluates ``where``/``predicate`` and computes costs for the added files
only, merges (``core.catalog.merge_catalogs``) and balances the whole catalog again: the plan written is the one
planning from scratch writes, with the same checksum (G8 extended to updates).

That holds only while nothing but additions happened, so everything else is refused with ``PlanUpdateError``
naming the first difference, never merged:

- a planned file removed (a Delta ``remove``: delete, update, overwrite, compaction), or changed in size,
  modification time or content fingerprint (a rewrite, G15: an ETag, or a digest where the plan recorded one), or
  an Iceberg delete that removed rows of a planned file;
- a planning parameter other than the old plan's (dataset, table format, world size, batch size, policy, seed,
  ``where``/``predicate``, cost): an update keeps every parameter;
- added files whose schema differs from the planned files', that bring a new hive partition column, or that change
  a partition column's type (``1``, ``2`` then ``x``: int32 becomes string) when a filter or cost reads it.

Planned files are checked by listing (size and modification time) rather than by reading their footers again, which
is what keeps an update proportional to the files added; a rewrite that keeps size and modification time (G15's
last case) is still refused by the reader, which compares each footer's digest with the plan's as it reads.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.catalog import Catalog
from ..core.predicate_info import PredicateInfo
from ..errors import PlanUpdateError
from ..io import fs as fsutil
from ..io import tables
from ..io.dataset import list_data_files, relative_path
from ..plan.model import ShardPlan

if TYPE_CHECKING:
    from ..io.tables import TableSnapshot

FROM_SCRATCH = "plan from scratch (plan_shards without update=, or the CLI without --update)"


def old_plan(update: Any) -> ShardPlan:
    """The plan to update: a ``ShardPlan``, or a plan URL read and checked (``read_plan``) but not compared with
    the dataset, which has grown since."""
    if isinstance(update, ShardPlan):
        return update
    from ..plan.load import read_plan
    return read_plan(update)


def check_parameters(old: ShardPlan, *, url: str, table: tables.TableRef | None, world_size: int,
                     batch_size: int | None, policy: str, seed: int, predicate: PredicateInfo,
                     cost: str | None) -> None:
    """``PlanUpdateError`` naming the first planning parameter that differs from the old plan's."""
    def fmt(ref: tables.TableRef | None) -> str:
        return "parquet folder" if ref is None else ref.format

    pairs = [("dataset_url", old.dataset_url, url), ("table format", fmt(old.table), fmt(table)),
             ("world_size", old.world_size, world_size), ("batch_size", old.batch_size, batch_size),
             ("policy", old.policy, policy), ("seed", old.seed, seed),
             ("where/predicate", _filter(old.predicate), _filter(predicate)), ("cost", old.catalog.cost, cost)]
    for name, planned, given in pairs:
        if planned != given:
            raise PlanUpdateError(f"{name} is {given!r} but the plan to update was made with {planned!r}; an update "
                                  f"keeps every planning parameter: pass {name} {planned!r}, or {FROM_SCRATCH}")


def _filter(info: PredicateInfo) -> str:
    return "none" if info.kind == "none" else f"{info.kind} {info.text!r}" if info.kind == "sql" else \
        f"{info.kind} {info.fingerprint[:12]} ({info.text[:80]})"


def added_paths(old: ShardPlan, url: str, snapshot: TableSnapshot | None) -> tuple[list[str], list[str]]:
    """(the relative paths of the files listed now that the old plan lacks, every listed path), both sorted;
    ``PlanUpdateError`` for the first planned file removed, resized or modified (or, in an Iceberg table, with rows
    deleted since)."""
    table = None if snapshot is None else snapshot.ref
    where = url if table is None else table.describe()
    _, root, entries = list_data_files(url, table=table)
    now = {relative_path(e.path, root): e for e in entries}
    for planned in old.catalog.files:  # sorted by path
        entry = now.get(planned.path)
        if entry is None:
            how = ("removed from the table (a delete, update, overwrite or compaction)" if table is not None
                   else "removed")
            raise PlanUpdateError(f"{planned.path!r} was {how} since the plan to update was made, and an update "
                                  f"only adds files; {FROM_SCRATCH} of {where}")
        if entry.size != planned.size:
            raise PlanUpdateError(f"{planned.path!r} changed size ({planned.size} -> {entry.size} bytes) since the "
                                  f"plan to update was made, and an update only adds files; {FROM_SCRATCH}")
        mtime = entry.mtime_ns
        if mtime is not None and planned.mtime_ns is not None and mtime != planned.mtime_ns:
            raise PlanUpdateError(f"{planned.path!r} was rewritten since the plan to update was made (modification "
                                  f"time {planned.mtime_ns} -> {mtime} ns), and an update only adds files; "
                                  f"{FROM_SCRATCH}")
    _check_contents(old, url, table)
    if snapshot is not None and old.table is not None and old.table.format == tables.ICEBERG:
        _check_no_new_deletes(old, snapshot)
    known = {f.path for f in old.catalog.files}
    return sorted(p for p in now if p not in known), sorted(now)


def _check_contents(old: ShardPlan, url: str, table) -> None:
    """``PlanUpdateError`` for a planned file whose content fingerprint (an ETag, or a digest where the plan
    recorded one: ``io/content.py``) changed, though its size and modification time did not."""
    from ..errors import StalePlanError
    from ..plan.format import check_contents
    try:
        check_contents(old, [f for f in old.catalog.files if f.content])
    except StalePlanError as exc:
        raise PlanUpdateError(f"{exc}; an update only adds files: {FROM_SCRATCH}") from None


def _check_no_new_deletes(old: ShardPlan, snapshot: TableSnapshot) -> None:
    """An Iceberg snapshot that deleted rows of a planned file (position deletes) is no append."""
    try:
        before = tables.snapshot(old.table).deleted_rows() if old.table is not None else {}
    except Exception as exc:  # noqa: BLE001 - an expired snapshot or a metadata file gone: cannot compare
        raise PlanUpdateError(f"the snapshot of the plan to update ({old.table.describe() if old.table else ''}) "
                              f"can no longer be read ({exc}), so its deletes cannot be compared; "
                              f"{FROM_SCRATCH}") from None
    after = snapshot.deleted_rows()
    for f in old.catalog.files:
        a, b = before.get(f.path), after.get(f.path)
        if (a is None) != (b is None) or (a is not None and b is not None and
                                          (len(a) != len(b) or not (a == b).all())):
            raise PlanUpdateError(f"{f.path!r}: {snapshot.ref.describe()} deletes rows of it that "
                                  f"{old.table.describe() if old.table else 'the planned snapshot'} had (an Iceberg "
                                  f"delete), and an update only adds files; {FROM_SCRATCH}")


def check_added(old: ShardPlan, added: Catalog, every_path: Sequence[str], *, reads_partitions: bool,
                table=None) -> None:
    """``PlanUpdateError`` when the added files' catalog would not merge into the one planning from scratch builds:
    another dataset kind, a new partition column, a partition column whose type the added values change (when the
    filter or cost reads partition values), or a schema other than the planned files'."""
    planned = old.catalog
    if added.kind != planned.kind:
        raise PlanUpdateError(f"the dataset is now {added.kind!r}, not {planned.kind!r} as planned (a Unischema "
                              f"_common_metadata was added or removed); {FROM_SCRATCH}")
    if added.partition_columns != planned.partition_columns:
        new = sorted(set(added.partition_columns) ^ set(planned.partition_columns))
        raise PlanUpdateError(f"the added files change the hive partition columns ({list(planned.partition_columns)}"
                              f" -> {list(added.partition_columns)}: {new[0]!r}); {FROM_SCRATCH}")
    if reads_partitions:
        before = tables.partition_types(old.table, [f.path for f in planned.files])
        after = tables.partition_types(table, every_path)
        for column, kind in sorted(before.items()):
            if after.get(column) != kind:
                raise PlanUpdateError(f"the added files' values of partition column {column!r} change its type from "
                                      f"{kind} to {after.get(column)}, which changes what the filter or cost sees in "
                                      f"the planned files; {FROM_SCRATCH}")
    if added.files and planned.files:
        _check_schema(old.dataset_url, planned.files[0].path, added.files[0].path)


def _check_schema(url: str, planned: str, added: str) -> None:
    """The first added file's Parquet schema must be the planned files' (compared with one planned footer)."""
    from ..io.dataset import dataset_root
    from .scan import read_footer
    filesystem, root = dataset_root(url)
    metas = [read_footer(filesystem, fsutil.join(root, path))[1] for path in (planned, added)]
    if not metas[0].schema.equals(metas[1].schema):
        names = [m.schema.to_arrow_schema() for m in metas]
        raise PlanUpdateError(f"{added!r} has schema {_schema_text(names[1])} but the planned {planned!r} has "
                              f"{_schema_text(names[0])}; {FROM_SCRATCH}")


def _schema_text(schema) -> str:
    return "(" + ", ".join(f"{f.name}: {f.type}" for f in schema) + ")"
