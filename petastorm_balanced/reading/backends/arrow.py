"""The Arrow backend: planned fragments read with ``pyarrow.parquet`` / ``pyarrow.fs`` alone, no Petastorm.

Why it exists: Petastorm calls pyarrow's legacy dataset API, so it cannot even be imported on pyarrow >= 16. Our
reading never needed Petastorm's machinery to decide *what* to read (the plan does that): it needs a bounded,
ordered prefetch of row groups, which a thread pool gives, because pyarrow decodes Parquet in C++ with the GIL
released.

What makes it give the very same batches as the Petastorm backend: both read each fragment with
``fragments.read_fragment`` (only the requested columns, row count checked against the plan, cut to the planned
rows) and convert with ``fragments.to_columns``; the batches are then made by the shared ``stream.slot_runs``,
which takes the chunks in order whatever their cut. Only the scheduling differs, and how fragments are grouped
into bundles (here from the bytes measured on the reads, ``read_ahead.py``).

Prefetch: at most ``max_ahead + 1`` bundles are submitted beyond the one being consumed, and results are taken in
submission order with ``Future.result()`` (blocking, no polling), so memory stays bounded by ``max_ahead + 2``
bundles whatever the threads' speeds, and the order never depends on timing.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from time import perf_counter
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ...errors import StalePlanError
from ...io import fs as fsutil
from ...io import retry
from ...io.footer import CheckedFooters
from ...io.row_group_cache import CacheSettings, entry_key, local_disk_cache
from ...plan.format import check_file
from ...plan.model import Fragment, ShardPlan
from .. import stats
from ..rows import fragments as fr
from ..rows.read_ahead import BundleSizes
from .arrow_memory import give_back

# Requests in flight per process on a remote filesystem: the fragments of the bundles read ahead are read side by
# side in this many threads (and pyarrow's I/O pool and the S3 client's connections match), since each read waits a
# round trip and does little else.
REMOTE_READS = fsutil.REMOTE_REQUESTS


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
# Idle reading pools kept per process and size for the next epoch (``_take_pool``), at most this many of a size.
IDLE_POOLS = 4
_IDLE: dict[tuple[int, int], deque[_Pool]] = {}


def remote_pool() -> ThreadPoolExecutor:
    """The process's ``REMOTE_READS`` threads for remote fragment reads, started once (not per epoch: starting 32
    threads took a tenth of a second), per process id (a forked DataLoader worker has no threads of its parent);
    pyarrow's I/O pool, where ``pre_buffer`` reads run, is raised to as many (``fs.raise_io_threads``)."""
    pid = os.getpid()
    with _POOLS_LOCK:
        pool = _POOLS.get(pid)
        if pool is None:
            fsutil.raise_io_threads()
            pool = _POOLS[pid] = ThreadPoolExecutor(REMOTE_READS, thread_name_prefix="pb-io")
        return pool


class Started:
    """A bundle whose fragments' reads were queued (``BundleReader.start``): ``futures``, one per fragment, in
    order (none: nothing started, ``read`` reads it all); ``cancel`` drops the reads not begun."""

    __slots__ = ("bundle", "futures")

    def __init__(self, bundle: list[Fragment], futures: list):
        self.bundle, self.futures = bundle, futures

    def cancel(self) -> None:
        for future in self.futures:
            future.cancel()


