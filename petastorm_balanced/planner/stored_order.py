"""Planning says when rows are stored sorted or clustered (G16), once, and only where it changes the batches.

Sorted storage matters only when a rank's rows need more than one shuffle window: while they fit one (the default
``shuffle_budget`` holds them), a loader's batches are cut from one uniform permutation of the rank's rows, whatever
the stored order. So a plan warns when its own world size and batch size would need more windows at the default
budget, and says the one thing that fixes it (a larger budget, or past 4 GiB a spill folder on local disk);
``petastorm-balanced inspect`` states the finding either way.
"""
from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from ..core.quality import clustered_columns
from ..core.shuffle import DEFAULT_BUDGET, EXTRA_ROW_BYTES, MEMORY_ADVICE, budget_window
from ..errors import ShuffleQualityWarning
from ..io import fs as fsutil
from ..io.footer import footer_at
from ..io.stats import row_bytes, value_ranges
from ..plan.model import ShardPlan

SAMPLE_FILES = 16  # footers read (the first planned files in path order): statistics only, no data
GiB, MiB = 2**30, 2**20


@dataclass(frozen=True)
class StoredOrder:
    """What the plan's first files say about their order: the columns stored in order (``{column: spread}``),
    and for ``world_size`` ranks of ``rank_rows`` rows the rows one default shuffle window holds."""

    clustered: dict[str, float]
    world_size: int
    rank_rows: int
    window_rows: int
    row_bytes: float = 0.0  # estimated decoded bytes per row (the disk a spill folder takes)

    @property
    def windows(self) -> int:
        return -(-self.rank_rows // max(1, self.window_rows))

    @property
    def matters(self) -> bool:
        """Shuffled batches are further from i.i.d. than a uniform permutation's (sorted, and more than a window)."""
        return bool(self.clustered) and self.windows > 1

    def budget_needed(self) -> int:
        """The ``shuffle_budget`` (bytes) whose window holds a rank's rows, rounded up to 256 MiB."""
        need = DEFAULT_BUDGET * self.rank_rows / max(1, self.window_rows)
        return int(-(-need // (256 * MiB)) * 256 * MiB)

    def advice(self) -> str:
        """The one thing to do when it matters."""
        need = self.budget_needed()
        if need > MEMORY_ADVICE:
            disk = self.rank_rows * self.row_bytes
            return (f"pass make_loader(shuffle_spill_dir=<local disk>), which holds them in one window there (about "
                    f"{disk / GiB:.1f} GiB per rank)")
        size = f"{need // GiB}GiB" if need % GiB == 0 else f"{need // MiB}MiB"
        return f"pass make_loader(shuffle_budget=\"{size}\"), which holds them in one window"

    def describe(self) -> str:
        """One line for ``inspect`` (and the warning's text when it matters)."""
        name, spread = min(self.clustered.items(), key=lambda item: item[1])
        found = f"rows are stored sorted by {name!r} (a row group spans {spread:.0%} of its range)"
        if not self.matters:
            return (f"{found}; each rank's {self.rank_rows:,} rows at world size {self.world_size} fit one shuffle "
                    "window of the default shuffle_budget, so shuffled batches are as random as a uniform "
                    "permutation's")
        return (f"{found} and each rank's {self.rank_rows:,} rows at world size {self.world_size} need "
                f"{self.windows} shuffle windows of the default shuffle_budget, so shuffled batches mix only "
                f"nearby row groups: {self.advice()}")

    def as_dict(self) -> dict:
        return {"clustered": self.clustered, "world_size": self.world_size, "rank_rows": self.rank_rows,
                "window_rows": self.window_rows, "windows": self.windows, "matters": self.matters}


def _footers(plan: ShardPlan) -> list[pq.FileMetaData]:
    paths = sorted({g.path for g in plan.catalog.row_groups})[:SAMPLE_FILES]
    filesystem, root = plan.location.filesystem, plan.location.root

    def footer(path):
        return footer_at(filesystem, fsutil.join(root, path))

    with ThreadPoolExecutor(max(1, min(8, len(paths)))) as pool:
        return list(pool.map(footer, paths))


def stored_order(plan: ShardPlan) -> dict[str, float]:
    """``{column: spread}`` of the columns the plan's first files store in order (``quality.clustered_columns``)."""
    finding = find_stored_order(plan)
    return {} if finding is None else finding.clustered


def find_stored_order(plan: ShardPlan, world_size: int | None = None,
                      batch_size: int | None = None) -> StoredOrder | None:
    """The plan's stored order, for ``world_size`` ranks (default: the plan's); None when no footer could be read
    or the plan is empty (a check that informs: planning itself already read these footers)."""
    try:
        footers = _footers(plan)
    except (OSError, pa.ArrowException):
        return None
    if not footers:
        return None
    world = world_size or plan.world_size
    batch = batch_size or plan.batch_size or 1
    rank_rows = plan.rows_per_rank(world, batch)
    try:
        schema = footers[0].schema.to_arrow_schema()
    except (pa.ArrowException, ValueError):
        return None
    row = row_bytes(schema, footers) + EXTRA_ROW_BYTES
    window = budget_window(DEFAULT_BUDGET, row, batch)
    return StoredOrder(clustered_columns(value_ranges(footers)), world, rank_rows, window, row)


def warn_stored_order(plan: ShardPlan) -> dict[str, float]:
    """Warn (``ShuffleQualityWarning``) when the plan's rows are stored in order and, at its world size and batch
    size, a rank's rows need more than one default shuffle window; returns the columns found in order."""
    finding = find_stored_order(plan)
    if finding is None:
        return {}
    if finding.matters:
        warnings.warn(ShuffleQualityWarning(finding.describe()), stacklevel=3)
    return finding.clustered
