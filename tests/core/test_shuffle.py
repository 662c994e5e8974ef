"""The window shuffle rule (``core/shuffle.py``): one permutation per window, the same whichever sort computes it,
and the same as its plain first form (so a saved position resumes across releases and NumPy versions)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.core import shuffle
from tests.support.reference_orders import v1_permutation
from tests.support.strategies import shuffle_keys


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 70_000) | st.sampled_from([1, 2, 2**16 - 1, 2**16, 2**16 + 1]), key=shuffle_keys)
def test_both_window_sorts_give_the_v1_permutation(n, key):
    """The radix passes (NumPy 1) and the one sort of unique keys (NumPy 2, windows up to 2**16 rows) are two ways
    to one permutation: the plain v1 reference's, on either side of the 2**16 boundary."""
    words = shuffle.raw_words(key, n)
    expected = v1_permutation(n, key)
    assert np.array_equal(shuffle._by_radix(words), expected)
    bits = max(1, (n - 1).bit_length())
    if bits <= 16:
        assert np.array_equal(shuffle._by_unique_keys(words, bits), expected)
    assert np.array_equal(shuffle.window_permutation(n, key), expected)
