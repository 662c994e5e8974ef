"""``CostOptions``: how a loader arranges each shuffle window by cost, fixed-size batches (``arrangement.py``) or
batches under a token budget (``budget.py``), and where a slot resumes under a budget."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import InvalidValueError
from ..packing import Packing
from ..shuffle import StartPoint
from .arrangement import ARRANGEMENT_VERSION, ARRANGEMENTS
from .budget import arrange_budget, budget_batches


@dataclass(frozen=True)
class CostOptions:
    """How a loader arranges batches by cost; built once, from the loader's checked arguments, by
    ``reading/source/resolve.resolve_cost``."""

    cost: str  # the plan's cost text
    column: str  # the source column the loader reads to compute it
    function: str | None
    reduce: str  # "sum" | "max"
    budget: int | None = None  # max_batch_cost: batches of varying rows
    mean_cost: float = 0.0  # the plan's cost per matching row (token budgets)
    version: int = ARRANGEMENT_VERSION  # of the fixed-size arrangement (``arrangement.ARRANGEMENTS``)
    pack: Packing | None = None  # packed sequences (``core/packing.py``): a window's steps from its rows

    @property
    def per_window(self) -> bool:
        """Whether each window decides its own steps (a token budget, or packing) rather than fixed-size batches."""
        return self.budget is not None or self.pack is not None

    def arrange(self, costs: np.ndarray, batch_size: int | None, key: Sequence[int]):
        """``(order, lengths)`` for one window: lengths is None for fixed-size batches."""
        if self.pack is not None:
            return self.pack.arrange(costs, key)
        if self.budget is not None:
            return arrange_budget(costs, budget_batches(len(costs), self.mean_cost, self.budget), self.budget, key)
        if batch_size is None:
            raise AssertionError("fixed-size cost batches need a batch_size")
        return ARRANGEMENTS[self.version][self.reduce].run(costs, batch_size, key), None

    def budget_steps(self, rows: int, window_rows: int) -> int:
        """Batches of a slot of ``rows`` rows under the budget (or packing): the same on every rank with the same
        rows."""
        return int(sum(self._window_steps(rows, window_rows)))

    def _window_steps(self, rows: int, window_rows: int) -> list[int]:
        """Steps of each window of a slot of ``rows`` rows (the last window may be shorter)."""
        full, rest = divmod(rows, window_rows)
        sizes = [window_rows] * full + ([rest] if rest else [])
        if self.pack is not None:
            return [self.pack.steps_of_window(i, size) for i, size in enumerate(sizes)]
        if self.budget is None:  # the budget_* methods serve max_batch_cost and packing loaders only
            raise AssertionError("a budget method called on fixed-size cost batches (max_batch_cost=None)")
        budget = self.budget
        return [budget_batches(size, self.mean_cost, budget) for size in sizes]

    def budget_start(self, rows: int, window_rows: int, fragment_rows: np.ndarray, batches_done: int) -> StartPoint:
        """Where a slot resumes under the budget: the start of the window holding batch ``batches_done``;
        ``skip_rows`` then counts *batches* of that window to drop."""
        starts = np.r_[0, np.cumsum(self._window_steps(rows, window_rows), dtype=np.int64)]  # (windows + 1,)
        steps = int(starts[-1])
        if batches_done < 0 or batches_done > steps:
            raise InvalidValueError(f"batches_done={batches_done} is outside this slot's {steps} batches")
        window = len(starts) - 1 if batches_done == steps else int(np.searchsorted(starts, batches_done, "right")) - 1
        row = min(window * window_rows, rows)
        ends = np.cumsum(np.asarray(fragment_rows, dtype=np.int64))
        fragment = int(np.searchsorted(ends, row, side="right"))
        offset = row - (int(ends[fragment - 1]) if fragment else 0)
        return StartPoint(fragment, offset, window, row, batches_done - int(starts[window]))