class BundleReader:
    """Reads bundles of fragments as column dicts; each thread keeps its own few open files (a ``ParquetFile`` is
    not safe to share between threads), all opened through one ``CheckedFooters`` (each footer read and checked
    once per reader).

    On a remote filesystem each file is opened once per reader and shared, row groups are read with
    ``pre_buffer`` (one coalesced request per row group), every read is retried under the retry policy
    (``io/retry.py``), and a bundle's fragments are read side by side (``REMOTE_READS`` threads), so a bundle
    costs about one round trip rather than one per fragment."""

    def __init__(self, plan: ShardPlan, spec: fr.ReadSpec, fields=None, schemas=(), transform=None, *,
                 retry_policy: retry.RetryPolicy | None = None, cache: CacheSettings | None = None):
        self._plan = plan
        self._transform = transform  # a transform.Transform: run here, in the reading thread, on the decoded rows
        filesystem, self._root = plan.location.filesystem, plan.location.root
        self._planned = {f.path: f for f in plan.catalog.files}
        self._spec, self._fields, self._schemas = spec, fields, schemas
        self._local = threading.local()
        self._retry = retry_policy or retry.default_policy()
        self.remote = not isinstance(filesystem, pafs.LocalFileSystem)  # an object store: reads overlapped
        self._io = remote_pool() if self.remote else None
        # every footer read, hashed and compared with the planned one (G15) before a row of its file is used, once
        # per reader (per epoch): the threads' later opens of the file reuse it
        self._footers = CheckedFooters(filesystem, self._check, pre_buffer=self.remote, shared=self.remote,
                                       contents={fsutil.join(self._root, f.path): f.content
                                                 for f in plan.catalog.files if f.content})
        # row groups kept on the local disk (io/row_group_cache.py), keyed by the footer this reader just checked
        self._cache = local_disk_cache(cache) if cache is not None else None
        self._stats = stats.current()  # made inside the loader's next(): its recorder (reading/stats.py)

    def close(self) -> None:
        """Nothing to stop: the remote read threads are the process's (``remote_pool``)."""

    def _check(self, path: str, footer) -> None:
        check_file(self._plan, self._planned[path], footer=footer.digest, mtime_ns=footer.mtime_ns,
                   content=footer.content)

    def _cached(self, fragment: Fragment, columns: list[str], load: Callable[[], pa.Table]) -> pa.Table:
        """The row group's columns from the local-disk cache, or read (``load``) and stored there; the entry is
        the one of the file's footer as checked against the plan in this epoch (G15)."""
        footer = self._footers.checked(fragment.path)
        if self._cache is None or footer is None:
            return load()
        key = entry_key(f"{self._plan.dataset_url}/{fragment.path}", footer.digest, footer.file_size,
                        footer.mtime_ns, fragment.row_group, columns, content=footer.content)
        return self._cache.read(key, load)

    def _files(self) -> fr.FileCache:
        files = getattr(self._local, "files", None)
        if files is None:
            root, planned, footers = self._root, self._planned, self._footers

            def opener(path):
                if path not in planned:  # only a path the plan lists, checked again (G14)
                    raise StalePlanError(f"{path!r} is not a data file of the plan; re-run planning")
                return footers.open(path, fsutil.join(root, path))
            files = self._local.files = fr.FileCache(opener)
        return files

    def start(self, bundle: list[Fragment]) -> Started:
        """Begin reading ``bundle`` now (on a remote filesystem: its fragments' requests queued on the process's
        I/O threads), for ``read`` to finish later: ``in_order`` starts a bundle when it enters the read-ahead, so
        the requests of every bundle ahead are in flight while the threads decode earlier ones, however few
        threads decode (``workers_count``). On a local disk nothing starts early: a read there is the CPU's."""
        if self._io is None:
            return Started(bundle, [])
        # the folders' listings (modification times, G15) first, so none waits behind the reads that need it
        self._footers.list_ahead([fsutil.join(self._root, f.path) for f in bundle], self._io)
        return Started(bundle, [self._io.submit(self._fragment, f) for f in bundle])

    def read(self, bundle: list[Fragment] | Started) -> dict:
        """The bundle's rows as columns (decoded, transformed); ``bundle`` may be what ``start`` returned."""
        fragments = bundle.bundle if isinstance(bundle, Started) else bundle
        if self._stats is None:
            if self._transform is not None:
                return self._transform.apply(self.table(bundle), fragments)
            return fr.to_columns(self.table(bundle), self._fields, self._schemas, fragments)
        cell = self._stats.cell()  # one bundle: two stages timed, a few counts (reading/stats.py)
        start, inner = perf_counter(), cell.inner
        table = self.table(bundle)
        cell.since("read", start, inner)
        cell.count("rows", table.num_rows)
        cell.count("bytes", table.get_total_buffer_size())  # not nbytes: that one walks the offsets (50 ns a row)
        start, inner = perf_counter(), cell.inner
        if self._transform is not None:
            out = self._transform.apply(table, fragments)
            cell.since("transform", start, inner)
            return out
        out = fr.to_columns(table, self._fields, self._schemas, fragments)
        cell.since("decode", start, inner)
        return out

    def read_chunks(self, bundle: list[Fragment] | Started, sizes: BundleSizes | None = None
                    ) -> list[tuple[list[Fragment], dict]]:
        """The bundle's rows as chunks of columns (decoded, transformed), each with the fragments it holds;
        ``bundle`` may be what ``start`` returned. A fragment of ``fragments.BUNDLE_ROWS`` rows or more is converted
        alone (joining large row groups into one array would copy every value once more, for no fewer conversions),
        the smaller ones between them together (one conversion for many small row groups).

        ``sizes`` (``read_ahead.BundleSizes``) is told the decoded bytes read, and the reading stops at the first
        fragment that takes them past ``sizes.limit``: the chunks then hold the bundle's first fragments only, and
        the caller reads the others."""
        fragments = bundle.bundle if isinstance(bundle, Started) else bundle
        cell = self._stats.cell() if self._stats is not None else None  # timed as ``read`` times (reading/stats.py)
        start, inner = perf_counter(), cell.inner if cell is not None else 0.0
        tables = self.tables(bundle, limit=None if sizes is None else sizes.limit)
        fragments = fragments[:len(tables)]
        if sizes is not None or cell is not None:
            rows = sum(t.num_rows for t in tables)
            held = sum(t.get_total_buffer_size() for t in tables)  # not nbytes: that walks the offsets
            if sizes is not None:
                sizes.measure(rows=rows, nbytes=held)
                give_back(held)
        if cell is not None:
            cell.since("read", start, inner)
            cell.count("rows", rows)
            cell.count("bytes", held)
            start, inner = perf_counter(), cell.inner
        if self._transform is not None:
            transformed = [(fragments, self._transform.apply(fr.concat_tables(tables), fragments))]
            if cell is not None:
                cell.since("transform", start, inner)
            return transformed
        chunks: list[tuple[list[Fragment], dict]] = []
        small: list[int] = []  # positions of the small fragments not converted yet

        def convert(group: list[int]) -> None:
            held = [fragments[i] for i in group]
            table = fr.concat_tables([tables[i] for i in group])
            chunks.append((held, fr.to_columns(table, self._fields, self._schemas, held)))
        for i, table in enumerate(tables):
            if table.num_rows < fr.BUNDLE_ROWS:
                small.append(i)
                continue
            if small:
                convert(small)
                small = []
            convert([i])
        if small:
            convert(small)
        if cell is not None:
            cell.since("decode", start, inner)
        return chunks

    def table(self, bundle: list[Fragment] | Started, indices=None) -> pa.Table:
        """The bundle's rows as one Arrow table, not decoded (``indices``: one fragment's rows, in that order)."""
        return fr.concat_tables(self.tables(bundle, indices))

    def tables(self, bundle: list[Fragment] | Started, indices=None, limit: int | None = None) -> list[pa.Table]:
        """The bundle's rows as one Arrow table per fragment, not decoded; with ``limit``, only its first fragments:
        up to the first whose table takes the bytes held past ``limit`` (the others' reads are cancelled)."""
        started = bundle if isinstance(bundle, Started) else None
        if started is None or not started.futures:
            fragments = started.bundle if started is not None else bundle
            assert isinstance(fragments, list)
            if self._io is None or len(fragments) < 2:
                return _until(limit, (self._fragment(f, indices) for f in fragments))
            started = Started(fragments, [self._io.submit(self._fragment, f, indices) for f in fragments])
        try:
            return _until(limit, (future.result() for future in started.futures))
        finally:
            started.cancel()

    def _fragment(self, fragment: Fragment, indices=None) -> pa.Table:
        """One fragment's rows, its file opened (footer checked) and its row group read under the retry policy;
        returned only once the file's modification time was checked too (``_confirm``, G15), which on a remote
        filesystem waits for its folder's listing, in flight beside the read."""
        location = f"{self._plan.dataset_url}/{fragment.path}"
        files = self._files()
        cell = self._stats.cell() if self._stats is not None else None
        if cell is not None:
            start, inner, retried = perf_counter(), cell.inner, retry.retries()
        try:
            handle = retry.call(lambda: files.get(fragment.path), url=location, policy=self._retry)
        except (OSError, pa.ArrowException) as exc:  # the footer: stale listing, or name the unreadable file
            raise fr.unreadable_dataset_error(self._plan, exc, fragment.path) from exc
        if cell is not None and not self.remote:  # opening the file (footer read and checked once per epoch); on
            cell.since("list", start, inner)  # remote storage it overlaps the reads, and counts to their "read"
        if self._cache is not None:  # a cache entry is keyed by the checked footer, time included
            self._confirm(fragment)
        try:
            cache = self._cached if self._cache is not None else None
            table = retry.call(lambda: fr.read_fragment(handle, fragment, self._spec, indices=indices, cache=cache),
                               url=location, policy=self._retry)
        except (OSError, pa.ArrowException) as exc:  # name the file and row group
            try:
                self._confirm(fragment)  # a rewrite (G15) is the truer cause of a failed read
            except StalePlanError as stale:
                raise stale from exc
            except (OSError, pa.ArrowException):
                pass
            raise fr.read_error(fragment, exc) from exc
        self._confirm(fragment)
        if cell is not None:  # the read itself is timed by the thread reading the bundle (``read``)
            cell.count("requests", 1)
            cell.count("retries", retry.retries() - retried)
        return table

    def _confirm(self, fragment: Fragment) -> None:
        """``CheckedFooters.confirm`` of the fragment's file (its modification time), under the retry policy."""
        location = f"{self._plan.dataset_url}/{fragment.path}"
        try:
            retry.call(lambda: self._footers.confirm(fragment.path, fsutil.join(self._root, fragment.path)),
                       url=location, policy=self._retry)
        except (OSError, pa.ArrowException) as exc:  # the listing failed: name the file and what was done
            raise fr.unreadable_dataset_error(self._plan, exc, fragment.path) from exc


