"""The Arrow backend: planned fragments read with ``pyarrow.parquet`` / ``pyarrow.fs`` alone, no Petastorm.

Why it exists: Petastorm calls pyarrow's legacy dataset API, so it cannot even be imported on pyarrow >= 16. Our
reading never needed Petastorm's machinery to decide *what* to read (the plan does that): it needs a bounded,
ordered prefetch of row groups, which a thread pool gives, because pyarrow decodes Parquet in C++ with the GIL
released.

What makes it give the very same batches as the Petastorm backend: both cut the fragments into the same bundles
(``fragments.bundle``), read each fragment with ``fragments.read_fragment`` (only the requested columns, row count
checked against the plan, cut to the planned rows) and convert with ``fragments.to_columns``; the batches are then
made by the shared ``stream.slot_runs``. Only the scheduling differs.

Prefetch: at most ``max_ahead + 1`` bundles are submitted beyond the one being consumed, and results are taken in
submission order with ``Future.result()`` (blocking, no polling), so memory stays bounded by ``max_ahead + 2``
bundles whatever the threads' speeds, and the order never depends on timing.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import List

import pyarrow as pa
import pyarrow.parquet as pq

from ..io import fs as fsutil
from ..plan.model import Fragment, ShardPlan
from . import fragments as fr



class BundleReader:
    """Reads bundles of fragments as column dicts; each thread keeps its own few open files (footers parsed once
    per thread: a ``ParquetFile`` is not safe to share between threads)."""

    def __init__(self, plan: ShardPlan, spec: fr.ReadSpec, fields=None, schemas=()):
        self._plan = plan
        self._filesystem, self._root = fsutil.resolve(plan.dataset_url)
        self._spec, self._fields, self._schemas = spec, fields, schemas
        self._local = threading.local()

    def _files(self) -> fr.FileCache:
        files = getattr(self._local, "files", None)
        if files is None:
            filesystem, root = self._filesystem, self._root
            if isinstance(filesystem, pa.fs.LocalFileSystem):
                def opener(path):
                    return pq.ParquetFile(f"{root}/{path}")  # native local reads (memory-mapped off)
            else:
                def opener(path):
                    return pq.ParquetFile(filesystem.open_input_file(f"{root}/{path}"))
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
        return fr.to_columns(fr.concat_tables(tables), self._fields, self._schemas)


def arrow_chunks(plan: ShardPlan, columns, *, workers_count: int = 4, reader_pool_type: str = "thread",
                 max_ahead=None):
    """A ``stream.Chunks`` reading bundles in ``workers_count`` threads (or inline for ``"dummy"``), in order;
    the pool options were checked when the loader was made (``options.check_pool_options``)."""
    inline = reader_pool_type == "dummy"
    ahead = max_ahead or workers_count + 2

    def chunks(todo: List[Fragment]):
        reader = BundleReader(plan, columns.spec, columns.fields, columns.schemas)
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
