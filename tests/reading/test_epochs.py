"""Epochs that frameworks cannot shift (``position.Position``), on any stack (Arrow backend).

Frameworks probe loaders with a bare ``iter()`` (Lightning), re-create iterators before ``set_epoch`` and abandon
them half-way. A model of the documented semantics (only delivered batches and ``set_epoch`` move the position;
``set_epoch(e)`` keeps a position just loaded for epoch ``e``) is run against the real loaders on random
sequences of those operations: every batch delivered must be the next one of the uninterrupted reference epoch,
and ``state_dict()`` must always name the epoch and batch that the next iteration serves.
"""
from itertools import islice

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from petastorm_balanced import BalancedIterableDataset, make_loader, plan_shards  # noqa: E402
from tests.support.resume_contract import fingerprint  # noqa: E402

BATCH = 700  # 20,000 rows over 2 ranks: a handful of steps, so each epoch is quick
EPOCHS = 4


@pytest.fixture(scope="module")
def plan(plain_dataset):
    return plan_shards(plain_dataset.url, 2, batch_size=BATCH, policy="pad", seed=11, engine="local")


def loader_kinds(plan):
    return {
        "make_loader": lambda: make_loader(1, 2, plan=plan, backend="arrow", shuffle_window=1500, workers_count=2,
                                           padding_mask=True),
        "dataset": lambda: BalancedIterableDataset(plan, 1, 2, shuffle_window=1500, padding_mask=True,
                                                   backend="arrow"),
        "dataloader-0": lambda: BalancedIterableDataset(plan, 1, 2, shuffle_window=1500, padding_mask=True,
                                                        backend="arrow").dataloader(num_workers=0),
    }


def reference_epoch(plan, epoch):
    """Epoch ``epoch`` of an uninterrupted loader, as built by make_loader(epoch=e)."""
    loader = make_loader(1, 2, plan=plan, backend="arrow", shuffle_window=1500, padding_mask=True, epoch=epoch)
    return [fingerprint(b) for b in loader]


@pytest.fixture(scope="module")
def reference(plan):
    return Epochs(plan, EPOCHS + 2)


class Epochs(list):
    """The reference epochs: the first ``count`` up front, later ones when a test reaches them (a sequence of
    takes can run past them, and then it is checked all the same)."""

    def __init__(self, plan, count):
        super().__init__(reference_epoch(plan, e) for e in range(count))
        self._plan = plan

    def __getitem__(self, epoch):
        while isinstance(epoch, int) and epoch >= len(self):
            self.append(reference_epoch(self._plan, len(self)))
        return super().__getitem__(epoch)

    def __repr__(self):  # Hypothesis prints the arguments of a failing example
        return f"<{len(self)} reference epochs>"


operation = st.one_of(
    st.tuples(st.just("take"), st.integers(0, 12)),   # iter(), take k batches, abandon (0: a probe)
    st.tuples(st.just("set_epoch"), st.integers(0, EPOCHS - 1)),
    st.tuples(st.just("reload"), st.just(0)),           # save, build a fresh loader, load
)


@pytest.mark.parametrize("kind", ["make_loader", "dataset", "dataloader-0"])
@settings(max_examples=25, deadline=None)
@given(ops=st.lists(operation, max_size=7))
@example(ops=[("set_epoch", EPOCHS - 1)] + [("take", 12)] * 7)  # runs past the reference computed up front
def test_only_delivered_batches_and_set_epoch_move_the_position(plan, reference, kind, ops):
    make = loader_kinds(plan)[kind]
    steps = len(reference[0])
    loader = make()
    epoch, batches, resumed = 0, 0, False  # the model
    for name, arg in ops:
        if name == "take":
            arg = min(arg, steps - batches)  # one iter() serves at most the rest of its epoch
            got = [fingerprint(b) for b in islice(iter(loader), arg)]
            assert got == reference[epoch][batches:batches + arg]
            if arg:
                resumed = False
                batches += arg
                if batches == steps:
                    epoch, batches = epoch + 1, 0
        elif name == "set_epoch":
            loader.set_epoch(arg)
            if not (resumed and arg == epoch):
                epoch, batches, resumed = arg, 0, False
        else:
            state = loader.state_dict()
            loader = make()
            loader.load_state_dict(state)
            resumed = True
        state = loader.state_dict()
        assert (state["epoch"], state["batches"]) == (epoch, batches), "state_dict names the next batch"
        assert getattr(loader, "dataset", loader).epoch == epoch


def test_lightning_pattern_probe_then_set_epoch(plan, reference):
    """Lightning: iter() to probe, iter() before set_epoch, then batches; epoch e is make_loader(epoch=e)."""
    for make in loader_kinds(plan).values():
        loader = make()
        iter(loader)  # the probe
        for epoch in range(3):
            it = iter(loader)  # created before set_epoch (Lightning's setup_data / on_run_start)
            getattr(loader, "sampler", loader).set_epoch(epoch)  # Lightning tells only loader.sampler
            assert [fingerprint(b) for b in it] == reference[epoch]
            assert loader.state_dict()["epoch"] == epoch + 1 and loader.state_dict()["batches"] == 0


def test_dataloader_workers_start_at_the_first_batch(plan, reference):
    """BalancedDataLoader with workers: workers start at the first next(), after a set_epoch made after iter()."""
    loader = BalancedIterableDataset(plan, 1, 2, shuffle_window=1500, padding_mask=True,
                                     backend="arrow").dataloader(num_workers=2)
    iter(loader)  # a probe starts no worker and consumes nothing
    it = iter(loader)
    loader.set_epoch(2)
    head = [fingerprint(b) for b in islice(it, 3)]
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (2, 3)
    rest = [fingerprint(b) for b in iter(loader)]  # an abandoned epoch is continued, not skipped
    assert head + rest == _epoch_with_workers(plan, 2)
    assert loader.state_dict()["epoch"] == 3


def _epoch_with_workers(plan, epoch):
    ds = BalancedIterableDataset(plan, 1, 2, shuffle_window=1500, padding_mask=True, epoch=epoch, backend="arrow")
    return [fingerprint(b) for b in ds.dataloader(num_workers=2)]
