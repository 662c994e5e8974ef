"""G13 owed by a shuffled copy: every column comes back from ``make_shuffled_copy`` with the Arrow type and the value
``pyarrow.dataset`` reads from the source, column type by column type (every kind of the conformance suite,
``tests/support/strategies.COLUMN_KINDS``, plus unsigned and zoned extremes), and a column Spark cannot give back
exactly is refused before Spark runs, naming it. Runs on both stacks (Spark 4.0 / pyarrow 14, Spark 4.3 / 26)."""
import datetime
import decimal
import os

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.io.exact_copy import check_copyable
from petastorm_balanced.spark import make_shuffled_copy
from tests.support.strategies import COLUMN_KINDS, NULL_FREE

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::petastorm_balanced.errors.ShuffleQualityWarning",
                                                           "ignore::FutureWarning")]

REFUSED = {"ts_ns": "nanoseconds", "time_us": "time of day", "time_s": "time of day"}  # Spark reads none of them
ROWS_PER_FILE = 12
# Values a draw seldom reaches, where a wrong conversion shows: unsigned maxima, dates and instants outside the
# nanosecond range (INT96 read at nanoseconds wraps there) and before the Gregorian switch (calendar rebasing)
EXTRA = {"u32": (pa.uint32(), [0, 2**32 - 1]), "u8": (pa.uint8(), [0, 255]),
         "ts_ms_ny": (pa.timestamp("ms", "America/New_York"), [-2**41, 2**41]),
         "ts_old": (pa.timestamp("us", "UTC"), [int(datetime.datetime(1500, 3, 1).timestamp()) * 10**6 - 1,
                                                int(datetime.datetime(3000, 1, 1).timestamp()) * 10**6 + 7]),
         "date_old": (pa.date32(), [datetime.date(1, 1, 1), datetime.date(9999, 12, 31)]),
         "dur_ns": (pa.duration("ns"), [-2**63 + 1, 2**63 - 1]),
         "dec_wide": (pa.decimal128(38, 0), [decimal.Decimal(10**38 - 1), decimal.Decimal(-(10**38 - 1))]),
         "u64_max": (pa.uint64(), [0, 2**64 - 1])}
COPIED = sorted(set(COLUMN_KINDS) - set(REFUSED))


def write_source(root, data) -> None:
    """Two hive partitions (``part=1``, ``part=-3``) of ``ROWS_PER_FILE`` rows each: every copied kind and the
    extremes, nulls in all but the null-free kinds."""
    for index, part in enumerate((1, -3)):
        ids = list(range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE))
        arrays = {"id": pa.array(ids, pa.int64())}
        for name in COPIED:
            kind, strategy, _ = COLUMN_KINDS[name]
            value = st.none() | strategy if name not in NULL_FREE else strategy
            arrays[name] = pa.array(data.draw(st.lists(value, min_size=len(ids), max_size=len(ids)), label=name),
                                    kind)
        for name, (kind, edges) in EXTRA.items():
            arrays[name] = pa.array([edges[i % len(edges)] if i % 3 else None for i in range(len(ids))], kind)
        folder = os.path.join(root, f"part={part}")
        os.makedirs(folder)
        pq.write_table(pa.table(arrays), os.path.join(folder, "data-0.parquet"), row_group_size=5)


@settings(max_examples=1, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(data=st.data())
def test_the_copy_keeps_every_type_and_value(spark, tmp_path_factory, data):
    root = tmp_path_factory.mktemp("copy-types")
    source = str(root / "source")
    write_source(source, data)
    converter = make_shuffled_copy(source, spark=spark, parent_cache_dir_url=str(root / "cache"), world_size=2,
                                   batch_size=4)
    want = pads.dataset(source, format="parquet", partitioning="hive").to_table().sort_by("id")
    got = pads.dataset(converter.dataset_url[len("file://"):], format="parquet",
                       partitioning="hive").to_table().sort_by("id")
    assert got.column_names == want.column_names
    for name in want.column_names:  # one by one, so a failure names the type
        assert got.schema.field(name).type == want.schema.field(name).type, name
        assert got.column(name).equals(want.column(name)), (name, got.column(name), want.column(name))
    files = [pq.ParquetFile(f) for f in pads.dataset(converter.dataset_url[len("file://"):]).files]
    assert sum(f.metadata.num_rows for f in files) == want.num_rows
    assert converter.plan.total_rows == want.num_rows
    again = make_shuffled_copy(source, spark=spark, parent_cache_dir_url=str(root / "cache"), world_size=2,
                               batch_size=4)
    assert again.dataset_url == converter.dataset_url  # written once: the types are restored before the commit


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_column_spark_cannot_give_back_is_refused_before_spark_runs(tmp_path, name):
    kind, strategy, _ = COLUMN_KINDS[name]
    source = tmp_path / "source"
    source.mkdir()
    pq.write_table(pa.table({"id": pa.array([0, 1], pa.int64()), name: pa.array([0, None], kind)}),
                   source / "part-0.parquet")

    class NoSpark:  # any use of the session means Spark ran
        def __getattr__(self, attribute):
            raise AssertionError(f"Spark was used: {attribute}")
    with pytest.raises(InvalidValueError, match=rf"column '{name}' .*{REFUSED[name]}.*table.cast"):
        make_shuffled_copy(str(source), spark=NoSpark(), parent_cache_dir_url=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()


def test_every_conformance_kind_is_copied_or_refused():
    """The copy's differential test covers every Arrow type the conformance suite covers."""
    assert set(COPIED) | set(REFUSED) == set(COLUMN_KINDS)
    for name in COPIED:
        check_copyable(pa.schema([pa.field(name, COLUMN_KINDS[name][0])]))
    for name, (kind, _) in EXTRA.items():
        check_copyable(pa.schema([pa.field(name, kind)]))
