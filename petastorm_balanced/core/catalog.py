"""The catalog: what planning learned about the dataset, as plain frozen values.

A catalog lists every data file (so a plan can tell later whether the dataset changed) and every row group with
at least one matching row (so balancing never sees empty work). Row groups are keyed by (path relative to the
dataset root, index in the file), never by a position in some list whose order depends on a code path.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..errors import InvalidValueError
from . import selection


@dataclass(frozen=True)
class FileInfo:
    """One data file as planning saw it: enough to notice a rewrite, an append or a truncation."""

    path: str  # relative to the dataset root, '/'-separated
    size: int
    row_group_rows: tuple[int, ...]
    footer: str = ""  # sha256 (hex) of the footer bytes; "" when unknown (plans of format version 1)
    mtime_ns: int | None = None  # modification time as listed; None where the filesystem reports none
    content: str = ""  # the store's content fingerprint ('etag:...', 'sha256:...'; io/content.py), "" when none

    @property
    def num_rows(self) -> int:
        return sum(self.row_group_rows)


@dataclass(frozen=True)
class RowGroupMatch:
    """The matching rows of one row group: ``selection`` is empty when all ``total_rows`` match."""

    path: str
    row_group: int
    total_rows: int
    matching_rows: int
    selection: bytes = b""
    cost_sum: int | None = None  # cost plans: the matching rows' cost sum and largest row cost
    cost_max: int | None = None

    def positions(self) -> np.ndarray:
        return selection.decode(self.selection, self.total_rows)


class RowGroups(Sequence):
    """The catalog's row groups as columns: a sequence of ``RowGroupMatch`` made on access.

    A million row groups as dataclasses cost about 0.5 GB and seconds to build on every rank; as columns they
    cost tens of MB, and a rank materializes only the row groups it reads. Paths are stored once each
    (``paths``, sorted) and referenced by ``path_index``.
    """

    __slots__ = ("paths", "path_index", "row_group", "total_rows", "matching_rows", "selection", "cost_sum",
                 "cost_max")

    def __init__(self, paths, path_index, row_group, total_rows, matching_rows, selection, cost_sum=None,
                 cost_max=None):
        paths, path_index = tuple(paths), np.asarray(path_index, dtype=np.int64)
        if len(path_index) and (path_index.min() < 0 or path_index.max() >= len(paths)):
            raise ValueError(f"path_index must point into the {len(paths)} paths")
        used = np.bincount(path_index, minlength=len(paths)) > 0  # (paths,)
        if not used.all():  # keep only paths with a row group, so equal catalogs have equal columns
            paths = tuple(p for p, u in zip(paths, used.tolist(), strict=True) if u)
            path_index = (np.cumsum(used) - 1)[path_index]
        self.paths = paths  # (distinct paths,) sorted
        self.path_index = path_index  # (row groups,)
        self.row_group = np.asarray(row_group, dtype=np.int64)
        self.total_rows = np.asarray(total_rows, dtype=np.int64)
        self.matching_rows = np.asarray(matching_rows, dtype=np.int64)
        if not isinstance(selection, (pa.Array, pa.ChunkedArray)):
            selection = pa.array(list(selection), pa.large_binary())
        if isinstance(selection, pa.ChunkedArray):
            selection = selection.combine_chunks() if selection.num_chunks != 1 else selection.chunk(0)
        self.selection = selection.cast(pa.large_binary())  # (row groups,); empty = every row matches
        # cost plans: each row group's matching rows' cost sum and largest row cost (None: no cost)
        self.cost_sum = None if cost_sum is None else np.asarray(cost_sum, dtype=np.int64)
        self.cost_max = None if cost_max is None else np.asarray(cost_max, dtype=np.int64)
        n = len(self.path_index)
        if (self.cost_sum is None) != (self.cost_max is None):
            raise ValueError("catalog cost columns come together: cost_sum and cost_max, or neither")
        costs = [a for a in (self.cost_sum, self.cost_max) if a is not None]
        if not all(len(a) == n for a in (self.row_group, self.total_rows, self.matching_rows, self.selection, *costs)):
            raise ValueError("catalog columns must have one value per row group")

    @classmethod
    def from_matches(cls, matches: Iterable[RowGroupMatch]) -> RowGroups:
        matches = list(matches)
        paths = sorted({m.path for m in matches})
        where = {p: i for i, p in enumerate(paths)}
        with_cost = bool(matches) and all(m.cost_sum is not None and m.cost_max is not None for m in matches)
        return cls(paths, [where[m.path] for m in matches], [m.row_group for m in matches],
                   [m.total_rows for m in matches], [m.matching_rows for m in matches],
                   [m.selection for m in matches], *(([m.cost_sum for m in matches], [m.cost_max for m in matches])
                                                    if with_cost else ()))

    @classmethod
    def from_columns(cls, path, row_group, total_rows, matching_rows, selection, cost_sum=None,
                     cost_max=None) -> RowGroups:
        """From per-row-group columns; ``path``: a sequence of strings, or an Arrow string or dictionary array
        (chunked or not), which is never expanded into one Python string per row group."""
        if not isinstance(path, (pa.Array, pa.ChunkedArray)):
            path = pa.array(list(path), pa.string())
        chunks = path.chunks if isinstance(path, pa.ChunkedArray) else [path]
        coded = [c if pa.types.is_dictionary(c.type) else c.dictionary_encode() for c in chunks]
        paths = sorted({p for c in coded for p in c.dictionary.to_pylist()})
        where = {p: i for i, p in enumerate(paths)}
        # each chunk's dictionary codes -> positions in the sorted path list
        index = [np.array([where[p] for p in c.dictionary.to_pylist()], dtype=np.int64)[
                 c.indices.to_numpy(zero_copy_only=False)] if len(c) else np.zeros(0, np.int64) for c in coded]
        return cls(paths, np.concatenate(index) if index else np.zeros(0, np.int64), row_group, total_rows,
                   matching_rows, selection, cost_sum, cost_max)

    def __len__(self) -> int:
        return len(self.path_index)

    def __getitem__(self, item):
        if isinstance(item, slice):
            return [self[i] for i in range(*item.indices(len(self)))]
        i = int(item)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row group {item} out of range for {len(self)} row groups")
        return RowGroupMatch(self.paths[self.path_index[i]], int(self.row_group[i]), int(self.total_rows[i]),
                             int(self.matching_rows[i]), self.selection[i].as_py(), *self._costs_of(i))

    def _costs_of(self, i: int) -> tuple:
        if self.cost_sum is None or self.cost_max is None:  # both or neither (__init__)
            return ()
        return int(self.cost_sum[i]), int(self.cost_max[i])

    def __iter__(self) -> Iterator[RowGroupMatch]:
        paths = self.paths
        costs = (zip(self.cost_sum.tolist(), self.cost_max.tolist(), strict=True)
                 if self.cost_sum is not None and self.cost_max is not None else itertools.repeat(()))
        for p, g, t, m, s, c in zip(self.path_index.tolist(), self.row_group.tolist(), self.total_rows.tolist(),
                                    self.matching_rows.tolist(), self.selection.to_pylist(), costs, strict=False):
            yield RowGroupMatch(paths[p], g, t, m, s, *c)

    def is_sorted_unique(self) -> bool:
        """Keys strictly increasing by (path, row_group)."""
        p, g = self.path_index, self.row_group
        return bool(np.all((p[1:] > p[:-1]) | ((p[1:] == p[:-1]) & (g[1:] > g[:-1]))))

    def __eq__(self, other):
        if isinstance(other, RowGroups):
            return (self.paths == other.paths and len(self) == len(other)
                    and all(np.array_equal(getattr(self, n), getattr(other, n))
                            for n in ("path_index", "row_group", "total_rows", "matching_rows"))
                    and self.selection.equals(other.selection)
                    and all((a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
                            for a, b in ((self.cost_sum, other.cost_sum), (self.cost_max, other.cost_max))))
        if isinstance(other, (tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self):  # catalogs and plans were hashable as tuples of frozen dataclasses; they stay so
        return hash((self.paths, *(getattr(self, n).tobytes() for n in ("path_index", "row_group", "total_rows",
                                                                         "matching_rows")),
                     tuple(self.selection.to_pylist()),
                     *(a.tobytes() for a in (self.cost_sum, self.cost_max) if a is not None)))

    def __repr__(self) -> str:
        return f"RowGroups({len(self)} row groups in {len(self.paths)} files)"


@dataclass(frozen=True)
class Catalog:
    """Every data file, and every row group with a matching row, both sorted by key.

    ``row_groups`` may be given as any sequence of ``RowGroupMatch``; it is kept as ``RowGroups`` columns.
    """

    files: tuple[FileInfo, ...]
    row_groups: RowGroups
    kind: str = "plain"  # 'petastorm' when the dataset carries a Unischema
    partition_columns: tuple[str, ...] = field(default=())
    cost: str | None = None  # the cost (column or Spark SQL expression) every row group has stats for

    def __post_init__(self):
        if not isinstance(self.row_groups, RowGroups):
            object.__setattr__(self, "row_groups", RowGroups.from_matches(self.row_groups))
        if not self.row_groups.is_sorted_unique():
            raise InvalidValueError("catalog row groups must be unique and sorted by (path, row_group)")
        if self.cost is not None and (self.row_groups.cost_sum is None or self.row_groups.cost_max is None):
            raise InvalidValueError(f"catalog with cost={self.cost!r} has row groups without cost statistics")

    @property
    def total_rows(self) -> int:
        """Matching rows over the whole dataset."""
        return int(self.matching_counts().sum())

    @property
    def scanned_rows(self) -> int:
        return sum(map(sum, (f.row_group_rows for f in self.files)))

    def cost_sums(self) -> np.ndarray:
        """Cost of each row group's matching rows, shape (row groups,); only for a catalog with a cost."""
        if self.row_groups.cost_sum is None:
            raise InvalidValueError("this catalog has no cost statistics; plan with cost= to get them")
        return self.row_groups.cost_sum

    @property
    def max_row_cost(self) -> int | None:
        """The largest cost of one matching row (a token budget below it could never hold that row)."""
        cost_max = self.row_groups.cost_max
        if self.cost is None or cost_max is None:  # a cost catalog always has cost_max (__post_init__)
            return None
        return int(cost_max.max()) if len(self.row_groups) else 0

    def matching_counts(self) -> np.ndarray:
        # (row groups,)
        return self.row_groups.matching_rows


