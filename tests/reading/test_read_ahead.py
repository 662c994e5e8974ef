"""``in_order`` with ``start``: every item's I/O begins as it enters the read-ahead (before a thread decodes it), the
results keep their order whatever the threads' speeds, at most ``ahead + 1`` items are begun beyond the one being
consumed, and closing the stream cancels the reads begun and not running."""
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from petastorm_balanced.reading.backends.arrow import Started, in_order


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_items_are_begun_ahead_and_come_back_in_order(workers):
    io = ThreadPoolExecutor(8)
    begun, consumed = [], []
    lock = threading.Lock()

    def slow(item):
        time.sleep(random.Random(item).uniform(0, 0.01))
        return item * 10

    def start(item):
        with lock:
            begun.append(item)
            assert len(begun) - len(consumed) <= 5, (begun, consumed)  # ahead=3: the one consumed and 4 beyond
        return Started([item], [io.submit(slow, item)])

    def function(started):
        return started.futures[0].result() + started.bundle[0]

    for item, result in zip(range(20), in_order(function, list(range(20)), workers_count=workers, ahead=3,
                                                start=start), strict=True):
        consumed.append(item)
        assert result == item * 11
    assert begun == list(range(20))


def test_closing_the_stream_cancels_the_reads_not_begun():
    io = ThreadPoolExecutor(1)
    gate = threading.Event()
    futures = []

    def start(item):
        future = io.submit(gate.wait)  # one thread: every read after the first waits in the queue
        futures.append(future)
        return Started([item], [future])

    stream = in_order(lambda started: started.futures[0].result(), list(range(10)), workers_count=0, ahead=4,
                      start=start)
    gate.set()
    next(stream)
    gate.clear()
    stream.close()
    gate.set()
    assert len(futures) == 6 and any(f.cancelled() for f in futures[1:])
