"""Cost arrangement versions (G11 with G4, G6, G12): version 2 (``core/cost/one_sort.py``), the default, against
version 1 (``core/cost/arrangement.py``), and the loader state's record of the version.

Properties of v2: a permutation of the window (every row exactly once), a function of the costs and the key alone,
the same whichever sort computes it (NumPy 1's radix passes, NumPy 2's one sort), the same batches on every rank for
the same window (one stream drawn without the rank), the LPT bound of v1 up to the 16-bit load digits, and a
straggler ratio within a few percent of v1's. A position saved under v1 (or before states recorded the version)
is refused mid-epoch, naming the fix, and loads at an epoch's first batch.
"""
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.core.cost import arrangement, one_sort
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.reading import state as loader_state
from tests.core.test_cost import cost_plan, lengths  # noqa: F401  (module fixtures)
from tests.support.strategies import shuffle_keys

V2 = {"sum": one_sort.arrange_sum, "max": one_sort.arrange_max}
V1 = {"sum": arrangement.arrange_sum, "max": arrangement.arrange_max}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), k=st.integers(0, 40), batch=st.integers(1, 80), key=shuffle_keys,
       top=st.sampled_from([0, 3, 2**16 - 1, 2**16, 10**9, 2**62]), reduce=st.sampled_from(["sum", "max"]))
def test_v2_is_a_deterministic_permutation_on_every_sort(data, k, batch, key, top, reduce):
    """Every row exactly once; the same for the same costs and key, with the radix passes or the one sort (the two
    stacks' NumPy); batches beyond 64 rows take the sort-based shuffle inside batches."""
    costs = np.array(data.draw(st.lists(st.integers(0, top), min_size=k * batch, max_size=k * batch)), dtype=np.int64)
    orders = []
    for vector_sort in (False, True):
        with mock.patch.object(one_sort, "VECTOR_SORT", vector_sort):
            orders.append(V2[reduce](costs, batch, key))
    assert sorted(orders[0].tolist()) == list(range(k * batch))
    assert np.array_equal(orders[0], orders[1]), "the same order whichever sort computes it"
    assert np.array_equal(orders[0], V2[reduce](costs.copy(), batch, tuple(key))), "a function of costs and key"


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.integers(4, 60), batch=st.integers(2, 16),
       top=st.sampled_from([100, 10**4, 10**9]))
def test_v2_sum_keeps_the_lpt_bound(seed, k, batch, top):
    """Batches of a window cost the mean up to the largest row, as v1's (``test_sum_arrangement_evens_batches``),
    widened by the 16-bit load digits' rounding: ``largest row / (1 - 2**-15)``; ``top`` 10**9 spreads loads past
    2**16 (the digits' path), 100 keeps them below (the exact path)."""
    costs = np.random.default_rng(seed).integers(1, top, size=k * batch)
    sums = costs[one_sort.arrange_sum(costs, batch, (seed, 0, 0, 0, 0))].reshape(k, batch).sum(axis=1)
    spread = int(sums.max()) - int(sums.min())
    assert spread * 32767 <= int(costs.max()) * 32768
    if top == 100:  # loads below 2**16: the digits are exact, and so is v1's bound
        assert spread <= costs.max()


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_v2_same_window_same_batches_on_every_rank(reduce):
    """One stream drawn without the rank: equal windows give equal orders, so step t serves the same quantile."""
    costs = np.random.default_rng(3).integers(1, 500, size=64 * 16)
    assert np.array_equal(V2[reduce](costs, 16, (1, 2, 0, 0, 3)), V2[reduce](costs, 16, (1, 2, 7, 0, 3)))
    assert not np.array_equal(V2[reduce](costs, 16, (1, 2, 0, 0, 3)), V2[reduce](costs, 16, (1, 2, 0, 0, 4)))


def straggler(arrange, reduce, windows=12, ranks=8, rows=4096, batch=16):
    """Mean over steps of max / mean rank batch cost, lognormal lengths (sigma 1), as ``bench_cost.py`` measures."""
    rng = np.random.default_rng(11)
    ratios = []
    for window in range(windows):
        per_rank = []
        for rank in range(ranks):
            costs = np.maximum(1, np.round(np.exp(rng.normal(np.log(64), 1.0, rows)))).astype(np.int64)
            batches = costs[arrange(costs, batch, (5, 1, rank, 0, window))].reshape(-1, batch)
            per_rank.append(batches.sum(axis=1) if reduce == "sum" else batch * batches.max(axis=1))
        per_rank = np.array(per_rank, dtype=np.float64)
        ratios.append(np.mean(per_rank.max(axis=0) / per_rank.mean(axis=0)))
    return float(np.mean(ratios))


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_v2_balances_as_v1(reduce):
    """The straggler ratio stays within 2% of v1's (both about 1.02-1.03 here; random batches about 1.5)."""
    v1, v2 = straggler(V1[reduce], reduce), straggler(V2[reduce], reduce)
    assert v2 <= v1 * 1.02, (v1, v2)
    assert v2 < 1.06


