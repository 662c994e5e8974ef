"""G16 beyond the budget: a shuffled copy written once by Spark holds the same rows, every value equal, in an order
whose row groups are random samples, so even a small shuffle window gives random batches."""
import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from petastorm_balanced import plan_shards
from petastorm_balanced.core.quality import clustered_columns
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.io.stats import value_ranges
from petastorm_balanced.spark import make_shuffled_copy
from tests.reading.test_shuffle_quality import BATCH, labels, qualities, write

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::petastorm_balanced.errors.ShuffleQualityWarning")]


def test_a_shuffled_copy_has_every_row_and_random_batches_in_small_windows(spark, tmp_path):
    source = write(tmp_path / "sorted", row_group=600)
    cache = str(tmp_path / "cache")
    converter = make_shuffled_copy(source, spark=spark, parent_cache_dir_url=cache, world_size=2, batch_size=BATCH)
    original = ds.dataset(source).to_table().sort_by("id")
    copy = ds.dataset(converter.dataset_url).to_table().select(original.column_names).sort_by("id")
    assert copy.equals(original)  # the same rows, every value, no cast

    files = sorted(str(p) for p in ds.dataset(converter.dataset_url).files)
    assert "label" in clustered_columns(value_ranges(pq.ParquetFile(source + f"/part-{i}.parquet").metadata
                                                     for i in range(3)))
    assert "label" not in clustered_columns(value_ranges(pq.ParquetFile(f).metadata for f in files))

    reference = np.concatenate([b for r in labels(converter.plan, 2, shuffle_window=1_024) for b in r])
    rank, step = qualities(labels(converter.plan, 2, shuffle_window=1_024), reference)
    assert rank.ratio <= 1.15 and step.ratio <= 1.10, (rank, step)
    sorted_plan_rank, _ = qualities(labels(plan_shards(
        source, 2, batch_size=BATCH, engine="local"), 2, shuffle_window=1_024), reference)
    assert sorted_plan_rank.ratio > 2.0  # the same small window over the sorted original

    again = make_shuffled_copy(source, spark=spark, parent_cache_dir_url=cache, world_size=2, batch_size=BATCH)
    assert again.dataset_url == converter.dataset_url  # written once, reused
    other = make_shuffled_copy(source, spark=spark, parent_cache_dir_url=cache, seed=1, world_size=2,
                               batch_size=BATCH)
    assert other.dataset_url != converter.dataset_url


def test_a_petastorm_dataset_is_refused(spark, petastorm_dataset, tmp_path):
    with pytest.raises(InvalidValueError, match="Unischema"):
        make_shuffled_copy(petastorm_dataset.url, spark=spark, parent_cache_dir_url=str(tmp_path))