def full_catalog(files: Iterable[FileInfo], kind: str = "plain", partition_columns=()) -> Catalog:
    """The catalog when every row matches: one entry per non-empty row group, straight from the footers."""
    files = tuple(sorted(files, key=lambda f: f.path))
    per_file = np.array([len(f.row_group_rows) for f in files], dtype=np.int64)
    # (row groups of every file,)
    rows = np.fromiter(itertools.chain.from_iterable(f.row_group_rows for f in files), np.int64, int(per_file.sum()))
    file_of = np.repeat(np.arange(len(files)), per_file)
    index = np.arange(len(rows)) - np.repeat(np.cumsum(per_file) - per_file, per_file)
    keep = rows > 0
    row_groups = RowGroups([f.path for f in files], file_of[keep], index[keep], rows[keep], rows[keep],
                           empty_selections(int(keep.sum())))
    return Catalog(files, row_groups, kind, tuple(partition_columns))


def empty_selections(n: int) -> pa.Array:
    """``n`` empty selections (every row matches), without making ``n`` Python objects."""
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(np.zeros(n + 1, np.int64)),
                                                                   pa.py_buffer(b"")])


def match_from_mask(path: str, row_group: int, mask: np.ndarray) -> RowGroupMatch | None:
    """The catalog entry for a row group given its boolean match mask, or None if nothing matches."""
    mask = np.asarray(mask, dtype=bool)
    count = int(np.count_nonzero(mask))
    if count == 0:
        return None
    return RowGroupMatch(path, row_group, len(mask), count, selection.encode_mask(mask))


