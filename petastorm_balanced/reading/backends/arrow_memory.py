"""When the reading threads hand Arrow's freed memory back to the system (``give_back``).

Why at all: Arrow's allocator (mimalloc on recent pyarrow) keeps freed memory per thread, and with rows of
kilobytes that came to twice what Arrow held (+119 against +65 MiB, 2 threads, 8 MiB budget).

Why not every few MiB read, whatever the memory does: every page handed back while the reads go on is faulted in
and zeroed again by the next bundles. Handing back every 8 MiB read cost 3,100-3,400 page faults and about 20 ms of
a 70 ms epoch over 64k-row row groups of numbers (pyarrow 26, 2 threads; the calls themselves 0.6 ms each), where
the allocator was reusing what it kept and the process's memory did not grow at all. So every ``RELEASE_BYTES``
read a thread looks at the memory the allocator holds beyond what Arrow holds (the process's anonymous resident
memory less the pool's allocated bytes: the bundles read ahead come and go, and do not count), and hands back only
where that grew by ``GROWTH_BYTES`` or more since the last hand-back (or since the lowest it was seen at after
it): memory the allocator keeps beyond that is handed back as before, memory it reuses stays. The reading threads
live across epochs (``arrow._take_pool``), so their heaps are reused too. Measured (pyarrow 26, 2 threads, 64k
numeric row groups, load 1.7-2.5): 1-4 hand-backs in 8 epochs against 3 an epoch, page faults 10-700 an epoch
against 3,400; the peaks of ``tests/reading/test_spill.py``'s three cases 47, 80, 104-106 MiB against 47, 70,
104-106 handing back at every look (bound 120).
"""
from __future__ import annotations

import os
import threading

import pyarrow as pa

# Bytes a reading thread reads between two looks at the memory, and the growth that makes it hand back.
RELEASE_BYTES = 8 << 20
GROWTH_BYTES = 32 << 20
_READ_SINCE = threading.local()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Low:
    """The anonymous resident bytes beyond the pool's after the last hand-back, or the lowest seen since, per
    process (a forked DataLoader worker starts with its parent's figures, which are not its own)."""

    pid = -1
    held: int | None = None


def anonymous_resident() -> int | None:
    """The process's resident memory that is not a file's pages (``/proc/self/statm``: resident minus shared), in
    bytes; None where there is no ``/proc`` (then every look hands back, as if the memory had grown)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            fields = statm.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def _unused(pool: pa.MemoryPool) -> int | None:
    """Bytes of anonymous resident memory beyond what ``pool`` holds allocated (None: no figure)."""
    resident = anonymous_resident()
    return None if resident is None else resident - pool.bytes_allocated()


def give_back(nbytes: int, pool: pa.MemoryPool | None = None) -> None:
    """Count ``nbytes`` read by this thread; past ``RELEASE_BYTES`` since its last look, look at the memory and,
    where what Arrow does not hold grew by ``GROWTH_BYTES`` or more (module docstring), hand the unused memory of
    ``pool`` (Arrow's default) back to the system. Threads share the figure they compare with; a race between two
    of them costs at most one hand-back more or one look later."""
    since = getattr(_READ_SINCE, "nbytes", 0) + nbytes
    if since < RELEASE_BYTES:
        _READ_SINCE.nbytes = since
        return
    _READ_SINCE.nbytes = 0
    pool = pool or pa.default_memory_pool()
    held, pid = _unused(pool), os.getpid()
    low = _Low.held if _Low.pid == pid else None
    if held is None or low is None or held - low >= GROWTH_BYTES:
        pool.release_unused()
        _Low.pid, _Low.held = pid, _unused(pool)
    elif held < low:
        _Low.held = held
