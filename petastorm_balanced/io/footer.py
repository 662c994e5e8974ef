"""Parquet footers read once, with a fingerprint of their bytes (G15).

Planning and the reader both parse every footer they use; reading the footer's bytes here (one read of the file's
tail, as Arrow itself does) lets both hash exactly what the writer wrote and parse it without a second read. The
bytes, not a re-serialized ``FileMetaData``: a pyarrow that does not know a newer writer's footer fields drops
them when re-serializing, so the same file would hash differently on the petastorm and the modern stack.
"""
from __future__ import annotations

import functools
import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import StalePlanError

TAIL_READ = 1 << 16  # bytes read from a file's end: most footers fit, as in Arrow's own first read
_MAGIC = b"PAR1"


@dataclass(frozen=True)
class Footer:
    """A parsed footer and the sha256 (hex) of its bytes as stored in the file, and the file's size then; the
    file's modification time (ns) once a ``CheckedFooters`` looked it up after reading the footer, None where the
    filesystem reports none; the file's content fingerprint (``io/content.py``) once a ``CheckedFooters`` asked for
    one, else ``""``."""

    metadata: pq.FileMetaData
    digest: str
    file_size: int
    mtime_ns: int | None = None
    content: str = ""


class ParsedFooters:
    """Parsed footers by the sha256 of their bytes, least recently used out first once they hold more than
    ``max_bytes`` of footer bytes.

    Why: a reader checks every footer against the plan at each epoch (G15), which needs the footer's bytes and
    their hash, but parsing them again (most of a footer's cost: a Thrift decode of every row group and column
    chunk) gives the very same ``FileMetaData`` when the bytes are the same. Keyed by the hash of the bytes, a
    hit is exact by construction: a rewritten file has other bytes, is parsed anew and checked as ever. Parsed
    footers are read-only, so threads and loaders share them."""

    def __init__(self, max_bytes: int):
        self._max, self._held = max_bytes, 0
        self._items: OrderedDict[str, tuple[pq.FileMetaData, int]] = OrderedDict()
        self._lock = threading.Lock()

    def parse(self, stored: bytes, digest: str) -> pq.FileMetaData:
        """``stored`` (a footer with its length and magic bytes, ``digest`` the hash of the footer) parsed."""
        with self._lock:
            hit = self._items.get(digest)
            if hit is not None:
                self._items.move_to_end(digest)
                return hit[0]
        metadata = pq.read_metadata(pa.BufferReader(_MAGIC + stored))
        with self._lock:
            if digest not in self._items and len(stored) <= self._max:
                self._items[digest] = (metadata, len(stored))
                self._held += len(stored)
                while self._held > self._max:
                    self._held -= self._items.popitem(last=False)[1][1]
        return metadata


# the reading path's footers (a process's loaders, each epoch); planning parses each footer once and keeps none
READ_FOOTERS = ParsedFooters(32 << 20)


class FileMemo:
    """Values worked out from a parsed footer, kept while that very ``FileMetaData`` object lives.

    Why: a footer's parse is shared by every loader of the process (``READ_FOOTERS``, keyed by the hash of its
    bytes), and reading each row group's statistics from it takes a Python object per column chunk (null counts: 4 ms
    of a loader's 12 ms setup for 12 files of 177 row groups); a rewritten file has another footer, another object.
    Keyed by ``id`` (footers are not hashable on every pyarrow) and checked through a weak reference, so an entry
    never outlives its footer or answers for another."""

    def __init__(self):
        self._items: dict[int, tuple[weakref.ref, dict]] = {}
        self._lock = threading.Lock()

    def get(self, meta) -> dict:
        """The memo of ``meta`` (a dict to read and fill), empty the first time."""
        key = id(meta)
        with self._lock:
            held = self._items.get(key)
            if held is not None and held[0]() is meta:
                return held[1]
            try:
                ref = weakref.ref(meta, functools.partial(self._drop, key))
            except TypeError:  # a footer type without weak references: nothing kept
                return {}
            memo: dict = {}
            self._items[key] = (ref, memo)
            return memo

    def _drop(self, key: int, _dead: object = None) -> None:
        # no lock: a collection may run this inside ``get`` in the same thread; an entry dropped for a new object
        # at the same address is only worked out again
        held = self._items.get(key)
        if held is not None and held[0]() is None:
            self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