def arrow_chunks(plan: ShardPlan, columns, *, workers_count: int = 4, reader_pool_type: str = "thread",
                 max_ahead=None, transform=None, retry_policy: retry.RetryPolicy | None = None,
                 cache: CacheSettings | None = None):
    """A ``stream.Chunks`` reading bundles in ``workers_count`` threads (or inline for ``"dummy"``), in order;
    the pool options were checked when the loader was made (``reader_arguments.check_pool_options``).
    ``transform`` (a ``transform.Transform``) runs in the threads too, on each bundle's rows; ``cache``: row groups
    kept on the local disk (``io/row_group_cache.py``)."""
    inline = reader_pool_type == "dummy"
    ahead = max_ahead or workers_count + 2

    def chunks(todo: list[Fragment]):
        threads = 0 if inline else workers_count
        spec = columns.spec if threads < 2 else replace(columns.spec, use_threads=False)  # our threads decode
        reader = BundleReader(plan, spec, columns.fields, columns.schemas, transform, retry_policy=retry_policy,
                              cache=cache)
        # larger bundles where threads hand them over (fragments.BUNDLE_BYTES); a transform sees at most
        # BUNDLE_ROWS-row bundles, and a remote bundle's fragments are requested side by side (kept as they are).
        # Either way a bundle holds about BUNDLE_BYTES of the decoded bytes measured on this slot's reads so far
        # (read_ahead.py), so the prefetch stays a few MiB whatever a row weighs. The bundles read before anything
        # was measured take the footers' guess (at most 16 x BUNDLE_ROWS rows): it misses dictionary strings, but a
        # thread's cut bounds their bytes as it bounds every bundle's. Why not one fragment each until measured:
        # every bundle handed over costs the batcher a chunk, and on small row groups that cost 10-15% of an
        # unshuffled epoch (pyarrow 26, 250k rows in 177 row groups, paired in one process).
        large = threads > 1 and transform is None and not reader.remote
        first = min(16 * fr.BUNDLE_ROWS if large else fr.BUNDLE_ROWS, fr.bundle_rows(columns.row_bytes))
        sizes = BundleSizes(target=fr.BUNDLE_BYTES, first_rows=first, max_rows=None if large else fr.BUNDLE_ROWS)

        def read(begun: Started | list[Fragment]):
            return begun.bundle if isinstance(begun, Started) else begun, reader.read_chunks(begun, sizes)

        def rest(bundle: list[Fragment], chunks_read: list) -> Generator:
            """What a bundle cut short (rows far larger than measured) left: read here, in bundles cut from the
            bytes just measured, one at a time (no more memory than one), before the bundles read ahead after it."""
            done = sum(len(held) for held, _ in chunks_read)
            if done == len(bundle):
                return
            for part in sizes.bundles(bundle[done:]):
                part_read = reader.read_chunks(part, sizes)
                yield from part_read
                yield from rest(part, part_read)
        results = in_order(read, sizes.bundles(todo), workers_count=threads, ahead=ahead, start=reader.start)
        try:
            for bundle, chunks_read in results:
                yield from chunks_read
                yield from rest(bundle, chunks_read)
        finally:
            results.close()  # cancels the reads not started, waits for those in flight
            reader.close()
    return chunks


