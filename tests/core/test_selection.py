"""Selection encodings: exact round trip, the plan size budget, and corrupt bytes refused, never misread."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from petastorm_balanced.core import selection
from petastorm_balanced.errors import PlanIntegrityError
from tests.support.strategies import positions_in_row_group

# The plan-size budget (docs/plan-format.md): about 1 bit per scanned row at random, plus a small constant (tag
# and padding byte).
RANDOM_BYTES_PER_ROW = 1 / 8
CONSTANT_BYTES = 2


@given(positions_in_row_group())
def test_round_trip_within_a_bitmap_size(case):
    """Exact round trip; whatever the mask, the chosen encoding costs at most one bit per row + the constant."""
    positions, total = case
    data = selection.encode(positions, total)
    decoded = selection.decode(data, total)
    assert decoded.dtype == np.int64 and np.array_equal(decoded, positions)
    assert len(data) <= total * RANDOM_BYTES_PER_ROW + CONSTANT_BYTES


@pytest.mark.parametrize("total", [1, 7, 8, 1000, 65_537, 1_000_000])
def test_random_half_mask_costs_one_bit_per_row(total):
    rng = np.random.default_rng(total)
    mask = rng.random(total) < 0.5
    mask[0] = True
    data = selection.encode(np.flatnonzero(mask), total)
    assert len(data) <= total * RANDOM_BYTES_PER_ROW + CONSTANT_BYTES
    assert np.array_equal(selection.decode(data, total), np.flatnonzero(mask))


@pytest.mark.parametrize("total", [10, 60_000, 1_000_000, 5_000_000_000])
def test_all_match_and_long_runs_cost_a_few_bytes(total):
    """All rows: zero bytes. One to three long runs: a few bytes, whatever the row group's size."""
    assert selection.encode(np.arange(min(total, 10)), 10) == b""
    if total <= 1_000_000:
        assert selection.encode(np.arange(total), total) == b""
    cuts = [total // 5, total // 3, total // 2, total * 2 // 3]
    # Runs as long as memory allows (up to a million rows each), at the same relative offsets for every size: a
    # billions-row group still round-trips through a few bytes, its last run's positions past 2**32 included.
    tail = total - min(total // 10, 1_000_000)
    runs = [(a, min(b, a + 1_000_000)) for a, b in ((cuts[0], cuts[1]), (cuts[2], cuts[3]), (tail, total))]
    positions = np.concatenate([np.arange(a, b) for a, b in runs])
    data = selection.encode(positions, total)
    assert len(data) <= 2 + 2 * len(runs) * 8
    assert np.array_equal(selection.decode(data, total), positions)
    single = np.array([total - 1])
    assert len(selection.encode(single, total)) <= 2 + 2 * 8


def test_empty_selection_is_not_encoded():
    with pytest.raises(ValueError, match="no matching row"):
        selection.encode(np.array([], dtype=np.int64), 10)


@given(st.binary(max_size=64), st.integers(1, 300))
def test_arbitrary_bytes_decode_to_valid_positions_or_plan_error(data, total):
    """Corrupt selections raise PlanIntegrityError; anything accepted is a valid, non-empty position set."""
    try:
        positions = selection.decode(data, total)
    except PlanIntegrityError:
        return
    assert positions.dtype == np.int64 and len(positions) >= 1
    assert np.all(np.diff(positions) > 0) and positions[0] >= 0 and positions[-1] < total


@given(positions_in_row_group(max_rows=2_000), st.data())
def test_mutated_encoding_is_refused_or_valid(case, data):
    """Flip, cut or extend a real encoding: never negative, out-of-range or unsorted positions."""
    positions, total = case
    encoded = bytearray(selection.encode(positions, total))
    action = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if action == "flip" and encoded:
        i = data.draw(st.integers(0, len(encoded) - 1))
        encoded[i] ^= data.draw(st.integers(1, 255))
    elif action == "truncate" and encoded:
        del encoded[data.draw(st.integers(0, len(encoded) - 1)):]
    else:
        encoded += data.draw(st.binary(min_size=1, max_size=9))
    try:
        decoded = selection.decode(bytes(encoded), total)
    except PlanIntegrityError:
        return
    assert len(decoded) >= 1 and np.all(np.diff(decoded) > 0) and decoded[0] >= 0 and decoded[-1] < total


@pytest.mark.parametrize("data", [
    b"R8" + np.array([2**63 + 5, 3], dtype="<u8").tobytes(),  # wraps negative if cast before bounding
    b"R8" + np.array([0, 2**63 - 1, 0, 2**63 - 1], dtype="<u8").tobytes(),  # sums overflow int64
    b"R2",  # no run at all
    b"R2" + np.array([5, 0], dtype="<u2").tobytes(),  # runs of zero rows
    b"B" + bytes(2),  # bitmap selecting nothing
    b"B" + bytes(1),  # bitmap too short
    b"R3" + bytes(4), b"X", b"R2\x00",
])
def test_known_corruptions_are_refused(data):
    with pytest.raises(PlanIntegrityError):
        selection.decode(data, 10)


@given(st.integers(1, 3000), st.floats(0.0, 1.0), st.integers(1, 64), st.integers(0, 2**32 - 1))
def test_encode_mask_is_encode_of_the_positions(total, density, run, seed):
    """``encode_mask`` (the planning shortcut) writes exactly ``encode``'s bytes, at every density and run length,
    the bitmap/runs border included (runs of ``run`` rows at ``density``)."""
    rng = np.random.default_rng(seed)
    mask = np.repeat(rng.random(-(-total // run)) < density, run)[:total]
    if not mask.any():
        with pytest.raises(ValueError, match="no matching row"):
            selection.encode_mask(mask)
        return
    assert selection.encode_mask(mask) == selection.encode(np.flatnonzero(mask), total)


@pytest.mark.parametrize("total", [1000, 1001, 70_000])
def test_encode_mask_at_the_bitmap_border(total):
    """Every run count from one to one per two rows: the border where runs stop beating the bitmap is crossed
    (for uint16 and uint32 runs) and ``encode_mask`` still writes ``encode``'s bytes."""
    for runs in sorted({*range(1, 300), *range(total // 40, total // 2, max(1, total // 2000))}):
        mask = np.zeros(total, dtype=bool)
        mask[np.linspace(0, total - 2, runs).astype(np.int64) // 2 * 2] = True
        assert selection.encode_mask(mask) == selection.encode(np.flatnonzero(mask), total), runs
