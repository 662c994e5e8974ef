"""Elastic mid-epoch resume (G10) and sub-epochs on real loaders reading real Parquet, checked on the ``id`` column.

Every rank of a world W reads part of an epoch; rank 0's ``state_dict()`` is loaded by every rank of a new world
W' (and again W''), which reads the rest. Checked against the dataset: the new ranks take equal steps,
``len(loader)`` is the steps left, every batch is full, no real row is delivered twice in the epoch, ``drop`` leaves
out fewer than ``W' x batch`` rows, ``pad`` delivers every row; the epoch after is an ordinary W' epoch.
"""
import numpy as np
import pyarrow.dataset as pads
import pytest

from petastorm_balanced import BalancedIterableDataset, make_loader, plan_shards
from petastorm_balanced.errors import StateKeyError
from petastorm_balanced.reading.state import flat, nest
from petastorm_balanced.tools.coverage import coverage_check

BATCH = 16


@pytest.fixture(scope="module")
def hive_plans(hive_dataset):
    ids = set(pads.dataset(hive_dataset.path, format="parquet", partitioning="hive").to_table(columns=["id"])
              .column("id").to_numpy().tolist())
    return {policy: (plan_shards(hive_dataset.url, 4, batch_size=BATCH, policy=policy, seed=11, engine="local"), ids)
            for policy in ("drop", "pad")}


def loader_world(plan, world, **kwargs):
    return [make_loader(rank, world, plan=plan, padding_mask=True, shuffle_window=100, workers_count=1, **kwargs)
            for rank in range(world)]


def read(loader, count=None):
    """(real ids, padded ids, batches) of the next ``count`` batches (all when None) of one ``iter()``."""
    real, padded, batches = [], [], 0
    for batch in loader:
        assert len(batch["id"]) == BATCH
        flags = batch["_padding"].numpy()
        real += batch["id"].numpy()[~flags].tolist()
        padded += batch["id"].numpy()[flags].tolist()
        batches += 1
        if batches == count:
            break
    return real, padded, batches


def serve(loaders, count=None, state=None):
    """Every rank of a world reads ``count`` batches (after loading ``state``); equal steps checked."""
    real, padded, steps = [], [], set()
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
        assert len({len(loader) for loader in loaders}) == 1, "every new rank has the same steps left"
    for loader in loaders:
        r, p, n = read(loader, count)
        real, padded = real + r, padded + p
        steps.add(n)
    assert len(steps) == 1, f"ranks took different steps {steps}"
    return real, padded, steps.pop()


def check_epoch(plan, ids, real, padded, world):
    """G2 over an epoch served by several worlds, judged by ``tools/coverage.py``: no real row twice, none foreign,
    ``drop`` leaves out fewer than the last world's ``world x batch`` rows and pads none, ``pad`` delivers every
    row. Padding of ``pad`` (each world pads its own rest) is only checked to repeat matching rows."""
    expected = np.array(sorted(ids), np.int64)
    real, padded = np.asarray(real, np.int64), np.asarray(padded, np.int64)
    shown = [real, padded] if plan.policy == "drop" else [real]
    check = coverage_check(shown, [np.zeros(len(real), bool), np.ones(len(padded), bool)][:len(shown)],
                           expected=expected, policy=plan.policy, global_batch=world * BATCH, name="G2 elastic epoch")
    assert check.ok, check.line()
    assert np.isin(padded, expected).all(), "padding repeats matching rows"


