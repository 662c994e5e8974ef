"""Decoded bytes per row, measured on rows read the way the loader reads them, to size shuffle windows.

Why not the footers alone (``dataset_schema.row_bytes``): a footer counts a column's encoded bytes, and a
dictionary-encoded column stores one index per row, not its strings (4 KB strings drawn from 8 values weigh a few
bytes a row there, 4 KB in a window); and footers of the first files say nothing of the files after them.

Why a sample decided by the plan: the window's rows are part of the delivery order (``core/shuffle.py``), so every
rank, every DataLoader worker and every resumed run must compute the same number with no communication. The sample
is a function of the plan alone (row groups spread evenly over the whole catalog, in its path order, and the first
``SAMPLE_ROWS`` planned rows of each), and a plan refuses files whose content changed (G7, G15), so the bytes
decoded from it are the same wherever and whenever they are measured. What a sample still misses (one file of long
strings among thousands) cannot break the memory bound: a window counts the bytes it actually holds as it fills
and sends the rest to local disk (``spill_window.py``); only that window's placement, never its rows, depends on it.
"""
from __future__ import annotations

import numpy as np

from ..plan.model import Fragment, ShardPlan
from .backends.arrow import BundleReader
from .spill import nbytes

SAMPLE_ROW_GROUPS = 8  # row groups decoded, spread evenly over the catalog
SAMPLE_ROWS = 2048  # planned rows of each decoded (a row group is read whole, then cut: codecs run on these alone)


def sample_fragments(plan: ShardPlan, count: int = SAMPLE_ROW_GROUPS) -> list[Fragment]:
    """Up to ``count`` row groups spread evenly over the plan's catalog (first, last and between), a head of the
    planned rows of each: a function of the plan alone."""
    groups = plan.catalog.row_groups
    if not len(groups):
        return []
    picks = np.unique(np.linspace(0, len(groups) - 1, num=min(count, len(groups))).round().astype(np.int64))
    out = []
    for i in picks.tolist():
        match = groups[i]
        if match.matching_rows:
            out.append(Fragment(match.path, match.row_group, False, 0, 0, min(match.matching_rows, SAMPLE_ROWS),
                                match.total_rows, match.selection))
    return out


def measured_row_bytes(plan: ShardPlan, columns, *, count: int = SAMPLE_ROW_GROUPS) -> float:
    """The largest decoded bytes per row among the sampled row groups, as the window holds them (numpy arrays
    and Arrow arrays after ``fragments.to_columns``, masks included); 0.0 when the plan has no rows."""
    reader = BundleReader(plan, columns.spec, columns.fields, columns.schemas)
    fragments = sample_fragments(plan, count)
    # on a remote store the next row group's request is in flight while one is decoded (one round trip ahead,
    # not eight row groups held at once)
    started = [reader.start([f]) for f in fragments[:1]]
    largest = 0.0
    try:
        for i, fragment in enumerate(fragments):
            if i + 1 < len(fragments):
                started.append(reader.start([fragments[i + 1]]))
            decoded = reader.read(started.pop(0))
            largest = max(largest, sum(nbytes(values) for values in decoded.values()) / fragment.num_rows)
            del decoded
    finally:
        for begun in started:
            begun.cancel()
        reader.close()
    return largest
