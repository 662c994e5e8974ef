"""A local-disk cache of row groups read from remote storage, so that a second epoch reads the local disk.

Why: on an object store every epoch reads the whole dataset again over the network, while training usually runs
many epochs over the same files. Petastorm offers ``cache_type="local-disk"`` for that; this is the same idea for
the Arrow backend, with the guarantees the loader keeps elsewhere:

- **exact values**: an entry is the row group's requested columns as the Parquet reader decoded them, stored as an
  Arrow IPC file (types, nulls and bytes kept as they are);
- **never stale (G15)**: an entry's name is the sha256 of the file's location, its footer digest, size and
  modification time (what the reader has just checked against the plan for this epoch), the row group and the
  columns, so a rewritten file is refused by the epoch's footer check before any entry is looked up, and an entry
  written for other bytes is never found under the planned file's name;
- **safe with several processes** (ranks of one node, DataLoader workers): an entry is written to a temporary
  name and renamed (``os.replace``, atomic on one filesystem), so readers see a whole entry or none; two writers
  of one entry write the same bytes and the later rename wins; an entry that cannot be read (cut short by a
  crash, removed by another process's eviction) is a miss, removed, and read from the storage again;
- **bounded in bytes**: when what this process believes the folder holds passes ``size_limit``, or after it wrote
  an eighth of the limit, it lists the folder and removes the least recently used entries (a hit touches its
  entry's modification time) until the folder holds at most nine tenths of the limit. Other processes' writes since
  its last listing are seen at the next one, so the folder exceeds the limit by at most what the other processes
  wrote meanwhile (an eighth of the limit each).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from ..errors import InvalidValueError

FORMAT = 1  # in every entry's key: a change of what an entry holds makes the old entries misses
_PREFIX, _SUFFIX = "rg-", ".arrow"
_STALE_TEMP_S = 3600  # a temporary file this old was left by a killed writer: removed by the next eviction
_FREE_TO = 0.9  # eviction frees the folder down to this share of the limit


@dataclass(frozen=True)
class CacheSettings:
    """Where the cache lives and how many bytes it may hold (a loader's ``cache_location``, ``cache_size_limit``)."""

    location: str
    size_limit: int


def entry_key(location: str, digest: str, file_size: int, mtime_ns: int | None, row_group: int,
              columns: Sequence[str], *, content: str = "") -> str:
    """The name of a row group's entry: the sha256 of everything its content depends on (the file's location and
    G15 fingerprint: footer, size, time and, where the plan recorded one, the content fingerprint checked this
    epoch; the row group, the columns in order, the entry format)."""
    text = json.dumps([FORMAT, location, digest, file_size, mtime_ns, row_group, list(columns),
                       *([content] if content else [])])
    return hashlib.sha256(text.encode()).hexdigest()


class LocalDiskCache:
    """Row group tables by key in one folder (see the module docstring). Thread-safe; one per folder and process
    (``local_disk_cache``), so a process's threads share its byte count."""

    def __init__(self, location: str, size_limit: int):
        if not isinstance(size_limit, int) or size_limit < 1:
            raise InvalidValueError(f"cache_size_limit={size_limit!r} must be a positive number of bytes")
        self.location, self.size_limit = os.path.abspath(os.path.expanduser(location)), size_limit
        try:
            os.makedirs(self.location, exist_ok=True)
        except OSError as exc:
            raise InvalidValueError(f"cache_location={location!r} cannot be created ({exc}); pass a writable local "
                                    "folder") from None
        if not os.access(self.location, os.W_OK | os.X_OK):
            raise InvalidValueError(f"cache_location={location!r} is not writable; pass a writable local folder")
        self._lock = threading.Lock()
        self._held = self._scan(evict=False)  # bytes the folder holds, as far as this process knows
        self._written = 0  # bytes written since the last listing
        self.hits = self.misses = 0

    def path(self, key: str) -> str:
        return os.path.join(self.location, f"{_PREFIX}{key}{_SUFFIX}")

    def get(self, key: str) -> pa.Table | None:
        """The entry's table, or None (absent, or unreadable: then removed)."""
        path = self.path(key)
        try:
            # read into memory, not mapped: a mapped file that something truncates kills the process (SIGBUS)
            with pa.OSFile(path) as source:
                table = pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException):  # cut short or damaged: a miss, and gone for the next reader
            _remove(path)
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return table

    def put(self, key: str, table: pa.Table) -> None:
        """Store ``table`` under ``key``: written to a temporary name, then renamed; a failed write (a full disk)
        leaves nothing and is not an error (the rows were read; the next epoch reads them again)."""
        path = self.path(key)
        temp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with pa.OSFile(temp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            size = os.path.getsize(temp)
            if size > self.size_limit * _FREE_TO:  # larger than the cache may hold: never cached, and an entry
                _remove(temp)  # stored under the key before is gone too, so a get never answers with older bytes
                _remove(path)
                return
            os.replace(temp, path)
        except (OSError, pa.ArrowException):
            _remove(temp)
            return
        with self._lock:
            self._held += size
            self._written += size
            due = self._held > self.size_limit or self._written > self.size_limit // 8
        if due:
            self.evict()

    def read(self, key: str, load: Callable[[], pa.Table]) -> pa.Table:
        """The entry's table if cached, else ``load()``, stored under ``key``."""
        table = self.get(key)
        with self._lock:
            if table is not None:
                self.hits += 1
            else:
                self.misses += 1
        if table is not None:
            return table
        table = load()
        self.put(key, table)
        return table

    def evict(self) -> None:
        """List the folder and remove the least recently used entries until it holds at most nine tenths of the
        limit (and temporary files that killed writers left)."""
        held = self._scan(evict=True)
        with self._lock:
            self._held, self._written = held, 0

    def _scan(self, *, evict: bool) -> int:
        entries, now = [], time.time()
        try:
            listing = list(os.scandir(self.location))
        except OSError:
            return 0
        for item in listing:
            name = item.name
            if not name.startswith(_PREFIX):
                continue  # not ours: never touched
            try:
                stat = item.stat()
            except OSError:
                continue
            if name.endswith(".tmp"):
                if evict and now - stat.st_mtime > _STALE_TEMP_S:
                    _remove(item.path)
                continue
            if name.endswith(_SUFFIX):
                entries.append((stat.st_mtime, stat.st_size, item.path))
        held = sum(size for _, size, _ in entries)
        if evict and held > self.size_limit * _FREE_TO:
            for _, size, path in sorted(entries):
                if held <= self.size_limit * _FREE_TO:
                    break
                _remove(path)
                held -= size
        return held


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass  # already gone (another process evicted it) or never written


_CACHES: dict[tuple, LocalDiskCache] = {}
_CACHES_LOCK = threading.Lock()


def local_disk_cache(settings: CacheSettings) -> LocalDiskCache:
    """The process's cache for ``settings`` (one per folder, limit and process id: a forked worker counts its own
    writes), made once."""
    key = (os.path.abspath(os.path.expanduser(settings.location)), settings.size_limit, os.getpid())
    with _CACHES_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = LocalDiskCache(settings.location, settings.size_limit)
        return cache
