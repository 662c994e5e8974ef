"""Plan order out of Petastorm's worker pools, with bounded memory.

Petastorm's thread and process pools hand results back in completion order, so with several workers the rows
would come in a different order on every run (G4 broken). Each ventilated item carries its fragment's sequence
number; ``OrderedResults`` keeps early arrivals in a small buffer and releases them in sequence. The buffer stays
bounded because ``OrderedVentilator`` never sends fragment ``i`` before the consumer has taken fragment
``i - max_ahead``: at most ``max_ahead`` fragments are ever in flight or waiting, whatever the workers' speeds.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

from petastorm.workers_pool import EmptyResultError
from petastorm.workers_pool.ventilator import Ventilator


class Gate:
    """How far ventilation may run ahead of consumption; wakes the ventilator as soon as there is room."""

    def __init__(self, max_ahead: int):
        if max_ahead < 1:
            raise ValueError(f"max_ahead={max_ahead} must be >= 1")
        self.max_ahead = max_ahead
        self._consumed = 0
        self._stopped = False
        self._cond = threading.Condition()

    def consumed(self, count: int) -> None:
        with self._cond:
            self._consumed = count
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def wait_for_room(self, sequence: int) -> bool:
        """Block until item ``sequence`` may be sent; False when stopped."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopped or sequence < self._consumed + self.max_ahead)
            return not self._stopped


class OrderedVentilator(Ventilator):
    """Ventilates the items once, in order, never more than the gate allows ahead of the consumer."""

    def __init__(self, ventilate_fn, items: List[dict], gate: Gate):
        super().__init__(ventilate_fn)
        self._items, self._gate = items, gate
        self._done = not items
        self._stop_requested = False
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._run, name="petastorm-balanced-ventilator", daemon=True)
        self._thread.start()

    def _run(self):
        for sequence, item in enumerate(self._items):
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
    """Pulls ``(sequence, payload)`` results from a pool and returns them in sequence order."""

    def __init__(self, pool, gate: Gate, count: int):
        self._pool, self._gate, self._count = pool, gate, count
        self._next = 0
        self._early: Dict[int, Any] = {}

    @property
    def delivered(self) -> int:
        return self._next

    def next(self) -> Tuple[int, Any]:
        """The next fragment's payload; ``EmptyResultError`` once every fragment was delivered."""
        if self._next >= self._count:
            raise EmptyResultError()
        while self._next not in self._early:
            try:
                sequence, payload = self._pool.get_results()
            except EmptyResultError:
                raise RuntimeError(f"the worker pool ended after {self._next} of {self._count} fragments; "
                                   "a worker died or the reader was stopped") from None
            self._early[sequence] = payload
        payload = self._early.pop(self._next)
        self._next += 1
        self._gate.consumed(self._next)
        return self._next - 1, payload

    def get_results(self):
        """Pool interface for Petastorm's results-queue readers: payloads only, in order."""
        return self.next()[1]
