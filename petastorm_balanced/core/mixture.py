"""A mixture of sources: how many rows of each source every batch holds, and where each source stands. Pure.

**Rows per batch.** Source ``i`` has weight ``w_i`` (normalized to sum 1), so its share of a batch of ``B`` rows
is ``q_i = w_i x B`` rows, rarely an integer. Every batch holds ``floor(q_i)`` rows of it, plus one more in some
batches: the fractions ``r_i = q_i - floor(q_i)`` add up to an integer ``M`` (the rows left over per batch), and
each batch gives one extra row to ``M`` distinct sources. Which ones is a *Pfair* schedule (proportionate-fair
scheduling of tasks of weights ``r_i`` on ``M`` processors, one slot per batch), computed with the PD² priority
rule (Anderson and Srinivasan), which is optimal when the weights fill the processors exactly, as here. What it
guarantees, and why that shape:

- every batch holds ``floor(q_i)`` or ``ceil(q_i)`` rows of source ``i`` and exactly ``B`` rows in all;
- the running count is within one row: after ``t`` batches source ``i`` has delivered more than ``q_i t - 1`` and
  fewer than ``q_i t + 1`` rows (Pfair's lag bound), so over any run of consecutive batches its count differs from
  ``q_i x batches`` by less than two rows. (Within one row over *every* run is impossible in general for three or
  more sources: Fraenkel's balanced-word problem.)
- the schedule is periodic: after ``period`` batches (the common denominator of the ``r_i``) every lag is zero and
  it repeats, so the rows any range of batches takes are a table lookup, the same on every rank, with no state but
  the batch count and no communication. Weights are read exactly as given: integers and ``Fraction`` as they
  are, a float as the simplest fraction that is that float (0.7 is 7/10, 4e-05 is 1/25000, 1/3 is 1/3), so the
  shares are the ones the user wrote, however small; a period longer than ``MAX_PERIOD`` batches (weights with
  many digits) is refused naming the weight, never rounded into other shares.

**Where a source stands.** Each rank reads a source in passes of ``rows_per_pass`` rows (the source plan's
rows per rank at ``batch_size=1``); a source's *counter* is the rows of it a rank has delivered since its first
pass began, so ``divmod(counter, rows_per_pass)`` is (pass, row). Every rank takes the same rows of every source at
every batch, so the counters are the same on every rank. A ``Point`` is a position in the mixture: the epoch, the
batch inside it, the schedule's phase and every source's counter; ``Mixture`` moves points forward.

**Epochs.** By default an epoch ends with the batch in which the scarcest source (fewest ``rows_per_pass / q_i``
batches per pass) completes a pass, so epoch ``e`` is pass ``e`` of that source, give or take the batch that holds
both passes' rows; its length may differ by one step from epoch to epoch (like sub-epochs), the same on every rank.
``epoch_steps=S`` makes every epoch ``S`` steps. Either way every source continues in the next epoch where it
stopped: no row of a source is repeated before all its rows of the pass were delivered, and none is skipped.

>>> schedule = make_schedule(parse_weights([0.7, 0.3], 2), batch_size=10)
>>> schedule.counts(0, 3).tolist()   # 7 and 3 rows of 10: integers, nothing to spread
[[7, 3], [7, 3], [7, 3]]
>>> schedule = make_schedule(parse_weights([2, 1, 1], 3), batch_size=6)   # 3, 1.5, 1.5 rows per batch
>>> schedule.counts(0, 4).tolist()
[[3, 2, 1], [3, 1, 2], [3, 2, 1], [3, 1, 2]]
>>> mixture = Mixture(schedule, rows_per_pass=(30, 9, 100))   # source 1: 9 rows / 1.5 per batch = 6 batches
>>> mixture.scarcest, mixture.steps_of(mixture.start(0)), mixture.start(1).counters
(1, 6, (18, 9, 9))
"""
from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from math import lcm
from numbers import Real

import numpy as np

from ..errors import InvalidTypeError, InvalidValueError
from .params import check_int

MAX_PERIOD = 1 << 20  # batches in one period of the schedule (one table of period x sources small ints)


