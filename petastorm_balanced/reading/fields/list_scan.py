"""The lengths of list columns, learned from every planned row group when the loader is made (``list_shapes``).

Why a pass over the rows: no Parquet footer says that every list of a column has the same length (its statistics
count values and nulls, never per-row lengths), and ``loader.schema`` must be decided before the first batch
(G13). So the loader reads the list columns that need it, and only those, from the planned row groups, once,
in threads (pyarrow decodes them in C++ without the GIL; the lengths come from the offsets, no Python object per
row). Whole row groups are read, not only the planned rows, so the answer is the same for every rank, world size
and epoch. Results are kept per process for the same files (path, size, modification time, footer digest): a
loader made again, or one per rank in one process, does not read them again; a file rewritten since is refused by
the reader (G15) before a row of it is delivered, and every batch is checked against the shape anyway.
"""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...io import fs as fsutil
from ...io.footer import open_file
from ...io.location import DatasetLocation
from ...plan.model import ShardPlan
from .list_shapes import ListStats, numeric_list_levels

SCAN_THREADS = 8
_CACHE: dict[tuple, ListStats] = {}
_CACHE_SIZE = 256


def scan_lists(plan: ShardPlan, types: dict[str, pa.DataType], threads: int = SCAN_THREADS) -> dict[str, ListStats]:
    """``ListStats`` of each column of ``types`` (delivered Arrow types) over the plan's planned row groups."""
    files = {f.path: f for f in plan.catalog.files}
    groups: dict[str, set[int]] = {}
    for g in plan.catalog.row_groups:
        groups.setdefault(g.path, set()).add(g.row_group)
    identity = (plan.dataset_url, tuple((p, files[p].size, files[p].mtime_ns, files[p].footer, files[p].content,
                                         tuple(sorted(groups[p]))) for p in sorted(groups)))
    keys = {name: (identity, name, str(t)) for name, t in types.items()}
    todo = {name: t for name, t in types.items() if keys[name] not in _CACHE}
    if todo:
        for name, stats in _scan(plan.location, sorted(groups.items()), todo, threads).items():
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[keys[name]] = stats
    return {name: _CACHE[keys[name]] for name in types}


def _scan(location: DatasetLocation, groups: Sequence[tuple[str, set[int]]], types: dict[str, pa.DataType],
          threads: int) -> dict[str, ListStats]:
    filesystem, root = location.filesystem, location.root
    names = list(types)

    def one_file(item):
        path, row_groups = item
        out: list[dict[str, tuple[ListStats, int | None, str]]] = []
        with filesystem.open_input_file(fsutil.join(root, path)) as handle:
            parquet = open_file(handle)
            for i in sorted(row_groups):
                table = parquet.read_row_group(i, columns=names, use_threads=False)
                out.append({n: column_stats(table.column(n), types[n], f"{path!r} row group {i}") for n in names})
        return out

    with ThreadPoolExecutor(max(1, min(threads, len(groups)))) as pool:
        per_file = list(pool.map(one_file, groups))
    depth = {n: len((numeric_list_levels(t) or ((),))[0]) for n, t in types.items()}  # only lists are scanned
    merged = {n: ListStats((None,) * depth[n]) for n in names}
    first: dict[str, int] = {}  # the outer length of the first non-null row, in plan order
    for chunks in per_file:
        for chunk in chunks:
            for name, (stats, head, head_at) in chunk.items():
                if head is not None and name in first and head != first[name] and not merged[name].odd:
                    stats = replace(stats, odd=f"{head_at} ({head} items where earlier rows have {first[name]})")
                if head is not None:
                    first.setdefault(name, head)
                merged[name] = merged[name].merge(stats)
    return merged


def column_stats(column, t: pa.DataType, where: str = "") -> tuple[ListStats, int | None, str]:
    """``ListStats`` of one column (chunked or not) of list type ``t`` (``where``: its row group), the outer length
    of its first non-null row and where that row is."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    array = pa.concat_arrays(chunks) if len(chunks) != 1 else chunks[0]
    found = numeric_list_levels(t)
    depth = len(found[0]) if found else 1
    lengths: list[tuple[int, int] | None] = []
    inner_nulls, level, odd, head, head_at = False, array, "", None, ""
    for i in range(depth):
        if i and level.null_count:
            inner_nulls = True
        counts = pc.list_value_length(level)
        low_high = pc.min_max(counts)
        low, high = low_high["min"].as_py(), low_high["max"].as_py()
        lengths.append(None if low is None else (low, high))
        if i == 0 and low is not None:
            valid = counts.is_valid().to_numpy(zero_copy_only=False)
            values = counts.fill_null(-1).to_numpy(zero_copy_only=False)
            at = int(np.argmax(valid))
            head, head_at = int(values[at]), f"{where} row {at}"
            if low != high:
                row = int(np.argmax(valid & (values != head)))
                odd = f"{where} row {row} ({int(values[row])} items where row {at} has {head})"
        level = level.flatten()
    stats = ListStats(tuple(lengths), array.null_count > 0, inner_nulls, level.null_count > 0, odd)
    return stats, head, head_at
