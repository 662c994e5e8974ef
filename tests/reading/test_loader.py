"""make_loader / BalancedLoader / BalancedIterableDataset over the skewed datasets, checked on the ``id`` column.

Every check reads real Parquet through real Petastorm worker pools (or real DataLoader worker processes) and
states an invariant: equal steps and full batches on every rank (G1), no row twice except flagged padding and
fewer than ``world x batch`` rows left out (G2), same configuration same sequence (G4), new epochs new
assignments (G5), and exact resume (G6, through the shared contract in ``tests/support/resume_contract.py``).
"""

import numpy as np
import pytest
import torch

from petastorm_balanced import BalancedIterableDataset, make_loader
from petastorm_balanced.reading.backends.reader_arguments import OWNED_ARGUMENTS
from petastorm_balanced.reading.rows import fragments as fragments_module
from petastorm_balanced.reading.state import flat, nest
from petastorm_balanced.tools.coverage import coverage_check, steps_check
from tests.support.delivery_contract import planned_ids
from tests.support.resume_contract import check_resume_contract, fingerprint
from tests.support.stacks import petastorm_only

WORLD_SIZES = (1, 2, 3, 8)
BATCH = 32


def read_rank(loader):
    """(ids, padding flags, batch sizes) of one epoch."""
    ids, pads, sizes = [], [], []
    for batch in loader:
        sizes.append({len(v) for v in batch.values()})
        ids.append(batch["id"].numpy())
        pads.append(batch["_padding"].numpy())
    return np.concatenate(ids), np.concatenate(pads), sizes


@pytest.mark.parametrize("case", ["plain-drop", "plain-pad", "plain-en", "hive", "petastorm"])
def test_every_rank_equal_full_batches_and_coverage(plans, case):
    if case not in plans:
        pytest.skip("Petastorm (Unischema) datasets need Petastorm, which does not import on this stack")
    plan, matching = plans[case]
    batch = plan.batch_size
    for world in WORLD_SIZES:
        if plan.total_rows < world * batch:
            continue
        steps = plan.steps_per_epoch(world)
        ids, flags, sizes = [], [], []
        for rank in range(world):
            loader = make_loader(rank, world, plan=plan, epoch=1, workers_count=2, padding_mask=True,
                                 shuffle_window=100)
            assert len(loader) == steps
            rank_ids, rank_flags, rank_sizes = read_rank(loader)
            ids.append(rank_ids)
            flags.append(rank_flags)
            sizes.append([s.pop() if len(s) == 1 else -1 for s in rank_sizes])  # -1: columns of unequal length
        checks = [steps_check(sizes, steps=steps, batch_size=batch, name="G1"),
                  coverage_check(ids, flags, expected=np.array(sorted(matching)), policy=plan.policy,
                                 global_batch=world * batch, name="G2")]
        assert all(c.ok for c in checks), f"world {world}: " + "; ".join(c.line() for c in checks)


def test_epochs_differ_and_same_config_repeats(plans):
    plan, _ = plans["plain-drop"]
    def sequence(epoch, **kwargs):
        return [fingerprint(b) for b in make_loader(0, 2, plan=plan, epoch=epoch, **kwargs)]

    first = sequence(0, workers_count=1)
    assert sequence(0, workers_count=3) == first, "G4: the worker count must not change the order"
    assert sequence(0, workers_count=2, reader_pool_type="dummy") == first
    second = sequence(1, workers_count=3)
    assert second != first
    rows = [set(np.concatenate(s)) for s in (first, second)]
    assert rows[0] != rows[1], "G5: each epoch reassigns rows to ranks"
    fixed = [set(np.concatenate(sequence(e, reshuffle="fixed"))) for e in (0, 1)]
    assert fixed[0] == fixed[1], "reshuffle='fixed' keeps the assignment"


