"""Plan order out of Petastorm's worker pools, with bounded memory.

Petastorm's thread and process pools hand results back in completion order, so with several workers the rows
would come in a different order on every run (G4 broken). Each ventilated item carries its fragment's sequence
number; ``OrderedResults`` keeps early arrivals in a small buffer and releases them in sequence. The buffer stays
bounded because ``OrderedVentilator`` never sends fragment ``i`` before the consumer has taken fragment
``i - max_ahead``: at most ``max_ahead`` fragments are ever in flight or waiting, whatever the workers' speeds.

An item may come back in parts (``Part``): a thread-pool worker whose item holds more bytes than its ``Cut`` allows
publishes what it read so far and reads the rest only once the consumer took that part (``Gate.wait_for_turn``), so
an item sent when rows were short holds at most ``Cut.limit`` bytes plus one fragment when they turn long.
"""
from __future__ import annotations

import queue
import sys
import threading
from dataclasses import dataclass
from traceback import format_exc
from typing import Any

from petastorm.workers_pool import EmptyResultError, VentilatedItemProcessedMessage
from petastorm.workers_pool.thread_pool import ThreadPool, WorkerTerminationRequested, WorkerThread
from petastorm.workers_pool.ventilator import Ventilator

from ...errors import InvalidValueError


class Gate:
    """How far ventilation may run ahead of consumption; wakes the ventilator as soon as there is room, and a worker
    holding the rest of a cut item as soon as its turn comes."""

    def __init__(self, max_ahead: int):
        if max_ahead < 1:
            raise InvalidValueError(f"max_ahead={max_ahead} must be >= 1")
        self.max_ahead = max_ahead
        self._consumed = 0
        self._parts = 0  # parts of item ``_consumed`` taken so far
        self._stopped = False
        self._cond = threading.Condition()

    def consumed(self, count: int) -> None:
        with self._cond:
            self._consumed, self._parts = count, 0
            self._cond.notify_all()

    def taken(self, sequence: int, parts: int) -> None:
        """The consumer took the first ``parts`` parts of item ``sequence`` (not all of them)."""
        with self._cond:
            self._consumed, self._parts = sequence, parts
            self._cond.notify_all()

    def wait_for_turn(self, sequence: int, part: int) -> bool:
        """Block until part ``part`` of item ``sequence`` may be read: the consumer took every part before it;
        False when stopped."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopped or self._consumed > sequence
                                or (self._consumed == sequence and self._parts >= part))
            return not self._stopped

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def wait_for_room(self, sequence: int) -> bool:
        """Block until item ``sequence`` may be sent; False when stopped."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopped or sequence < self._consumed + self.max_ahead)
            return not self._stopped


@dataclass(frozen=True)
class Cut:
    """What a thread-pool worker is told with its item: cut it into parts of about ``limit`` bytes (Arrow buffers),
    reading each part after the one before it was taken (``gate``)."""

    limit: int
    gate: Gate


@dataclass(frozen=True)
class Part:
    """Fragments ``[start, stop)`` of item ``sequence``, published by a worker that cut the item (``last``: the
    item's end)."""

    sequence: int
    index: int
    start: int
    stop: int
    last: bool


class LazyItems:
    """Items made one at a time, when the ventilator has room for the next: ``make(sequence)`` returns ``(item,
    last)``. ``count`` is known once the last was made. Why lazily: an item made when it is sent is cut from what
    the items before it measured (``read_ahead.BundleSizes``), not from what was known when the epoch began."""

    def __init__(self, make, *, empty: bool = False):
        self._make = make
        self._state = (0, empty)  # (items made, the last made): replaced at once, so readers see both or neither

    @property
    def exhausted(self) -> bool:
        return self._state[1]

    @property
    def count(self) -> int | None:
        made, last = self._state
        return made if last else None

    def next(self) -> dict:
        made = self._state[0]
        item, last = self._make(made)
        self._state = (made + 1, last)
        return item


