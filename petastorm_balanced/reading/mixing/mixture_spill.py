"""A mixture's shuffle windows with a spill folder (``shuffle_spill_dir``): each source's window on local disk.

Why: without a folder the memory budget is shared by the sources, so each source's window is a fraction of what one
plan would get, and on data stored sorted a source's rows in a batch come from a few of its row groups. With a
folder each source's window is sized as one plan's is (``window_budget.window_rows``): the source's whole share of a
pass on this rank where the spill budget holds it. The spill budget is shared by the sources (each takes what its
share needs, up to an equal part of what is left, the smallest needs first, so no byte of it is left unused while a
source wants more); the memory budget is shared equally, as without a folder. The windows come from the plans and
the options alone, the same on every rank, DataLoader worker and resumed run (G6, G10), so they are part of the
state's identity. A source's rows are placed by the single plan's rule (``window_budget.placement``): memory up to
its share of the budget, the rest in its own folder, removed when its pass (the stream that read it) ends or is
closed; without a spill folder, as for one plan, that folder is under the system temp folder and holds only rows
larger than the footers said, within the source's equal part of ``shuffle_spill_budget``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from ...core.shuffle import spill_window
from ..windows.spill import Placement
from ..windows.window_budget import placement


def spilled(options) -> bool:
    """Whether ``options`` give a spill folder for shuffled windows."""
    return bool(options.shuffle) and options.shuffle_spill_dir not in (None, False)


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


def source_windows(memory_window: int, row_bytes: Sequence[float], rank_rows: Sequence[int],
                   spill_budget: int, whole: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(rows per window, spill bytes) of each source: the larger of the memory budget's window and what its share
    of ``spill_budget`` holds of its ``rank_rows`` (``row_bytes`` decoded bytes each). A source whose share fits
    gets a window of ``whole`` rows (its rows at world size 1): one window per pass on any world and any DataLoader
    worker, the same number on all of them, so an elastic resume keeps the windows (a slot holds only its rows)."""
    needs = [math.ceil(r * b) for r, b in zip(rank_rows, row_bytes, strict=True)]
    shares = spill_shares(needs, spill_budget)
    windows = tuple(max(memory_window, every if share >= need else spill_window(share, row, 1, rows))
                    for share, need, row, rows, every in zip(shares, needs, row_bytes, rank_rows, whole, strict=True))
    return windows, tuple(shares)


def source_placement(options, sources: int, spill_bytes: int, workers: int = 1) -> Placement | None:
    """Where one source's window holds its rows in one slot (a DataLoader worker's share of the rank's): memory up
    to its part of the window memory, the rest in a folder of its own under the spill folder (the system temp
    folder without ``shuffle_spill_dir``, as for one plan: only rows larger than measured go there then); None with
    ``shuffle_spill_dir=False`` or unshuffled."""
    return placement(options, workers, sources=sources, disk=spill_bytes)
