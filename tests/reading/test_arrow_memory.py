"""When the reading threads hand Arrow's freed memory back (``backends/arrow_memory.give_back``): every
``RELEASE_BYTES`` read they look at the memory Arrow does not hold, and hand back only where it grew by
``GROWTH_BYTES`` since."""
import os
import threading

import numpy as np
import pytest

from petastorm_balanced.reading.backends import arrow_memory


class Pool:
    def __init__(self, held=0):
        self.released, self.held = 0, held

    def bytes_allocated(self):
        return self.held

    def release_unused(self):
        self.released += 1


@pytest.fixture
def memory(monkeypatch):
    """The resident memory as a test sets it, a fresh thread's count and figures."""
    held = {"bytes": 100 << 20}
    monkeypatch.setattr(arrow_memory, "anonymous_resident", lambda: held["bytes"])
    monkeypatch.setattr(arrow_memory, "_READ_SINCE", threading.local())
    monkeypatch.setattr(arrow_memory._Low, "pid", -1)
    return held


def test_memory_that_does_not_grow_is_looked_at_but_not_handed_back(memory):
    pool = Pool()
    step = arrow_memory.RELEASE_BYTES // 4
    for _ in range(4):  # the first look hands back: nothing to compare with yet
        arrow_memory.give_back(step, pool)
    assert pool.released == 1
    for i in range(400):  # 100 looks, the memory within GROWTH_BYTES of the lowest seen
        memory["bytes"] = (100 << 20) + (i % 7) * (arrow_memory.GROWTH_BYTES // 8)
        arrow_memory.give_back(step, pool)
    assert pool.released == 1


def test_memory_that_grows_is_handed_back_once_per_growth_and_the_lowest_seen_counts(memory):
    pool = Pool()
    arrow_memory.give_back(arrow_memory.RELEASE_BYTES, pool)
    assert pool.released == 1
    memory["bytes"] += arrow_memory.GROWTH_BYTES - 1
    arrow_memory.give_back(arrow_memory.RELEASE_BYTES - 1, pool)  # not a look yet
    arrow_memory.give_back(1, pool)
    assert pool.released == 1
    memory["bytes"] += 1
    arrow_memory.give_back(arrow_memory.RELEASE_BYTES, pool)
    assert pool.released == 2
    memory["bytes"] -= 10 << 20  # lower than after the hand-back: the figure to grow from
    arrow_memory.give_back(arrow_memory.RELEASE_BYTES, pool)
    memory["bytes"] += arrow_memory.GROWTH_BYTES
    arrow_memory.give_back(arrow_memory.RELEASE_BYTES, pool)
    assert pool.released == 3


def test_memory_arrow_holds_is_not_growth(memory):
    """Bundles read ahead come and go: only what the allocator keeps beyond them counts."""
    pool = Pool()
    arrow_memory.give_back(arrow_memory.RELEASE_BYTES, pool)
    for held in (0, 3, 1, 3, 0):
        pool.held = held * arrow_memory.GROWTH_BYTES
        memory["bytes"] = (100 << 20) + pool.held
        arrow_memory.give_back(arrow_memory.RELEASE_BYTES, pool)
    assert pool.released == 1
    memory["bytes"] += arrow_memory.GROWTH_BYTES
    arrow_memory.give_back(arrow_memory.RELEASE_BYTES, pool)
    assert pool.released == 2


def test_without_a_figure_of_the_memory_every_look_hands_back(memory, monkeypatch):
    monkeypatch.setattr(arrow_memory, "anonymous_resident", lambda: None)
    pool = Pool()
    for _ in range(5):
        arrow_memory.give_back(arrow_memory.RELEASE_BYTES, pool)
    assert pool.released == 5


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc: the figure is None by design")
def test_the_process_memory_is_read_as_the_kernel_counts_it():
    """Where ``/proc`` exists the figure is the kernel's ``RssAnon`` (read here from ``/proc/self/status``, the
    other file that states it) and follows memory the process touches."""
    from tests.support.peak_memory import rss_anon
    slack = 8 << 20  # the two files are read at two instants
    held = arrow_memory.anonymous_resident()
    assert held is not None and abs(held - rss_anon()) < slack, (held, rss_anon())
    block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, every page touched
    grown = arrow_memory.anonymous_resident()
    # half of it at least: threads left by other tests may give memory back meanwhile
    assert grown is not None and abs(grown - rss_anon()) < slack and grown - held > 32 << 20
    del block
