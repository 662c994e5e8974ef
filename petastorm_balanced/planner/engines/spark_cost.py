"""Cost statistics with Spark: any Spark SQL numeric expression, evaluated with Spark's own semantics.

Spark evaluates ``cost`` on the rows ``where`` keeps and reports each as its file (``_metadata.file_path``),
``_metadata.row_index`` and value. A Python task per partition maps row indices to row groups with the footer row
counts, checks every value (the same ``plan.cost.check_costs`` as the in-process engine) and folds them into one
``(sum, max)`` record per row group it saw; Spark then merges those partial records. What is shuffled is one small
record per (partition, row group), never a row.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...core.catalog import FileInfo
from ...core.cost.spec import CostSpec, check_costs
from ...errors import InvalidValueError, InvalidWhereError
from ...io.tables import partition_types
from ..cost_stats import Stats
from .spark import (
    AnalysisException,
    F,
    SparkRuntimeException,
    first_line,
    is_connect,
    quiet_pyspark_error_logs,
    read_for_where,
    ship_package,
    spark_relative_path,
)

_PARTIAL_SCHEMA = "path string, row_group int, cost_sum long, cost_max long, bad string"


def spark_cost_stats(spark, url: str, root: str, files: Sequence[FileInfo], spec: CostSpec,
                     where: str | None = None, table=None, every_path: Sequence[str] | None = None) -> Stats:
    """``(sum, max)`` of the cost of the rows ``where`` keeps, per row group; a NULL, negative or fractional cost
    is a ``ValueError`` naming file and row group. ``every_path``: given when ``files`` are some of the dataset's
    (an update), which Spark then reads by name with the partition types of every path."""
    types = partition_types(table, every_path or [f.path for f in files])  # as the loader types them
    frame = read_for_where(spark, url, types,
                            files if table is not None or every_path is not None else None,  # a table: its files
                            table=table)
    columns = frame.columns
    lookup = {f.path: f.row_group_rows for f in files if f.num_rows > 0}
    # Spark Connect has no broadcast: the lookup (row group sizes per file) travels inside the function instead.
    shared = _Inline(lookup) if is_connect(spark) else spark.sparkContext.broadcast(lookup)
    ship_package(spark)
    with quiet_pyspark_error_logs():
        if where is not None:
            try:
                frame = frame.where(where)
            except AnalysisException as exc:
                raise InvalidWhereError(where, first_line(exc), columns) from None
        try:
            rows = frame.select(F.col("_metadata.file_path").alias("file"),
                                F.col("_metadata.row_index").alias("row_index"),
                                F.expr(spec.text).cast("double").alias("cost"))
        except AnalysisException as exc:
            raise InvalidValueError(f"cost={spec.text!r} is not a numeric Spark SQL expression over columns {columns} "
                                    f"({first_line(exc)})") from None
        try:
            partial = rows.mapInPandas(_partial_stats(root, shared), _PARTIAL_SCHEMA)
            merged = (partial.groupBy("path", "row_group")
                      .agg(F.sum("cost_sum").alias("cost_sum"), F.max("cost_max").alias("cost_max"),
                           F.first("bad", ignorenulls=True).alias("bad")).collect())
        except (AnalysisException, SparkRuntimeException) as exc:
            raise InvalidValueError(f"cost={spec.text!r} failed on the data ({first_line(exc)})") from None
        finally:
            shared.destroy()
    bad = sorted((r.path, r.row_group, r.bad) for r in merged if r.bad)
    if bad:
        raise InvalidValueError(f"cost={spec.text!r}: {bad[0][2]}")
    return {(r.path, int(r.row_group)): (int(r.cost_sum), int(r.cost_max)) for r in merged}


class _Inline:
    """A broadcast's interface (``.value``, ``.destroy()``) for a value pickled with the task function."""

    def __init__(self, value):
        self.value = value

    def destroy(self) -> None:
        pass


def _partial_stats(root: str, lookup):
    def fold(batches):
        for frame in batches:
            if frame.empty:
                continue
            out: list[tuple[str, int, int, int, str | None]] = []  # bad: the error text, None when the costs are ok
            for key, part in frame.groupby("file", sort=True):
                relpath = spark_relative_path(key, root)
                bounds = np.concatenate(([0], np.cumsum(lookup.value[relpath], dtype=np.int64)))
                groups = np.searchsorted(bounds, part["row_index"].to_numpy(), side="right") - 1
                values = part["cost"].to_numpy(dtype=np.float64)
                for group in np.unique(groups):
                    picked = values[groups == group]
                    try:
                        costs = check_costs(picked, f"{relpath!r} row group {int(group)}")
                    except ValueError as exc:
                        out.append((relpath, int(group), 0, 0, str(exc)))
                        continue
                    out.append((relpath, int(group), int(costs.sum()), int(costs.max()), None))
            yield pd.DataFrame(out, columns=["path", "row_group", "cost_sum", "cost_max", "bad"]).astype(
                {"row_group": np.int32, "cost_sum": np.int64, "cost_max": np.int64})
    return fold