@pytest.mark.slow
@petastorm_only  # Petastorm's process pool
def test_process_pool_gives_the_same_batches_and_lives_across_epochs(plans):
    plan, _ = plans["hive"]
    thread = [[fingerprint(b) for b in make_loader(1, 2, plan=plan, epoch=e, workers_count=2)] for e in (2, 3)]
    loader = make_loader(1, 2, plan=plan, epoch=2, workers_count=2, reader_pool_type="process")
    process = [fingerprint(b) for b in loader]
    reader = loader._reads.keeper.reader
    process = [process, [fingerprint(b) for b in loader]]
    assert process == thread
    assert loader._reads.keeper.reader is reader, "a finished epoch's pool serves the next epoch"
    loader.close()
    assert reader.stopped


def test_unshuffled_order_is_the_plans_and_iter_advances_epochs(plans, hive_dataset):
    """shuffle=False delivers the planned fragments' rows in plan order (read here straight with pyarrow)."""
    plan, _ = plans["hive"]
    loader = make_loader(0, 3, plan=plan, shuffle=False, workers_count=3)
    for epoch in (0, 1):
        assert loader.epoch == epoch
        got = np.concatenate([b["id"].numpy() for b in loader])
        expected = planned_ids(hive_dataset.path, plan.assignment(0, epoch=epoch, world_size=3))
        assert np.array_equal(got, expected[:len(got)]) and len(got) == len(expected)


def test_shuffle_window_mixes_but_keeps_rows(plans):
    plan, _ = plans["plain-drop"]
    ordered = np.concatenate([b["id"].numpy() for b in make_loader(1, 2, plan=plan, shuffle=False)])
    shuffled = np.concatenate([b["id"].numpy() for b in make_loader(1, 2, plan=plan, shuffle_window=500)])
    assert sorted(ordered) == sorted(shuffled) and not np.array_equal(ordered, shuffled)
    # a window of W rows only permutes rows inside consecutive runs of W rows (rounded up to whole batches)
    window = 512
    for begin in range(0, len(ordered), window):
        assert set(ordered[begin:begin + window]) == set(shuffled[begin:begin + window])


def test_columns_padding_mask_and_petastorm_decoding(plans, petastorm_dataset):
    plan, _ = plans["petastorm"]
    batch = next(iter(make_loader(0, 2, plan=plan, schema_fields=["id", "vec", "image", "lang"])))
    assert list(batch) == ["id", "lang", "vec", "image"]
    assert batch["vec"].shape == (16, 4) and batch["vec"].dtype == torch.float32
    assert batch["image"].shape == (16, 8, 8) and batch["image"].dtype == torch.uint8
    assert batch["lang"] == ["en"] * 16
    plan, _ = plans["hive"]
    batch = next(iter(make_loader(0, 2, plan=plan, schema_fields=["year", "i.*"], padding_mask=True)))
    assert set(batch) == {"year", "id", "_padding"} and batch["year"].dtype == torch.int32  # as pyarrow.dataset infers
    assert batch["_padding"].dtype == torch.bool


def test_resume_reads_only_the_window_in_progress(plans, monkeypatch):
    """G6 cost: resuming after k batches reads no fragment before k's shuffle window, and from it only its tail."""
    plan, _ = plans["plain-drop"]
    read_rows = []
    original = fragments_module.read_fragment

    def counting(handle, fragment, spec, **kwargs):
        table = original(handle, fragment, spec, **kwargs)
        read_rows.append(table.num_rows)
        return table

    monkeypatch.setattr(fragments_module, "read_fragment", counting)
    loader = make_loader(0, 2, plan=plan, shuffle_window=BATCH * 4, workers_count=2)
    steps = len(loader)
    cut = steps - 5  # inside the last windows
    state = {**loader.state_dict(), "batches": cut}
    loader.load_state_dict(state)
    assert len(list(loader)) == steps - cut
    window_start = cut // 4 * 4 * BATCH
    assert sum(read_rows) == steps * BATCH - window_start


