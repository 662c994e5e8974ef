"""Shuffle windows larger than memory: the rows a window cannot hold in memory live in files on local disk.

Why: a batch mixes only the rows of its window (``core/shuffle.py``), so on data stored sorted a window smaller than
a slot's share gives batches of a few row groups. A slot's share of a large dataset does not fit in memory, but it
fits on a training node's local disk (NVMe: hundreds of GB). Here a window's decoded rows go, as they arrive, to
memory while the slot's memory budget (``Placement.memory``, measured on the rows actually held) allows, and to
files in a per-process folder beyond it, read back memory-mapped, so gathers in the permutation's order take only
the rows of the run being cut into anonymous memory. The row order is the window permutation's, whatever is on
disk: placement never changes a batch, only where its rows wait (``tests/reading/test_spill.py`` compares both).

Layout on disk: the fixed-width numpy columns (numbers, fixed-shape tensors) of a window in row-major
raw files (``DiskArray``), one per item size (a gathered row is one or two pages, as ``batching.Window``'s in-memory
matrix); the Arrow columns (text, lists) as Arrow IPC files, one record batch per chunk, memory-mapped and taken
from chunk by chunk. Files are deleted as soon as their window has been served, the folder at the end of the epoch
and at ``close()``, and folders left by a process that died are swept at the next start (each folder's lock file
is held, with ``fcntl.flock``, for as long as its owner lives; the kernel releases it when the process dies).
"""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import shutil
import tempfile
import threading
import time
import warnings
from typing import Any

import numpy as np
import pyarrow as pa

FLOCK: Any = None  # fcntl where there is one (POSIX); elsewhere a folder is swept by its owner's pid alone
try:
    import fcntl as FLOCK  # noqa: N812
except ImportError:
    pass

PREFIX = "pb-spill-"  # folders of this name under a spill folder belong to petastorm-balanced loaders
LOCK = "owner.lock"  # held by the owning process; its first line is the owner's pid
YOUNG_S = 60.0  # a folder without its lock file is left alone this long (its owner may be writing the lock)


class SpillFolder:
    """A per-process folder under ``base``, made when the first file is asked for; ``remove()`` deletes it."""

    def __init__(self, base: str):
        self.base = base
        self.path: str | None = None
        self._lock: Any = None  # the open lock file, held while this process lives
        self._count = 0
        self._mutex = threading.Lock()

    def file(self, suffix: str) -> str:
        with self._mutex:
            if self.path is None or os.getpid() != self._pid:  # a forked worker makes its own folder
                os.makedirs(self.base, exist_ok=True)
                sweep(self.base)
                self.path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.base)
                self._pid = os.getpid()
                lock = open(os.path.join(self.path, LOCK), "w")  # noqa: SIM115 (held while we live)
                lock.write(f"{os.getpid()}\n")
                lock.flush()
                if FLOCK is not None:
                    FLOCK.flock(lock.fileno(), FLOCK.LOCK_EX | FLOCK.LOCK_NB)
                self._lock = lock
            self._count += 1
            return os.path.join(self.path, f"{self._count}{suffix}")

    def remove(self) -> None:
        """Delete the folder and what it holds (mapped files stay readable until their last map is dropped)."""
        with self._mutex:
            if self.path is not None and os.getpid() == self._pid:
                shutil.rmtree(self.path, ignore_errors=True)
                if self._lock is not None:
                    self._lock.close()
                self.path, self._lock = None, None

    _pid = -1


def sweep(base: str) -> list[str]:
    """Remove the spill folders under ``base`` whose owner process is gone (a crash, a kill); returns them."""
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(base, name)
        if name.startswith(PREFIX) and os.path.isdir(path) and not _owner_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _owner_alive(folder: str) -> bool:
    lock = os.path.join(folder, LOCK)
    try:
        handle = open(lock)  # noqa: SIM115
    except OSError:  # no lock file: being made right now by its owner, or its owner died before writing it
        try:
            return time.time() - os.path.getmtime(folder) < YOUNG_S
        except OSError:
            return True
    with handle:
        if FLOCK is not None:
            try:
                FLOCK.flock(handle.fileno(), FLOCK.LOCK_SH | FLOCK.LOCK_NB)
            except OSError:
                return True  # its owner holds the lock
            return False
        try:
            os.kill(int(handle.readline().strip() or -1), 0)
        except (ValueError, OSError):
            return False
        return True


