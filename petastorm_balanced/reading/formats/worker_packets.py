"""DataLoader workers send runs of batches, one message each; the main process cuts them in the DataLoader's order.

Why: a DataLoader worker's every item is one message (pickled, written to a pipe, read, unpickled by the main
process), about 0.2 ms however small; one message per batch of 256 numeric rows cost 10-50 times the reading
itself. So ``BalancedDataLoader``'s workers (which send numpy, made into tensors in the main process) send
*packets*: ``(worker, number, last, pieces)``, where ``pieces`` is a list of ``(columns, batches)``, each a dict of
arrays holding ``batches`` whole batches (views of a run, pickled once), about ``PACKET_BYTES`` in all. Every
worker ends with a packet marked ``last`` (possibly holding no batch).

Order: without packets the DataLoader hands out batches round robin over its workers, worker 0 first, skipping a
worker that ran out; the plan relies on it (``iterable.py``: the rank's batch ``j`` is batch ``j // K`` of slot
``j % K``). Packets of different workers hold different numbers of batches, so ``interleave`` keeps each
worker's batches queued apart and hands out one batch per worker in turn, reading the next packet whenever the
worker whose turn it is has none queued: the same sequence of batches as one batch per message, whatever order
the packets of different workers arrive in. A worker's own packets are numbered: one out of order or missing is
an error, never a reordering.
"""
from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..fields.schema import PADDING
from ..rows.fragments import as_list

PACKET_BYTES = 1 << 20  # about 1 MiB a message: ~0.1 ms of copying against ~0.2 ms of overhead per message
Piece = tuple[dict, int]  # (columns holding whole batches, how many)
GROUP = 32  # batches a list of interleaved_groups holds (about): as tensors.GROUP, few enough to die young


def picklable(run: dict, padding_mask: bool) -> dict:
    """A run's columns as a worker sends them (the padding flag only with ``padding_mask``): Arrow slices pickle
    their whole parent buffers, so text and lists go as arrays of objects."""
    return {k: v if isinstance(v, np.ndarray) else np.fromiter(as_list(v), dtype=object, count=len(v))
            for k, v in run.items() if k != PADDING or padding_mask}


def pieces(run: dict, batch_size: int, packet_bytes: int | None = None) -> Iterator[Piece]:
    """A run of whole batches as pieces of at most about ``packet_bytes`` (at least one batch each); views."""
    rows = len(next(iter(run.values()))) if run else 0
    if rows == 0:
        return
    limit = PACKET_BYTES if packet_bytes is None else packet_bytes
    row_bytes = max(1, sum(_nbytes(v) for v in run.values()) // rows)
    step = max(1, limit // (row_bytes * batch_size)) * batch_size
    if step >= rows:
        yield run, rows // batch_size
        return
    for begin in range(0, rows, step):
        part = {name: values[begin:begin + step] for name, values in run.items()}
        yield part, (min(rows, begin + step) - begin) // batch_size


def packets(parts: Iterable[Piece], worker: int, packet_bytes: int | None = None) -> Iterator[tuple]:
    """Worker ``worker``'s pieces grouped into packets of about ``packet_bytes``, then its ``last`` packet."""
    limit = PACKET_BYTES if packet_bytes is None else packet_bytes
    number, held, size = 0, [], 0
    for columns, batches in parts:
        if not batches:
            continue
        held.append((columns, batches))
        size += sum(_nbytes(v) for v in columns.values())
        if size >= limit:
            yield worker, number, False, held
            number, held, size = number + 1, [], 0
    yield worker, number, True, held


def interleave(items: Iterable[tuple], workers: int, cut: Callable[[dict, int], Iterator[Any]]) -> Iterator[Any]:
    """The batches of ``workers`` workers' packets (``items``, in the DataLoader's order) round robin, worker 0
    first, a worker skipped once its last packet is spent; ``cut(columns, batch_size)`` makes a piece's batches."""
    return itertools.chain.from_iterable(interleaved_groups(items, workers, cut))


def interleaved_groups(items: Iterable[tuple], workers: int, cut: Callable[[dict, int], Iterator[Any]],
                       group: int = GROUP) -> Iterator[list]:
    """``interleave``'s batches as lists of about ``group`` batches (whole rounds over the workers where every
    one has batches queued), so a loop can hand them out in C."""
    source = iter(items)
    # per worker: its pieces in order, each (columns, batch size) until its batches are first asked for, then
    # their iterator (cut then, so that ``loader.stats()`` times the cutting, not the wait for it)
    queued: list[deque] = [deque() for _ in range(workers)]
    available = [0] * workers  # batches queued per worker
    ended = [False] * workers
    numbers = [0] * workers

    def receive() -> None:
        try:
            worker, number, last, parts = next(source)
        except StopIteration:
            raise RuntimeError(f"the DataLoader ended before every worker sent its last packet (ended: {ended}); "
                               "batches would be lost") from None
        if not 0 <= worker < workers or ended[worker] or number != numbers[worker]:
            raise RuntimeError(f"DataLoader worker {worker} sent packet {number}, expected packet "
                               f"{numbers[worker] if 0 <= worker < workers else '?'} of one of {workers} workers: "
                               "batches would be out of order")
        numbers[worker] += 1
        ended[worker] = last
        for columns, batches in parts:
            rows = len(next(iter(columns.values())))
            queued[worker].append((columns, rows // batches))
            available[worker] += batches

    def take(worker: int, count: int) -> list:
        out: list = []
        queue = queued[worker]
        while len(out) < count:
            if isinstance(queue[0], tuple):
                queue[0] = cut(*queue[0])
            out.extend(itertools.islice(queue[0], count - len(out)))
            if len(out) < count:
                queue.popleft()
        available[worker] -= count
        return out

    turn = list(range(workers))  # the workers not done, in the round robin's order; ``at``: whose turn it is
    at = 0
    while turn:
        for worker in turn:
            while not available[worker] and not ended[worker]:
                receive()
        rounds = min(available[w] for w in turn)
        if rounds:  # whole rounds from the worker whose turn it is
            rounds = min(rounds, max(1, group // len(turn)))
            order = turn[at:] + turn[:at]
            yield [batch for batches in zip(*[take(w, rounds) for w in order], strict=True) for batch in batches]
            continue
        out = []  # a worker is done: one batch of each before it in turn, then it leaves the round robin
        while available[turn[at]]:
            out += take(turn[at], 1)
            at = (at + 1) % len(turn)
        del turn[at]
        if at == len(turn):
            at = 0
        if out:
            yield out
    for _ in source:  # the DataLoader's end (its workers' stop signals), so it shuts down as after a full epoch
        raise RuntimeError("a DataLoader worker sent a packet after its last one")


def _nbytes(values: Any) -> int:
    return values.nbytes if isinstance(values, np.ndarray) else len(values) * 8
