"""How far batches are from i.i.d. samples of the epoch's rows: pure numpy over the values of one column.

The measure is the total variation distance between a batch's histogram of the column and the histogram of all
the rows the batches came from, averaged over batches. A batch of ``n`` rows drawn from a uniform random
permutation is not at distance 0 (sampling noise), so every figure is read against that baseline: the same
batches' sizes cut from a seeded permutation of the same values. A ratio near 1 means the batches are as random as
``DistributedSampler``'s; data stored sorted by the column and shuffled in small windows gives ratios of 3 to 4.

>>> import numpy as np
>>> values = np.repeat(np.arange(4), 8)        # stored sorted: 4 labels, 8 rows each
>>> sorted_batches = values.reshape(4, 8)      # unshuffled: every batch holds one label
>>> float(mean_tv(sorted_batches, values))
0.75
>>> float(mean_tv(uniform_batches(values, 8, seed=0), values)) < 0.75
True
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def batch_tvs(batches: Sequence[np.ndarray], reference: np.ndarray) -> np.ndarray:
    """TV distance of each batch's histogram from ``reference``'s (both arrays of the same column's values)."""
    distinct, counts = np.unique(reference, return_counts=True)
    target = counts / counts.sum()
    out = np.empty(len(batches))
    for i, batch in enumerate(batches):
        hist = np.bincount(np.searchsorted(distinct, np.asarray(batch)), minlength=len(distinct)) / len(batch)
        out[i] = 0.5 * np.abs(hist - target).sum()
    return out


def mean_tv(batches: Sequence[np.ndarray], reference: np.ndarray) -> float:
    return float(batch_tvs(batches, reference).mean()) if len(batches) else 0.0


def mean_distinct(batches: Sequence[np.ndarray]) -> float:
    """Distinct values per batch, averaged."""
    return float(np.mean([len(np.unique(b)) for b in batches])) if len(batches) else 0.0


def uniform_batches(values: np.ndarray, batch_size: int, seed: int = 0) -> list[np.ndarray]:
    """Whole batches of ``batch_size`` cut from a seeded uniform permutation of ``values``: the baseline."""
    permuted = np.random.default_rng([seed, 0x5EED]).permutation(np.asarray(values))
    whole = len(permuted) // batch_size * batch_size
    return list(permuted[:whole].reshape(-1, batch_size))


@dataclass(frozen=True)
class Quality:
    """Mean batch TV of some batches and of the uniform baseline with the same batch size, and their ratio."""

    tv: float
    uniform_tv: float
    distinct: float
    uniform_distinct: float
    batches: int

    @property
    def ratio(self) -> float:
        return self.tv / self.uniform_tv if self.uniform_tv else float("inf")

    @classmethod
    def of(cls, batches: Sequence[np.ndarray], reference: np.ndarray, seed: int = 0) -> Quality:
        """The quality of ``batches`` (equal sizes) against batches of that size cut from a permutation of
        ``reference``."""
        size = len(batches[0]) if len(batches) else 1
        uniform = uniform_batches(reference, size, seed)
        return cls(mean_tv(batches, reference), mean_tv(uniform, reference), mean_distinct(batches),
                   mean_distinct(uniform), len(batches))


CLUSTERED_SPREAD = 0.5  # a column whose row groups each span less than this share of its range is stored in order


def clustered_columns(ranges: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                      threshold: float = CLUSTERED_SPREAD) -> dict[str, float]:
    """``{column: spread}`` of the columns stored sorted or clustered, by their row groups' min/max statistics.

    ``spread`` is the rows-weighted mean of each row group's ``(max - min)`` over the column's whole range: about
    1 when rows are stored in random order (every row group spans the range), ``1 / row groups`` when they are
    sorted by the column. A batch can only mix rows that share its shuffle window, so on such a column batches are
    far from i.i.d. unless a window holds rows from across the range.

    >>> import numpy as np
    >>> sorted_ranges = (np.array([0., 25, 50, 75]), np.array([24., 49, 74, 99]), np.array([10, 10, 10, 10]))
    >>> clustered_columns({"label": sorted_ranges})
    {'label': 0.2424}
    """
    out = {}
    for name, (mins, maxs, rows) in ranges.items():
        if len(mins) < 2:
            continue
        width = float(maxs.max() - mins.min())
        if width <= 0:
            continue
        spread = float(np.average((maxs - mins) / width, weights=np.maximum(rows, 1)))
        if spread < threshold:
            out[name] = round(spread, 4)
    return out