def test_new_loaders_arrange_with_v2_and_record_it(cost_plan):  # noqa: F811
    from petastorm_balanced import make_loader
    loader = make_loader(0, 3, plan=cost_plan, shuffle_window=64, backend="arrow")
    assert loader.state_dict()["cost"][loader_state.COST_ARRANGEMENT] == arrangement.ARRANGEMENT_VERSION == 2
    with mock.patch.object(arrangement, "ARRANGEMENT_VERSION", 1):
        old = make_loader(0, 3, plan=cost_plan, shuffle_window=64, backend="arrow")
    ids, old_ids = [b["id"].tolist() for b in loader], [b["id"].tolist() for b in old]
    assert ids != old_ids, "v1 and v2 deal other batches (why the version is recorded)"
    assert sorted(sum(ids, [])) == sorted(sum(old_ids, [])), "the same rows in the epoch"


def _v1_state(plan, batches, keep_key):
    """A v1 loader's state after ``batches`` batches of epoch 0, as this release saves it (``keep_key``) or as a
    release before the version was recorded did (the key absent)."""
    from petastorm_balanced import make_loader
    with mock.patch.object(arrangement, "ARRANGEMENT_VERSION", 1):
        loader = make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow")
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = loader.state_dict()
    assert state["cost"][loader_state.COST_ARRANGEMENT] == 1
    if not keep_key:
        del state["cost"][loader_state.COST_ARRANGEMENT]
    return state


@pytest.mark.parametrize("keep_key", [False, True])
def test_v1_state_mid_epoch_is_refused_naming_the_fix(cost_plan, keep_key):  # noqa: F811
    from petastorm_balanced import make_loader
    state = _v1_state(cost_plan, 3, keep_key)
    loader = make_loader(0, 3, plan=cost_plan, shuffle_window=64, backend="arrow")
    with pytest.raises(InvalidValueError, match=r"cost_arrangement.*version 2.*Finish that epoch.*batches'\] = 0"):
        loader.load_state_dict(state)


def test_v1_state_at_an_epoch_start_loads_and_continues_under_v2(cost_plan):  # noqa: F811
    """Nothing of the epoch was arranged yet: it starts under v2, exactly as a fresh v2 loader's epoch."""
    from petastorm_balanced import make_loader
    state = _v1_state(cost_plan, 0, keep_key=False)
    state["epoch"] = 1
    loader = make_loader(0, 3, plan=cost_plan, shuffle_window=64, backend="arrow")
    loader.load_state_dict(state)
    assert loader.state_dict()["cost"][loader_state.COST_ARRANGEMENT] == 2
    fresh = make_loader(0, 3, plan=cost_plan, shuffle_window=64, backend="arrow", epoch=1)
    assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in fresh]


def test_v2_delivers_the_same_rows_on_every_stack_and_release():
    """A digest of v2's orders for fixed windows (ties, 16-bit and 64-bit costs, batches of 1 to 1,024 rows), the
    same on NumPy 1.26 and 2 with either sort: a position saved under v2 resumes in any release that holds v2, so
    v2 must never move a row (a change is a new version, recorded in the state)."""
    import hashlib
    digest = hashlib.sha256()
    rng = np.random.default_rng(5)
    for n, batch, top in ((20000, 16, 10000), (4096, 16, 2**20), (9600, 80, 100), (2048, 1024, 2**40), (1000, 1, 5),
                          (64, 16, 2**62)):
        costs = rng.integers(0, top, n, dtype=np.int64)
        for reduce in ("sum", "max"):
            digest.update(V2[reduce](costs, batch, (9, 2, 3, 1, 7)).astype(np.int64).tobytes())
    assert digest.hexdigest()[:16] == "bce8e081feb2f6b3"


def test_unshuffled_cost_loaders_record_no_arrangement(cost_plan):  # noqa: F811
    """Without shuffling no window is arranged (the plan's cost-dealt order): a state of one resumes under any
    version, so it records none."""
    from petastorm_balanced import make_loader
    loader = make_loader(0, 3, plan=cost_plan, shuffle=False, backend="arrow")
    it = iter(loader)
    expected = [next(it)["id"].tolist() for _ in range(4)]
    state = loader.state_dict()
    assert loader_state.COST_ARRANGEMENT not in state["cost"]
    state["batches"] = 2
    again = make_loader(0, 3, plan=cost_plan, shuffle=False, backend="arrow")
    again.load_state_dict(state)
    assert [b["id"].tolist() for b in again][:2] == expected[2:]
