"""A mixture read by DataLoader workers (``reading/mixing/mixture_workers.py``): each worker mixes from its own share
of every source, so a rank reads each of its rows once; the rank's batches are its slots' (ranks of a world of
``world_size x num_workers``) taken round robin, values as pyarrow.dataset reads them, every row of a source at most
once per pass over every rank and worker; exact resume, and a change of layout continued or refused by name."""
import multiprocessing
import pickle
from itertools import islice

import numpy as np
import pyarrow.dataset as pads
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced import datagen, plan_shards

torch = pytest.importorskip("torch")

from petastorm_balanced import BalancedIterableDataset, make_loader  # noqa: E402
from petastorm_balanced.core.registry import Algorithm  # noqa: E402
from petastorm_balanced.reading.backends import BACKENDS  # noqa: E402

SIZES = (1500, 640, 310)
WEIGHTS = [2, 1, 1]  # source 2 is the scarcest: an epoch is about its pass, the others read less than theirs


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture_workers")
    return [datagen.make_plain_dataset(root / f"s{i}", num_files=3, total_rows=n, seed=11 + i, min_row_group_rows=16,
                                       max_row_group_rows=120).url for i, n in enumerate(SIZES)]


@pytest.fixture(scope="module")
def plans(sources):
    return [plan_shards(url, 2, batch_size=16, seed=3 + i, engine="local") for i, url in enumerate(sources)]


def rows_of(batch):
    return list(zip(batch["_source"].tolist(), batch["id"].tolist(), strict=True))


def round_robin(loaders, count=None):
    """The batches of ``loaders`` taken in turn, as a DataLoader takes its workers'."""
    streams = [iter(loader) for loader in loaders]
    out = []
    while count is None or len(out) < count:
        batch = next(streams[len(out) % len(streams)], None)
        if batch is None:
            break
        out.append(rows_of(batch))
    return out


def test_each_dataloader_worker_reads_only_its_share_of_every_source(plans, monkeypatch):
    """Fails where every worker reads its rank's whole sequence of every source and keeps every K-th batch."""
    read = multiprocessing.Array("q", 2)  # rows read by each worker (forked workers share it)
    arrow = BACKENDS["arrow"]

    def counting(*args, **kwargs):
        chunks = arrow.run(*args, **kwargs)

        def counted(todo):
            worker = torch.utils.data.get_worker_info()
            for chunk, columns in chunks(todo):
                if worker is not None:
                    with read.get_lock():
                        read[worker.id] += sum(f.num_rows for f in chunk)
                yield chunk, columns
        return counted

    monkeypatch.setitem(BACKENDS._choices, "arrow", Algorithm("arrow", 1, counting))
    ds = BalancedIterableDataset(plans, 0, 2, weights=WEIGHTS, batch_size=16, shuffle_window=30, backend="arrow",
                                 epoch_steps=160)  # several passes of every source
    loader = ds.dataloader(num_workers=2, multiprocessing_context="fork")
    steps = len(loader)
    delivered = sum(len(b["id"]) for b in loader)
    assert delivered == steps * 16
    assert min(read[:]) > 0, "both workers read"
    # each worker reads its rows, plus at most the rest of the windows and row groups it stopped in
    assert sum(read[:]) < 1.3 * delivered, f"workers read {read[:]} rows to deliver {delivered}"


@pytest.mark.parametrize("workers", [2, 3])
def test_the_workers_batches_are_their_slots_round_robin_with_pyarrow_values_each_row_once_per_pass(
        plans, sources, workers):
    kwargs = dict(weights=WEIGHTS, batch_size=16, shuffle_window=30, backend="arrow")
    tables = [pads.dataset(url, format="parquet").to_table().to_pandas().set_index("id") for url in sources]
    seen: list[dict] = [{} for _ in SIZES]  # source -> {id: times} over the first epoch of every rank
    for rank in range(2):
        ds = BalancedIterableDataset(plans, rank, 2, **kwargs)
        loader = ds.dataloader(num_workers=workers)
        got = []
        for batch in loader:
            got.append(rows_of(batch))
            for s in range(3):
                pick = batch["_source"].numpy() == s
                ids = batch["id"].numpy()[pick]
                expected = tables[s].loc[ids, "value"].to_numpy()
                assert np.array_equal(batch["value"].numpy()[pick], expected), "values as pyarrow.dataset reads them"
                text = [t for t, p in zip(batch["text"], pick.tolist(), strict=True) if p]
                assert text == tables[s].loc[ids, "text"].tolist()
                for i in ids.tolist():
                    seen[s][i] = seen[s].get(i, 0) + 1
        slots = [make_loader(rank * workers + s, 2 * workers, plan=plans, workers_count=1, **kwargs)
                 for s in range(workers)]
        assert len(got) == sum(len(slot) for slot in slots) == workers * len(slots[0]), "equal steps"
        assert got == round_robin(slots, len(got)), "the slots' batches, round robin"
    for s in (0, 1):  # read less than a pass in the epoch: no row twice, over every rank and worker
        assert max(seen[s].values()) == 1
    assert sum(v > 1 for v in seen[2].values()) <= 16 * 2, "the scarcest source: only its last batch starts a pass"


