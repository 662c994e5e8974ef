"""DataLoader workers' statistics, sent to the rank's main process (``loader.stats()`` there holds them).

Why a queue: each worker is a process with its own copy of the dataset, and only the main process is asked for
``stats()``. ``BalancedDataLoader`` makes the queue before its workers start (``open_queue``); each worker counts with
a recorder of its own and sends what it added since its last message, at most once a second and when its iteration
ends (``WorkerSink``); the main process takes the messages when asked (``drain``). Small dicts, rarely: cheap.
"""
from __future__ import annotations

import os
from collections.abc import Generator, Iterable
from time import perf_counter
from typing import Any

from .stats import Cell, Recorder, View


class WorkerSink:
    """Figures of a DataLoader worker, sent to the main process through a queue made before the workers start:
    at most every ``EVERY_S`` seconds while batches flow, and when the worker's iteration ends."""

    EVERY_S = 1.0

    def __init__(self, queue: Any):
        self.queue = queue
        self.sent_at = 0.0
        self.base: dict[int, Cell] = {}

    def send(self, recorder: Recorder, *, force: bool = False) -> None:
        now = perf_counter()
        if not force and now - self.sent_at < self.EVERY_S:
            return
        self.sent_at = now
        delta = View()
        cells = recorder.cells()
        ids: dict[str, list[str]] = {}
        for cell in cells:
            before = dict(delta.threads)
            delta.add_cell(cell, self.base.get(id(cell)))
            self.base[id(cell)] = cell.copy()
            for stage, n in delta.threads.items():
                if n > before.get(stage, 0):  # this thread did the stage since the last message
                    ids.setdefault(stage, []).append(f"{os.getpid()}-{id(cell)}")
        if delta.seconds or delta.counts:
            try:
                self.queue.put_nowait({**delta.sent(), "ids": ids})
            except Exception:  # noqa: BLE001 - a full or closed queue loses figures, never a batch
                pass


def drain(queue: Any, recorder: Recorder) -> None:
    """Take what DataLoader workers sent into ``recorder`` (in the main process, when ``stats()`` is asked)."""
    import queue as queues
    while True:
        try:
            sent = queue.get_nowait()
        except (queues.Empty, OSError, ValueError, EOFError):
            return
        recorder.merge(sent)


def in_worker(owner: Any, batches: Iterable[Any]) -> Generator[Any, None, None]:
    """A DataLoader worker's batches: its stages counted by a recorder of its own (a forked copy of the parent's
    holds the parent's figures) and sent to the main process through ``owner._stats_queue`` when there is one."""
    queue = owner.__dict__.get("_stats_queue")
    recorder = owner.__dict__["_stats_recorder"] = Recorder()
    if queue is None:
        yield from recorder.measured(batches, loop=False)
        return
    queue.cancel_join_thread()  # a worker never waits at exit for figures nobody reads
    sink = WorkerSink(queue)
    try:
        for batch in recorder.measured(batches, loop=False):
            sink.send(recorder)
            yield batch
    finally:
        sink.send(recorder, force=True)


def open_queue(owner: Any, context: Any) -> Any:
    """The queue ``owner``'s DataLoader workers send their figures through, made once (before workers start) in
    the DataLoader's multiprocessing context."""
    queue = owner.__dict__.get("_stats_queue")
    if queue is None:
        import multiprocessing
        queue = owner.__dict__["_stats_queue"] = (context or multiprocessing).Queue()
    else:
        drain(queue, owner.recorder)
    return queue
