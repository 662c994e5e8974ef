"""DataLoader workers send runs of batches as packets; the main process hands the batches out in exactly the order
one batch per message gave (round robin over the workers, worker 0 first, a worker that ran out skipped)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from petastorm_balanced import BalancedIterableDataset
from petastorm_balanced.reading.formats import worker_packets
from petastorm_balanced.reading.formats.worker_packets import interleave, interleaved_groups, packets, pieces
from tests.support.resume_contract import check_resume_contract, fingerprint


def dataloader_order(per_worker: list[list]) -> list:
    """What the DataLoader delivers: one item of each worker in turn, skipping a worker that has no more."""
    out, at = [], [0] * len(per_worker)
    while any(a < len(items) for a, items in zip(at, per_worker, strict=True)):
        for w, items in enumerate(per_worker):
            if at[w] < len(items):
                out.append(items[at[w]])
                at[w] += 1
    return out


def cut(columns, size):
    ids = columns["id"]
    return iter([tuple(ids[b:b + size]) for b in range(0, len(ids), size)])


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_packets_come_back_in_the_round_robin_of_batches(data):
    workers = data.draw(st.integers(1, 4), "workers")
    total = data.draw(st.integers(0, 40), "total batches")
    batch = data.draw(st.integers(1, 3), "batch size")
    limit = data.draw(st.integers(1, 80), "packet bytes")
    # the rank's batch j is worker j % K's batch j // K (iterable.py); each worker reads runs of any size
    expected = [tuple(range(j * batch, (j + 1) * batch)) for j in range(total)]
    sent = []
    for w in range(workers):
        mine = [j for j in range(total) if j % workers == w]
        runs, at = [], 0
        while at < len(mine):
            size = data.draw(st.integers(1, 5), "run batches")
            runs.append(mine[at:at + size])
            at += size
        parts = (piece for run in runs
                 for piece in pieces({"id": np.concatenate([np.arange(j * batch, (j + 1) * batch) for j in run]),
                                      "x": np.zeros(len(run) * batch)}, batch, limit))
        sent.append(list(packets(parts, w, limit)))
        assert sent[-1][-1][2] and not any(p[2] for p in sent[-1][:-1]), "the last packet, and only it, says so"
    assert list(interleave(dataloader_order(sent), workers, cut)) == expected
    group = data.draw(st.integers(1, 9), "group")
    groups = list(interleaved_groups(dataloader_order(sent), workers, cut, group))
    assert [b for g in groups for b in g] == expected and all(g for g in groups)


def test_packets_of_one_worker_out_of_order_are_an_error():
    """Each worker's packets are numbered: the order across workers does not matter (each worker's batches are
    queued apart), a worker's own packets out of order or missing are an error, never another order."""
    sent = [list(packets([({"id": np.arange(2 * w, 2 * w + 2)}, 1)] * 2, w, 1)) for w in range(2)]
    items = dataloader_order(sent)
    expected = list(interleave(items, 2, cut))
    assert expected == [(0, 1), (2, 3), (0, 1), (2, 3)]
    assert list(interleave([items[1], items[0], *items[2:]], 2, cut)) == expected
    with pytest.raises(RuntimeError, match="out of order"):
        list(interleave([items[2], items[1], items[0], *items[3:]], 2, cut))
    with pytest.raises(RuntimeError, match="ended before"):
        list(interleave(items[:-1], 2, cut))


@pytest.mark.parametrize("shuffle", [False, True])
def test_workers_packets_give_the_batches_of_one_message_per_batch(plans, monkeypatch, shuffle):
    """Packets of a few batches (several per worker, of uneven sizes): the batches, their values and the resume
    are those of a plain DataLoader, whose workers send one batch per message."""
    monkeypatch.setattr(worker_packets, "PACKET_BYTES", 900)  # forked workers inherit it
    plan, _ = plans["plain-pad"]

    def make():
        return BalancedIterableDataset(plan, 1, 3, batch_size=8, shuffle=shuffle, shuffle_window=120,
                                       padding_mask=True)

    for workers in (1, 3):
        plain = list(DataLoader(make(), batch_size=None, num_workers=workers, multiprocessing_context="fork"))
        packed = list(make().dataloader(num_workers=workers, multiprocessing_context="fork"))
        assert [fingerprint(b) for b in packed] == [fingerprint(b) for b in plain]
        assert len(packed) == len(make()) >= 12
        for mine, theirs in zip(packed, plain, strict=True):
            assert mine.keys() == theirs.keys()
            for name, values in mine.items():
                if isinstance(values, list):
                    assert values == theirs[name]
                else:
                    assert values.dtype == theirs[name].dtype and values.equal(theirs[name]), name
    check_resume_contract(lambda: make().dataloader(num_workers=2, multiprocessing_context="fork"), iter,
                          epochs=2, cuts=[1, 5, 6, 7, -1, 0])
