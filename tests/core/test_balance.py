"""Properties of the pure balancer (G1-G5) over generated catalogs, checked on row intervals, not row lists.

Every check works on ``(catalog row, start, stop)`` intervals so catalogs of millions of rows stay cheap; the
intervals are the balancer's whole output, so checking them checks every row.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from petastorm_balanced.core import balance
from tests.support.strategies import BalanceCase, balance_cases, catalogs, seeds

# Epochs compared for G5. The first piece of an epoch always comes from the first row group of its order, so two
# epochs give the same assignment with probability <= 1/2 (two row groups); all of 40 epochs agree with
# probability <= 2**-39 per example: the property cannot flake in practice.
G5_EPOCHS = 40


def slots_of(p: balance.Pieces) -> np.ndarray:
    return p.rank * p.num_workers + p.worker


def check_well_formed(case: BalanceCase, p: balance.Pieces) -> None:
    """Non-empty pieces inside their row group, sorted by slot (rank-major, workers inside a rank)."""
    assert np.all(p.start >= 0) and np.all(p.stop > p.start)
    assert np.all(p.stop <= case.counts[p.catalog_row])
    assert np.all(np.diff(slots_of(p)) >= 0)
    assert np.all((p.rank >= 0) & (p.rank < p.world_size)) and np.all((p.worker >= 0) & (p.worker < p.num_workers))


def check_equal_steps(case: BalanceCase, p: balance.Pieces) -> None:
    """G1: every rank exactly steps x batch rows; every slot whole batches; steps depend on nothing else."""
    steps = balance.steps_per_rank(case.total, case.world_size, case.batch_size, case.policy)
    assert p.steps_per_rank == steps >= 1
    slots = p.world_size * p.num_workers
    slot_rows = np.bincount(slots_of(p), weights=p.num_rows, minlength=slots).astype(np.int64)
    rank_rows = slot_rows.reshape(p.world_size, p.num_workers).sum(axis=1)
    assert np.all(rank_rows == steps * case.batch_size)
    assert np.all(slot_rows % case.batch_size == 0)
    # workers of a rank differ by at most one batch, and share exactly the rank's steps
    worker_batches = slot_rows.reshape(p.world_size, p.num_workers) // case.batch_size
    assert np.all(worker_batches.max(axis=1) - worker_batches.min(axis=1) <= 1)


def check_coverage(case: BalanceCase, p: balance.Pieces) -> None:
    """G2 on intervals: real rows never overlap; drop leaves out < W*B rows, pad delivers all and pads < W*B."""
    real = ~p.padding
    order = np.lexsort((p.start[real], p.catalog_row[real]))
    row, start, stop = p.catalog_row[real][order], p.start[real][order], p.stop[real][order]
    same_group = row[1:] == row[:-1]
    assert np.all(start[1:][same_group] >= stop[:-1][same_group]), "a real row is delivered twice"
    delivered = int((stop - start).sum())
    global_batch = case.world_size * case.batch_size
    padded = int(p.num_rows[p.padding].sum())
    if case.policy == "drop":
        assert padded == 0
        assert 0 <= case.total - delivered < global_batch
    else:
        assert delivered == case.total, "pad must deliver every matching row"
        assert 0 <= padded < global_batch
        assert padded == p.steps_per_rank * global_batch - case.total


def check_locality(p: balance.Pieces) -> None:
    """G3: at most slots - 1 row groups have real rows in more than one slot."""
    real = ~p.padding
    pairs = np.unique(np.stack([p.catalog_row[real], slots_of(p)[real]]), axis=1)
    split = len(pairs[0]) - len(np.unique(pairs[0]))
    assert split <= p.world_size * p.num_workers - 1


def rank_sequence(p: balance.Pieces, rank: int):
    """A rank's delivery as maximal (catalog row, start, stop, padding) runs: worker boundaries merged away."""
    mine = p.of_rank(rank)
    runs = []
    for c, s, e, pad in zip(mine.catalog_row.tolist(), mine.start.tolist(), mine.stop.tolist(),
                            mine.padding.tolist(), strict=True):
        if runs and runs[-1][0] == c and runs[-1][2] == s and runs[-1][3] == pad:
            runs[-1][2] = e
        else:
            runs.append([c, s, e, pad])
    return runs


def same_pieces(a: balance.Pieces, b: balance.Pieces) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k))
               for k in ("rank", "worker", "catalog_row", "start", "stop", "padding"))


@given(balance_cases())
def test_equal_steps_coverage_locality_determinism(case):
    """G1-G3 on one epoch, and G4: the same inputs give identical arrays (ranks agree without talking)."""
    p = case.assign()
    check_well_formed(case, p)
    check_equal_steps(case, p)
    check_coverage(case, p)
    check_locality(p)
    assert same_pieces(p, case.assign())
    order = balance.epoch_order(len(case.counts), case.seed, case.epoch)
    # epoch_order is lru_cache'd (a second call returns the same object): recompute it past the cache
    assert np.array_equal(order, balance.epoch_order.__wrapped__(len(case.counts), case.seed, case.epoch))
    assert sorted(order.tolist()) == list(range(len(case.counts)))


@given(balance_cases(), st.integers(1, 8))
def test_rank_rows_do_not_depend_on_workers(case, other_workers):
    """Steps and each rank's rows (in order) are the same for any DataLoader worker count."""
    a, b = case.assign(), case.assign(num_workers=other_workers)
    assert a.steps_per_rank == b.steps_per_rank
    for rank in range(case.world_size):
        assert rank_sequence(a, rank) == rank_sequence(b, rank)