def test_a_workers_state_resumes_exactly_and_another_layout_continues_or_is_refused_by_name(plans):
    kwargs = dict(weights=WEIGHTS, batch_size=16, shuffle_window=30, backend="arrow", epoch_steps=12)
    ds = BalancedIterableDataset(plans, 1, 2, **kwargs)
    loader = ds.dataloader(num_workers=2)
    assert loader.state_dict()["workers"]["num_workers"] == 2, "the state says the layout its sources count in"
    whole = [rows_of(b) for b in loader] + [rows_of(b) for b in loader]
    assert len(whole) == 24
    again = BalancedIterableDataset(plans, 1, 2, **kwargs).dataloader(num_workers=2)
    head = [rows_of(b) for b in again] + [rows_of(b) for b in islice(iter(again), 5)]  # inside a round of two
    state = again.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 5
    fresh = BalancedIterableDataset(plans, 1, 2, **kwargs).dataloader(num_workers=2)
    fresh.load_state_dict(state)
    assert head[:12] == whole[:12] and head + [rows_of(b) for b in fresh] == whole, "exact, mid-round too"
    other = BalancedIterableDataset(plans, 1, 2, **kwargs).dataloader(num_workers=3)
    with pytest.raises(ValueError, match=r"inside a round of its num_workers=2 DataLoader workers.*num_workers=2"):
        other.load_state_dict(state)
        next(iter(other))
    with pytest.raises(ValueError, match=r"epoch_steps=12 with num_workers=5"):
        BalancedIterableDataset(plans, 1, 2, **kwargs).dataloader(num_workers=5)
    # at a batch every layout shares (6 of epoch 1), three workers continue the epoch: its 6 batches left
    at_six = BalancedIterableDataset(plans, 1, 2, **kwargs).dataloader(num_workers=2)
    list(at_six), list(islice(iter(at_six), 6))
    state = at_six.state_dict()
    three = BalancedIterableDataset(plans, 1, 2, **kwargs).dataloader(num_workers=3)
    three.load_state_dict(state)
    rest = [rows_of(b) for b in three]
    assert len(rest) == 6
    delivered = {r for b in whole[:18] for r in b}
    assert not delivered & {r for b in rest for r in b if r[0] != 2}, "no row of the epoch's pass twice"
    # make_loader continues a workers' state saved at a shared batch, and a workers' state mid-round is refused
    one = make_loader(1, 2, plan=plans, workers_count=1, **kwargs)
    one.load_state_dict(state)
    assert len([b for b in one]) == 6
    with pytest.raises(ValueError, match="inside a round"):
        make_loader(1, 2, plan=plans, workers_count=1, **kwargs).load_state_dict(
            {**fresh.state_dict(), "batches": 5})


def worker_streams(position, workers):
    """What each of ``workers`` DataLoader workers yields from ``position`` (a pickled copy each, as workers get),
    taken round robin, without starting processes."""
    from petastorm_balanced.reading.mixing.mixture_workers import mixture_slot
    streams = [mixture_slot(pickle.loads(pickle.dumps(position)), workers, w, False, []) for w in range(workers)]
    out = []
    while True:
        batch = next(streams[len(out) % workers], None)
        if batch is None:
            assert all(next(s, None) is None for s in streams), "no worker yields more than its share"
            return out
        out.append(rows_of(batch))


@settings(max_examples=12, deadline=None)
@given(workers=st.integers(1, 4), batches=st.integers(0, 60), window=st.sampled_from([1, 30, 10_000]),
       epoch_steps=st.sampled_from([None, 12, 24]))
def test_a_state_at_any_batch_resumes_exactly_with_the_same_workers(plans, workers, batches, window, epoch_steps):
    if epoch_steps is not None and epoch_steps % workers:
        return
    kwargs = dict(weights=WEIGHTS, batch_size=8, shuffle_window=window, backend="arrow", epoch_steps=epoch_steps)
    ds = BalancedIterableDataset(plans, 1, 2, **kwargs)
    position = ds._position
    position.to_workers(workers)
    epoch = [*worker_streams(position, workers)]  # the whole first epoch
    steps = len(epoch)
    assert steps == position.steps() and steps % workers == 0, "every worker takes the same batches"
    done = batches % steps
    run = position.begin()
    for _ in range(done):
        run.delivered()
    state = ds.state_dict()
    assert state["workers"]["num_workers"] == workers
    again = BalancedIterableDataset(plans, 1, 2, **kwargs)
    again.load_state_dict(state)
    assert worker_streams(again._position, workers) == epoch[done:]