def merge_catalogs(old: Catalog, added: Catalog) -> Catalog:
    """One catalog of the files of ``old`` and the files of ``added`` (no path in both), sorted by key as a catalog
    of all of them is: what a plan update writes, equal to the catalog planning them together builds.

    Kind, partition columns and cost must agree (``planner/update.py`` refuses an update where they do not).

    >>> a = full_catalog([FileInfo("b.parquet", 10, (3,))])
    >>> b = full_catalog([FileInfo("a.parquet", 10, (2, 4))])
    >>> merged = merge_catalogs(a, b)
    >>> [f.path for f in merged.files], [(m.path, m.row_group) for m in merged.row_groups]
    (['a.parquet', 'b.parquet'], [('a.parquet', 0), ('a.parquet', 1), ('b.parquet', 0)])
    >>> merged == full_catalog([FileInfo("a.parquet", 10, (2, 4)), FileInfo("b.parquet", 10, (3,))])
    True
    """
    both = {f.path for f in old.files} & {f.path for f in added.files}
    if both:
        raise InvalidValueError(f"{sorted(both)[0]!r} is in both catalogs; only files that are new can be added")
    for name in ("kind", "partition_columns", "cost"):
        if getattr(old, name) != getattr(added, name):
            raise InvalidValueError(f"catalogs with different {name} ({getattr(old, name)!r}, "
                                    f"{getattr(added, name)!r}) cannot be merged")
    a, b = old.row_groups, added.row_groups
    paths = sorted(set(a.paths) | set(b.paths))
    where = {p: i for i, p in enumerate(paths)}
    remap = [np.array([where[p] for p in rows.paths], dtype=np.int64) for rows in (a, b)]
    path_index = np.concatenate([m[rows.path_index] if len(rows) else np.zeros(0, np.int64)
                                 for m, rows in zip(remap, (a, b), strict=True)])
    row_group = np.concatenate([a.row_group, b.row_group])
    order = np.lexsort((row_group, path_index))  # (path, row_group) ascending: the catalog's key order

    def column(name):  # a side without row groups may lack the cost columns
        parts = [getattr(r, name) for r in (a, b)]
        return np.concatenate([np.zeros(0, np.int64) if p is None else p for p in parts])[order]

    costs = () if old.cost is None else (column("cost_sum"), column("cost_max"))
    selection = pa.concat_arrays([a.selection, b.selection]).take(pa.array(order))
    rows = RowGroups(paths, path_index[order], row_group[order], column("total_rows"), column("matching_rows"),
                     selection, *costs)
    files = tuple(sorted(old.files + added.files, key=lambda f: f.path))
    return Catalog(files, rows, old.kind, old.partition_columns, old.cost)
