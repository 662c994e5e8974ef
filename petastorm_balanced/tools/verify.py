"""``petastorm-balanced verify``: prove a plan keeps its promises, first on paper, then on the rows.

``plan_checks`` needs only footers: the dataset is unchanged (G7), the catalog agrees with the dataset's files,
and for every epoch asked the assignment gives every rank the same steps (G1), never gives a row twice and leaves
out fewer than ``world_size x batch_size`` rows (G2), and splits at most ``slots - 1`` row groups (G3).

``ReadCheck`` reads every rank's rows (with pyarrow as the loader would: whole row group, then the planned
positions; or through ``make_loader`` itself, identified by a unique column) and checks G1 and G2 again on what
was read, against ground truth taken from the data files: with no predicate every
row of every file must be delivered (``pad``) or all but fewer than ``world_size x batch_size`` (``drop``). A
predicate is not stored in the plan in runnable form, so with one the rows are checked against the plan's
catalog (that they exist, are in range, and are each delivered once); the output says so.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow.parquet as pq

from ..core import balance
from ..errors import InvalidValueError, PlanError
from ..io import fs as fsutil
from ..io.footer import footer_at, open_file
from ..plan.format import split_row_groups
from ..plan.model import ShardPlan
from ..planner.scan import check_footers
from .coverage import Check, bounds_check, coverage_check, steps_check


def plan_checks(plan: ShardPlan, *, epochs: int = 1, batch_size: int | None = None) -> list[Check]:
    checks = [_dataset_check(plan), _catalog_check(plan)]
    batch = batch_size or plan.batch_size or 1
    for epoch in range(epochs):
        pieces = plan.pieces(epoch=epoch, batch_size=batch)
        checks += [_g1_pieces(plan, pieces, epoch), _g2_pieces(plan, pieces, epoch), _g3_pieces(pieces, epoch)]
    return checks


class ReadCheck:
    """G1 and G2 on the rows themselves.

    By default rows are read with pyarrow and identified by ``(file, row group, position)`` keys, which works for
    any dataset. With ``id_column`` (a column whose values are unique) they are read through ``make_loader``, the
    way training reads them, batch by batch, and identified by that column's values. Building one checks its
    inputs (``ValueError``) before any long read starts.
    """

    def __init__(self, plan: ShardPlan, *, batch_size: int | None = None, id_column: str | None = None):
        self.plan, self.batch = plan, batch_size or plan.batch_size or 1
        self.rows = _RowReader(plan)
        self.expected, self.source = self.rows.expected_keys()
        self.via = _LoaderRows(plan, self.rows, id_column, self.batch) if id_column else None
        if self.via is not None:
            self.expected = self.via.ids_of(self.expected)
        self.how = (f"make_loader, by {id_column!r}" if id_column else "pyarrow, by (file, row group, position)")

    def run(self, *, epochs: int = 1, progress: Callable[[int], None] | None = None) -> list[Check]:
        checks = []
        for epoch in range(epochs):
            per_rank = []
            for rank in range(self.plan.world_size):
                per_rank.append(self.via.rank_rows(rank, epoch) if self.via else self._rank_rows(rank, epoch))
                if progress is not None:
                    progress(1)
            checks.append(_g1_rows(self.plan, per_rank, self.batch, epoch, self.how))
            checks.append(_g2_rows(self.plan, per_rank, self.batch, epoch, self.expected,
                                   f"{self.source}; read with {self.how}"))
        if self.plan.cost is not None:
            checks.append(cost_check(self.plan))
        return checks

    def _rank_rows(self, rank: int, epoch: int):
        """(keys, padding flags, batch sizes) of one rank, in delivery order."""
        batch, parts, padding = self.batch, [], []
        for frag in self.plan.assignment(rank, epoch=epoch, batch_size=batch):
            got = self.rows.keys(frag)
            parts.append(got)
            padding.append(np.full(len(got), frag.padding))
        keys = np.concatenate(parts or [np.zeros(0, np.int64)])
        sizes = [batch] * (len(keys) // batch) + ([len(keys) % batch] if len(keys) % batch else [])
        return keys, np.concatenate(padding or [np.zeros(0, bool)]), sizes


class _LoaderRows:
    """Rows as training sees them: ``make_loader`` per rank and epoch, identified by a unique column."""

    def __init__(self, plan: ShardPlan, rows: _RowReader, column: str, batch: int):
        self._ids = rows.column(column)  # (rows in files,) the id of every row, indexed by key
        if len(np.unique(self._ids)) != len(self._ids):
            raise InvalidValueError(f"--id-column {column!r} has repeated values, so it cannot identify rows; pick a "
                                    "unique column or leave --id-column out to check rows by position")
        try:
            from ..reading.front.loader import make_loader
            from ..reading.source.stream import PADDING
        except ImportError as exc:
            raise InvalidValueError(f"--id-column needs the loader and torch ({exc}); leave it out to check rows by "
                                    "position with pyarrow") from None
        self.plan, self.batch, self.column, self.padding = plan, batch, column, PADDING
        self._make_loader = make_loader

    def ids_of(self, keys: np.ndarray) -> np.ndarray:
        return self._ids[keys]

    def rank_rows(self, rank: int, epoch: int):
        loader = self._make_loader(rank, self.plan.world_size, plan=self.plan, batch_size=self.batch, epoch=epoch,
                                   schema_fields=[self.column], padding_mask=True)
        ids, padding, sizes = [], [], []
        try:
            for batch in loader:
                values = np.asarray(batch[self.column])
                ids.append(values)
                padding.append(np.asarray(batch[self.padding], dtype=bool))
                sizes.append(len(values))
        finally:
            loader.close()
        if len(sizes) != len(loader):
            sizes.append(-1)  # G1 reports it: the loader yielded a different number of batches than it promised
        empty = np.zeros(0, dtype=self._ids.dtype)
        return np.concatenate(ids or [empty]), np.concatenate(padding or [np.zeros(0, bool)]), sizes


class _RowReader:
    """Reads the smallest thing that proves a row exists: one column of the row group, then the positions."""

    def __init__(self, plan: ShardPlan):
        self.plan = plan
        self.filesystem, self.root = plan.location.filesystem, plan.location.root
        self._meta: dict[str, pq.FileMetaData] = {}
        self._offsets: dict[tuple[str, int], int] = {}
        base = 0
        for f in sorted(plan.catalog.files, key=lambda f: f.path):
            meta = self._meta[f.path] = footer_at(self.filesystem, fsutil.join(self.root, f.path))
            for i in range(meta.num_row_groups):
                self._offsets[(f.path, i)] = base
                base += meta.row_group(i).num_rows
        self.rows_in_files = base

    def expected_keys(self) -> tuple[np.ndarray, str]:
        """The keys that must be delivered, and where that truth comes from."""
        if self.plan.predicate.kind == "none":
            return np.arange(self.rows_in_files, dtype=np.int64), "every row of the data files"
        parts = [self._offset(r.path, r.row_group) + r.positions() for r in self.plan.catalog.row_groups]
        return (np.concatenate(parts) if parts else np.zeros(0, np.int64),
                f"the plan's catalog (the {self.plan.predicate.kind} predicate is not re-run)")

    def keys(self, frag) -> np.ndarray:
        """Global keys (row offset in the sorted files + position) of the rows ``frag`` delivers, read for real."""
        where = f"{frag.path!r} row group {frag.row_group}"
        offset = self._offset(frag.path, frag.row_group)
        meta = self._meta[frag.path]
        if meta.row_group(frag.row_group).num_rows != frag.total_rows:
            raise PlanError(f"{where} has {meta.row_group(frag.row_group).num_rows} rows, the plan says "
                            f"{frag.total_rows}")
        positions = frag.row_indices()
        with self.filesystem.open_input_file(fsutil.join(self.root, frag.path)) as handle:
            parquet = open_file(handle, metadata=meta)
            table = parquet.read_row_group(frag.row_group, columns=[parquet.schema_arrow.names[0]])
        if len(positions) and (positions.min() < 0 or positions.max() >= table.num_rows):
            raise PlanError(f"{where}: planned positions reach past its {table.num_rows} rows")
        if table.take(positions).num_rows != len(positions):
            raise PlanError(f"{where}: read fewer rows than planned")
        return offset + positions

    def column(self, name: str) -> np.ndarray:
        """(rows in files,) one column of every row, in key order."""
        parts = []
        for path in sorted(self._meta):
            with self.filesystem.open_input_file(f"{self.root}/{path}") as handle:
                parquet = open_file(handle, metadata=self._meta[path])
                if name not in parquet.schema_arrow.names:
                    raise InvalidValueError(f"--id-column {name!r} is not a stored column of {path!r}; its columns are "
                                            f"{parquet.schema_arrow.names}")
                parts.append(parquet.read(columns=[name]).column(name).to_numpy(zero_copy_only=False))
        return np.concatenate(parts)

    def _offset(self, path: str, row_group: int) -> int:
        try:
            return self._offsets[(path, row_group)]
        except KeyError:
            raise PlanError(f"{path!r} row group {row_group} is in the plan but not in the data files") from None


def cost_check(plan: ShardPlan) -> Check:
    """A cost plan's per-row-group statistics against the data: every matching row's cost evaluated again (with
    the loader's functions) must give the recorded sums and largest costs, and be a non-negative integer."""
    from ..core.cost.spec import parse_cost
    from ..planner.cost_stats import local_cost_stats
    name = "cost statistics (read)"
    spec = parse_cost(plan.cost)
    if not spec.loader_evaluable:
        return Check(name, True, f"not re-evaluated: {plan.cost!r} is a Spark SQL expression (re-plan to compare)")
    try:
        stats = local_cost_stats(plan.dataset_url, plan.catalog, spec)
    except ValueError as exc:
        return Check(name, False, str(exc))
    for r in plan.catalog.row_groups:
        got = stats[(r.path, r.row_group)]
        if got != (r.cost_sum, r.cost_max):
            return Check(name, False, f"{r.path!r} row group {r.row_group}: the data gives cost sum {got[0]} and "
                                      f"max {got[1]}, the plan recorded {r.cost_sum} and {r.cost_max}; re-plan")
    return Check(name, True, f"{plan.cost!r} sums and largest costs of {len(plan.catalog.row_groups)} row groups "
                             f"match the data (total {int(plan.catalog.cost_sums().sum())}, largest row "
                             f"{plan.max_row_cost})")


def _dataset_check(plan: ShardPlan) -> Check:
    try:
        check_footers(plan)
    except (PlanError, ValueError) as exc:
        return Check("dataset unchanged (G7)", False, str(exc))
    return Check("dataset unchanged (G7)", True, f"{len(plan.catalog.files)} files, sizes and row groups as planned")


def _catalog_check(plan: ShardPlan) -> Check:
    name = "catalog agrees with the dataset files"
    files = {f.path: f for f in plan.catalog.files}
    for r in plan.catalog.row_groups:
        where = f"{r.path!r} row group {r.row_group}"
        if r.path not in files or r.row_group >= len(files[r.path].row_group_rows):
            return Check(name, False, f"{where} is not in the plan's file list")
        if files[r.path].row_group_rows[r.row_group] != r.total_rows:
            return Check(name, False, f"{where}: {r.total_rows} rows in the catalog, "
                                      f"{files[r.path].row_group_rows[r.row_group]} in the file list")
        positions = r.positions()
        if not 0 < r.matching_rows <= r.total_rows or len(positions) != r.matching_rows:
            return Check(name, False, f"{where}: matching_rows={r.matching_rows} but the selection holds "
                                      f"{len(positions)} of {r.total_rows} rows")
    if plan.predicate.kind == "none":
        missing = plan.catalog.scanned_rows - plan.catalog.total_rows
        if missing:
            return Check(name, False, f"no predicate, yet the catalog leaves out {missing} of the dataset's "
                                      f"{plan.catalog.scanned_rows} rows")
    return Check(name, True, f"{len(plan.catalog.row_groups)} row groups, {plan.total_rows} matching rows")


def _g1_pieces(plan: ShardPlan, pieces: balance.Pieces, epoch: int) -> Check:
    name = f"G1 equal steps, epoch {epoch} (plan)"
    rows = np.bincount(pieces.rank, weights=pieces.num_rows, minlength=pieces.world_size).astype(np.int64)
    want = plan.steps_per_epoch(pieces.world_size, pieces.batch_size)
    if pieces.steps_per_rank != want or (rows != want * pieces.batch_size).any():
        return Check(name, False, f"rows per rank {rows.min()}..{rows.max()}, expected {want} steps x "
                                  f"{pieces.batch_size}")
    return Check(name, True, f"{pieces.world_size} ranks x {want} steps x {pieces.batch_size} rows")


def _g2_pieces(plan: ShardPlan, pieces: balance.Pieces, epoch: int) -> Check:
    name = f"G2 coverage, epoch {epoch} (plan)"
    counts = plan.catalog.matching_counts()
    if (pieces.start < 0).any() or (pieces.stop <= pieces.start).any() or \
            (pieces.stop > counts[pieces.catalog_row]).any():
        return Check(name, False, "a piece reaches outside its row group's matching rows")
    real = ~pieces.padding
    row, start, stop = pieces.catalog_row[real], pieces.start[real], pieces.stop[real]
    order = np.lexsort((start, row))
    row, start, stop = row[order], start[order], stop[order]
    overlap = int(((row[1:] == row[:-1]) & (start[1:] < stop[:-1])).sum())
    left_out = plan.total_rows - int((stop - start).sum())
    padded = int(pieces.num_rows[pieces.padding].sum())
    return bounds_check(name, plan.policy, pieces.world_size * pieces.batch_size, duplicates=overlap, foreign=0,
                        left_out=left_out, padded=padded)


def _g3_pieces(pieces: balance.Pieces, epoch: int) -> Check:
    splits, slots = split_row_groups(pieces), pieces.world_size * pieces.num_workers
    return Check(f"G3 locality, epoch {epoch} (plan)", splits <= slots - 1,
                 f"{splits} split row groups, at most {slots - 1} allowed")


def _g1_rows(plan: ShardPlan, per_rank, batch: int, epoch: int, how: str) -> Check:
    check = steps_check([sizes for _, _, sizes in per_rank], steps=plan.steps_per_epoch(plan.world_size, batch),
                        batch_size=batch, name=f"G1 equal steps, epoch {epoch} (read)")
    return Check(check.name, check.ok, f"{check.detail} ({how})")


def _g2_rows(plan: ShardPlan, per_rank, batch: int, epoch: int, expected: np.ndarray, source: str) -> Check:
    check = coverage_check([keys for keys, _, _ in per_rank], [pad for _, pad, _ in per_rank], expected=expected,
                           policy=plan.policy, global_batch=plan.world_size * batch,
                           name=f"G2 coverage, epoch {epoch} (read)")
    return Check(check.name, check.ok, f"{check.detail}; checked against {source}")
