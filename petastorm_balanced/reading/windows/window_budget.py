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

A mixture (``mixture_windows``) shares the memory budget equally among its sources, so without a spill folder each
source's window is a fraction of what one plan would get, and on data stored sorted a source's rows in a batch come
from a few of its row groups. With a folder each source's window is sized as one plan's is: its whole share of a
pass on this rank where the spill budget holds it. The spill budget is shared by the sources (each takes what its
share needs, up to an equal part of what is left, the smallest needs first, so no byte of it is left unused while a
source wants more). A source's rows are placed by the single plan's rule (``placement``), within its share.
"""
from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence

from ...core.shuffle import WINDOW_COPIES, budget_window, spill_window
from .spill import Placement, SpillFolder


def spilled(options) -> bool:
    """Whether ``options`` give a spill folder for shuffled windows."""
    return bool(options.shuffle) and options.shuffle_spill_dir not in (None, False)


def memory_window(options, row_bytes: float, batch_rows: int, sources: int = 1) -> int:
    """Rows per window that the memory budget holds for rows of ``row_bytes`` decoded bytes (a mixture's
    ``sources`` share it)."""
    return budget_window(int(options.shuffle_budget) // sources, row_bytes, batch_rows)


def window_rows(options, row_bytes: float, batch_rows: int, rank_rows: int) -> int:
    """Rows per window for a loader without ``shuffle_window``: the memory budget's window, or shuffled with a
    spill folder a rank's whole share within ``shuffle_spill_budget`` (each slot's share is at most its rank's, so
    each slot then delivers one window per epoch). Unshuffled windows only group batches: the footers' estimate of
    ``row_bytes`` is enough."""
    rows = memory_window(options, row_bytes, batch_rows)
    if spilled(options):
        rows = max(rows, spill_window(int(options.shuffle_spill_budget), row_bytes, batch_rows, rank_rows))
    return rows


def mixture_windows(options, row_bytes: Sequence[float], rank_rows: Sequence[int], whole: Sequence[int]
                    ) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(the window a source's share of the memory budget holds, each source's window, each source's spill bytes) of
    a mixture whose sources have ``row_bytes`` decoded bytes per row and ``rank_rows`` rows per rank. With a spill
    folder each source's window is the larger of the memory window and what its share of the spill budget holds;
    a source whose share fits gets a window of ``whole`` rows (its rows at world size 1): one window per pass on any
    world and any DataLoader worker, the same number on all of them, so an elastic resume keeps the windows (a slot
    holds only its rows). Without one, each source's spill bytes are an equal part (rows larger than measured)."""
    sources, spill, given = len(row_bytes), int(options.shuffle_spill_budget), options.shuffle_window
    window = memory_window(options, max(row_bytes), 1, sources) if given is None else given
    if given is not None or not spilled(options):
        return window, (window,) * sources, (spill // sources,) * sources
    needs = [math.ceil(r * b) for r, b in zip(rank_rows, row_bytes, strict=True)]
    shares = spill_shares(needs, spill)
    windows = tuple(max(window, every if share >= need else spill_window(share, row, 1, rows))
                    for share, need, row, rows, every in zip(shares, needs, row_bytes, rank_rows, whole, strict=True))
    return window, windows, tuple(shares)


def spill_shares(needs: Sequence[float], budget: int) -> list[int]:
    """Each source's bytes of ``budget``: what it ``needs`` (its whole share), up to an equal part of what the
    sources with smaller needs left.

    >>> spill_shares([100, 10, 1000], 600)
    [100, 10, 490]
    """
    shares = [0] * len(needs)
    left = int(budget)
    for done, index in enumerate(sorted(range(len(needs)), key=lambda i: (needs[i], i))):
        shares[index] = min(int(needs[index]), left // (len(needs) - done))
        left -= shares[index]
    return shares


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
