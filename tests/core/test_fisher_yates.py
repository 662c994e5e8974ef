"""The shuffled windows' row order (``core/fisher_yates.py``, ``shuffle.row_order``, version 2): NumPy's
``Generator.permutation`` runs exactly the Fisher-Yates rule written out in Python, so the order is a function of
the key alone on every NumPy; a NumPy that drew otherwise is detected; the permutation is uniform."""
import hashlib
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.core import fisher_yates, shuffle
from tests.support.strategies import shuffle_keys


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000) | st.sampled_from([2**16 + 3]), key=shuffle_keys)
def test_numpy_runs_the_written_rule(n, key):
    order = shuffle.row_order(n, key)
    assert np.array_equal(order, fisher_yates.reference(n, key))
    assert np.array_equal(np.sort(order), np.arange(n))


def test_a_numpy_that_draws_otherwise_is_detected_and_the_rule_still_runs():
    """Were ``Generator.permutation`` to draw from the stream otherwise (here: the v1 sort of words, or one swap
    less), the import check would say so, and ``permutation`` then runs the written rule instead of NumPy's."""
    assert fisher_yates.draws_as_the_rule(fisher_yates.numpy_permutation) and fisher_yates.GENERATOR_IS_THE_RULE
    assert not fisher_yates.draws_as_the_rule(shuffle.window_permutation)

    def one_swap_less(n, key):
        order = fisher_yates.numpy_permutation(n, key)
        order[:2] = order[1::-1] if n > 1 else order[:2]
        return order
    assert not fisher_yates.draws_as_the_rule(one_swap_less)
    with mock.patch.object(fisher_yates, "GENERATOR_IS_THE_RULE", False), \
            mock.patch.object(fisher_yates, "numpy_permutation", one_swap_less):
        assert np.array_equal(shuffle.row_order(500, (1, 2, 3)), fisher_yates.reference(500, (1, 2, 3)))


def test_every_order_of_four_rows_is_equally_likely():
    """24,000 windows of 4 rows, one key each (as windows get): the 24 orders' counts pass a chi-square test at
    p < 1e-6 (statistic under 70 for 23 degrees of freedom; the keys are fixed, so this never flakes)."""
    counts: dict = {}
    for w in range(24_000):
        order = tuple(shuffle.row_order(4, (11, 0, 0, 0, w)).tolist())
        counts[order] = counts.get(order, 0) + 1
    assert len(counts) == 24
    observed = np.array(list(counts.values()), dtype=float)
    assert float(((observed - 1000.0) ** 2 / 1000.0).sum()) < 70


def test_each_row_lands_anywhere_in_a_large_window():
    """Row positions over 400 windows of 1,000 rows: every decile of positions gets each row's share (no row
    stays near its start, as a shuffle biased towards small moves would leave it)."""
    moved = np.concatenate([shuffle.row_order(1000, (3, 1, 0, 0, w)) - np.arange(1000) for w in range(400)])
    assert abs(float(np.mean(np.abs(moved))) - 333.0) < 5  # E|i - j| for i, j uniform in [0, 1000): n/3


def test_v2_orders_the_same_rows_on_every_stack_and_release():
    """A digest of v2's orders for fixed keys and sizes, the same on NumPy 1.26 and 2: a position saved under v2
    resumes in any release that holds v2, so v2 must never move a row (a change is a new version, recorded in the
    state as ``shuffle_order``)."""
    digest = hashlib.sha256()
    for n, key in ((1, (0, 0, 0, 0, 0)), (256, (9, 2, 3, 1, 7)), (70_001, (5, 0, 1, 2, 3)), (3, (2**40, 1, 0, 0))):
        digest.update(shuffle.row_order(n, key).astype(np.int64).tobytes())
    assert digest.hexdigest()[:16] == DIGEST


DIGEST = "3cf60b89af3eb41d"  # computed once, on NumPy 1.26.4 and 2.4.6 alike
