"""How many rows a loader's shuffle windows hold, and where a slot keeps them: what ``shuffle_budget``,
``shuffle_spill_dir`` and ``shuffle_spill_budget`` decide.

The rows of a window are part of the delivery order, of resume by arithmetic (G6) and of the elastic arithmetic
(G10): they must come out the same on every rank, in every DataLoader worker and in every resumed run, with no
communication. So they are computed here from the plan and the options alone (the footers' decoded bytes per row),
never from what one process happened to read, and never from row groups another rank reads (G3: a rank reads only
its own share, so a corrupt or slow file elsewhere cannot stop it). Footers undercount what a window holds (a
dictionary-encoded column stores an index per row, not its strings), so where a window's rows then wait is decided
by measuring: a ``spill.Placement`` counts the decoded bytes the slot's window actually holds as it fills, keeps
them in memory up to the slot's budget and sends the rest to local disk. It moves bytes, never rows.

Memory bound: a rank holds its ``shuffle_budget`` (each of K DataLoader workers a K-th of it) plus a constant
(docs/shuffle.md gives the measured figure). The window's share of the budget is ``1 / WINDOW_COPIES``, the rest
covering the reader's prefetch, the run being gathered and the batches handed out.
"""
from __future__ import annotations

import tempfile

from ...core.shuffle import WINDOW_COPIES, budget_window, spill_window
from .spill import Placement, SpillFolder

EXTRA_ROW_BYTES = 9.0  # the padding flag and the cost column the batcher carries beside the dataset's columns


def row_bytes(plan, columns) -> float:
    """Decoded bytes per row for sizing windows: the footers' estimate (the memory bound is the placement's)."""
    return float(columns.row_bytes) + EXTRA_ROW_BYTES


def window_rows(plan, columns, options, batch_rows: int, rank_rows: int) -> tuple[int, float]:
    """(rows per window, decoded bytes per row) for a loader without ``shuffle_window``: the memory budget's
    window, or with a spill folder a rank's whole share within ``shuffle_spill_budget`` (each slot's share is at
    most its rank's, so each slot then delivers one window per epoch)."""
    row = row_bytes(plan, columns)
    rows = budget_window(int(options.shuffle_budget), row, batch_rows)
    if options.shuffle_spill_dir not in (None, False):
        rows = max(rows, spill_window(int(options.shuffle_spill_budget), row, batch_rows, rank_rows))
    return rows, row


def spill_folder(options) -> str | None:
    """Where windows go beyond memory: the folder given, the system temp folder by default (only rows larger
    than measured go there then), None with ``shuffle_spill_dir=False``."""
    if options.shuffle_spill_dir is False:
        return None
    return tempfile.gettempdir() if options.shuffle_spill_dir is None else str(options.shuffle_spill_dir)


def placement(options, num_workers: int = 1, *, sources: int = 1, disk: int | None = None) -> Placement | None:
    """A slot's placement: a ``num_workers``-th of the rank's window memory and of its spill budget. A mixture's
    source (``sources``: how many share the rank's window memory; ``disk``: the source's part of the spill budget)
    takes the same rule, so its windows overflow to the same folder (the system temp folder by default)."""
    base = spill_folder(options)
    if base is None or not options.shuffle:
        return None
    workers = max(1, num_workers)
    memory = int(options.shuffle_budget) // WINDOW_COPIES // max(1, sources) // workers
    spill = int(options.shuffle_spill_budget) if disk is None else int(disk)
    return Placement(memory, SpillFolder(base), spill // workers)