# what the loader's setup works out from each parsed footer: its columns' null flags, its statistics' value ranges
FOOTER_FACTS = FileMemo()


class FreshFooters:
    """Remote files just opened and their footers just read (a loader's schema pass), handed once to the first
    reader that opens the file (``take``), so the loader's first epoch checks those very bytes (G15) instead of
    opening and reading every file again: one open and one footer read per file per epoch, where it was two.

    Why handed over once: the check is per epoch, so a later epoch's reader reads every footer anew. At most
    ``max_items`` are held (the oldest dropped: a loader made and never iterated holds nothing for long)."""

    def __init__(self, max_items: int = 4096):
        self._max = max_items
        self._items: OrderedDict[tuple[int, str], tuple[object, Footer]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, filesystem, location: str, handle, footer: Footer) -> None:
        with self._lock:
            self._items[(id(filesystem), location)] = (handle, footer)
            while len(self._items) > self._max:
                self._items.popitem(last=False)

    def take(self, filesystem, location: str) -> tuple | None:
        with self._lock:
            return self._items.pop((id(filesystem), location), None)


FRESH_FOOTERS = FreshFooters()


class OpenFiles:
    """Remote files kept open for the process, by filesystem and location: opening a file of an object store asks
    for its size (a HEAD, a round trip), and every loader's schema pass and every epoch's reader opens the same
    files again. A kept file is read by position only (safe from several threads, ``read_at``), and never closed
    by a reader (``forget`` drops it).

    Safe for G15: a kept file knows the size its object had when opened, and every footer is still read through it
    anew each time (``read_footer``) and checked against the plan; an object rewritten to another size shows other
    footer bytes or fails to read (a read past its new end), and a caller that gets an error or a footer other than
    the planned one through a kept file opens the file afresh once before deciding (``OPEN_FILES.fresh``), so only
    what is on the storage now decides. At most ``max_items`` are kept, the oldest dropped."""

    def __init__(self, max_items: int = 16384):
        self._max = max_items
        self._items: OrderedDict[tuple[int, str], tuple[object, object]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, filesystem, location: str) -> tuple[object, bool]:
        """``(handle, kept)``: the kept file (``kept=True``), or one opened now and kept."""
        key = (id(filesystem), location)
        with self._lock:
            item = self._items.get(key)
            if item is not None and item[0] is filesystem:
                self._items.move_to_end(key)
                return item[1], True
        handle = filesystem.open_input_file(location)
        with self._lock:
            self._items[key] = (filesystem, handle)  # the filesystem held too: its id is never another's
            while len(self._items) > self._max:
                self._items.popitem(last=False)
        return handle, False

    def fresh(self, filesystem, location: str):
        """The file opened afresh (its size asked again) and kept in place of the one kept before."""
        self.forget(filesystem, location)
        return self.open(filesystem, location)[0]

    def forget(self, filesystem, location: str) -> None:
        with self._lock:
            self._items.pop((id(filesystem), location), None)


OPEN_FILES = OpenFiles()


def read_kept_footer(filesystem, location: str, parsed: ParsedFooters | None = None,
                     check: Callable[[Footer], None] | None = None) -> tuple[object, Footer]:
    """``(handle, footer)`` of a remote file through ``OPEN_FILES`` (no round trip to open a file kept open), the
    footer read now and passed to ``check`` (which raises ``StalePlanError`` for one other than the planned one).
    When the read fails or ``check`` refuses the footer read through a kept file, the file is opened afresh and
    its footer read and checked again: a size kept from before a rewrite never decides."""
    handle, kept = OPEN_FILES.open(filesystem, location)
    if kept:
        try:
            footer = read_footer(handle, parsed)
            if check is not None:
                check(footer)
            return handle, footer
        except (OSError, pa.ArrowException, StalePlanError):
            handle = OPEN_FILES.fresh(filesystem, location)
    try:
        footer = read_footer(handle, parsed)
        if check is not None:
            check(footer)
        return handle, footer
    except BaseException:
        OPEN_FILES.forget(filesystem, location)
        raise