@pytest.mark.parametrize("backend", ["arrow", pytest.param("petastorm", marks=petastorm_only)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_contract_balanced_loader(plans, shuffle, backend):
    plan, _ = plans["hive"]
    check_resume_contract(lambda: make_loader(1, 2, plan=plan, shuffle=shuffle, shuffle_window=150,
                                              padding_mask=True, workers_count=2, backend=backend), iter)


def test_resume_contract_iterable_dataset_with_dataloader(plans):
    plan, _ = plans["plain-pad"]

    def make():
        return BalancedIterableDataset(plan, 1, 3, batch_size=48, shuffle_window=200,
                                       padding_mask=True).dataloader(num_workers=2)

    check_resume_contract(make, iter, cuts=[3, 40, -1, 0])


def test_dataloader_workers_split_a_rank_without_changing_steps(plans, plain_dataset):
    """Any DataLoader worker count gives the rank's steps of full batches: exactly the rows of the rank's slots."""
    from torch.utils.data import DataLoader
    plan, _ = plans["plain-en"]
    for workers in (0, 3):
        dataset = BalancedIterableDataset(plan, 2, 3, epoch=1)
        batches = list(DataLoader(dataset, batch_size=None, num_workers=workers))
        assert len(batches) == len(dataset) == plan.steps_per_epoch(3)
        assert all(len(b["id"]) == plan.batch_size for b in batches)
        got = np.concatenate([b["id"].numpy() for b in batches])
        slots = plan.assignment(2, epoch=1, world_size=3, num_workers=max(1, workers))
        assert sorted(got) == sorted(planned_ids(plain_dataset.path, slots))
    # the documented recipe for a plain DataLoader: set the position by hand, same K
    dataset = BalancedIterableDataset(plan, 2, 3, epoch=1)
    dataset.load_state_dict(nest({**flat(dataset.state_dict()), "batches": 5, "num_workers": 3}))
    resumed = [fingerprint(b) for b in DataLoader(dataset, batch_size=None, num_workers=3)]
    assert resumed == [fingerprint(b) for b in batches][5:]
    single = [fingerprint(b) for b in BalancedIterableDataset(plan, 2, 3, epoch=4)]
    assert single == [fingerprint(b) for b in make_loader(2, 3, plan=plan, epoch=4)]


@pytest.mark.parametrize("name", sorted(OWNED_ARGUMENTS) + ["seed", "shuffle_rows"])
def test_owned_arguments_are_refused(plans, name):
    plan, _ = plans["hive"]
    with pytest.raises(ValueError, match=name):
        make_loader(0, 2, plan=plan, **{name: 1})


def test_bad_arguments_name_the_parameter(plans):
    plan, _ = plans["hive"]
    with pytest.raises(TypeError, match="no_such_option"):
        make_loader(0, 2, plan=plan, no_such_option=1)
    with pytest.raises(ValueError, match="rank"):
        make_loader(2, 2, plan=plan)
    with pytest.raises(TypeError, match="rank"):
        make_loader("0", 2, plan=plan)
    with pytest.raises(ValueError, match="world"):
        make_loader(0, None, plan=plan)
    with pytest.raises(ValueError, match="shuffle_window"):
        make_loader(0, 2, plan=plan, shuffle_window=0)
    with pytest.raises(ValueError, match="schema_fields"):
        make_loader(0, 2, plan=plan, schema_fields=["nope"])
    with pytest.raises(ValueError, match="plan"):
        make_loader(0, 2, plan=None)


def test_world_from_environment(plans, monkeypatch):
    plan, _ = plans["hive"]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = make_loader(plan=plan)
    assert (loader.rank, loader.world_size, len(loader)) == (1, 4, plan.steps_per_epoch(4))
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(RuntimeError, match="RANK"):
        make_loader(plan=plan)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(RuntimeError, match="WORLD_SIZE"):
        make_loader(plan=plan)