def in_order(function: Callable, items: Iterable, *, workers_count: int, ahead: int,
             start: Callable[[Any], Started] | None = None) -> Generator:
    """``function(item)`` for every item, in order, computed by ``workers_count`` threads (0: inline) at most
    ``ahead`` items beyond the one being consumed; closing the generator cancels what was not started. ``items`` is
    iterated lazily, an item as it enters those ``ahead`` (``read_ahead.BundleSizes`` cuts a bundle then).

    ``start(item)``, called in the consuming thread as an item enters those ``ahead`` (``BundleReader.start``),
    begins its I/O, and ``function`` gets what it returned: inline too, the requests of the items ahead are in
    flight while the current one is decoded."""
    begin: Callable = start or (lambda item: item)
    if workers_count < 1:
        started: deque = deque()
        try:
            upcoming = iter(items)
            for item in upcoming:
                started.append(begin(item))
                if len(started) > ahead:
                    break
            while started:
                current = started.popleft()
                nxt = next(upcoming, None)
                if nxt is not None:
                    started.append(begin(nxt))
                yield function(current)
        finally:
            for item in started:
                if isinstance(item, Started):
                    item.cancel()
        return
    # a pool of workers_count threads whatever the items: it starts a thread only for an item submitted while none
    # is idle, and one size per workers_count keeps few idle pools (``_take_pool``)
    held = _take_pool(workers_count)
    pool = held.executor
    pending: deque = deque()  # (future of function, what start returned)
    try:
        upcoming = iter(items)
        for item in upcoming:
            begun = begin(item)
            pending.append((pool.submit(function, begun), begun))
            if len(pending) > ahead:
                break
        while pending:
            result = pending.popleft()[0].result()
            nxt = next(upcoming, None)
            if nxt is not None:
                begun = begin(nxt)
                pending.append((pool.submit(function, begun), begun))
            yield result
    finally:
        for future, begun in pending:
            future.cancel()
            if isinstance(begun, Started):
                begun.cancel()
        # No join here: this finally may run inside a garbage collection that interrupted threading's own locked
        # bookkeeping (a generator dropped unclosed), where joining deadlocks every later Thread.start. A read in
        # flight (at most one item per thread) finishes in the background and its result is dropped.
        _put_back(held, workers_count)


