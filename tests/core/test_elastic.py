"""Elastic mid-epoch resume (G10) and sub-epochs, on the pure arithmetic: random plans, worlds, resume points.

A pass is simulated the way loaders serve it: each world (stage) serves parts of the pass, each slot delivering
its planned rows through the real ``WindowBatcher`` (fixed-window shuffle), and stops after some batches; the
next world gets ``elastic.stage_pieces`` for the rest. The delivered rows are then checked against the plan: no
real row twice in the pass, equal steps on every rank of each world and part, ``drop`` leaves out fewer than
``W_last x batch`` rows, ``pad`` delivers every row (padding flagged, fewer than ``W x batch`` per world).
"""
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm_balanced.core import balance, elastic
from petastorm_balanced.core.shuffle import Windows, window_rows
from petastorm_balanced.reading.batches.batching import WindowBatcher, start_point
from tests.support.strategies import catalogs, seeds


def slot_key(seed, epoch, stage, rank, slot):
    """The loaders' window key: (seed, epoch, rank, slot), plus the stage after an elastic resume."""
    return (seed, epoch, rank, slot) if stage == 0 else (seed, epoch, rank, slot, stage)


@dataclass(frozen=True)
class Job:
    counts: np.ndarray
    batch: int
    policy: str
    seed: int
    passes: int  # which pass
    parts: int
    window: int  # shuffle window rows (None: no shuffle)
    shuffle: bool

    def pieces(self, stages, world, workers, part) -> balance.Pieces:
        epoch = self.passes * self.parts + part
        return elastic.stage_pieces(self.counts, stages=stages, world_size=world, num_workers=workers,
                                    batch_size=self.batch, policy=self.policy, seed=self.seed, epoch=epoch,
                                    windows=Windows.of(batch_size=self.batch, shuffle_window=self.window,
                                                       shuffle=self.shuffle), partition_epoch=self.parts)

    def delivered(self, pieces: balance.Pieces, stage: int, part: int, batches: int) -> list[tuple[int, int, bool]]:
        """(catalog row, matching row, padding) each rank delivers in its first ``batches`` batches."""
        epoch = self.passes * self.parts + part
        out = []
        for rank in range(pieces.world_size):
            mine = pieces.of_rank(rank)
            for worker in range(pieces.num_workers):
                fragments = [[(int(mine.catalog_row[i]), int(m), bool(mine.padding[i]))
                              for m in mine.matching_rows(i)] for i in np.flatnonzero(mine.worker == worker)]
                done = (batches + pieces.num_workers - 1 - worker) // pieces.num_workers
                out += slot_batches(fragments, self.batch, self.window, self.shuffle,
                                    slot_key(self.seed, epoch, stage, rank, worker))[:done * self.batch]
        return out


def slot_batches(fragments, batch, window, shuffle, key):
    """A slot's rows in delivery order, through the loaders' own batcher, fed one fragment (piece) at a time as
    the loaders feed it."""
    ids = [row for fragment in fragments for row in fragment]
    if not ids:
        return []
    size = window_rows(batch, window, shuffle)
    lengths = np.array([len(f) for f in fragments])
    start = start_point(lengths, batch_size=batch, window_rows=size, batches_done=0, shuffle=shuffle)
    batcher = WindowBatcher(total_rows=len(ids), batch_size=batch, window_rows=size, start=start,
                            key=key if shuffle else None)
    ends = np.cumsum(lengths)
    runs = [run for begin, end in zip(ends - lengths, ends, strict=True)
            for run in batcher.push({"i": np.arange(begin, end)})]
    batcher.finish()
    return [ids[i] for run in runs for i in run["i"].tolist()]


