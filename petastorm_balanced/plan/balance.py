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
with no communication. No I/O, no torch, no pyspark in here.

>>> import numpy as np
>>> pieces = assign(np.array([10, 3, 7]), world_size=2, batch_size=4, policy="drop", seed=0, epoch=0)
>>> [int(pieces.rows_of_rank(r)) for r in range(2)]
[8, 8]
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import numpy as np

POLICIES = ("drop", "pad")
RESHUFFLES = ("epoch", "fixed")
ALGORITHM = "sequence-cut"
ALGORITHM_VERSION = 1


@dataclass(frozen=True)
class Pieces:
    """Row ranges of catalog row groups, in delivery order, for every slot of one epoch.

    All arrays have shape (pieces,) and are sorted by slot, then by delivery sequence. ``start:stop`` slices the
    row group's *matching* rows (not its raw positions).
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

    @property
    def num_rows(self) -> np.ndarray:
        return self.stop - self.start

    def rows_of_rank(self, rank: int) -> int:
        return int(self.num_rows[self.rank == rank].sum())

    def of_rank(self, rank: int) -> "Pieces":
        keep = self.rank == rank
        return Pieces(self.world_size, self.num_workers, self.steps_per_rank, self.batch_size,
                      *(a[keep] for a in (self.rank, self.worker, self.catalog_row, self.start, self.stop,
                                          self.padding)))


def steps_per_rank(total_rows: int, world_size: int, batch_size: int, policy: str) -> int:
    """Full batches each rank takes per epoch: rounded down for ``drop``, up for ``pad``."""
    check_policy(policy)
    global_batch = world_size * batch_size
    return total_rows // global_batch if policy == "drop" else -(-total_rows // global_batch)


def worker_steps(steps: int, num_workers: int) -> np.ndarray:
    """Steps of each DataLoader worker of one rank; the first ``steps % num_workers`` take one more."""
    # (num_workers,)
    return steps // num_workers + (np.arange(num_workers) < steps % num_workers)


@functools.lru_cache(maxsize=2)
def epoch_order(num_row_groups: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of catalog rows drawn from ``[seed, epoch]`` (read-only).

    Sorting raw PCG64 words rather than calling ``Generator.permutation`` keeps the order identical across NumPy
    versions, because only the bit generator's stream is guaranteed stable. The last two orders are kept: a rank
    that loads a plan (checks at epoch 0) and then asks for its epoch-0 assignment sorts a million words once.
    """
    words = np.random.Generator(np.random.PCG64([seed, epoch])).bit_generator.random_raw(num_row_groups)
    order = np.argsort(words, kind="stable").astype(np.int64)
    order.flags.writeable = False
    return order


def assign(counts: np.ndarray, *, world_size: int, batch_size: int, policy: str, seed: int, epoch: int,
           num_workers: int = 1, reshuffle: str = "epoch", rank: Optional[int] = None) -> Pieces:
    """Assign the matching rows of each catalog row group (``counts``) to ``world_size * num_workers`` slots.

    With ``rank``, only that rank's pieces are cut (the same pieces as ``assign(...).of_rank(rank)``): with a
    million row groups a rank then cuts its own thousand, not everyone's.
    """
    check_params(world_size=world_size, batch_size=batch_size, num_workers=num_workers, seed=seed, epoch=epoch)
    if rank is not None:
        check_params(rank=rank)
        if rank >= world_size:
            raise ValueError(f"rank={rank} must be < world_size={world_size}")
    check_policy(policy)
    if reshuffle not in RESHUFFLES:
        raise ValueError(f"reshuffle={reshuffle!r} is not one of {RESHUFFLES}")
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total < world_size * batch_size:
        raise ValueError(f"{total} matching rows cannot fill one step of world_size={world_size} x "
                         f"batch_size={batch_size} = {world_size * batch_size} rows; use a smaller batch_size or "
                         "world_size, or a predicate that matches more rows")
    steps = steps_per_rank(total, world_size, batch_size, policy)
    delivered = steps * world_size * batch_size

    order = epoch_order(len(counts), seed, 0 if reshuffle == "fixed" else epoch)
    # Segments of the delivery sequence: (catalog row, first matching row, length, padding)
    seg_row, seg_first, seg_len = order, np.zeros_like(order), counts[order]
    seg_pad = np.zeros(len(order), dtype=bool)
    if delivered > total:
        tail = _tail_segments(seg_row, seg_len, delivered - total)
        seg_row, seg_first, seg_len = (np.concatenate(p) for p in zip((seg_row, seg_first, seg_len), tail))
        seg_pad = np.concatenate([seg_pad, np.ones(len(tail[0]), dtype=bool)])

    seg_pos = np.concatenate(([0], np.cumsum(seg_len)))  # (segments + 1,) sequence position of each segment
    # slot quotas, rank-major: (world_size * num_workers,)
    slot_rows = np.tile(worker_steps(steps, num_workers) * batch_size, world_size)
    slot_pos = np.concatenate(([0], np.cumsum(slot_rows)))  # (slots + 1,)

    if rank is None:
        cuts = distinct(np.concatenate((seg_pos[seg_pos <= delivered], slot_pos)))  # where pieces start or end
    else:  # the same cuts, inside the rank's part of the sequence only
        lo, hi = slot_pos[rank * num_workers], slot_pos[(rank + 1) * num_workers]
        inside = seg_pos[np.searchsorted(seg_pos, lo, side="left"):np.searchsorted(seg_pos, hi, side="right")]
        cuts = distinct(np.concatenate((inside, slot_pos[rank * num_workers:(rank + 1) * num_workers + 1])))
    lo, hi = cuts[:-1], cuts[1:]
    seg = np.searchsorted(seg_pos, lo, side="right") - 1
    slot = np.searchsorted(slot_pos, lo, side="right") - 1
    start = seg_first[seg] + (lo - seg_pos[seg])
    return Pieces(world_size, num_workers, steps, batch_size, rank=slot // num_workers, worker=slot % num_workers,
                  catalog_row=seg_row[seg], start=start, stop=start + (hi - lo), padding=seg_pad[seg])


def distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values, as ``np.unique`` gives them; by sorting, which NumPy 2's hash-based ``np.unique``
    is several times slower than on a million int64s."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def _tail_segments(seg_row, seg_len, rows):
    """Segments that repeat the last ``rows`` rows of the sequence, in sequence order."""
    from_end = np.cumsum(seg_len[::-1])
    n = int(np.searchsorted(from_end, rows)) + 1  # segments needed, counted from the end
    rows_needed = seg_len[::-1][:n].copy()
    rows_needed[-1] -= from_end[n - 1] - rows  # the earliest one is taken only in part, from its end
    row, length = seg_row[::-1][:n][::-1], rows_needed[::-1]
    first = seg_len[::-1][:n][::-1] - length
    return row, first, length


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not one of {POLICIES}: 'drop' leaves out fewer than "
                         "world_size x batch_size rows, 'pad' repeats as many, flagged as padding")


def check_params(**params) -> None:
    """Reject non-integers and out-of-range sizes, naming the parameter."""
    minimum = {"world_size": 1, "batch_size": 1, "num_workers": 1, "seed": 0, "epoch": 0, "rank": 0}
    for name, value in params.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if value < minimum[name]:
            raise ValueError(f"{name}={value} must be >= {minimum[name]}")