class _Pool:
    """A reading pool and a weak reference to it made with it: a garbage collection that finds the pool unreachable
    (an unclosed ``in_order`` dropped) clears it, and with it the one by which the pool's threads know it is alive,
    so they end, even when ``in_order``'s ``finally`` then puts the pool back (``_take_pool`` drops it then)."""

    __slots__ = ("executor", "alive")

    def __init__(self, threads: int):
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="pb-arrow")
        self.alive = weakref.ref(self.executor)


def _take_pool(threads: int) -> _Pool:
    """An idle pool of ``threads`` threads this process made for an earlier ``in_order``, or a new one.

    Why not a new one each time: ``in_order`` runs once per epoch, and the threads' allocator heaps die with them
    (mimalloc, pyarrow 26's default pool, keeps freed memory per thread): over 64k-row row groups of numbers the
    memory the allocator held but Arrow did not grew by about 50 MiB an epoch with new threads, and each hand-back
    of it (``arrow_memory.give_back``) costs page faults in the epochs after. Each ``in_order`` holds its own pool
    while it runs (loaders side by side never share threads). No locks: ``_put_back`` may run inside a garbage
    collection (see ``in_order``), and a deque's ``append`` and ``pop`` are atomic."""
    idle = _IDLE.setdefault((os.getpid(), threads), deque())  # by process: a forked child has none of its threads
    while idle:
        try:
            pool = idle.pop()
        except IndexError:  # taken by another thread since
            break
        if pool.alive() is not None:
            return pool
        pool.executor.shutdown(wait=False, cancel_futures=True)  # its threads ended (class docstring)
    return _Pool(threads)


def _put_back(pool: _Pool, threads: int) -> None:
    """``pool`` kept for the next ``in_order`` (its queued items were cancelled; one in flight finishes first), or
    shut down (no join) when ``IDLE_POOLS`` of its size wait already."""
    idle = _IDLE.setdefault((os.getpid(), threads), deque())
    if len(idle) < IDLE_POOLS:
        idle.append(pool)
    else:
        pool.executor.shutdown(wait=False, cancel_futures=True)


def _until(limit: int | None, tables: Iterable[pa.Table]) -> list[pa.Table]:
    """The tables, or with ``limit`` those up to the first that takes their bytes past it (at least one)."""
    out, held = [], 0
    for table in tables:
        out.append(table)
        held += table.get_total_buffer_size()
        if limit is not None and held > limit:
            break
    return out