class OrderedVentilator(Ventilator):
    """Ventilates the items once, in order, never more than the gate allows ahead of the consumer."""

    def __init__(self, ventilate_fn, items: list[dict] | LazyItems, gate: Gate):
        super().__init__(ventilate_fn)
        self._items, self._gate = items, gate
        self._done = not items if isinstance(items, list) else items.exhausted
        self._stop_requested = False
        self._thread: threading.Thread | None = None

    def start(self):
        thread = threading.Thread(target=self._run, name="petastorm-balanced-ventilator", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self):
        items = self._items
        if isinstance(items, LazyItems):  # each item made once there is room for it: from the latest measure
            sequence = 0
            while not items.exhausted:
                if not self._gate.wait_for_room(sequence):
                    return
                self._ventilate_fn(**items.next())
                sequence += 1
        else:
            for sequence, item in enumerate(items):
                if not self._gate.wait_for_room(sequence):
                    return
                self._ventilate_fn(**item)
        self._done = True  # only after the last ventilate call: pools count items before asking completed()

    def processed_item(self):
        pass  # the gate counts consumption in order, which is stricter than processing

    def completed(self):
        return self._done or self._stop_requested

    def stop(self):
        self._stop_requested = True
        self._gate.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def reset(self):
        raise NotImplementedError("a planned reader covers exactly one epoch; create a new one for the next epoch")


class OrderedResults:
    """Pulls ``(sequence, payload)`` or ``(Part, payload)`` results from a pool and returns them in order."""

    def __init__(self, pool, gate: Gate, count: int | LazyItems):
        self._pool, self._gate, self._count = pool, gate, count
        self._next, self._part = 0, 0  # the next item, and the next part of it
        self._early: dict[tuple[int, int], tuple[Part | None, Any]] = {}

    @property
    def delivered(self) -> int:
        return self._next

    def next(self) -> tuple[int, Any, Part | None]:
        """The next item's payload (or the next part of it: ``Part``, else None); ``EmptyResultError`` once every
        item was delivered."""
        count = self._count.count if isinstance(self._count, LazyItems) else self._count
        if count is not None and self._next >= count:
            raise EmptyResultError()
        key = (self._next, self._part)
        while key not in self._early:
            try:
                head, payload = self._pool.get_results()
            except EmptyResultError:
                raise RuntimeError(f"the worker pool ended after {self._next} of {count or 'more'} items; "
                                   "a worker died or the reader was stopped") from None
            if isinstance(head, Part):
                self._early[(head.sequence, head.index)] = (head, payload)
            else:
                self._early[(head, 0)] = (None, payload)
        part, payload = self._early.pop(key)
        sequence = self._next
        if part is None or part.last:
            self._next, self._part = sequence + 1, 0
            self._gate.consumed(self._next)
        else:
            self._part += 1
            self._gate.taken(sequence, self._part)
        return sequence, payload, part

    def get_results(self):
        """Pool interface for Petastorm's results-queue readers: payloads only, in order."""
        return self.next()[1]


WAIT_S = 0.05  # how long an idle pool thread sleeps between checks of the stop flag (it wakes at once for work)
_WAKE = object()


class BlockingThreadPool(ThreadPool):
    """Petastorm's ``ThreadPool``, except that idle threads block on the work queue instead of waking every
    millisecond to poll it.

    Why: with the ventilator holding work back until the consumer catches up, pool threads are idle most of the
    time, and a thousand wake-ups per second per thread each take the GIL from the thread making batches (measured:
    a third of the loader's wall time on two cores). Results, errors and shutdown behave as in Petastorm.
    """

    def start(self, worker_class, worker_args=None, ventilator=None):
        if self._stop_event.is_set():
            raise RuntimeError("a BlockingThreadPool cannot be restarted")
        self._ventilator_queue: queue.Queue[Any] = queue.Queue()
        self._results_queue: queue.Queue[Any] = queue.Queue(self._results_queue_size)
        self._workers = []
        for worker_id in range(self.workers_count):
            impl = worker_class(worker_id, self._stop_aware_put, worker_args)
            thread = _BlockingWorkerThread(impl, self._stop_event, self._ventilator_queue, self._results_queue)
            thread.daemon = True
            self._workers.append(thread)
        for thread in self._workers:
            thread.start()
        if ventilator:
            self._ventilator = ventilator
            self._ventilator.start()

    def stop(self):
        super().stop()
        if self._ventilator_queue is not None:
            for _ in self._workers:
                self._ventilator_queue.put(_WAKE)  # idle threads see the stop flag now, not in WAIT_S


class _BlockingWorkerThread(WorkerThread):
    def run(self):
        while not self._stop_event.is_set():
            try:
                item = self._ventilator_queue.get(block=True, timeout=WAIT_S)
            except queue.Empty:
                continue
            if item is _WAKE:
                continue
            args, kwargs = item
            try:
                self._worker_impl.process(*args, **kwargs)
                self._worker_impl.publish_func(VentilatedItemProcessedMessage())
            except WorkerTerminationRequested:
                pass
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, as Petastorm's pool does
                sys.stderr.write(f"Worker {self._worker_impl.worker_id} terminated: unexpected exception:\n"
                                 f"{format_exc()}")
                self._results_queue.put(exc)
                break
