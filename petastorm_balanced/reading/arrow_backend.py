"""The Arrow backend: planned fragments read with ``pyarrow.parquet`` / ``pyarrow.fs`` alone, no Petastorm.

Why it exists: Petastorm calls pyarrow's legacy dataset API, so it cannot even be imported on pyarrow >= 16. Our
reading never needed Petastorm's machinery to decide *what* to read (the plan does that): it needs a bounded,
ordered prefetch of row groups, which a thread pool gives, because pyarrow decodes Parquet in C++ with the GIL
released.

What makes it give the very same batches as the Petastorm backend: both cut the fragments into the same bundles
(``fragments.bundle``), read each fragment with ``fragments.read_fragment`` (only the requested columns, row count
checked against the plan, cut to the planned rows) and convert with ``fragments.to_columns``; the batches are then
made by the shared ``stream.slot_runs``. Only the scheduling differs.

Prefetch: at most ``max_ahead`` bundles are submitted beyond the one being consumed, and results are taken in
submission order with ``Future.result()`` (blocking, no polling), so memory stays bounded by ``max_ahead`` bundles
whatever the threads' speeds, and the order never depends on timing.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import List

import pyarrow as pa

from ..io import fs as fsutil
from ..io.dataset import dataset_root
from ..io.footer import open_parquet
from ..plan.format import check_file
from ..plan.model import Fragment, ShardPlan
from . import fragments as fr
from ..errors import InvalidValueError, StalePlanError

POOL_TYPES = ("thread", "dummy")  # "dummy": read in the consuming thread (DataLoader workers, debugging)


class BundleReader:
    """Reads bundles of fragments as column dicts; each thread keeps its own few open files (footers parsed once
    per thread: a ``ParquetFile`` is not safe to share between threads)."""

    def __init__(self, plan: ShardPlan, spec: fr.ReadSpec, fields=None):
        self._plan = plan
        self._filesystem, self._root = dataset_root(plan.dataset_url)
        self._planned = {f.path: f for f in plan.catalog.files}
        self._spec, self._fields = spec, fields
        self._local = threading.local()

    def _files(self) -> fr.FileCache:
        files = getattr(self._local, "files", None)
        if files is None:
            filesystem, root, plan, planned = self._filesystem, self._root, self._plan, self._planned

            def opener(path):
                # Only a path the plan lists, checked again (G14); its footer read once, hashed and compared with
                # the planned footer (G15) before a row of it is used.
                if path not in planned:
                    raise StalePlanError(f"{path!r} is not a data file of the plan; re-run planning")
                parquet, footer = open_parquet(filesystem, fsutil.join(root, path))
                check_file(plan, planned[path], footer=footer.digest)
                return parquet
            files = self._local.files = fr.FileCache(opener)
        return files

    def read(self, bundle: List[Fragment]) -> dict:
        files, tables = self._files(), []
        for fragment in bundle:
            try:
                handle = files.get(fragment.path)
            except (OSError, pa.ArrowException) as exc:  # the footer: stale listing, or name the unreadable file
                raise fr.unreadable_dataset_error(self._plan, exc, fragment.path) from exc
            try:
                tables.append(fr.read_fragment(handle, fragment, self._spec))
            except (OSError, pa.ArrowException) as exc:  # name the file and row group
                raise fr.read_error(fragment, exc) from exc
        return fr.to_columns(fr.concat_tables(tables), self._fields)


def check_pool_type(reader_pool_type) -> None:
    if reader_pool_type not in POOL_TYPES:
        raise InvalidValueError(f"reader_pool_type={reader_pool_type!r} is not one of {POOL_TYPES} for backend='arrow' "
                                "(pyarrow decodes in C++ without the GIL, so threads suffice); use "
                                "backend='petastorm' for Petastorm's process pool")


def arrow_chunks(plan: ShardPlan, columns, *, workers_count: int = 4, reader_pool_type: str = "thread",
                 max_ahead=None):
    """A ``stream.Chunks`` reading bundles in ``workers_count`` threads (or inline for ``"dummy"``), in order."""
    check_pool_type(reader_pool_type)
    inline = reader_pool_type == "dummy" or workers_count < 1
    ahead = max_ahead or workers_count + 2

    def chunks(todo: List[Fragment]):
        reader = BundleReader(plan, columns.spec, columns.fields)
        bundles = fr.bundle(todo, fr.BUNDLE_ROWS)
        if inline:
            for bundle in bundles:
                yield bundle, reader.read(bundle)
            return
        pool = ThreadPoolExecutor(max(1, min(workers_count, len(bundles))), thread_name_prefix="pb-arrow")
        pending = deque()
        try:
            upcoming = iter(bundles)
            for bundle in upcoming:
                pending.append((bundle, pool.submit(reader.read, bundle)))
                if len(pending) > ahead:
                    break
            while pending:
                bundle, future = pending.popleft()
                columns_of_bundle = future.result()
                nxt = next(upcoming, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(reader.read, nxt)))
                yield bundle, columns_of_bundle
        finally:
            for _, future in pending:
                future.cancel()
            pool.shutdown(wait=True)  # a read in flight finishes (at most one bundle per thread), then threads end
    return chunks