def read_footer(handle, parsed: ParsedFooters | None = None) -> Footer:
    """The footer of an open random-access file (a ``pyarrow`` ``NativeFile``), parsed, or taken from ``parsed``
    when it holds these very bytes; pyarrow's error types for a file that is not Parquet (``ArrowInvalid``) or
    cannot be read (``OSError``)."""
    size = handle.size()
    if size < 12:
        raise pa.ArrowInvalid(f"Parquet file size is {size} bytes, smaller than the minimum file footer (12 bytes)")
    take = min(size, TAIL_READ)
    tail = handle.read_at(take, size - take)  # positional: a kept handle is shared by threads (``OPEN_FILES``)
    if tail[-4:] != _MAGIC:
        what = "an encrypted footer, which is not supported" if tail[-4:] == b"PARE" else "no Parquet magic bytes"
        raise pa.ArrowInvalid(f"Parquet magic bytes not found in footer ({what}); the file is corrupted or is not a "
                              "parquet file")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise pa.ArrowInvalid(f"Parquet footer length {length} is larger than the file ({size} bytes)")
    if length + 8 > take:
        tail = handle.read_at(length + 8, size - length - 8)
    stored = tail[len(tail) - length - 8:]
    digest = hashlib.sha256(stored[:length]).hexdigest()
    if parsed is not None:
        return Footer(parsed.parse(stored, digest), digest, size)
    return Footer(pq.read_metadata(pa.BufferReader(_MAGIC + stored)), digest, size)


def open_file(source, metadata: pq.FileMetaData | None = None, **options) -> pq.ParquetFile:
    """``source`` (an open file, a local path or a buffer) opened as Parquet, its footer parsed (``metadata``: one
    parsed before). Every footer the package parses goes through this module, so how footers are read (buffering,
    a cache, a pyarrow option) is decided in one place."""
    return pq.ParquetFile(source, metadata=metadata, **options)


def footer_at(filesystem, location: str) -> pq.FileMetaData:
    """The parsed footer of the file at ``location`` on ``filesystem``, the file closed again."""
    with filesystem.open_input_file(location) as handle:
        return open_file(handle).metadata


def modification_time(filesystem, location: str) -> int | None:
    """The file's modification time in nanoseconds as the filesystem lists it (what planning recorded), or None."""
    return filesystem.get_file_info(location).mtime_ns


