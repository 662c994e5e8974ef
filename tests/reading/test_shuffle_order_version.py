"""The shuffled windows' row order is versioned in the loader state (``state['layout']['shuffle_order']``), as the
cost arrangement is: version 2 (``core/fisher_yates.py``) deals other batches than version 1 (the stable sort of
48-bit words), so a position saved under 1 (or before states recorded the order) is refused mid-epoch, naming the
fix, and loads at an epoch's first batch; a mixture's, where every source stands at a pass start."""
from unittest import mock

import numpy as np
import pytest

from petastorm_balanced import make_loader, plan_shards
from petastorm_balanced.core import shuffle
from petastorm_balanced.errors import InvalidValueError
from petastorm_balanced.reading import state as loader_state
from tests.core.test_cost import cost_plan, lengths  # noqa: F401  (module fixtures)

KEY = loader_state.SHUFFLE_ORDER


@pytest.fixture(scope="module")
def plan(lengths):  # noqa: F811
    return plan_shards(lengths, 3, batch_size=8, engine="local")


def ids(loader):
    return [b["id"].tolist() for b in loader]


def _v1_state(plan, batches, keep_key, **kwargs):
    """A v1 loader's state after ``batches`` batches of epoch 0, as a release with the key saves it, or as one
    before states recorded it (the key absent)."""
    with mock.patch.object(shuffle, "ORDER_VERSION", 1):
        loader = make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow", **kwargs)
        it = iter(loader)
        for _ in range(batches):
            next(it)
        state = loader.state_dict()
    assert state["layout"][KEY] == 1
    if not keep_key:
        del state["layout"][KEY]
    return state


def test_shuffled_loaders_record_the_order_and_v1_deals_other_batches(plan, cost_plan):  # noqa: F811
    loader = make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow")
    assert loader.state_dict()["layout"][KEY] == shuffle.ORDER_VERSION == 2
    with mock.patch.object(shuffle, "ORDER_VERSION", 1):
        old = ids(make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow"))
    new = ids(loader)
    assert new != old, "v1 and v2 deal other batches (why the version is recorded)"
    assert sorted(sum(new, [])) == sorted(sum(old, [])), "the same rows in the epoch"
    assert KEY not in make_loader(0, 3, plan=plan, shuffle=False, backend="arrow").state_dict()["layout"]
    # a cost balance arranges its windows by its own rule (recorded as cost_arrangement)
    assert KEY not in make_loader(0, 3, plan=cost_plan, shuffle_window=64, backend="arrow").state_dict()["layout"]


@pytest.mark.parametrize("keep_key", [False, True])
def test_v1_state_mid_epoch_is_refused_naming_the_fix(plan, keep_key):
    state = _v1_state(plan, 3, keep_key)
    loader = make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow")
    with pytest.raises(InvalidValueError, match=r"shuffle_order.*version 2.*Finish that epoch.*batches'\] = 0"):
        loader.load_state_dict(state)
    state["batches"] = 0  # the fix the message names: the epoch starts again, under v2
    loader.load_state_dict(state)
    assert ids(loader) == ids(make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow"))


def test_v1_state_at_an_epoch_start_loads_and_continues_under_v2(plan):
    state = _v1_state(plan, 0, keep_key=False)
    state["epoch"] = 1
    loader = make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow")
    loader.load_state_dict(state)
    assert loader.state_dict()["layout"][KEY] == 2
    assert ids(loader) == ids(make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow", epoch=1))


def test_v2_state_mid_epoch_resumes_exactly(plan):
    expected = ids(make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow"))
    loader = make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow")
    it = iter(loader)
    for _ in range(5):
        next(it)
    again = make_loader(0, 3, plan=plan, shuffle_window=64, backend="arrow")
    again.load_state_dict(loader.state_dict())
    assert ids(again) == expected[5:]


def test_mixture_state_without_the_order_is_refused_inside_a_pass(plan, lengths):  # noqa: F811
    plans = [plan, plan_shards(lengths, 3, batch_size=8, engine="local", seed=3)]
    mixture = make_loader(0, 3, plan=plans, weights=[1, 1], shuffle_window=64, backend="arrow")
    it = iter(mixture)
    for _ in range(3):
        next(it)
    state = mixture.state_dict()
    assert state["layout"][KEY] == 2
    del state["layout"][KEY]
    again = make_loader(0, 3, plan=plans, weights=[1, 1], shuffle_window=64, backend="arrow")
    with pytest.raises(InvalidValueError, match=r"shuffle_order.*absent.*\[pass, 0\]"):
        again.load_state_dict(state)
    state["mixture"]["sources"] = [[entry[0], 0] for entry in state["mixture"]["sources"]]
    again.load_state_dict(state)  # every source at a pass start: nothing of their windows served
    assert again.state_dict()["layout"][KEY] == 2
    assert np.all([len(b["id"]) == 8 for b in again])