@pytest.mark.parametrize("policy", ["drop", "pad"])
@pytest.mark.parametrize("worlds", [(4, 3), (2, 5), (4, 3, 2)])
def test_elastic_resume_continues_the_epoch(hive_plans, policy, worlds):
    plan, ids = hive_plans[policy]
    epoch = 1
    loaders = loader_world(plan, worlds[0], epoch=epoch)
    steps = len(loaders[0])
    real, padded, _ = serve(loaders, steps * 2 // 5)  # stop at about 40% of the epoch
    state = loaders[0].state_dict()
    assert all(loader.state_dict() == state for loader in loaders), "the state is the same on every rank"
    for index, world in enumerate(worlds[1:]):
        loaders = loader_world(plan, world)
        last = index == len(worlds) - 2
        r, p, taken = serve(loaders, None if last else 3, state)
        real, padded = real + r, padded + p
        if last:
            assert loaders[0].epoch == epoch + 1
            assert taken * world * BATCH - len(p) == len(r)
        else:
            state = loaders[0].state_dict()
            assert len(state["elastic"]["stages"]) == index + 1 and len(str(state)) < 600, "the state stays a few ints"
    check_epoch(plan, ids, real, padded, worlds[-1])
    # the next epoch is an ordinary one of the new world
    fresh = loader_world(plan, worlds[-1], epoch=epoch + 1)
    assert [read(loader)[0] for loader in loaders] == [read(loader)[0] for loader in fresh]


def test_elastic_state_saved_and_resumed_in_the_same_new_world_is_exact(hive_plans):
    plan, _ = hive_plans["drop"]
    old = loader_world(plan, 4)
    serve(old, 5)
    state = old[0].state_dict()
    new = make_loader(1, 3, plan=plan, padding_mask=True, shuffle_window=100, workers_count=1)
    new.load_state_dict(state)
    reference = read(new)[0]
    again = make_loader(1, 3, plan=plan, padding_mask=True, shuffle_window=100, workers_count=1)
    again.load_state_dict(state)
    head = read(again, 4)[0]
    saved = again.state_dict()
    third = make_loader(1, 3, plan=plan, padding_mask=True, shuffle_window=100, workers_count=1)
    third.load_state_dict(saved)
    assert head + read(third)[0] == reference, "G6 inside an elastic stage"


@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_sub_epochs_split_a_pass_and_resume_elastically(hive_plans, policy):
    plan, ids = hive_plans[policy]
    parts = 3
    loaders = loader_world(plan, 2, partition_epoch=parts)
    lengths, real, padded = [], [], []
    for _ in range(parts):
        lengths.append(len(loaders[0]))
        r, p, _ = serve(loaders)
        real, padded = real + r, padded + p
    assert max(lengths) - min(lengths) <= 1 and sum(lengths) == plan.steps_per_epoch(2)
    check_epoch(plan, ids, real, padded, 2)
    assert loaders[0].epoch == parts, "the next epoch is the first part of the next pass"
    next_pass = serve(loaders)[0]
    assert set(next_pass) != set(real[:len(next_pass)]), "each pass has a fresh order"

    # the same pass served by 2 ranks for part 0 and 40% of part 1, then by 3 ranks
    loaders = loader_world(plan, 2, partition_epoch=parts)
    real, padded, _ = serve(loaders)
    r, p, _ = serve(loaders, lengths[1] * 2 // 5)
    real, padded = real + r, padded + p
    state = loaders[0].state_dict()
    loaders = loader_world(plan, 3, partition_epoch=parts)
    r, p, _ = serve(loaders, None, state)
    real, padded = real + r, padded + p
    for _ in range(parts - 2):
        assert loaders[0].epoch % parts != 0
        r, p, _ = serve(loaders)
        real, padded = real + r, padded + p
    assert loaders[0].epoch == parts
    check_epoch(plan, ids, real, padded, 3)


def test_iterable_dataset_resumes_at_another_world_and_worker_count(hive_plans):
    plan, ids = hive_plans["pad"]

    def loaders(world, workers):
        return [BalancedIterableDataset(plan, rank, world, shuffle_window=100, padding_mask=True)
                .dataloader(num_workers=workers) for rank in range(world)]

    old = loaders(4, 2)
    steps = len(old[0])
    real, padded, _ = serve(old, steps // 3)
    state = old[0].state_dict()
    real_new, padded_new, _ = serve(loaders(3, 3), None, state)
    check_epoch(plan, ids, real + real_new, padded + padded_new, 3)
    # same world, another worker count: also elastic, exact coverage
    old = loaders(2, 2)
    real, padded, _ = serve(old, 7)
    new = loaders(2, 1)
    r, p, _ = serve(new, None, old[0].state_dict())
    check_epoch(plan, ids, real + r, padded + p, 2)


def test_too_few_rows_left_for_the_new_world_ends_the_epoch(hive_plans):
    """drop: fewer than W' x batch rows left means an empty rest of epoch, then an ordinary next epoch."""
    plan, ids = hive_plans["drop"]
    old = loader_world(plan, 4, epoch=2)
    steps = len(old[0])
    real, _, _ = serve(old, steps - 1)
    state = old[0].state_dict()
    left = len(ids) - len(real)
    world = left // BATCH + 1  # one step needs more rows than are left
    new = loader_world(plan, world)
    for loader in new:
        loader.load_state_dict(state)
        assert loader.state_dict()["epoch"] == 3 and len(loader) == plan.steps_per_epoch(world)
        loader.set_epoch(2)  # the usual loop: the loaded epoch first
        assert read(loader)[2] == 0
        assert loader.epoch == 3
    fresh = loader_world(plan, world, epoch=3)
    assert [read(loader)[0] for loader in new] == [read(loader)[0] for loader in fresh]


def test_backends_agree_after_an_elastic_resume(hive_plans):
    """G12 for the rows an elastic resume leaves (fragments with their own row selections)."""
    pytest.importorskip("petastorm")
    plan, _ = hive_plans["pad"]
    old = loader_world(plan, 4)
    serve(old, 9)
    state = old[0].state_dict()
    got = {}
    for backend in ("arrow", "petastorm"):
        loader = make_loader(2, 3, plan=plan, padding_mask=True, shuffle_window=100, backend=backend)
        loader.load_state_dict(state)
        got[backend] = [(b["id"].tolist(), b["_padding"].tolist()) for b in loader]
    assert got["arrow"] == got["petastorm"] and got["arrow"]


def test_set_epoch_back_into_parts_an_old_world_served_is_refused(hive_plans):
    plan, _ = hive_plans["drop"]
    old = loader_world(plan, 2, partition_epoch=3)
    serve(old)
    serve(old, 4)  # part 1, 4 batches
    new = make_loader(0, 3, plan=plan, shuffle_window=100, partition_epoch=3)
    new.load_state_dict(old[0].state_dict())
    assert new.state_dict()["elastic"]["stages"] == [[2, 1, 1, 4]]
    with pytest.raises(ValueError, match="set_epoch to epoch >= 1"):
        new.set_epoch(0)
    new.set_epoch(2)  # a later part of the same pass keeps the stages
    assert new.state_dict()["elastic"]["stages"] == [[2, 1, 1, 4]] and new.epoch == 2
    new.set_epoch(3)  # the next pass starts afresh
    steps = plan.steps_per_epoch(3)
    assert new.state_dict()["elastic"]["stages"] == [] and len(new) == steps // 3 + (steps % 3 > 0)


def test_plain_dataloader_with_another_worker_count_resumes_elastically(hive_plans):
    """The documented plain-DataLoader recipe, with K' != K: each worker derives the same elastic position."""
    from torch.utils.data import DataLoader
    plan, ids = hive_plans["drop"]
    old = [BalancedIterableDataset(plan, rank, 2, shuffle_window=100, padding_mask=True).dataloader(num_workers=2)
           for rank in range(2)]
    real, padded, _ = serve(old, 11)
    state = old[0].state_dict()
    assert state["workers"]["num_workers"] == 2
    for rank in range(2):
        dataset = BalancedIterableDataset(plan, rank, 2, shuffle_window=100, padding_mask=True)
        dataset.load_state_dict(state)
        r, p, _ = read(DataLoader(dataset, batch_size=None, num_workers=3))
        real, padded = real + r, padded + p
    check_epoch(plan, ids, real, padded, 2)


@pytest.mark.parametrize("change,says", [
    ({"stages": [[4, 1]]}, "4 ints"),
    ({"stages": "none"}, "list of saved stages"),
    ({"stages": [[4, 1, 5, 2]]}, "stopped in part 5"),
    ({"stages": [[4, 1, 0, 10 ** 6]]}, "took 1000000 batches"),
    ({"partition_epoch": 2}, "partition_epoch=1"),
    ({"world_size": 0}, "world_size"),
    ({"batches": 10 ** 6}, "state['batches']=1000000"),
])
def test_a_broken_elastic_state_is_refused_naming_the_problem(hive_plans, change, says):
    plan, _ = hive_plans["drop"]
    state = nest({**flat(loader_world(plan, 4)[0].state_dict()), **change})  # each key in its component
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("(", r"\(")):
        make_loader(0, 3, plan=plan, shuffle_window=100).load_state_dict(state)


def test_numpy_ints_in_a_state_and_set_epoch_are_ints(hive_plans):
    """One epoch rule (``params.check_int``): numpy integers (a state that went through numpy) count as ints, in
    ``load_state_dict`` as in ``set_epoch`` and ``epoch=``; a bool or a float does not."""
    plan, _ = hive_plans["drop"]
    loader = make_loader(0, 2, plan=plan, shuffle_window=100, epoch=np.int64(1))
    next(iter(loader))
    state = loader.state_dict()
    resumed = make_loader(0, 2, plan=plan, shuffle_window=100)
    values = flat(state)
    resumed.load_state_dict(nest({**values, **{k: np.int64(values[k]) for k in ("epoch", "batches", "world_size")}}))
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["batches"] == 1
    resumed.set_epoch(np.int32(3))
    assert resumed.state_dict()["epoch"] == 3
    for bad in (True, 1.0):
        with pytest.raises(TypeError, match="epoch"):
            resumed.set_epoch(bad)
        with pytest.raises(TypeError, match="epoch"):
            make_loader(0, 2, plan=plan, shuffle_window=100).load_state_dict({**state, "epoch": bad})


def test_resume_contract_with_sub_epochs(hive_plans):
    """G6 inside and across parts (the shared contract; 250 steps per pass, 10 parts of 25)."""
    from tests.support.resume_contract import check_resume_contract
    plan, _ = hive_plans["drop"]
    assert plan.steps_per_epoch(2) == 250

    check_resume_contract(lambda: make_loader(1, 2, plan=plan, shuffle_window=150, padding_mask=True,
                                              workers_count=2, partition_epoch=10), iter)


@pytest.mark.slow
def test_resume_contract_with_sub_epochs_in_dataloader_workers(hive_plans):
    from tests.support.resume_contract import check_resume_contract
    plan, _ = hive_plans["drop"]
    check_resume_contract(lambda: BalancedIterableDataset(plan, 0, 2, shuffle_window=150, padding_mask=True,
                                                          partition_epoch=10).dataloader(num_workers=2), iter,
                          cuts=[3, 11, -1, 0])


def test_the_state_is_nested_per_component_and_loaded_strictly(hive_plans):
    """reading/state.py: the position at the top, the rest under its component; a key it does not declare, at the
    top or inside a component, or one filed under the wrong component, is refused naming the key."""
    plan, _ = hive_plans["drop"]
    loader = make_loader(0, 2, plan=plan, shuffle_window=100)
    next(iter(loader))
    state = loader.state_dict()
    assert set(state) == {"epoch", "batches", "layout", "elastic"} and state["layout"]["world_size"] == 2
    fresh = make_loader(0, 2, plan=plan, shuffle_window=100)
    for broken, says in [({**state, "extra": 1}, "unknown key 'extra'"),
                         ({**state, "world_size": 2}, "belongs under state['layout']"),
                         ({**state, "layout": {**state["layout"], "seed": 1}}, "state['layout'] has the unknown key"),
                         ({**state, "layout": {k: v for k, v in state["layout"].items() if k != "shuffle"}},
                          "state['layout']['shuffle']")]:
        with pytest.raises(StateKeyError, match=says.replace("[", r"\[")):
            fresh.load_state_dict(broken)


@pytest.mark.parametrize("kind", ["loader", "dataset"])
def test_a_state_saved_before_the_nesting_still_loads(hive_plans, kind):
    """The migration: a flat state (every key at the top, as saved before the nesting) resumes exactly as its nested
    form does; a flat state with an unknown key is refused as a nested one is."""
    plan, _ = hive_plans["drop"]

    def make():
        if kind == "loader":
            return make_loader(1, 2, plan=plan, shuffle_window=100, padding_mask=True)
        return BalancedIterableDataset(plan, 1, 2, shuffle_window=100, padding_mask=True).dataloader(num_workers=0)
    loader = make()
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    old = flat(state)
    assert "plan_checksum" in old and not any(isinstance(v, dict) for v in old.values())
    resumed, migrated = make(), make()
    resumed.load_state_dict(state)
    migrated.load_state_dict(old)
    assert [b["id"].tolist() for b in migrated] == [b["id"].tolist() for b in resumed]
    with pytest.raises(StateKeyError, match="unknown key 'extra'"):
        make().load_state_dict({**old, "extra": 1})