class CheckedFooters:
    """Opens a reader's files, reading, hashing and checking each footer once (``check(name, footer)`` raises for
    a footer that is not the planned one) and reusing it for every later open of the file by this reader.

    The footer handed to ``check`` carries the file's modification time (G15): a rewrite that keeps the footer's
    bytes (the same rows of a row group in another order, the same statistics) is told by its modification time.
    A reader hands on no row of a file before both were checked: ``open`` checks the footer, ``confirm`` the time
    (on a local disk ``open`` does both, looking the time up after reading the footer).

    Why: each reading thread keeps only a few files open, and a plan's seeded row group order crosses files, so one
    file is opened again and again in an epoch; its footer was read, hashed and parsed each time (two extra
    requests per row group on an object store). A later open whose file size differs from the checked one reads
    and checks the footer again, so a file rewritten while the reader lives is still refused. Parsed footers are
    read-only and shared by the threads; the dict is filled under the GIL, and two threads opening one file at
    once merely both check it. The next epoch's reader reads and checks every footer again, and parses only the
    footers whose bytes changed (``READ_FOOTERS``).

    On a remote filesystem (``shared=True``) the open file itself is kept too and shared by the threads (an
    object store file is positional reads only, safe from several threads), so a file costs one open (a HEAD)
    and one footer read per reader, not one per thread, and none when the loader's schema pass just read it
    (``FRESH_FOOTERS``); ``pre_buffer`` makes each row group's column chunks one
    coalesced read, issued at once, instead of one request per column chunk in series. The modification times
    come from one listing per folder per reader (a request per 1,000 files) instead of a HEAD per file, started
    with the first reads of the folder's files (``list_ahead``) and checked by ``confirm`` once a row group was read
    and before its rows are handed on, so the listing's round trip overlaps the reads instead of preceding them.
    A check holds as of the earlier of the footer read and the listing: a file rewritten before both is refused
    (a new footer or a new time), and one rewritten after either is refused by the next epoch's reader, as one
    rewritten after a per-file look-up would be; a rewrite between a row group's read and the listing is refused
    too, though the rows read were the planned ones.
    """

    def __init__(self, filesystem, check, *, pre_buffer: bool = False, shared: bool = False,
                 contents: dict[str, str] | None = None):
        self._filesystem, self._check = filesystem, check
        # location -> the planned content fingerprint of the files whose plan recorded one: each is taken afresh
        # once per reader (its kind: an ETag, or every byte's digest) beside the modification time, started with
        # the folder's listing on a remote filesystem (``list_ahead``), so it adds no round trip in series
        self._contents = contents or {}
        self._fingerprints: dict[str, Future] = {}  # shared=True: location -> its fingerprint now
        self._footers: dict[str, Footer] = {}  # checked whole: footer and modification time
        self._opened: dict[str, Footer] = {}  # shared=True: footers checked, their time not yet (``confirm``)
        self._pre_buffer, self._shared = pre_buffer, shared
        self._handles: dict[str, object] = {}  # name -> open file, shared by the threads (shared=True)
        self._locks: dict[str, threading.Lock] = {}  # shared=True: one thread opens a file, the others wait for it
        self._locks_lock = threading.Lock()
        self._listings: dict[str, Future] = {}  # shared=True: folder -> its listing, {location: mtime_ns}

    @staticmethod
    def _folder(location: str) -> str:
        return location.rsplit("/", 1)[0] if "/" in location else ""

    def _list(self, folder: str) -> dict[str, int | None]:
        entries = self._filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        return {e.path: e.mtime_ns for e in entries if e.type == pafs.FileType.File}

    def list_ahead(self, locations, executor) -> None:
        """``shared=True``: start listing the folders of ``locations`` not listed yet on ``executor`` now, for the
        ``confirm`` of their files; call it before queuing reads of those files on the same executor (a listing
        queued behind the reads that wait for it could wait for a free thread forever)."""
        locations = list(locations)
        for folder in dict.fromkeys(self._folder(loc) for loc in locations):
            with self._locks_lock:
                if folder not in self._listings:
                    self._listings[folder] = executor.submit(self._list, folder)
        for location in dict.fromkeys(loc for loc in locations if loc in self._contents):
            with self._locks_lock:
                if location not in self._fingerprints:
                    self._fingerprints[location] = executor.submit(self._fresh_content, location)

    def _listed(self, folder: str) -> dict[str, int | None]:
        """The folder's listing: the one started ahead, or listed here now (once per reader); a failed listing is
        forgotten, so a retry lists again."""
        with self._locks_lock:
            known = self._listings.get(folder)
            mine = known is None
            future: Future = Future() if known is None else known
            if mine:
                self._listings[folder] = future
        if mine:
            try:
                future.set_result(self._list(folder))
            except BaseException as exc:
                future.set_exception(exc)
        return self._awaited(self._listings, folder, future)

    def _awaited(self, futures: dict, key: str, future: Future):
        """``future``'s result, shared by the threads that asked for ``key``; a failure is forgotten, so the next
        caller asks the storage again instead of getting the same error."""
        try:
            return future.result()
        except BaseException:
            with self._locks_lock:
                if futures.get(key) is future:
                    del futures[key]
            raise

    def _modification_time(self, location: str) -> int | None:
        """``modification_time``; on a remote filesystem from its folder's listing, listed once per reader."""
        if not self._shared:
            return modification_time(self._filesystem, location)
        listed = self._listed(self._folder(location))
        if location in listed:
            return listed[location]
        return modification_time(self._filesystem, location)  # not listed (created since): look it up

    def open(self, name: str, location: str) -> pq.ParquetFile:
        """The file ``name`` (what ``check`` is told) at ``location`` on the filesystem, its footer checked (and,
        but with ``shared=True``, its modification time: ``confirm``)."""
        if not self._shared:
            return self._open(name, location)
        with self._locks_lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:  # many threads read one file's row groups at once: one open and one footer read, not one each
            return self._open(name, location)

    def _open(self, name: str, location: str) -> pq.ParquetFile:
        known = self._footers.get(name) or self._opened.get(name)
        if known is not None:
            shared = self._handles.get(name)
            if shared is not None:
                return pq.ParquetFile(shared, metadata=known.metadata, pre_buffer=self._pre_buffer)
            handle = self._filesystem.open_input_file(location)
            try:
                if handle.size() == known.file_size:
                    return pq.ParquetFile(handle, metadata=known.metadata, pre_buffer=self._pre_buffer)
            except BaseException:
                handle.close()
                raise
            handle.close()
        if self._shared:  # the footer now; the time once the folder's listing is in (``confirm``)
            fresh = FRESH_FOOTERS.take(self._filesystem, location)
            if fresh is not None:
                handle, footer = fresh
                try:
                    self._check(name, footer)
                except StalePlanError:  # read through a kept file: decided by a fresh open below
                    fresh = None
            if fresh is None:  # a file kept open (``OPEN_FILES``): no HEAD, the footer read anew
                handle, footer = read_kept_footer(self._filesystem, location, READ_FOOTERS,
                                                  lambda read: self._check(name, read))
            self._opened[name] = footer
            self._handles[name] = handle
            return pq.ParquetFile(handle, metadata=footer.metadata, pre_buffer=self._pre_buffer)
        handle = self._filesystem.open_input_file(location)
        try:
            footer = read_footer(handle, READ_FOOTERS)
            footer = replace(footer, mtime_ns=self._modification_time(location),
                             content=self._content(location, handle))
            self._check(name, footer)
        except BaseException:
            handle.close()
            raise
        self._footers[name] = footer
        return pq.ParquetFile(handle, metadata=footer.metadata, pre_buffer=self._pre_buffer)

    def _fresh_content(self, location: str) -> str:
        from . import content
        return content.fresh(self._filesystem, location, self._contents[location])

    def _content(self, location: str, handle=None) -> str:
        """The file's content fingerprint now, of the kind the plan recorded, or ``""`` where it recorded none; an
        ETag from ``handle`` when it was just opened (the request that opened it returned it), else the one
        started ahead (``list_ahead``, once per reader; a failed one is forgotten, so a retry asks again)."""
        planned = self._contents.get(location, "")
        if not planned:
            return ""
        from . import content
        if handle is not None and planned.startswith(content.ETAG):
            return content.of_handle(handle) or self._fresh_content(location)
        with self._locks_lock:
            future = self._fingerprints.get(location)
        if future is None:
            return self._fresh_content(location)
        return self._awaited(self._fingerprints, location, future)

    def confirm(self, name: str, location: str) -> None:
        """``shared=True``: check the modification time of ``name``, opened (``open``) by this reader, against the
        plan (``check``), once per reader, from its folder's listing; call it before handing on a row of the
        file. A no-op once checked, and for a reader that checks it in ``open``."""
        if name in self._footers:
            return
        footer = self._opened[name]
        checked = replace(footer, mtime_ns=self._modification_time(location), content=self._content(location))
        try:
            self._check(name, checked)
        except StalePlanError:
            # a listing's time may be rounded otherwise than a file look-up's (what a table's plan recorded):
            # the look-up decides, so a refusal is a rewrite, never a rounding
            checked = replace(checked, mtime_ns=modification_time(self._filesystem, location))
            self._check(name, checked)
        self._footers[name] = checked

    def checked(self, name: str) -> Footer | None:
        """The footer of ``name`` as read and checked by this reader (with the file's modification time), or None
        before its first open (and ``confirm``)."""
        return self._footers.get(name)

    def check_all(self, names_locations, threads: int = 16) -> None:
        """Read and check the footer and modification time of every ``(name, location)`` now, ``threads`` at a
        time (each a small, latency-bound read), closing the files: for a reader whose reading happens elsewhere
        (Petastorm's pool opens the files itself), so nothing of a rewritten file is served."""
        todo = [(n, loc) for n, loc in dict(names_locations).items() if n not in self._footers]

        def check(name: str, location: str) -> None:
            self.open(name, location).close()
            self.confirm(name, location)
        if len(todo) < 2:
            for name, location in todo:
                check(name, location)
            return
        with ThreadPoolExecutor(min(threads, len(todo))) as pool:
            futures = [pool.submit(check, *item) for item in todo]
        first = next((e for e in (f.exception() for f in futures) if e is not None), None)
        if first is not None:
            raise first
