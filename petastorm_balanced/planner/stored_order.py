"""Planning says when rows are stored sorted or clustered (G16): what decides whether loaders' batches are random."""
from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from ..core.quality import clustered_columns
from ..errors import ShuffleQualityWarning
from ..io import fs as fsutil
from ..io.stats import value_ranges
from ..plan.model import ShardPlan

SAMPLE_FILES = 16  # footers read (the first planned files in path order): statistics only, no data


def stored_order(plan: ShardPlan) -> dict[str, float]:
    """``{column: spread}`` of the columns the plan's first files store in order (``quality.clustered_columns``)."""
    paths = sorted({g.path for g in plan.catalog.row_groups})[:SAMPLE_FILES]
    filesystem, root = plan.location.filesystem, plan.location.root

    def footer(path):
        with filesystem.open_input_file(fsutil.join(root, path)) as handle:
            return pq.ParquetFile(handle).metadata

    try:
        with ThreadPoolExecutor(max(1, min(8, len(paths)))) as pool:
            footers = list(pool.map(footer, paths))
    except (OSError, pa.ArrowException):
        return {}  # a check that informs: planning itself already read these footers
    return clustered_columns(value_ranges(footers))


def warn_stored_order(plan: ShardPlan) -> dict[str, float]:
    """Warn (``ShuffleQualityWarning``) when the plan's rows are stored in order; returns what was found."""
    found = stored_order(plan)
    if found:
        names = ", ".join(f"{name!r} ({spread:.0%} of its range per row group)" for name, spread in found.items())
        rows = plan.rows_per_rank(plan.world_size, plan.batch_size or 1)
        first = next(iter(found))
        warnings.warn(ShuffleQualityWarning(
            f"rows are stored sorted or clustered by {names}: a loader's batches are as random as a uniform "
            f"permutation's while each rank's rows ({rows:,} at world size {plan.world_size}) fit one shuffle "
            "window (make_loader(shuffle_budget=), 512 MiB of decoded rows by default), and mix fewer row groups "
            f"beyond it; check before training with `petastorm-balanced inspect PLAN --shuffle-quality {first}`, "
            "and if they do not fit, raise the budget or write a shuffled copy once "
            "(petastorm_balanced.spark.make_shuffled_copy)"), stacklevel=3)
    return found
