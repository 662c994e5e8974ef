"""Elastic mid-epoch resume (G10): the rows of a pass no rank has consumed yet, split over a new world.

Why no row lists: a loader position is ``(epoch, batches)`` and every rank of a world takes the same steps, so
the plan alone says which rows each old slot delivered: its planned rows (``balance.cut_part``) read in plan
order and permuted in fixed shuffle windows (the core's rule, ``shuffle.py``, which the readers apply): after
``k`` batches a slot has delivered every window before the current one, plus the first ``k`` batches' share of the
current window's permutation. The caller only says how its slots shuffled (``shuffle.Windows``); this module reads
the rule backwards itself and stays pure arithmetic over intervals of matching rows.

A pass may change worlds several times; each finished world is a ``Stage``: its world size, DataLoader workers
per rank, the part (sub-epoch, ``epoch % partition_epoch``) in which it stopped and the batches each of its ranks
had taken in that part. Stage 0 is the ordinary assignment of the pass. Stage ``s + 1`` starts from the pool of
rows stage ``s`` left unconsumed, in a deterministic order that keeps reads local (old slot by old slot: the
unread rows of its current window, then the rest of its quota; then the rows of later parts and the rows that
policy ``drop`` left out), and cuts it for its own world exactly as a pass is cut: the parts left in the pass share
``pool // (W' x batch)`` steps (``pad``: rounded up, the last rows repeated with the padding flag), the parts
differing by at most one step. So over a pass no real row is delivered twice, ``drop`` leaves out fewer than
``W_last x batch`` rows (only the last stage drops), and ``pad`` delivers every row.

Rows of a partly consumed window are scattered inside their row groups; they become *subset* segments (sorted
matching-row indices), at most one window per old slot, so the extra state is bounded by the windows, not the
dataset.

>>> import numpy as np
>>> from petastorm_balanced.core import balance
>>> from petastorm_balanced.core.shuffle import Windows
>>> counts = np.array([10, 6, 4])  # 20 matching rows, batch 2
>>> windows = Windows.of(batch_size=2, shuffle_window=4, shuffle=False)  # no shuffling: rows in plan order
>>> args = dict(batch_size=2, policy="drop", seed=0, epoch=0, windows=windows)
>>> balance.assign(counts, world_size=4, batch_size=2, policy="drop", seed=0, epoch=0).steps_per_rank
2
>>> after = stage_pieces(counts, stages=[Stage(world_size=4, num_workers=1, part=0, batches=1)], world_size=3,
...                      num_workers=1, **args)  # 4 ranks took 1 step (8 rows); 12 left for 3 ranks
>>> after.steps_per_rank, [after.rows_of_rank(r) for r in range(3)]
(2, [4, 4, 4])
"""
from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidValueError
from . import balance
from .balance import Pieces, RowSequence
from .shuffle import Windows


@dataclass(frozen=True)
class Stage:
    """A world that served part of a pass and stopped: where it stopped and how its slots were laid out."""

    world_size: int
    num_workers: int
    part: int  # the part (epoch % partition_epoch) it stopped in
    batches: int  # batches each of its ranks had taken in that part

    def as_list(self) -> list[int]:
        return [self.world_size, self.num_workers, self.part, self.batches]

    @classmethod
    def from_list(cls, values) -> Stage:
        if not isinstance(values, (list, tuple)) or len(values) != 4 or any(
                isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in values):
            raise InvalidValueError("a saved stage must be 4 ints [world_size, num_workers, part, batches], got "
                                    f"{values!r}")
        stage = cls(*(int(v) for v in values))
        balance.check_params(world_size=stage.world_size, num_workers=stage.num_workers)
        if stage.part < 0 or stage.batches < 0:
            raise InvalidValueError(f"a saved stage has a negative part or batch count: {values!r}")
        return stage


def stage_pieces(counts: np.ndarray, *, stages: Seq[Stage], world_size: int, num_workers: int, batch_size: int,
                 policy: str, seed: int, epoch: int, windows: Windows, reshuffle: str = "epoch",
                 partition_epoch: int = 1) -> Pieces:
    """Every slot's rows for loader epoch ``epoch`` in the world after ``stages`` (``[]``: ``balance.assign``);
    ``windows``: how the stages' slots shuffled their rows (the slots' keys follow from ``seed`` and ``epoch``)."""
    if not stages:
        return balance.assign(counts, world_size=world_size, batch_size=batch_size, policy=policy, seed=seed,
                              epoch=epoch, num_workers=num_workers, reshuffle=reshuffle,
                              partition_epoch=partition_epoch)
    balance.check_params(world_size=world_size, batch_size=batch_size, num_workers=num_workers, seed=seed,
                         epoch=epoch, partition_epoch=partition_epoch)
    pass_index, part = balance.split_epoch(epoch, partition_epoch)
    pool = balance.pass_sequence(np.asarray(counts, dtype=np.int64), seed=seed, pass_index=pass_index,
                                 reshuffle=reshuffle)
    first_part = 0  # the first part the current stage serves
    for index, stage in enumerate(stages):
        if not first_part <= stage.part < partition_epoch:
            raise InvalidValueError(f"stage {index} stopped in part {stage.part}, outside parts {first_part}.."
                                    f"{partition_epoch - 1} that were left in the pass")
        pieces, begin = _cut(pool, stage.world_size, stage.num_workers, batch_size, policy,
                             stage.part - first_part, partition_epoch - first_part)
        if stage.batches > pieces.steps_per_rank:
            raise InvalidValueError(f"stage {index} took {stage.batches} batches in part {stage.part}, which has only "
                                    f"{pieces.steps_per_rank} steps at world_size={stage.world_size}")
        pool = unconsumed(pool, stage, index, pieces, windows, seed=seed, epoch=epoch, part_begin=begin)
        first_part = stage.part
    if part < first_part:
        raise InvalidValueError(f"epoch {epoch} is part {part} of pass {pass_index}, which a world before the last "
                                f"resume already served (it stopped in part {first_part}); set_epoch to a later epoch")
    return _cut(pool, world_size, num_workers, batch_size, policy, part - first_part,
                partition_epoch - first_part)[0]


