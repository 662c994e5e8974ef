"""Hypothesis strategies shared by the test modules (one place, as pyarrow keeps them).

The balancer only ever sees catalog row groups with at least one matching row, so counts start at 1; sizes mix
tiny, medium and huge row groups because the interesting cases are a few huge groups among many small ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from petastorm_balanced.plan import balance

MAX_ROW_GROUP_ROWS = 100_000

#: Matching rows of one catalog row group: tiny, medium or huge, so skew is the norm.
row_group_counts = st.one_of(st.integers(1, 10), st.integers(1, 2_000), st.integers(1, MAX_ROW_GROUP_ROWS))

seeds = st.integers(0, 2**32 - 1)
epochs = st.integers(0, 10_000)


@dataclass(frozen=True)
class BalanceCase:
    """One call of ``balance.assign``: a catalog's matching counts and the job topology."""

    counts: np.ndarray
    world_size: int
    batch_size: int
    num_workers: int
    policy: str
    seed: int
    epoch: int

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def assign(self, **overrides) -> balance.Pieces:
        kwargs = dict(world_size=self.world_size, batch_size=self.batch_size, policy=self.policy, seed=self.seed,
                      epoch=self.epoch, num_workers=self.num_workers)
        kwargs.update(overrides)
        return balance.assign(self.counts, **kwargs)


@st.composite
def catalogs(draw, min_row_groups=1, max_row_groups=120):
    """Matching-row counts of a catalog, shape (row groups,), every entry >= 1."""
    counts = draw(st.lists(row_group_counts, min_size=min_row_groups, max_size=max_row_groups))
    return np.array(counts, dtype=np.int64)


@st.composite
def balance_cases(draw, min_row_groups=1, max_row_groups=120):
    """A catalog and a topology that can make at least one step (total >= world x batch).

    World and batch are drawn in their full ranges (1..64, 1..512) and then shrunk to fit small catalogs, which
    keeps the edge ``total`` just above ``world x batch`` frequent instead of rejecting it.
    """
    counts = draw(catalogs(min_row_groups, max_row_groups))
    total = int(counts.sum())
    world = min(draw(st.integers(1, 64)), total)
    batch = min(draw(st.integers(1, 512)), max(1, total // world))
    return BalanceCase(counts, world, batch, draw(st.integers(1, 8)), draw(st.sampled_from(balance.POLICIES)),
                       draw(seeds), draw(epochs))


@st.composite
def positions_in_row_group(draw, max_rows=5_000):
    """(sorted unique matching positions, total rows) of one row group, never empty.

    Masks are drawn as runs (long runs, short runs, scattered single rows) so every selection encoding wins
    sometimes.
    """
    total = draw(st.integers(1, max_rows))
    style = draw(st.sampled_from(["runs", "random", "single", "all"]))
    if style == "all":
        return np.arange(total, dtype=np.int64), total
    if style == "single":
        return np.array([draw(st.integers(0, total - 1))], dtype=np.int64), total
    if style == "random":
        rng = np.random.default_rng(draw(seeds))
        mask = rng.random(total) < draw(st.floats(0.01, 0.99))
    else:
        bounds = sorted(set(draw(st.lists(st.integers(0, total), min_size=1, max_size=40))) | {0, total})
        first = draw(st.booleans())
        mask = np.zeros(total, dtype=bool)
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            mask[lo:hi] = (i % 2 == 0) == first
    if not mask.any():
        mask[draw(st.integers(0, total - 1))] = True
    return np.flatnonzero(mask).astype(np.int64), total


# Catalog paths a forged plan might carry (G14): escapes, absolute paths, schemes, NULs, backslashes and empty or
# dot segments, mixed with ordinary names so that both sides of the rule are drawn.
_segments = st.one_of(st.sampled_from(["..", ".", "", "part-0.parquet", "a", "x=1", "c:", "\\..", "..\\x", "\x00",
                                       "s3:", "file:", "%2e%2e", "~"]),
                      st.text(st.characters(blacklist_categories=("Cs",)), max_size=6))
catalog_paths = st.one_of(
    st.lists(_segments, min_size=1, max_size=5).map("/".join),
    st.tuples(st.sampled_from(["/", "//", "s3://b/", "file:///", "hdfs://nn/", "C:\\", "../"]),
              st.lists(_segments, min_size=1, max_size=3).map("/".join)).map("".join))
