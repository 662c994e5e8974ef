"""Per-row-group cost statistics read in this process: the local engine's, and the Spark engine's for a Petastorm
``predicate`` (whose matching rows Spark SQL cannot name).

Only the cost's source column is read, and only the matching rows are evaluated, with the same ``plan.cost``
functions the loader uses at run time, so the plan's sums are the sums of the costs the loader will see.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa

from ..core.catalog import Catalog, RowGroups
from ..core.cost.spec import CostSpec, check_costs, evaluate, row_group_stats
from ..errors import InvalidValueError
from ..io import fs as fsutil
from ..io.dataset import dataset_root
from ..io.footer import open_file

Stats = dict[tuple[str, int], tuple[int, int]]


def with_costs(catalog: Catalog, spec: CostSpec, stats: Stats) -> Catalog:
    """The catalog with each row group's ``(cost_sum, cost_max)`` from ``stats`` and the cost named."""
    missing = [(r.path, r.row_group) for r in catalog.row_groups if (r.path, r.row_group) not in stats]
    if missing:
        raise RuntimeError(f"no cost statistics for {missing[0]}; the dataset changed while planning: re-run")
    groups = RowGroups.from_matches(replace(r, cost_sum=stats[(r.path, r.row_group)][0],
                                            cost_max=stats[(r.path, r.row_group)][1]) for r in catalog.row_groups)
    if not len(groups):  # no row group (an update's added files that match nothing): empty cost columns
        groups = RowGroups((), [], [], [], [], [], [], [])
    return Catalog(catalog.files, groups, catalog.kind, catalog.partition_columns, spec.text)


def local_cost_stats(url: str, catalog: Catalog, spec: CostSpec, *, threads: int = 8) -> Stats:
    """``(sum, max)`` of the matching rows' costs for every catalog row group, read with pyarrow."""
    if not spec.loader_evaluable:
        raise InvalidValueError(f"cost={spec.text!r} is a Spark SQL expression; this path evaluates a numeric column "
                                "or one of length/octet_length/size(column): plan with engine='spark' and where= (not "
                                "a Petastorm predicate), or store the expression as a column")
    if spec.column in catalog.partition_columns:
        raise InvalidValueError(f"cost={spec.text!r}: {spec.column!r} is a hive partition column; costs come from a "
                                "stored column")
    filesystem, root = dataset_root(url)
    by_file: dict[str, list] = {}
    for r in catalog.row_groups:
        by_file.setdefault(r.path, []).append(r)

    def read(path):
        out = {}
        with filesystem.open_input_file(fsutil.join(root, path)) as handle:
            parquet = open_file(handle)
            if spec.column not in parquet.schema_arrow.names:
                raise InvalidValueError(f"cost={spec.text!r}: {path!r} has no column {spec.column!r}; the dataset has "
                                        f"{parquet.schema_arrow.names}")
            for r in by_file[path]:
                where = f"{path!r} row group {r.row_group}"
                try:
                    column = parquet.read_row_group(r.row_group, columns=[spec.column]).column(0)
                except (OSError, pa.ArrowException) as exc:
                    raise InvalidValueError(f"cost={spec.text!r}: cannot read {where} ({exc})") from exc
                if r.selection:
                    column = column.take(pa.array(r.positions()))
                out[(r.path, r.row_group)] = row_group_stats(check_costs(evaluate(spec, column), where))
        return out

    stats: Stats = {}
    with ThreadPoolExecutor(max(1, min(threads, len(by_file)))) as pool:
        for part in pool.map(read, sorted(by_file)):
            stats.update(part)
    return stats
