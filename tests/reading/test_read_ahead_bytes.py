"""Read-ahead bundles sized from the decoded bytes measured on this slot's reads (``reading/rows/read_ahead.py``): where
rows grow far beyond what the footers and the bundles read so far said, no bundle holds more than its limit plus
one fragment (the rest of it is read fragment by fragment), and the rows delivered are ``pyarrow.dataset``'s, in
plan order, whatever the bundles' cut."""
from unittest import mock

import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.reading.backends import arrow
from petastorm_balanced.reading.rows import fragments, read_ahead
from tests.reading.test_spill import late_long_strings

STRING, TARGET = 4096, 1 << 20


@pytest.fixture(scope="module")
def growing(tmp_path_factory):
    """Short strings in the first 8 files, 4 KB ones in the 8 after (a row group of those: 1 MB, the target)."""
    return late_long_strings(tmp_path_factory.mktemp("grow") / "ds", files=16, short_files=8, row_group_size=250)


@pytest.mark.parametrize("workers", [1, 2])
def test_no_bundle_holds_more_than_its_limit_plus_a_fragment_where_rows_grow(growing, workers):
    plan = plan_shards(growing, 1, batch_size=50, engine="local")
    held, cut = [], []
    real_until, real_bundles = arrow._until, read_ahead.BundleSizes.bundles

    def until(limit, tables):
        out = real_until(limit, tables)
        held.append((sum(t.get_total_buffer_size() for t in out), max(t.get_total_buffer_size() for t in out)))
        return out

    def bundles(self, todo):
        for bundle in real_bundles(self, todo):
            cut.append(len(bundle))
            yield bundle
    with mock.patch.object(fragments, "BUNDLE_BYTES", TARGET), mock.patch.object(arrow, "_until", until), \
            mock.patch.object(read_ahead.BundleSizes, "bundles", bundles):
        with make_loader(0, 1, plan=plan, backend="arrow", batch_format="numpy", shuffle=False,
                         workers_count=workers) as loader:
            delivered = [b for b in loader]
    limit = read_ahead.LIMIT_FACTOR * TARGET
    assert all(total <= limit + largest for total, largest in held), held
    assert max(total for total, _ in held) > STRING * 250  # the long rows were read, in bundles of several
    assert max(cut) > 4  # bundles of several fragments where rows are short
    with mock.patch.multiple(fragments, BUNDLE_BYTES=0, BUNDLE_ROWS=1):  # one fragment a bundle
        with make_loader(0, 1, plan=plan, backend="arrow", batch_format="numpy", shuffle=False,
                         workers_count=workers) as loader:
            one_by_one = [b for b in loader]
    assert [b["id"].tolist() for b in delivered] == [b["id"].tolist() for b in one_by_one]
    assert [list(b["text"]) for b in delivered] == [list(b["text"]) for b in one_by_one]
    table = ds.dataset(growing).to_table()
    expected = dict(zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True))
    ids = [i for b in delivered for i in b["id"].tolist()]
    texts = [t for b in delivered for t in b["text"]]
    assert sorted(ids) == sorted(expected) and all(expected[i] == t for i, t in zip(ids, texts, strict=True))


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.integers(1, 50), min_size=1, max_size=40), measures=st.lists(st.integers(1, 10_000)),
       first=st.integers(1, 100))
def test_bundles_cover_every_fragment_once_in_order(rows, measures, first):
    """Whatever is measured between two cuts, the bundles are the fragments in order, each once, none empty."""
    class Fragment:
        def __init__(self, n):
            self.num_rows = n
    todo = [Fragment(n) for n in rows]
    sizes = read_ahead.BundleSizes(target=1_000, first_rows=first)
    out, pending = [], list(measures)
    for bundle in sizes.bundles(todo):
        assert bundle
        out.extend(bundle)
        if pending:
            sizes.measure(rows=sum(f.num_rows for f in bundle), nbytes=pending.pop())
    assert out == todo