@given(balance_cases(min_row_groups=2, max_row_groups=40))
def test_epochs_differ_and_fixed_keeps_epoch_zero(case):
    """G5: epochs reassign rows (some two of G5_EPOCHS epochs differ); 'fixed' always gives epoch 0's."""
    first = case.assign(epoch=0)
    assert any(not same_pieces(first, case.assign(epoch=e)) for e in range(1, G5_EPOCHS))  # stops at the first
    for e in (1, case.epoch):
        assert same_pieces(case.assign(epoch=e, reshuffle="fixed"), first)


@given(balance_cases(min_row_groups=3, max_row_groups=40), seeds)
def test_seed_changes_order(case, other_seed):
    """Different seeds draw different orders, and epoch e of seed s is not epoch 0 of seed s + e (no seed + epoch)."""
    n = len(case.counts)
    first = balance.epoch_order(n, case.seed, 0)
    assert any(not np.array_equal(first, balance.epoch_order(n, case.seed, e)) for e in range(1, G5_EPOCHS))
    others = [other_seed] + [case.seed + k for k in range(1, G5_EPOCHS)]
    assert any(not np.array_equal(first, balance.epoch_order(n, s, 0)) for s in others)
    if n >= 20:  # 20! orders: a collision would be a bug, not chance
        assert not np.array_equal(balance.epoch_order(n, case.seed, 1), balance.epoch_order(n, case.seed + 1, 0))


@given(catalogs(max_row_groups=20), st.integers(1, 64), st.integers(1, 512), st.sampled_from(balance.POLICIES))
def test_too_few_rows_is_refused(counts, world, batch, policy):
    total = int(counts.sum())
    if total >= world * batch:
        p = balance.assign(counts, world_size=world, batch_size=batch, policy=policy, seed=0, epoch=0)
        assert p.steps_per_rank >= 1
    else:
        with pytest.raises(ValueError, match="world_size"):
            balance.assign(counts, world_size=world, batch_size=batch, policy=policy, seed=0, epoch=0)


@pytest.mark.parametrize("kwargs, error, name", [
    ({"world_size": 0}, ValueError, "world_size"), ({"batch_size": 0}, ValueError, "batch_size"),
    ({"num_workers": 0}, ValueError, "num_workers"), ({"seed": -1}, ValueError, "seed"),
    ({"epoch": -1}, ValueError, "epoch"), ({"world_size": True}, TypeError, "world_size"),
    ({"batch_size": 2.0}, TypeError, "batch_size"), ({"policy": "repeat"}, ValueError, "policy"),
    ({"reshuffle": "never"}, ValueError, "reshuffle"),
])
def test_bad_parameters_name_themselves(kwargs, error, name):
    args = dict(world_size=2, batch_size=4, policy="drop", seed=0, epoch=0, num_workers=1, reshuffle="epoch")
    args.update(kwargs)
    with pytest.raises(error, match=name):
        balance.assign(np.array([100, 50]), **args)


@pytest.mark.parametrize("policy", balance.POLICIES)
def test_one_huge_row_group_is_split_evenly(policy):
    """A single 1M-row group over 8 ranks x 4 workers: balanced by splitting, at most slots - 1 cuts."""
    case = BalanceCase(np.array([1_000_003]), 8, 64, 4, policy, 5, 3)
    p = case.assign()
    check_equal_steps(case, p)
    check_coverage(case, p)
    check_locality(p)


@pytest.mark.parametrize("policy", balance.POLICIES)
def test_world_larger_than_row_groups(policy):
    """Three row groups, 16 ranks: every rank still gets equal whole batches."""
    case = BalanceCase(np.array([40, 7, 300]), 16, 8, 2, policy, 1, 0)
    p = case.assign()
    check_equal_steps(case, p)
    check_coverage(case, p)
    check_locality(p)
    assert len(np.unique(p.rank)) == 16


def test_doc_example_and_shapes():
    p = balance.assign(np.array([10, 3, 7]), world_size=2, batch_size=4, policy="drop", seed=0, epoch=0)
    assert [p.rows_of_rank(r) for r in range(2)] == [8, 8]
    assert len({len(a) for a in (p.rank, p.worker, p.catalog_row, p.start, p.stop, p.padding)}) == 1
    assert balance.worker_steps(7, 3).tolist() == [3, 2, 2] and balance.worker_steps(2, 4).sum() == 2


@given(balance_cases())
def test_pad_repeats_exactly_the_last_rows_of_the_sequence(case):
    """Policy pad: the padding rows are the last ``delivered - total`` rows of the epoch's delivery sequence, in
    order, so they sit in the row groups the last slots read anyway (the partial tail segment must start inside its
    row group, at the right row)."""
    pieces = case.assign(policy="pad")
    counts = np.asarray(case.counts, dtype=np.int64)
    extra = pieces.steps_per_rank * pieces.world_size * pieces.batch_size - case.total
    tail = []  # (catalog row, matching row) of the sequence's last ``extra`` rows, in sequence order
    for row in balance.epoch_order(len(counts), case.seed, case.epoch)[::-1]:
        if len(tail) >= extra:
            break
        take = min(int(counts[row]), extra - len(tail))
        tail = [(int(row), i) for i in range(int(counts[row]) - take, int(counts[row]))] + tail
    padded = [(int(r), i)
              for r, s, e, p in zip(pieces.catalog_row, pieces.start, pieces.stop, pieces.padding, strict=True) if p
              for i in range(int(s), int(e))]
    assert padded == tail