@st.composite
def jobs(draw):
    counts = draw(catalogs(1, 25).filter(lambda c: c.sum() <= 2_000))
    total = int(counts.sum())
    batch = draw(st.integers(1, 16))
    worlds = [min(draw(st.integers(1, 6)), max(1, total // 2)) for _ in range(3)]
    batch = max(1, min(batch, total // (max(worlds) * 2)))  # at least one step in every world
    steps = balance.steps_per_rank(total, worlds[0], batch, "drop")
    parts = draw(st.integers(1, max(1, min(4, steps))))
    job = Job(counts, batch, draw(st.sampled_from(balance.POLICIES)), draw(seeds), draw(st.integers(0, 3)), parts,
              draw(st.sampled_from([1, 5, 64, 10_000])), draw(st.booleans()))
    return job, worlds, [draw(st.integers(1, 3)) for _ in range(3)]


def run_pass(job: Job, worlds, workers, stops):
    """Serve one pass with a world change at each of ``stops`` ((part, fraction of the part's steps)); return the
    delivered rows and the steps each (world, part) took."""
    stages: list[elastic.Stage] = []
    rows, first_part = [], 0
    for index, (world, k) in enumerate(zip(worlds, workers, strict=True)):
        last = index == len(worlds) - 1
        stop_part, fraction = (job.parts - 1, 1.0) if last else stops[index]
        stop_part = max(stop_part, first_part)
        for part in range(first_part, stop_part + 1):
            pieces = job.pieces(stages, world, k, part)
            rank_rows = np.bincount(pieces.rank, weights=pieces.num_rows, minlength=world)
            assert np.all(rank_rows == pieces.steps_per_rank * job.batch), "G1: equal steps on every rank"
            take = pieces.steps_per_rank if part < stop_part else int(fraction * pieces.steps_per_rank)
            rows += job.delivered(pieces, len(stages), part, take)
            if part == stop_part and not last:
                stages.append(elastic.Stage(world, k, part, take))
        first_part = stop_part
    return rows


@settings(max_examples=60, deadline=None)
@given(jobs(), st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1)), min_size=2, max_size=2),
       st.integers(1, 3))
def test_elastic_pass_delivers_each_row_once(case, stops, changes):
    job, worlds, workers = case
    worlds, workers = worlds[:changes], workers[:changes]
    stops = sorted((min(p, job.parts - 1), f) for p, f in stops)
    rows = run_pass(job, worlds, workers, stops)
    real = [(c, m) for c, m, pad in rows if not pad]
    assert len(real) == len(set(real)), "a real row delivered twice in the pass"
    total = int(job.counts.sum())
    assert all(m < job.counts[c] for c, m in real)
    padded = len(rows) - len(real)
    if job.policy == "drop":
        assert padded == 0
        assert 0 <= total - len(real) < worlds[-1] * job.batch, "drop leaves out fewer than W_last x batch rows"
    else:
        assert len(real) == total, "pad delivers every row"
        assert padded < sum(worlds) * job.batch


@settings(max_examples=40, deadline=None)
@given(jobs())
def test_sub_epochs_split_a_pass(case):
    """Parts: equal steps on every rank, parts differ by at most one step, no row twice, < W x B left out."""
    job, worlds, workers = case
    world, k = worlds[0], workers[0]
    steps = [job.pieces([], world, k, part).steps_per_rank for part in range(job.parts)]
    assert max(steps) - min(steps) <= 1 and min(steps) >= 1
    assert sum(steps) == balance.steps_per_rank(int(job.counts.sum()), world, job.batch, job.policy)
    rows = run_pass(job, [world], [k], [])
    real = [(c, m) for c, m, pad in rows if not pad]
    assert len(real) == len(set(real))
    left_out = int(job.counts.sum()) - len(real)
    assert (0 <= left_out < world * job.batch) if job.policy == "drop" else left_out == 0


def test_one_part_is_the_plain_assignment():
    """partition_epoch=1: epoch e is the whole of pass e, the pass's rows in its seeded row group order, padded
    with a flagged copy of its last rows, cut into consecutive equal rank stretches (an oracle built from the
    order alone, not from the cutting code)."""
    counts = np.array([40, 7, 13, 22])
    world, batch = 3, 4
    steps = balance.steps_per_rank(int(counts.sum()), world, batch, "pad")
    for epoch in range(3):
        parted = balance.assign(counts, world_size=world, batch_size=batch, policy="pad", seed=5, epoch=epoch,
                                partition_epoch=1)
        rows = [(int(c), i, False) for c in balance.epoch_order(len(counts), 5, epoch) for i in range(counts[c])]
        missing = steps * world * batch - len(rows)
        rows += [(c, i, True) for c, i, _ in rows[len(rows) - missing:]]
        for rank in range(world):
            mine = parted.of_rank(rank)
            got = [(int(c), i, bool(p))
                   for c, s, e, p in zip(mine.catalog_row, mine.start, mine.stop, mine.padding, strict=True)
                   for i in range(s, e)]
            assert got == rows[rank * steps * batch:(rank + 1) * steps * batch], (epoch, rank)


def test_passes_have_fresh_orders():
    counts = np.arange(1, 30)
    first = [balance.assign(counts, world_size=2, batch_size=4, policy="drop", seed=1, epoch=e,
                            partition_epoch=3).catalog_row.tolist() for e in range(6)]
    assert first[:3] != first[3:], "pass 1 must not repeat pass 0's order"


def test_too_many_parts_is_refused():
    with pytest.raises(ValueError, match="partition_epoch=9 exceeds the 2 steps"):
        balance.assign(np.array([16]), world_size=2, batch_size=4, policy="drop", seed=0, epoch=0,
                       partition_epoch=9)


def test_stage_past_its_part_is_refused():
    job = Job(np.array([50, 50]), 5, "drop", 0, 0, 1, 10, True)
    with pytest.raises(ValueError, match="took 99 batches"):
        job.pieces([elastic.Stage(2, 1, 0, 99)], 3, 1, 0)