def parse_weights(weights, sources: int) -> tuple[Fraction, ...]:
    """``weights`` (one positive number per source) as fractions summing to 1."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise InvalidTypeError(f"weights={weights!r} must be a list of numbers, one per plan")
    if len(weights) != sources:
        raise InvalidValueError(f"weights={list(weights)!r} has {len(weights)} entries for {sources} plans; give one "
                                "weight per plan")
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (Real, Fraction)):
            raise InvalidTypeError(f"weights[{i}]={w!r} must be a number")
        if not float(w) > 0 or w != w or w == float("inf"):
            raise InvalidValueError(f"weights[{i}]={w!r} must be a positive finite number (leave a source out "
                                    "instead of giving it weight 0)")
    parsed = [Fraction(w) if isinstance(w, (int, Fraction)) else simplest_fraction(float(w)) for w in weights]
    total = sum(parsed)
    return tuple(w / total for w in parsed)


def simplest_fraction(value: float) -> Fraction:
    """The fraction of smallest denominator (within a factor of two) that converts back to ``value``: what a user
    who wrote ``0.7`` or ``4e-05`` meant (7/10, 1/25000), where the float's own binary fraction would make every
    schedule period astronomically long.

    >>> simplest_fraction(0.7), simplest_fraction(4e-05), simplest_fraction(1 / 3)
    (Fraction(7, 10), Fraction(1, 25000), Fraction(1, 3))
    """
    exact = Fraction(value)
    bound = 1
    while True:  # ends: the float itself is a fraction whose denominator is a power of two
        candidate = exact.limit_denominator(bound)
        if float(candidate) == value:
            return candidate
        bound *= 2


@dataclass(frozen=True)
class Schedule:
    """Rows of each source in every batch: ``base`` in all of them, plus the 0/1 ``extras`` of the periodic
    table (``extras[t % period]``); ``prefix[t]`` is the extras of batches ``0..t-1`` of a period."""

    weights: tuple[Fraction, ...]
    batch_size: int
    base: np.ndarray  # (sources,) int64: floor(w x batch_size)
    extras: np.ndarray  # (period, sources) int64, 0 or 1
    prefix: np.ndarray  # (period + 1, sources) int64

    @property
    def period(self) -> int:
        return len(self.extras)

    @property
    def sources(self) -> int:
        return len(self.weights)

    @property
    def shares(self) -> tuple[Fraction, ...]:
        """Rows per batch of each source, exactly: ``w x batch_size``."""
        return tuple(w * self.batch_size for w in self.weights)

    def consumed(self, batches) -> np.ndarray:
        """Rows of each source in the first ``batches`` batches of the schedule: (sources,) for an int,
        (n, sources) for an array of n batch counts."""
        t = np.asarray(batches, dtype=np.int64)
        whole, rest = np.divmod(t, self.period)
        return (t[..., None] * self.base + whole[..., None] * self.prefix[-1] + self.prefix[rest])

    def origin(self, source: int, phase: int, counter: int) -> int:
        """Where ``source``'s batch boundaries lie when batch ``phase`` (of a period) starts at ``counter``: every
        boundary is ``origin + consumed(t)`` for some integer ``t``, and two points of one timeline give the same
        origin (it is taken modulo the rows of one period)."""
        return int(counter - self.consumed(phase)[source]) % int(self.consumed(self.period)[source])

    def cuts(self, source: int, origin: int, lo: int, hi: int) -> np.ndarray:
        """The counters of ``source`` in ``lo..hi`` at which a batch starts on the timeline of ``origin``
        (sorted, distinct)."""
        share = float(self.shares[source])
        margin = int(2 / share) + 2  # the lag bound: t batches take within two rows of share x t
        ts = np.arange(int((lo - origin) / share) - margin, int((hi - origin) / share) + margin + 1)
        bounds = origin + self.consumed(ts)[:, source]
        return np.unique(bounds[(bounds >= lo) & (bounds <= hi)])

    def counts(self, start: int, stop: int) -> np.ndarray:
        """(stop - start, sources) rows of each source in batches ``start..stop-1``."""
        rows = np.arange(start, stop, dtype=np.int64) % self.period
        return self.extras[rows] + self.base


@functools.lru_cache(maxsize=16)
def make_schedule(weights: tuple[Fraction, ...], batch_size: int) -> Schedule:
    """The schedule of ``weights`` (``parse_weights``) for batches of ``batch_size`` rows."""
    batch_size = check_int("batch_size", batch_size, minimum=1)
    shares = [w * batch_size for w in weights]
    base = np.array([int(s) for s in shares], dtype=np.int64)  # floor: shares are positive
    fractions = [s - int(s) for s in shares]
    period = lcm(*(f.denominator for f in fractions))
    if period > MAX_PERIOD:
        worst = max(range(len(weights)), key=lambda i: fractions[i].denominator)
        raise InvalidValueError(f"weights[{worst}] is {weights[worst]} of the total, so with batch_size={batch_size} "
                                f"the schedule repeats only every {period} batches (more than {MAX_PERIOD}); give "
                                "weights with a small common denominator, such as integers ([7, 2, 1]) or two "
                                "decimals")
    extras = pfair([int(f * period) for f in fractions], period)
    prefix = np.concatenate([np.zeros((1, len(weights)), dtype=np.int64), np.cumsum(extras, axis=0)])
    return Schedule(weights, batch_size, base, extras, prefix)


def pfair(numerators: Sequence[int], period: int) -> np.ndarray:
    """(period, tasks) 0/1: a Pfair schedule of tasks of weight ``numerators[i] / period`` (each < 1, summing to an
    integer ``M``) on ``M`` processors over one period, by the PD² rule.

    Task ``i``'s ``j``-th unit (1-based) may run from slot ``floor((j-1)/w)`` on and must run before
    ``ceil(j/w)`` (its window); among the units whose window has opened, the ``M`` with the earliest deadline
    run, ties broken by the b-bit (whether the next window overlaps this one: 1 first) and then, for heavy tasks
    (``w >= 1/2``), the later group deadline. Every unit then runs inside its window, which is the lag bound
    ``|w t - units run by t| < 1``.
    """
    tasks = len(numerators)
    total = sum(numerators)
    if total % period:
        raise ValueError(f"weights {numerators}/{period} do not add up to a whole number of processors")
    processors = total // period
    table = np.zeros((period, tasks), dtype=np.int64)
    done = [0] * tasks

    def priority(i: int):
        a, j = numerators[i], done[i] + 1
        deadline = -(-j * period // a)
        b_bit = deadline - (j * period) // a
        group = 0
        if 2 * a >= period and b_bit:  # heavy task: its group deadline breaks the tie (later first)
            c = -(-deadline * (period - a) // period)
            group = -(-c * period // (period - a))
        return (deadline, -b_bit, -group, i)

    for t in range(period):
        ready = [priority(i) for i in range(tasks)
                 if done[i] < numerators[i] and (done[i] * period) // numerators[i] <= t]
        for _, _, _, i in heapq.nsmallest(processors, ready):
            table[t, i] = 1
            done[i] += 1
    return table


@dataclass(frozen=True)
class Point:
    """A position in a mixture: batch ``batch`` of epoch ``epoch``, the schedule's ``phase`` (batches since its
    origin, modulo the period) and each source's counter (rows per rank delivered since its first pass)."""

    epoch: int
    batch: int
    phase: int
    counters: tuple[int, ...]