class Placement:
    """Where one slot's shuffle windows hold their rows: up to ``memory`` bytes of decoded rows in memory, the rest
    in ``folder`` (None: nowhere else, all in memory), with ``disk`` bytes allowed there (a warning beyond)."""

    def __init__(self, memory: int, folder: SpillFolder | None, disk: int):
        self.memory, self.folder, self.disk = int(memory), folder, int(disk)
        self.written = 0  # bytes in spill files now (the window being filled and the one served)
        self.peak_written = 0
        self._warned = False

    def allocate(self, shape: tuple, dtype, held: int):
        """An array for a window's fixed-width column(s): in memory (``np.ndarray``) if it fits beside ``held``
        bytes, else a ``DiskArray``."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if self.folder is None or held + nbytes <= self.memory or nbytes == 0:
            return np.empty(shape, dtype=dtype)
        self.count(nbytes)
        return DiskArray(self.folder.file(".bin"), shape, dtype)

    def count(self, nbytes: int) -> None:
        self.written += nbytes
        self.peak_written = max(self.peak_written, self.written)
        if self.written > self.disk and not self._warned:
            self._warned = True
            warnings.warn(ResourceWarning(
                f"the shuffle spill folder {self.folder.base if self.folder else ''!r} holds {self.written:,} bytes, "
                f"beyond shuffle_spill_budget={self.disk:,}: this slot's rows are larger than sampled when the "
                "window was sized; raise shuffle_spill_budget or pass a smaller shuffle_window"), stacklevel=2)

    def release(self, nbytes: int) -> None:
        self.written = max(0, self.written - nbytes)

    def close(self) -> None:
        if self.folder is not None:
            self.folder.remove()
        self.written = 0


class DiskArray:
    """A window's fixed-width rows in a file: written in row order with ``pwrite`` as chunks arrive (no page faults
    of a writable map: one epoch of 1M rows of 34 columns through ``np.memmap`` took 1.08 s of CPU, 0.97 s so,
    against 0.86 s for the memory window of 1/64 the rows), then mapped read-only, its pages faulted in at once
    (``MAP_POPULATE``), for the window's gathers."""

    def __init__(self, path: str, shape: tuple, dtype):
        self.path, self.shape, self.dtype = path, tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self._row_bytes = self.nbytes // max(1, self.shape[0])
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        reserve(self._fd, self.nbytes)

    def write(self, row: int, values: np.ndarray) -> None:
        """Rows ``row`` to ``row + len(values)``."""
        data = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1).view(np.uint8).data
        offset = row * self._row_bytes
        while len(data):
            done = os.pwrite(self._fd, data, offset)
            data, offset = data[done:], offset + done

    def __setitem__(self, rows: slice, values) -> None:
        self.write(rows.start, values)

    def mapped(self) -> np.ndarray:
        """The rows written, mapped read-only (the file's descriptor closed: the map keeps it)."""
        os.ftruncate(self._fd, self.nbytes)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(self._fd, self.nbytes, flags=flags, prot=mmap.PROT_READ)
        os.close(self._fd)
        return np.frombuffer(mapped, dtype=self.dtype).reshape(self.shape)


try:
    _LIBC: Any = ctypes.CDLL(None, use_errno=True)
    _FALLOCATE: Any = _LIBC.fallocate  # Linux; not posix_fallocate, which writes zeros where a filesystem has none
    _FALLOCATE.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
except (AttributeError, OSError, TypeError):
    _FALLOCATE = None


