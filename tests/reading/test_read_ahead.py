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


def test_epochs_one_after_another_reuse_the_threads_and_streams_side_by_side_do_not_share_them():
    """An ``in_order`` takes an idle pool of its size that an earlier one left (no threads started per epoch), and
    holds it while it runs: two streams open at once never see each other's threads."""
    marks, numbers = threading.local(), iter(range(10**6))

    def where(item):  # a number per thread (thread ids are reused once a thread ends)
        if not hasattr(marks, "number"):
            marks.number = next(numbers)
        return marks.number

    # a pool starts a thread only when no thread of it is idle, so one epoch may use one thread and the next two:
    # what holds with kept threads is that five epochs never see more threads than one pool of 2 has
    epochs = [set(in_order(where, list(range(40)), workers_count=2, ahead=3)) for _ in range(5)]
    assert len(set().union(*epochs)) <= 2, epochs
    one, two = in_order(where, list(range(40)), workers_count=2, ahead=3), in_order(
        where, list(range(40)), workers_count=2, ahead=3)
    seen_one, seen_two = {next(one)}, {next(two)}
    seen_one.update(one)
    seen_two.update(two)
    assert not seen_one & seen_two


def test_a_stream_closed_early_leaves_its_pool_for_the_next_whose_items_all_come():
    def slow(item):
        time.sleep(0.002)
        return item

    stream = in_order(slow, list(range(100)), workers_count=2, ahead=6)
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.close()
    assert list(in_order(slow, list(range(30)), workers_count=2, ahead=6)) == list(range(30))


def test_a_stream_dropped_unclosed_and_collected_leaves_no_dead_pool_behind():
    """A generator dropped in a reference cycle is closed by the garbage collector, which has already cleared the
    weak references by which its pool's threads know the pool lives: they end, and the next stream must not take
    that pool (it would wait for ever)."""
    import gc

    def slow(item):
        time.sleep(0.001)
        return item

    stream = in_order(slow, list(range(50)), workers_count=2, ahead=4)
    assert next(stream) == 0
    cycle: list = [stream]
    cycle.append(cycle)
    del stream, cycle
    gc.collect()
    got: list = []
    after = threading.Thread(target=lambda: got.extend(in_order(slow, list(range(30)), workers_count=2, ahead=4)),
                             daemon=True)
    after.start()
    after.join(timeout=20)
    assert got == list(range(30))