@dataclass(frozen=True)
class Mixture:
    """A schedule, each source's rows per pass (per rank), and how long an epoch is (None: the default)."""

    schedule: Schedule
    rows_per_pass: tuple[int, ...]
    epoch_steps: int | None = None

    def __post_init__(self) -> None:
        if len(self.rows_per_pass) != self.schedule.sources:
            raise ValueError("one rows_per_pass per source")
        for i, (rows, share) in enumerate(zip(self.rows_per_pass, self.schedule.shares, strict=True)):
            if rows < -(-share.numerator // share.denominator):
                raise InvalidValueError(f"source {i} has {rows} rows per rank per pass, fewer than its share of one "
                                        f"batch ({float(share):g} rows); give it a smaller weight, or use a "
                                        "smaller batch_size or world size")

    @property
    def scarcest(self) -> int:
        """The source with the fewest batches per pass (``rows_per_pass / share``); the first of equals."""
        spans = [Fraction(rows) / share for rows, share in zip(self.rows_per_pass, self.schedule.shares,
                                                               strict=True)]
        return spans.index(min(spans))

    def advance(self, point: Point, batches: int) -> Point:
        """``point`` after ``batches`` more batches (in the same epoch: the caller moves epochs)."""
        schedule = self.schedule
        taken = schedule.consumed(point.phase + batches) - schedule.consumed(point.phase)
        counters = tuple(int(c) + int(d) for c, d in zip(point.counters, taken, strict=True))
        return Point(point.epoch, point.batch + batches, (point.phase + batches) % schedule.period, counters)

    def remaining(self, point: Point) -> int:
        """Batches left in ``point``'s epoch (at least one at an epoch's first batch; a point at the end of its
        epoch has none left)."""
        if self.epoch_steps is not None:
            return max(0, self.epoch_steps - point.batch)
        s = self.scarcest
        rows = self.rows_per_pass[s]
        goal = (point.counters[s] // rows + 1) * rows - point.counters[s]  # rows of s left in its pass
        return self._batches_to(s, point.phase, goal)

    def steps_of(self, point: Point) -> int:
        """Steps of ``point``'s epoch (its batches so far and those left)."""
        return point.batch + self.remaining(point)

    def next_epoch(self, point: Point, epochs: int = 1) -> Point:
        """The first batch of the ``epochs``-th epoch after ``point``'s, by arithmetic (the same cost for any
        ``epochs``): after the end of ``point``'s epoch, each epoch takes ``epoch_steps`` batches, or (the default)
        ends in the batch where the scarcest source's counter reaches its next pass, and that batch never carries
        it a whole pass further (a pass holds at least a batch's share), so ``epochs - 1`` more epochs end where
        its counter reaches ``epochs - 1`` more pass boundaries."""
        epochs = check_int("epochs", epochs, minimum=1)
        end = self.advance(point, self.remaining(point))
        more = epochs - 1
        if self.epoch_steps is not None:
            batches = more * self.epoch_steps
        else:
            s, rows = self.scarcest, self.rows_per_pass[self.scarcest]
            counter = end.counters[s]
            batches = self._batches_to(s, end.phase, (counter // rows + more) * rows - counter) if more else 0
        return replace(self.advance(end, batches), epoch=point.epoch + epochs, batch=0)

    def start(self, epoch: int) -> Point:
        """The first batch of ``epoch`` when every source started at its first row at epoch 0 with this schedule."""
        epoch = check_int("epoch", epoch, minimum=0)
        if self.epoch_steps is not None:
            batches = epoch * self.epoch_steps
        else:  # epoch e starts after the batch in which the scarcest source's counter reaches e passes
            s = self.scarcest
            batches = self._batches_to(s, 0, epoch * self.rows_per_pass[s])
        origin = Point(0, 0, 0, (0,) * self.schedule.sources)
        return replace(self.advance(origin, batches), epoch=epoch, batch=0)

    def at(self, epoch: int, batch: int) -> Point:
        """Batch ``batch`` of ``epoch`` on the timeline of ``start``."""
        start = self.start(epoch)
        batch = check_int("batch", batch, minimum=0, maximum=self.remaining(start))
        return self.advance(start, batch)

    def _batches_to(self, source: int, phase: int, rows: int) -> int:
        """The fewest batches from ``phase`` after which ``source`` has taken at least ``rows`` rows."""
        if rows <= 0:
            return 0
        schedule = self.schedule
        column = schedule.consumed(phase)[source]
        share = schedule.shares[source]
        lo, hi = 0, int((rows + 1) / share) + 2  # the lag bound: t batches take more than share x t - 1 rows
        while lo < hi:  # the smallest t with consumed(phase + t) - consumed(phase) >= rows
            mid = (lo + hi) // 2
            if schedule.consumed(phase + mid)[source] - column >= rows:
                hi = mid
            else:
                lo = mid + 1
        return lo
