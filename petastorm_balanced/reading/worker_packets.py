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

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

PACKET_BYTES = 1 << 20  # about 1 MiB a message: ~0.1 ms of copying against ~0.2 ms of overhead per message
Piece = tuple[dict, int]  # (columns holding whole batches, how many)


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
    source = iter(items)
    queued: list[deque] = [deque() for _ in range(workers)]  # per worker: iterators of its batches, in order
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
            queued[worker].append(cut(columns, rows // batches))

    turn = list(range(workers))
    at = 0
    while turn:
        worker = turn[at]
        queue = queued[worker]
        while True:
            if queue:
                batch = next(queue[0], None)
                if batch is not None:
                    break
                queue.popleft()
            elif ended[worker]:
                batch = None
                break
            else:
                receive()
        if batch is None:  # this worker is done: the others continue in turn
            del turn[at]
            if at == len(turn):
                at = 0
            continue
        yield batch
        at += 1
        if at == len(turn):
            at = 0
    for _ in source:  # the DataLoader's end (its workers' stop signals), so it shuts down as after a full epoch
        raise RuntimeError("a DataLoader worker sent a packet after its last one")


def _nbytes(values: Any) -> int:
    return values.nbytes if isinstance(values, np.ndarray) else len(values) * 8
