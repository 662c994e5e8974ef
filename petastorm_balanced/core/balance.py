"""The balancing algorithm: a pure function from matching-row counts to per-slot row ranges.

Why this shape: every rank must take the same number of steps, so every rank gets exactly
``steps * batch_size`` rows, and to keep reads local each slot (rank, worker) should read as few row groups, and
as few partial ones, as possible. Laying the catalog's row groups end to end in a seeded order and cutting that
sequence into consecutive slot quotas gives both at once: quotas are exact, and a row group is split only where
a cut falls inside it, so at most ``slots - 1`` row groups are split per epoch.

- Policy ``drop`` keeps the first ``steps * world * batch`` rows of the sequence; the tail it leaves out is
  shorter than ``world * batch`` rows and, because the order changes with the epoch, different rows each epoch.
- Policy ``pad`` appends a copy of the sequence's last rows, flagged as padding, so every matching row is
  delivered and the padded rows sit in the same row groups the last slots read anyway.

The order is drawn from ``[seed, epoch]`` (never ``seed + epoch``), so every rank computes the same assignment
with no communication. With sub-epochs (``partition_epoch=P``) the order is drawn per pass (``epoch // P``) and
the pass's steps are cut into P consecutive runs of whole global steps (``part_steps``); ``elastic.py`` cuts what
a pass has left after a world change the same way (``RowSequence``, ``pad_to``, ``cut_part``). No I/O, no torch, no
pyspark in here.

>>> import numpy as np
>>> pieces = assign(np.array([10, 3, 7]), world_size=2, batch_size=4, policy="drop", seed=0, epoch=0)
>>> [int(pieces.rows_of_rank(r)) for r in range(2)]
[8, 8]
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidValueError
from .params import check_choice, check_int
from .registry import Algorithm, Registry

POLICIES = ("drop", "pad")
RESHUFFLES = ("epoch", "fixed")


@dataclass(frozen=True)
class Pieces:
    """Row ranges of catalog row groups, in delivery order, for every slot of one epoch.

    All arrays have shape (pieces,) and are sorted by slot, then by delivery sequence. ``start:stop`` slices the
    row group's *matching* rows (not its raw positions), or, for a piece with ``subset[i] >= 0`` (only after an
    elastic resume, see ``elastic.py``), the matching-row indices ``subsets[subset[i]]``.
    """

    world_size: int
    num_workers: int
    steps_per_rank: int
    batch_size: int
    rank: np.ndarray  # (pieces,) int64
    worker: np.ndarray  # (pieces,) int64
    catalog_row: np.ndarray  # (pieces,) int64, index into the catalog
    start: np.ndarray  # (pieces,) int64
    stop: np.ndarray  # (pieces,) int64
    padding: np.ndarray  # (pieces,) bool
    subset: np.ndarray | None = None  # (pieces,) int64, -1 for a plain slice; None: no subsets at all
    subsets: tuple[np.ndarray, ...] = ()  # sorted matching-row indices, referenced by ``subset``

    @property
    def num_rows(self) -> np.ndarray:
        return self.stop - self.start

    def rows_of_rank(self, rank: int) -> int:
        return int(self.num_rows[self.rank == rank].sum())

    def of_rank(self, rank: int) -> Pieces:
        keep = self.rank == rank
        ranks, worker, catalog_row, start, stop, padding = (
            a[keep] for a in (self.rank, self.worker, self.catalog_row, self.start, self.stop, self.padding))
        return Pieces(self.world_size, self.num_workers, self.steps_per_rank, self.batch_size,
                      ranks, worker, catalog_row, start, stop, padding,
                      subset=None if self.subset is None else self.subset[keep], subsets=self.subsets)

    def matching_rows(self, i: int) -> np.ndarray:
        """Matching-row indices (into the row group's matching rows) of piece ``i``, in delivery order."""
        if self.subset is None or self.subset[i] < 0:
            return np.arange(self.start[i], self.stop[i], dtype=np.int64)
        return self.subsets[self.subset[i]][self.start[i]:self.stop[i]]


@dataclass(frozen=True)
class RowSequence:
    """Rows laid end to end in delivery order, as segments of catalog row groups' matching rows; what ``cut``
    divides into slot quotas. Segment ``i`` holds matching rows ``first[i]:first[i] + length[i]`` of catalog row
    ``row[i]``, or those positions of ``subsets[subset[i]]`` when ``subset[i] >= 0``."""

    row: np.ndarray  # (segments,) int64
    first: np.ndarray  # (segments,) int64
    length: np.ndarray  # (segments,) int64
    padding: np.ndarray  # (segments,) bool
    subset: np.ndarray  # (segments,) int64
    subsets: tuple[np.ndarray, ...] = ()

    @property
    def total(self) -> int:
        return int(self.length.sum())

    @property
    def positions(self) -> np.ndarray:
        """(segments + 1,) sequence position where each segment starts, then the end."""
        return np.concatenate(([0], np.cumsum(self.length)))

    def append(self, other: RowSequence) -> RowSequence:
        shift = len(self.subsets)
        row, first, length, padding = (np.concatenate(p) for p in zip(
            (self.row, self.first, self.length, self.padding),
            (other.row, other.first, other.length, other.padding), strict=True))
        return RowSequence(
            row, first, length, padding,
            np.concatenate([self.subset, np.where(other.subset >= 0, other.subset + shift, -1)]),
            self.subsets + other.subsets)

    def take(self, index: np.ndarray, first: np.ndarray, length: np.ndarray, padding: bool = False) -> RowSequence:
        """Segments ``index`` cut to ``first`` (absolute) and ``length``, keeping their subsets."""
        return RowSequence(self.row[index], first, length, np.full(len(index), padding), self.subset[index],
                        self.subsets)


def plain_sequence(row: np.ndarray, counts: np.ndarray) -> RowSequence:
    """Whole row groups ``row`` (catalog rows) with ``counts`` matching rows each, in that order."""
    n = len(row)
    return RowSequence(np.asarray(row, dtype=np.int64), np.zeros(n, dtype=np.int64),
                    np.asarray(counts, dtype=np.int64), np.zeros(n, dtype=bool), np.full(n, -1, dtype=np.int64))


def steps_per_rank(total_rows: int, world_size: int, batch_size: int, policy: str) -> int:
    """Full batches each rank takes per epoch: rounded down for ``drop``, up for ``pad``."""
    check_policy(policy)
    global_batch = world_size * batch_size
    return total_rows // global_batch if policy == "drop" else -(-total_rows // global_batch)


def worker_steps(steps: int, num_workers: int) -> np.ndarray:
    """Steps of each DataLoader worker of one rank; the first ``steps % num_workers`` take one more."""
    # (num_workers,)
    return steps // num_workers + (np.arange(num_workers) < steps % num_workers)


def part_steps(steps: int, parts: int) -> np.ndarray:
    """Steps per rank of each of ``parts`` sub-epochs sharing ``steps``: the first ``steps % parts`` take one
    more, so parts differ by at most one step."""
    # (parts,)
    return steps // parts + (np.arange(parts) < steps % parts)


@functools.lru_cache(maxsize=2)
def epoch_order(num_row_groups: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of catalog rows drawn from ``[seed, epoch]``.

    Sorting raw PCG64 words rather than calling ``Generator.permutation`` keeps the order identical across NumPy
    versions, because only the bit generator's stream is guaranteed stable. The last two orders are kept (read-only):
    a rank that loads a plan (checked at epoch 0) and then asks for its epoch-0 assignment sorts a million words once.
    """
    words = np.random.Generator(np.random.PCG64([seed, epoch])).bit_generator.random_raw(num_row_groups)
    order = np.argsort(words, kind="stable").astype(np.int64)
    order.flags.writeable = False
    return order


def split_epoch(epoch: int, partition_epoch: int) -> tuple[int, int]:
    """(pass, part) of loader epoch ``epoch`` with ``partition_epoch`` sub-epochs per pass."""
    return epoch // partition_epoch, epoch % partition_epoch


def pass_sequence(counts: np.ndarray, *, seed: int, pass_index: int, reshuffle: str = "epoch") -> RowSequence:
    """Every matching row of one pass, row groups in the order drawn from ``[seed, pass]`` (pass 0 if fixed)."""
    order = epoch_order(len(counts), seed, 0 if reshuffle == "fixed" else pass_index)
    return plain_sequence(order, np.asarray(counts, dtype=np.int64)[order])


def assign(counts: np.ndarray, *, world_size: int, batch_size: int, policy: str, seed: int, epoch: int,
           num_workers: int = 1, reshuffle: str = "epoch", partition_epoch: int = 1, order=None) -> Pieces:
    """Assign the matching rows of each catalog row group (``counts``) to ``world_size * num_workers`` slots.

    With ``partition_epoch=P`` the pass ``epoch // P`` (one order, one set of steps) is cut into P consecutive
    parts of whole global steps, and ``epoch`` gets part ``epoch % P``. ``order`` replaces the pass's seeded row
    group order (cost plans pass ``cost.cost_order``'s, which deals it so every stretch carries average cost);
    the cuts are the same row quotas either way.
    """
    check_params(world_size=world_size, batch_size=batch_size, num_workers=num_workers, seed=seed, epoch=epoch,
                 partition_epoch=partition_epoch)
    check_policy(policy)
    check_choice("reshuffle", reshuffle, RESHUFFLES)
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    check_fills_a_step(total, world_size, batch_size)
    steps = steps_per_rank(total, world_size, batch_size, policy)
    check_partition(steps, partition_epoch)
    pass_index, part = split_epoch(epoch, partition_epoch)
    if order is None:
        sequence = pass_sequence(counts, seed=seed, pass_index=pass_index, reshuffle=reshuffle)
    else:
        order = np.asarray(order, dtype=np.int64)
        sequence = plain_sequence(order, counts[order])
    return cut_part(pad_to(sequence, steps * world_size * batch_size), steps=steps, part=part,
                    parts=partition_epoch, world_size=world_size, num_workers=num_workers, batch_size=batch_size)


# The balancing algorithms (one so far): a plan stamps the one it was balanced by, and a reader refuses another.
BALANCERS = Registry("balancing algorithm", "algorithm", {"sequence-cut": Algorithm("sequence-cut", 1, assign)})
BALANCER = BALANCERS["sequence-cut"]
ALGORITHM, ALGORITHM_VERSION = BALANCER.name, BALANCER.version


def distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values, as ``np.unique`` gives them; by sorting, which NumPy 2's hash-based ``np.unique``
    is several times slower than on a million int64s."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def check_partition(steps: int, partition_epoch: int) -> None:
    if partition_epoch > steps:
        raise InvalidValueError(f"partition_epoch={partition_epoch} exceeds the {steps} steps per rank of a pass; "
                                f"every part needs at least one step: use partition_epoch <= {steps}")


def pad_to(sequence: RowSequence, delivered: int) -> RowSequence:
    """``sequence`` followed, when it holds fewer than ``delivered`` rows, by a flagged copy of its last rows."""
    total, missing = sequence.total, delivered - sequence.total
    if missing <= 0:
        return sequence
    if missing <= total:  # always so for a whole pass (total >= world x batch); not for a small elastic pool
        return sequence.append(_tail(sequence, missing))
    whole = sequence.take(np.arange(len(sequence.row)), sequence.first, sequence.length, padding=True)
    for _ in range(missing // total):
        sequence = sequence.append(whole)
    return pad_to(sequence, delivered) if missing % total else sequence


def cut_part(sequence: RowSequence, *, steps: int, part: int, parts: int, world_size: int, num_workers: int,
             batch_size: int) -> Pieces:
    """Part ``part`` of ``parts`` sharing ``steps`` steps per rank: consecutive whole global steps of
    ``sequence``, each cut into slot quotas (rank-major, workers inside a rank)."""
    per_part = part_steps(steps, parts)  # (parts,)
    begin = int(per_part[:part].sum()) * world_size * batch_size
    mine = int(per_part[part])
    # slot quotas, rank-major: (world_size * num_workers,)
    slot_rows = np.tile(worker_steps(mine, num_workers) * batch_size, world_size)
    slot_pos = begin + np.concatenate(([0], np.cumsum(slot_rows)))  # (slots + 1,)
    seg_pos = sequence.positions  # (segments + 1,)
    end = int(slot_pos[-1])
    if end > sequence.total:
        raise InvalidValueError(f"the sequence holds {sequence.total} rows; part {part} needs rows up to {end}")
    cuts = distinct(np.concatenate((seg_pos[(seg_pos >= begin) & (seg_pos <= end)], slot_pos)))  # piece ends
    lo, hi = cuts[:-1], cuts[1:]
    seg = np.searchsorted(seg_pos, lo, side="right") - 1
    slot = np.searchsorted(slot_pos, lo, side="right") - 1
    start = sequence.first[seg] + (lo - seg_pos[seg])
    subset = sequence.subset[seg]
    return Pieces(world_size, num_workers, mine, batch_size, rank=slot // num_workers, worker=slot % num_workers,
                  catalog_row=sequence.row[seg], start=start, stop=start + (hi - lo), padding=sequence.padding[seg],
                  subset=subset if (subset >= 0).any() else None, subsets=sequence.subsets if (subset >= 0).any()
                  else ())


def _tail(sequence: RowSequence, rows: int) -> RowSequence:
    """Padding segments that repeat the last ``rows`` rows of the sequence, in sequence order."""
    length = sequence.length
    from_end = np.cumsum(length[::-1])
    n = int(np.searchsorted(from_end, rows)) + 1  # segments needed, counted from the end
    index = np.arange(len(length) - n, len(length))
    take = length[index].copy()
    take[0] -= from_end[n - 1] - rows  # the earliest one is taken only in part, from its end
    first = sequence.first[index] + length[index] - take
    return sequence.take(index, first, take, padding=True)


def check_fills_a_step(total_rows: int, world_size: int, batch_size: int) -> None:
    """The one "too few rows" rule: every rank needs at least one full batch (planning, plans and loaders ask)."""
    if total_rows < world_size * batch_size:
        raise InvalidValueError(f"{total_rows} matching rows cannot fill one step of world_size={world_size} x "
                                f"batch_size={batch_size} = {world_size * batch_size} rows; use a smaller batch_size "
                                "or world_size, or a predicate that matches more rows")


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise InvalidValueError(f"policy={policy!r} is not one of {POLICIES}: 'drop' leaves out fewer than "
                                "world_size x batch_size rows, 'pad' repeats as many, flagged as padding")


def check_params(**params) -> None:
    """Reject non-integers and out-of-range sizes, naming the parameter."""
    minimum = {"world_size": 1, "batch_size": 1, "num_workers": 1, "seed": 0, "epoch": 0, "partition_epoch": 1}
    for name, value in params.items():
        check_int(name, value, minimum=minimum[name])
