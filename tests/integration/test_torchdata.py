"""torchdata's StatefulDataLoader over BalancedIterableDataset: its own state_dict/load_state_dict resume exactly.

With workers, StatefulDataLoader saves each worker's ``dataset.state_dict()`` (taken inside the worker, with the
batch it belongs to) and gives it back to the same worker; the dataset's worker state says where the worker's
iteration started and how many batches it delivered since. Checked against an uninterrupted epoch: saving after
any number of batches (first, middle, last, the whole epoch) and loading into a fresh StatefulDataLoader gives
exactly the batches that came next, for 0, 2 and 3 workers and for snapshots taken every step or every few steps,
and again after a second interruption of the resumed run. ``take`` starts a new iteration when one ends, so the
comparison covers the epoch boundary too.
"""
from itertools import islice

import pytest

pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed "
                    "(requirements/frameworks.txt)")

from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from petastorm_balanced import BalancedIterableDataset, plan_shards  # noqa: E402
from tests.support.resume_contract import fingerprint  # noqa: E402

BATCH = 160


@pytest.fixture(scope="module")
def plan(plain_dataset):
    return plan_shards(plain_dataset.url, 2, batch_size=BATCH, policy="pad", seed=9, engine="local")


def make(plan, workers, snapshot=1):
    dataset = BalancedIterableDataset(plan, 1, 2, shuffle_window=700, padding_mask=True, backend="arrow")
    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers, snapshot_every_n_steps=snapshot)


def take(loader, count):
    """``count`` batches, starting a new iteration (``iter(loader)``) whenever one ends, as a training loop does."""
    out = []
    for _ in range(4):
        out += [fingerprint(b) for b in islice(iter(loader), count - len(out))]
        if len(out) == count:
            return out
    raise AssertionError(f"only {len(out)} of {count} batches in 4 iterations")


def check_resumes(plan, workers, snapshot):
    """Two epochs' worth of batches, interrupted twice, equal the uninterrupted run's. (In process the dataset
    counts and moves to the next epoch by itself; with workers the main process never sees it iterate, so,
    as with any DataLoader, the next iteration repeats the epoch unless ``dataset.set_epoch`` is called.)"""
    steps = plan.steps_per_epoch(2, BATCH)
    reference = take(make(plan, workers, snapshot), 2 * steps)
    assert reference[:steps] != reference[steps:] if workers == 0 else reference[:steps] == reference[steps:]
    for cut in sorted({1, steps // 2, steps - 1, steps, steps + 3}):
        loader = make(plan, workers, snapshot)
        head = take(loader, cut)
        resumed = make(plan, workers, snapshot)
        resumed.load_state_dict(loader.state_dict())
        middle = take(resumed, (2 * steps - cut) // 2)
        again = make(plan, workers, snapshot)  # a second interruption, saved by the resumed loader
        again.load_state_dict(resumed.state_dict())
        rest = take(again, 2 * steps - cut - len(middle))
        assert head + middle + rest == reference, f"cut at {cut}, {steps} steps per epoch, {workers} workers"


def test_statefuldataloader_in_process_resumes_exactly(plan):
    check_resumes(plan, 0, 1)


@pytest.mark.slow
@pytest.mark.parametrize("workers, snapshot", [(2, 1), (3, 4)])
def test_statefuldataloader_workers_resume_exactly(plan, workers, snapshot):
    check_resumes(plan, workers, snapshot)


@pytest.mark.slow
def test_worker_state_is_refused_outside_its_worker(plan):
    loader = make(plan, 2)
    next(iter(loader))
    worker_states = loader.state_dict()["_snapshot"]["_worker_snapshots"]
    state = next(iter(worker_states.values()))["dataset_state"]
    assert state["workers"]["worker"] in (0, 1)
    dataset = BalancedIterableDataset(plan, 1, 2, shuffle_window=700, padding_mask=True, backend="arrow")
    with pytest.raises(ValueError, match="StatefulDataLoader.load_state_dict"):
        dataset.load_state_dict(state)