def _cut(pool: RowSequence, world_size: int, num_workers: int, batch_size: int, policy: str, part: int,
         parts: int) -> tuple[Pieces, int]:
    """Part ``part`` of the ``parts`` left, cut from ``pool`` as a pass is cut (0 steps when ``drop`` cannot fill
    one), and the pool position where that part starts."""
    steps = balance.steps_per_rank(pool.total, world_size, batch_size, policy)
    padded = balance.pad_to(pool, steps * world_size * batch_size)
    pieces = balance.cut_part(padded, steps=steps, part=part, parts=parts, world_size=world_size,
                              num_workers=num_workers, batch_size=batch_size)
    return pieces, int(balance.part_steps(steps, parts)[:part].sum()) * world_size * batch_size


def unconsumed(pool: RowSequence, stage: Stage, index: int, pieces: Pieces, windows: Windows, *, seed: int,
               epoch: int, part_begin: int) -> RowSequence:
    """The real rows of ``pool`` that ``stage`` (stage ``index``, cut as ``pieces``, its part starting at
    ``part_begin``) did not deliver, in the order the next stage lays them out."""
    workers, batch = stage.num_workers, pieces.batch_size
    # slot quotas of the part, rank-major: (slots,)
    slot_rows = np.tile(balance.worker_steps(pieces.steps_per_rank, workers) * batch, stage.world_size)
    slot_pos = part_begin + np.concatenate(([0], np.cumsum(slot_rows)))  # (slots + 1,)
    real = pool.total  # padding, if any, sits at positions >= real
    builder = _Builder(pool)
    for slot in range(len(slot_rows)):
        rank, worker = divmod(slot, workers)
        done = (stage.batches + workers - 1 - worker) // workers  # rank batch j is slot batch j // K of j % K
        window, rest = windows.unread(int(slot_rows[slot]), batch_size=batch, batches_done=done, seed=seed,
                                      epoch=epoch, rank=rank, slot=worker, stage=index)
        begin = int(slot_pos[slot])
        builder.positions(begin + window[begin + window < real])
        builder.range(begin + rest, min(int(slot_pos[slot + 1]), real))
    builder.range(int(slot_pos[-1]), real)  # later parts, and the rows policy drop left out
    return builder.build()


class _Builder:
    """Collects runs and scattered positions of a pool into the next pool, sharing the pool's subsets."""

    def __init__(self, pool: RowSequence):
        self.pool, self.starts = pool, pool.positions
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.subsets: list[np.ndarray] = list(pool.subsets)

    def range(self, lo: int, hi: int) -> None:
        if lo >= hi:
            return
        pos, pool = self.starts, self.pool
        index = np.arange(np.searchsorted(pos, lo, side="right") - 1, np.searchsorted(pos, hi, side="left"))
        a, b = np.maximum(pos[index], lo), np.minimum(pos[index + 1], hi)  # (segments,)
        keep = b > a
        index, a, b = index[keep], a[keep], b[keep]
        self.parts.append((pool.row[index], pool.first[index] + (a - pos[index]), b - a, pool.subset[index]))

    def positions(self, positions: np.ndarray) -> None:
        """Scattered rows (sorted pool positions): one segment per row group they fall in."""
        if not len(positions):
            return
        pool = self.pool
        seg = np.searchsorted(self.starts, positions, side="right") - 1
        inside = pool.first[seg] + (positions - self.starts[seg])  # index in the segment's row space
        breaks = np.flatnonzero(np.diff(seg)) + 1
        for group in np.split(np.arange(len(seg)), breaks):
            s = int(seg[group[0]])
            rows = inside[group]
            if pool.subset[s] >= 0:
                rows = pool.subsets[pool.subset[s]][rows]
            if rows[-1] - rows[0] == len(rows) - 1:  # one run of matching rows: a plain slice
                part = ([pool.row[s]], [rows[0]], [len(rows)], [-1])
            else:
                self.subsets.append(rows.astype(np.int64))
                part = ([pool.row[s]], [0], [len(rows)], [len(self.subsets) - 1])
            self.parts.append(tuple(np.asarray(p, dtype=np.int64) for p in part))

    def build(self) -> RowSequence:
        if not self.parts:
            empty = np.empty(0, dtype=np.int64)
            return RowSequence(empty, empty, empty, np.empty(0, dtype=bool), empty, ())
        row, first, length, subset = (np.concatenate(p).astype(np.int64) for p in zip(*self.parts, strict=True))
        used = np.unique(subset[subset >= 0])  # keep only subsets still referenced, renumbered
        renumber = np.full(len(self.subsets) + 1, -1, dtype=np.int64)  # index -1 (no subset) stays -1
        renumber[used] = np.arange(len(used))
        subset = renumber[subset]
        return RowSequence(row, first, length, np.zeros(len(row), dtype=bool), subset,
                        tuple(self.subsets[i] for i in used))