def reserve(fd: int, size: int) -> None:
    """Allocate a spill file's blocks before it is written, where the filesystem can (``fallocate``): each page
    written then skips the filesystem's delayed allocation (144 MB written in 4 KB pages: 22 against 31 ms of CPU on
    ext4, measured). Nothing where it cannot: ``pwrite`` allocates as before, and reports a full disk as before."""
    if _FALLOCATE is not None and size > 0:
        _FALLOCATE(fd, 0, 0, size)  # its error (EOPNOTSUPP, ENOSPC) is left to the writes


def nbytes(values) -> int:
    """Bytes of decoded rows a column chunk holds (an Arrow array counts its slice only)."""
    if isinstance(values, pa.Array):
        return int(values.nbytes)
    if isinstance(values, np.ndarray) and values.dtype == object:  # Python objects: the first 64 as a sample
        sample = values[:64]
        each = sum(getattr(v, "nbytes", 64) for v in sample) / max(1, len(sample))
        return int(values.nbytes + each * len(values))
    return int(getattr(values, "nbytes", 0))


class BlockColumn:
    """One Arrow column of a window as its chunks (some in memory, some memory-mapped from an IPC file): taking
    rows in any order takes them chunk by chunk, so no copy of the whole column is ever made (Arrow's own take on a
    chunked array concatenates it first)."""

    def __init__(self, chunks: list):
        self.chunks = chunks
        self.starts = np.cumsum([0] + [len(c) for c in chunks])  # (chunks + 1,)
        self._chunk_of: np.ndarray | None = None  # (rows,) each row's chunk, made at the first take

    def __len__(self) -> int:
        return int(self.starts[-1])

    def take(self, order: np.ndarray):
        order = np.asarray(order, dtype=np.int64)
        if not len(order):
            return self.chunks[0].slice(0, 0)
        if self._chunk_of is None:  # one byte a row up to 256 chunks: its gathers and the sort below stay cheap
            count = len(self.chunks)
            small = np.uint8 if count <= 256 else np.uint16 if count <= 65536 else np.int64
            self._chunk_of = np.repeat(np.arange(count, dtype=small), np.diff(self.starts))
        block = self._chunk_of[order]  # (rows,) the chunk of each row (a binary search per row cost 3x more)
        by_block = np.argsort(block, kind="stable")  # small integers: one radix pass, not a merge sort of int64
        edges = np.concatenate([[0], np.cumsum(np.bincount(block, minlength=len(self.chunks)))])
        pieces = [self.chunks[b].take(pa.array(order[by_block[edges[b]:edges[b + 1]]] - self.starts[b]))
                  for b in range(len(self.chunks)) if edges[b + 1] > edges[b]]
        taken = pa.concat_arrays(pieces) if len(pieces) != 1 else pieces[0]
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[by_block] = np.arange(len(order))
        return taken.take(pa.array(inverse))

    __getitem__ = take  # what ``batching.Window``'s gathers call

    def combined(self):
        return pa.concat_arrays(self.chunks)


class SpilledColumn:
    """An Arrow column's chunks written to one IPC file as they come; ``chunks()`` maps them back."""

    def __init__(self, path: str, first: pa.Array):
        self.path = path
        self._schema = pa.schema([pa.field("v", first.type)])
        self._sink = pa.OSFile(path, "wb")
        self._writer = pa.ipc.new_file(self._sink, self._schema)

    def write(self, values: pa.Array) -> None:
        self._writer.write_batch(pa.record_batch([values], schema=self._schema))

    def chunks(self) -> list:
        self._writer.close()
        self._sink.close()
        reader = pa.ipc.open_file(pa.memory_map(self.path, "r"))
        return [reader.get_batch(i).column(0) for i in range(reader.num_record_batches)]


def spillable(values) -> bool:
    """Arrow arrays go to IPC files (dictionary arrays stay in memory: an IPC file holds one dictionary)."""
    return isinstance(values, pa.Array) and not pa.types.is_dictionary(values.type)
