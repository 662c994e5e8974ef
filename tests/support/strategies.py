"""Hypothesis strategies shared by the test modules (one place, as pyarrow keeps them).

The balancer only ever sees catalog row groups with at least one matching row, so counts start at 1; sizes mix
tiny, medium and huge row groups because the interesting cases are a few huge groups among many small ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from petastorm_balanced.core import balance

MAX_ROW_GROUP_ROWS = 100_000

#: Matching rows of one catalog row group: tiny, medium or huge, so skew is the norm.
row_group_counts = st.one_of(st.integers(1, 10), st.integers(1, 2_000), st.integers(1, MAX_ROW_GROUP_ROWS))

seeds = st.integers(0, 2**32 - 1)
epochs = st.integers(0, 10_000)

#: A window's key (``shuffle.slot_key`` parts and a window number), words past 32 bits included.
shuffle_keys = st.tuples(*[st.integers(0, 2**32 - 1) | st.integers(2**32, 2**70)] * 5)


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
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            mask[lo:hi] = (i % 2 == 0) == first
    if not mask.any():
        mask[draw(st.integers(0, total - 1))] = True
    return np.flatnonzero(mask).astype(np.int64), total


# ------------------------------------------------------------------------------------ conformance (G13)
# Column kinds of the differential suite (tests/reading/test_conformance.py): Arrow type, a strategy for one non-null
# value, and the writers that take the kind as it is (polars and DuckDB rewrite some types; the oracle reads what they
# wrote).
def _column_kinds():
    import datetime
    import decimal

    import pyarrow as pa
    small = st.integers(-2**31, 2**31 - 1)
    text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=5)
    every = ("pyarrow", "polars", "duckdb")
    return {
        "i8": (pa.int8(), st.integers(-128, 127), every),
        "i64": (pa.int64(), st.integers(-2**63, 2**63 - 1), every),
        "u64": (pa.uint64(), st.integers(0, 2**64 - 1), every),
        "f32": (pa.float32(), st.floats(width=32, allow_nan=False), every),
        "f64": (pa.float64(), st.floats(allow_nan=False), every),
        "bool": (pa.bool_(), st.booleans(), every),
        "str": (pa.string(), text, every),
        "large_str": (pa.large_string(), text, ("pyarrow", "duckdb")),
        "bin": (pa.binary(), st.binary(max_size=4), every),
        "dict": (pa.dictionary(pa.int32(), pa.string()), st.sampled_from(["red", "green", "blue"]), every),
        "ts_utc": (pa.timestamp("us", "UTC"), st.integers(-2**50, 2**50), every),
        "ts_ns": (pa.timestamp("ns"), st.integers(-2**62, 2**62), ("pyarrow", "polars")),
        "date": (pa.date32(), st.integers(-100_000, 100_000).map(
            lambda d: datetime.date(1970, 1, 1) + datetime.timedelta(days=d)), every),
        "dur": (pa.duration("ms"), st.integers(-2**40, 2**40), ("pyarrow", "polars")),
        "time_us": (pa.time64("us"), st.integers(0, 86_400 * 10**6 - 1), ("pyarrow",)),
        "time_s": (pa.time32("s"), st.integers(0, 86_399), ("pyarrow",)),
        "date_ms": (pa.date64(), st.integers(-10**5, 10**5).map(lambda d: d * 86_400_000), ("pyarrow",)),
        "dec": (pa.decimal128(10, 2), st.decimals(-10**7, 10**7, places=2, allow_nan=False,
                                                  allow_infinity=False).map(decimal.Decimal), every),
        "list_i32": (pa.list_(pa.int32()), st.lists(st.one_of(st.none(), small), max_size=3), every),
        "large_list": (pa.large_list(pa.int64()), st.lists(st.integers(-2**63, 2**63 - 1), max_size=3),
                       ("pyarrow", "polars")),
        "ragged": (pa.list_(pa.list_(pa.int32())), st.lists(st.lists(small, max_size=3), max_size=3), every),
        "fixed": (pa.list_(pa.float32(), 2), st.lists(st.floats(width=32, allow_nan=False), min_size=2,
                                                       max_size=2), ("pyarrow",)),
        "struct": (pa.struct([("a", pa.int32()), ("b", pa.string())]),
                   st.fixed_dictionaries({"a": st.one_of(st.none(), small), "b": st.one_of(st.none(), text)}), every),
        "map": (pa.map_(pa.string(), pa.int32()), st.lists(st.tuples(st.sampled_from("abc"), small), max_size=2,
                                                           unique_by=lambda kv: kv[0]), ("pyarrow", "duckdb")),
    }


COLUMN_KINDS = _column_kinds()
NULL_FREE = ("fixed",)  # pyarrow 14 cannot write a fixed_size_list with null rows
PARTITION_VALUES = {"string": ["a/b", "50%", "x y", "ü", "1", None], "int": [1, 2, -3, 40, None]}


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of the conformance suite: a writer, columns and their per-file values, hive partitioning."""

    writer: str
    columns: tuple  # kind names
    files: tuple  # per file: dict of column name -> list of values (None = null); "id" unique over the dataset
    row_group_rows: tuple  # per file
    partition: str = ""  # "" (none), "string" or "int": a column "part" holding hive values


@st.composite
def dataset_specs(draw, writers=("pyarrow", "polars", "duckdb"), max_rows=40):
    writer = draw(st.sampled_from(writers))
    names = sorted(k for k, (_, _, allowed) in COLUMN_KINDS.items() if writer in allowed)
    columns = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=5, unique=True)))
    partition = draw(st.sampled_from(["", "string", "int"])) if writer in ("pyarrow", "duckdb") else ""
    sizes = draw(st.lists(st.integers(0 if writer == "pyarrow" else 1, max_rows // 2), min_size=1, max_size=4))
    if sum(sizes) < 8:
        sizes[0] += 8 - sum(sizes)
    files, next_id = [], 0
    for size in sizes:
        values = {"id": list(range(next_id, next_id + size))}
        next_id += size
        for name in columns:
            null_rate = 0.0 if name in NULL_FREE else draw(st.sampled_from([0.0, 0.0, 0.3, 1.0]))
            strategy = COLUMN_KINDS[name][1]
            values[name] = [None if draw(st.floats(0, 1)) < null_rate else draw(strategy) for _ in range(size)]
        if partition:
            choices = PARTITION_VALUES[partition]
            values["part"] = [draw(st.sampled_from(choices)) for _ in range(size)]
        files.append(values)
    if partition and all(v is None for f in files for v in f["part"]):
        files[0]["part"][0] = PARTITION_VALUES[partition][0]  # pyarrow.dataset cannot type an all-null column
    row_groups = tuple(draw(st.integers(1, 7)) for _ in sizes)
    return DatasetSpec(writer, columns, tuple(files), row_groups, partition)

# Catalog paths a forged plan might carry (G14): escapes, absolute paths, schemes, NULs, backslashes and empty or
# dot segments, mixed with ordinary names so that both sides of the rule are drawn.
_segments = st.one_of(st.sampled_from(["..", ".", "", "part-0.parquet", "a", "x=1", "c:", "\\..", "..\\x", "\x00",
                                       "s3:", "file:", "%2e%2e", "~"]),
                      st.text(st.characters(blacklist_categories=("Cs",)), max_size=6))
catalog_paths = st.one_of(
    st.lists(_segments, min_size=1, max_size=5).map("/".join),
    st.tuples(st.sampled_from(["/", "//", "s3://b/", "file:///", "hdfs://nn/", "C:\\", "../"]),
              st.lists(_segments, min_size=1, max_size=3).map("/".join)).map("".join))
