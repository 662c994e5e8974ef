"""The window shuffle rule (``core/shuffle.py``): one permutation per window, the same whichever sort computes it,
and the same as its plain first form (so a saved position resumes across releases and NumPy versions)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.core import shuffle, sorting
from tests.support.reference_orders import v1_permutation
from tests.support.strategies import shuffle_keys


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 70_000) | st.sampled_from([1, 2, 2**16 - 1, 2**16, 2**16 + 1]), key=shuffle_keys)
def test_both_window_sorts_give_the_v1_permutation(n, key):
    """The radix passes (NumPy 1 up to 2**16 rows) and the one sort of packed keys (NumPy 2, and any NumPy beyond
    2**16 rows) are two ways to one permutation: the plain v1 reference's, on either side of the 2**16 boundary."""
    words = shuffle.raw_words(key, n)
    expected = v1_permutation(n, key)
    assert np.array_equal(sorting._by_radix(words), expected)
    bits = max(1, (n - 1).bit_length())
    assert np.array_equal(sorting._by_packed_keys(words, bits), expected)
    if n <= 2**16:
        assert np.array_equal(sorting._by_top_digit(words), expected)
    assert np.array_equal(shuffle.window_permutation(n, key), expected)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2**16 + 1, 300_000), distinct=st.integers(1, 5_000), data=st.data())
def test_packed_keys_put_rows_whose_top_bits_tie_in_the_stable_order(n, distinct, data):
    """Beyond 2**16 rows the packed key holds only the top bits of each 48-bit word; rows that tie there (rare in
    PCG64 words, forced here by few distinct words, some equal in all 48 bits) still come in the stable sort's
    order: by the whole word, then by row."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    top = rng.integers(0, distinct, n).astype(np.uint64) << np.uint64(40)
    words = top | rng.integers(0, data.draw(st.sampled_from([1, 4, 2**20])), n).astype(np.uint64)
    words |= rng.integers(0, 2**16, n).astype(np.uint64) << np.uint64(48)  # bits above 48 are not part of the key
    bits = max(1, (n - 1).bit_length())
    expected = np.argsort(words & np.uint64(2**48 - 1), kind="stable")
    assert np.array_equal(sorting._by_packed_keys(words, bits), expected)
    assert np.array_equal(sorting._by_radix(words), expected)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 2**16), distinct=st.integers(1, 300), data=st.data())
def test_top_digit_sort_puts_tied_rows_in_the_stable_order(n, distinct, data):
    """The top-digit pass leaves rows that share their top 16 bits to a second sort; with few distinct top digits
    (forced here; most rows tie, some in all 48 bits) they still come by the whole word, then by row."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    words = rng.integers(0, distinct, n).astype(np.uint64) << np.uint64(32)
    words |= rng.integers(0, data.draw(st.sampled_from([1, 3, 2**32])), n).astype(np.uint64)
    words |= rng.integers(0, 2**16, n).astype(np.uint64) << np.uint64(48)  # bits above 48 are not part of the key
    expected = np.argsort(words & np.uint64(2**48 - 1), kind="stable")
    assert np.array_equal(sorting._by_top_digit(words), expected)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2**17, 400_000), distinct=st.integers(1, 5_000), low=st.sampled_from([1, 4, 2**20, 2**40]),
       data=st.data())
def test_bucket_sort_gives_the_stable_order(n, distinct, low, data):
    """From 2**17 rows on, rows are put in buckets by their word's top bits, then each bucket is sorted: with few
    distinct top bits (forced here: whole windows in one bucket, or rows equal in all 48 bits) and with PCG64's own
    words, the rows still come by the whole 48-bit word, then by row, as the v1 permutation orders them."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    words = rng.integers(0, distinct, n).astype(np.uint64) << np.uint64(40)
    words |= rng.integers(0, low, n).astype(np.uint64)
    words |= rng.integers(0, 2**16, n).astype(np.uint64) << np.uint64(48)  # bits above 48 are not part of the key
    bits = max(1, (n - 1).bit_length())
    assert np.array_equal(sorting._by_buckets(words, bits), np.argsort(words & np.uint64(2**48 - 1), kind="stable"))
    key = (data.draw(st.integers(0, 2**31)), 1, 0, 0, 2)
    assert np.array_equal(shuffle.window_permutation(n, key), v1_permutation(n, key))
