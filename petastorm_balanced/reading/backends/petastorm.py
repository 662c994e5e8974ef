"""``make_reader``: a Petastorm ``Reader`` over exactly one rank's planned rows for one epoch.

We keep Petastorm's ``Reader`` (its schema views, worker pools, cache and ``transform_spec`` handling) and replace
the three things that decide *which* rows come out and in what order:

- ``_filter_row_groups``: Petastorm keys row groups by their position in its own piece list; we map every planned
  ``(relative path, row group)`` onto that list and fail loudly (``StalePlanError``) when one is missing, instead of
  reading a different row group;
- the worker classes: read the planned row group (only the requested columns), check its row count against the
  plan, cut it to the planned rows, and only then decode, so codecs run only for delivered rows;
- the ventilator and the results queue: fragments are sent once, in plan order, each with its sequence number, and
  handed back in that order (``backends/ordering.py``), so the output does not depend on the pool's timing.
"""
from __future__ import annotations

import contextlib
import hashlib
import posixpath
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import pyarrow as pa

from ...errors import InvalidValueError, MissingDependencyError, PlanError, StalePlanError

try:
    from petastorm.arrow_reader_worker import ArrowReaderWorker
    from petastorm.cache import NullCache
    from petastorm.py_dict_reader_worker import PyDictReaderWorker, _apply_transform_spec
    from petastorm.reader import Reader
    from petastorm.utils import decode_row
    from petastorm.workers_pool import EmptyResultError
    from petastorm.workers_pool.thread_pool import ThreadPool, WorkerTerminationRequested
except ImportError as _missing:
    raise MissingDependencyError("make_reader returns a Petastorm reader and the Petastorm backend reads through one, "
                                 f"but Petastorm cannot be imported here ({_missing}; Petastorm needs pyarrow < 15). "
                                 "For the same planned rows on this stack use make_loader(..., backend='arrow') or "
                                 "BalancedIterableDataset; or install the petastorm stack: pip install "
                                 "'petastorm-balanced[petastorm]' (docs/stacks.md)") from None

from ...core.shuffle import window_permutation
from ...io import fs as fsutil
from ...io.footer import CheckedFooters, open_file
from ...plan.format import check_file
from ...plan.model import Fragment, ShardPlan
from ...unischema.pickling import harden_petastorm_unpickler
from ...unischema.storage import load_unischema
from .. import stats
from ..rows import fragments as fr
from ..rows.columns import Columns
from ..rows.read_ahead import BundleSizes
from ..rows.transform import checked
from ..source import stream
from ..windows.spill import nbytes
from .ordering import BlockingThreadPool, Cut, Gate, LazyItems, OrderedResults, OrderedVentilator, Part
from .reader_arguments import check_petastorm_kwargs, check_pool_options, planned_rows
from .reader_keeper import ReaderKeeper

# Every private member of Petastorm 0.12 this backend and ordering.py override or read, in one place; a test checks
# each still exists in the installed Petastorm (the extra bounds Petastorm to the versions tested: < 0.14).
# (class, name, how): "method" is a class attribute, "attribute" an instance attribute set in __init__ or start.
PETASTORM_PRIVATE = (
    ("petastorm.reader.Reader", "_filter_row_groups", "method"),
    ("petastorm.reader.Reader", "_create_ventilator", "method"),
    ("petastorm.reader.Reader", "_results_queue_reader", "attribute"),
    ("petastorm.reader.Reader", "_workers_pool", "attribute"),
    ("petastorm.arrow_reader_worker.ArrowReaderWorker", "_load_rows", "method"),
    ("petastorm.arrow_reader_worker.ArrowReaderWorker", "_read_with_shuffle_row_drop", "method"),
    ("petastorm.arrow_reader_worker.ArrowReaderWorker", "_split_pieces", "attribute"),
    ("petastorm.arrow_reader_worker.ArrowReaderWorker", "_local_cache", "attribute"),
    ("petastorm.arrow_reader_worker.ArrowReaderWorker", "_schema", "attribute"),
    ("petastorm.arrow_reader_worker.ArrowReaderWorker", "_transform_spec", "attribute"),
    ("petastorm.py_dict_reader_worker.PyDictReaderWorker", "_split_pieces", "attribute"),
    ("petastorm.py_dict_reader_worker", "_apply_transform_spec", "function"),
    ("petastorm.workers_pool.thread_pool.ThreadPool", "_stop_event", "attribute"),
    ("petastorm.workers_pool.thread_pool.ThreadPool", "_results_queue_size", "attribute"),
    ("petastorm.workers_pool.thread_pool.ThreadPool", "_stop_aware_put", "method"),
    ("petastorm.workers_pool.thread_pool.ThreadPool", "_ventilator_queue", "attribute"),
    ("petastorm.workers_pool.thread_pool.ThreadPool", "_workers", "attribute"),
    ("petastorm.workers_pool.thread_pool.ThreadPool", "_ventilator", "attribute"),
    ("petastorm.workers_pool.thread_pool.WorkerThread", "_worker_impl", "attribute"),
    ("petastorm.workers_pool.thread_pool.WorkerThread", "_stop_event", "attribute"),
    ("petastorm.workers_pool.thread_pool.WorkerThread", "_ventilator_queue", "attribute"),
    ("petastorm.workers_pool.thread_pool.WorkerThread", "_results_queue", "attribute"),
    ("petastorm.etl.legacy.RestrictedUnpickler", "find_class", "method"),
)
harden_petastorm_unpickler()

MODES = ("rows", "batches", "columns")  # make_reader on Unischema / on plain Parquet / the loader's columns


@dataclass(frozen=True)
class ReadTask:
    """What every ventilated fragment carries besides itself (small: it is pickled per item for process pools)."""

    mode: str
    columns: tuple[str, ...] | None = None  # None: the reader's schema view, in its order
    partition_types: tuple[tuple[str, str], ...] = ()
    target: pa.Schema | None = None  # the loader's delivered types of the stored columns
    schemas: tuple = ()  # the loader's ColumnSchemas (Unischema columns are converted inside the workers)
    shuffle_key: tuple[int, ...] | None = None  # make_reader(shuffle_rows=True): permute inside fragments
    transform: Any = None  # the loader's transform.Transform, applied in the worker (columns mode)


class _PlannedWorkerMixin:
    """The part shared by both worker classes: read a fragment's rows, checked and cut, as an Arrow table."""

    # Set by the Petastorm worker class each subclass also derives from (WorkerBase and its ReaderWorkers).
    args: tuple
    _split_pieces: list
    _schema: Any  # a Unischema
    _local_cache: Any  # a petastorm.cache.CacheBase
    _file_cache: fr.FileCache  # made on first use (_files)

    def _read_planned(self, piece_index, sequence, fragment: Fragment, task: ReadTask):
        piece = self._split_pieces[piece_index]
        if piece.row_group != fragment.row_group:
            raise PlanError(f"piece {piece_index} is row group {piece.row_group} of {piece.path!r}, expected "
                            f"{fragment.row_group} of {fragment.path!r}: Petastorm's piece list changed")
        columns = task.columns or tuple(self._schema.fields)
        spec = fr.ReadSpec(columns, task.partition_types, target=task.target)
        indices = None  # the fragment's own rows (read_fragment slices them when they are one run)
        if task.shuffle_key is not None:
            indices = fragment.row_indices()
            indices = indices[window_permutation(len(indices), (*task.shuffle_key, sequence))]
        try:
            if isinstance(self._local_cache, NullCache):
                handle = self._files().get(piece.path)
                return fr.read_fragment(handle, fragment, spec, indices=indices)
            # A cache holds whole row groups (requested columns): the cut stays exact whatever the cache returns.
            key = "{}:{}:{}:{}".format(hashlib.md5(str(self._dataset_path_or_paths_for_cache).encode()).hexdigest(),
                                       piece.path, piece.row_group, ",".join(columns))
            full = Fragment(fragment.path, fragment.row_group, False, 0, 0, fragment.total_rows,
                            fragment.total_rows)
            table = self._local_cache.get(key, lambda: fr.read_fragment(self._files().get(piece.path), full, spec))
            return fr.cut(table, fragment.row_indices() if indices is None else indices)
        except (OSError, pa.ArrowException) as exc:  # name the file and row group (StalePlanError passes as is)
            raise fr.read_error(fragment, exc) from exc

    def _parts(self, piece_indexes, sequence, fragments, task, cut: Cut | None):
        """The item's rows as ``(head, fragments, table)``: one table of them all (head: ``sequence``), or with
        ``cut``, parts up to the first fragment that takes their Arrow bytes past ``cut.limit`` (head: a ``Part``),
        each read once the consumer took the one before: rows far longer than when the item was cut wait in the
        files, not in memory."""
        if cut is None:
            yield sequence, fragments, fr.concat_tables([self._read_planned(p, sequence, f, task) for p, f in
                                                         zip(piece_indexes, fragments, strict=True)])
            return
        start, index = 0, 0
        while start < len(fragments):
            if index and not cut.gate.wait_for_turn(sequence, index):
                raise WorkerTerminationRequested()
            tables: list[pa.Table] = []
            held, stop = 0, start
            while stop < len(fragments) and (not tables or held <= cut.limit):
                tables.append(self._read_planned(piece_indexes[stop], sequence, fragments[stop], task))
                held += tables[-1].get_total_buffer_size()  # not nbytes: that walks the offsets
                stop += 1
            whole = start == 0 and stop == len(fragments)
            head = sequence if whole else Part(sequence, index, start, stop, stop == len(fragments))
            yield head, fragments[start:stop], fr.concat_tables(tables)
            start, index = stop, index + 1

    def _files(self) -> fr.FileCache:
        if getattr(self, "_file_cache", None) is None:
            filesystem = self.args[0]
            local = type(filesystem).__name__ == "LocalFileSystem"  # native local reads beat Python file objects

            def opener(path):
                return open_file(path if local else filesystem.open(path, "rb"))
            self._file_cache = fr.FileCache(opener)
        return self._file_cache

    @property
    def _dataset_path_or_paths_for_cache(self):
        return self.args[1]


class PlannedArrowWorker(_PlannedWorkerMixin, ArrowReaderWorker):
    """Plain Parquet: publishes ``(sequence, pyarrow.Table)`` with exactly the item's fragments' rows."""

    _transform_spec: Any  # Petastorm's worker argument (make_reader's transform_spec), wrapped on first use

    # pylint: disable=arguments-differ
    def process(self, piece_indexes, sequence, fragments, task, cut=None):
        for head, held, table in self._parts(piece_indexes, sequence, fragments, task, cut):
            if task.mode == "columns" and task.transform is not None:  # the loader's transform, here in the worker
                self.publish_func((head, task.transform.apply(table, held)))
                continue
            if task.mode == "batches" and self._transform_spec:
                if not getattr(self._transform_spec, "rows_checked", False):  # same rows, order (transform.RULE)
                    self._transform_spec = _checked_spec(self._transform_spec)
                self._pending = table
                table = self._load_rows(None, self._split_pieces[piece_indexes[0]], (0, 1))  # Petastorm's
            self.publish_func((head, table))

    def _read_with_shuffle_row_drop(self, piece, pq_file, column_names, shuffle_row_drop_partition):
        table, self._pending = self._pending, None
        return table


class PlannedPyDictWorker(_PlannedWorkerMixin, PyDictReaderWorker):
    """Petastorm (Unischema) datasets: decoded rows (make_reader) or decoded column arrays (the loader)."""

    # pylint: disable=arguments-differ
    def process(self, piece_indexes, sequence, fragments, task, cut=None):
        for head, held, table in self._parts(piece_indexes, sequence, fragments, task, cut):
            if task.mode == "columns" and task.transform is not None:
                payload: dict[str, Any] | list[dict] = task.transform.apply(table, held)
            elif task.mode == "columns":
                payload = fr.to_columns(table, self._schema.fields, task.schemas, held)
            else:
                fr.check_declared(table, self._schema.fields)
                payload = [decode_row(row, self._schema) for row in table.to_pylist()]
                if self._transform_spec:
                    payload = _apply_transform_spec(payload, self._transform_spec)
            self.publish_func((head, payload))


def _checked_spec(spec):
    """A copy of Petastorm's ``TransformSpec`` whose ``func`` checks it returned the same rows in the same order."""
    import copy
    out = copy.copy(spec)
    if spec.func is not None:
        out.func = checked(spec.func)
    out.rows_checked = True
    return out


class _InOrder:
    """Results-queue reader: Petastorm's own conversion (rows or batches), fed in plan order."""

    def __init__(self, inner, ordered: OrderedResults, mode: str):
        self._inner, self._ordered, self._mode = inner, ordered, mode

    @property
    def batched_output(self):
        return self._mode != "rows"

    def read_next(self, workers_pool, schema, ngram):
        if self._mode == "columns":
            try:
                return self._ordered.next()
            except EmptyResultError:
                raise StopIteration from None
        return self._inner.read_next(self, schema, ngram)

    def get_results(self):  # the pool interface the inner reader calls: skip empty payloads (transform_spec)
        while True:
            payload = self._ordered.get_results()
            if len(payload):
                return payload


class BalancedReader(Reader):
    """A Petastorm ``Reader`` over given fragments, in their order, each read once.

    Iterating gives what Petastorm's ``make_reader`` (Unischema rows) or ``make_batch_reader`` (one batch of numpy
    arrays per fragment) would give, or, in the loader's ``columns`` mode, ``(sequence, payload)`` pairs where
    ``payload`` holds the rows of the fragments ``bundles[sequence]``: consecutive small fragments travel together
    (at most ``BUNDLE_ROWS`` rows), so tiny row groups do not pay the pool's per-item cost one by one. A bundle is
    cut when the ventilator has room for it, to about ``BUNDLE_BYTES`` of the decoded bytes the bundles before it
    measured (``sizes``, told by the consumer, ``petastorm_chunks``; one fragment each until the first measure), as
    the Arrow backend's: a footer's estimate misses dictionary-encoded strings, and 8,192 rows of 4 KB strings
    made 32 MB bundles, ``workers_count + 2`` of them in flight. Where rows grow after a bundle was cut, a
    thread-pool worker hands it back in parts of at most ``sizes.limit`` Arrow bytes plus one fragment, reading each
    part once the one before was taken (``ordering.Cut``), as the Arrow backend's reading threads stop a bundle.
    """

    _results_queue_reader: Any  # Petastorm's; _create_ventilator wraps it in an _InOrder
    plan: ShardPlan | None = None  # set by open_reader: rearm checks the next fragments' files against it (G15)

    def __init__(self, pyarrow_filesystem, dataset_path, *, fragments: Sequence[Fragment], task: ReadTask,
                 plan_files: Sequence[str], dataset_url: str, max_ahead: int | None = None, **reader_kwargs):
        if task.mode not in MODES:
            raise InvalidValueError(f"mode={task.mode!r} is not one of {MODES}")
        self.fragments = list(fragments)
        self.bundles: list[list[Fragment]] = []  # cut as they are ventilated (_create_ventilator)
        self.sizes = BundleSizes(target=fr.BUNDLE_BYTES, first_rows=1, max_rows=fr.BUNDLE_ROWS) \
            if task.mode == "columns" else None
        self._task, self._plan_files, self._dataset_url, self._max_ahead = task, set(plan_files), dataset_url, \
            max_ahead
        super().__init__(pyarrow_filesystem, dataset_path, shuffle_row_groups=False, num_epochs=1, **reader_kwargs)

    def _filter_row_groups(self, dataset, row_groups, predicate, rowgroup_selector, cur_shard, shard_count, seed):
        self._pieces, self._root = row_groups, dataset.paths
        return piece_indexes(self.fragments, row_groups, dataset.paths, self._plan_files, self._dataset_url), None

    def _create_ventilator(self, row_group_indexes, *args, **kwargs):
        gate = Gate(self._max_ahead or self._workers_pool.workers_count + 2)
        pieces = iter(row_group_indexes)
        fragments, bundles = self.fragments, []
        groups = self.sizes.bundles(fragments) if self.sizes is not None else iter([f] for f in fragments)
        made = [0]  # fragments cut into bundles so far
        # Parts need a worker that may wait for the consumer: a thread pool's (a process pool's cannot see the
        # gate, the dummy pool's runs in the consumer's thread).
        cut = Cut(self.sizes.limit, gate) if self.sizes is not None and isinstance(self._workers_pool, ThreadPool) \
            else None

        def make(sequence: int) -> tuple[dict, bool]:
            bundle = next(groups)
            bundles.append(bundle)
            made[0] += len(bundle)
            item = dict(piece_indexes=[next(pieces) for _ in bundle], sequence=sequence, fragments=bundle,
                        task=self._task)
            if cut is not None:
                item["cut"] = cut
            return item, made[0] >= len(fragments)
        self.bundles = bundles
        items = LazyItems(make, empty=not fragments)
        self.ordered = OrderedResults(self._workers_pool, gate, items)
        self._petastorm_results = getattr(self, "_petastorm_results", None) or self._results_queue_reader
        self._results_queue_reader = _InOrder(self._petastorm_results, self.ordered, self._task.mode)
        return OrderedVentilator(self._workers_pool.ventilate, items, gate)

    @property
    def idle(self) -> bool:
        """Every item of the current fragments was handed out and the reader still runs: ``rearm`` may follow."""
        return not self.stopped and self.ventilator.completed() and self.ordered.delivered >= len(self.bundles)

    def rearm(self, fragments: Sequence[Fragment]) -> None:
        """Serve other fragments (the next epoch) with the same pool and piece list.

        Saves what building a reader costs every epoch: Petastorm lists the dataset and reads every footer, and a
        process pool starts its processes. Only once the previous fragments were all handed out (``idle``).
        """
        if not self.idle:
            raise RuntimeError("rearm() needs an idle reader: every fragment handed out, reader not stopped")
        if self.plan is not None:
            check_footers(self.plan, fragments)
        self.fragments = list(fragments)
        indexes = piece_indexes(self.fragments, self._pieces, self._root, self._plan_files, self._dataset_url)
        self.ventilator = self._create_ventilator(indexes)
        self._workers_pool._ventilator = self.ventilator  # Petastorm's pools ask their ventilator when work ends
        self.last_row_consumed = False
        self.ventilator.start()

    def reset(self):
        raise NotImplementedError("a planned reader covers exactly one epoch; call make_reader(epoch=e) for another")


def piece_indexes(fragments: Sequence[Fragment], row_groups, root, plan_files, dataset_url) -> list:
    """Petastorm's list position of every fragment's row group; ``StalePlanError`` on any mismatch."""
    root = (root if isinstance(root, str) else "").rstrip("/")
    positions, listed = {}, set()
    for index, piece in enumerate(row_groups):
        relative = _relative(piece.path, root)
        positions[(relative, piece.row_group)] = index
        listed.add(relative)
    unknown = sorted(listed - set(plan_files))
    if unknown:
        raise StalePlanError(f"{unknown[0]!r} is in {dataset_url} but not in the plan (added since planning?); "
                             "re-run planning")
    out = []
    for fragment in fragments:
        found = positions.get((fragment.path, fragment.row_group))
        if found is None:
            raise StalePlanError(f"the plan reads row group {fragment.row_group} of {fragment.path!r}, which "
                                 f"Petastorm does not find in {dataset_url} (file removed or rewritten since "
                                 "planning?); re-run planning")
        out.append(found)
    return out


def _relative(path: str, root: str) -> str:
    path = str(path)
    if root and path == root:  # a single-file dataset: its catalog path is its name (io.dataset.list_data_files)
        return posixpath.basename(path)
    if root and path.startswith(root + "/"):
        return path[len(root) + 1:]
    return posixpath.relpath(path, root or "/")


def open_reader(plan: ShardPlan, fragments: Sequence[Fragment], task: ReadTask, *, reader_pool_type="thread",
                workers_count=10, results_queue_size=50, schema_fields=None, transform_spec=None, cache_type="null",
                cache_location=None, cache_size_limit=None, cache_row_size_estimate=None, cache_extra_settings=None,
                hdfs_driver="libhdfs3", storage_options=None, zmq_copy_buffers=True, filesystem=None,
                pyarrow_serialize=False, max_ahead=None) -> BalancedReader:
    """Build the filesystem, cache and pool as Petastorm's factories do, then a ``BalancedReader``."""
    from petastorm.local_disk_cache import LocalDiskCache
    from petastorm.reader_impl.pickle_serializer import PickleSerializer
    from petastorm.workers_pool.dummy_pool import DummyPool
    from petastorm.workers_pool.process_pool import ProcessPool

    check_pool_options(reader_pool_type, workers_count)
    from ...io.remote import petastorm_filesystem  # s3:// needs a filesystem Petastorm 0.12.1 can list (remote.py)
    with quiet_legacy_pyarrow():
        fs, path = petastorm_filesystem(plan.dataset_url, filesystem=filesystem, storage_options=storage_options,
                                        hdfs_driver=hdfs_driver)
    if cache_type in (None, "null"):
        cache = NullCache()
    elif cache_type == "local-disk":
        cache = LocalDiskCache(cache_location, cache_size_limit, cache_row_size_estimate,
                               **(cache_extra_settings or {}))
    else:
        raise InvalidValueError(f"cache_type={cache_type!r} is not one of None, 'null', 'local-disk'")
    if reader_pool_type == "thread":
        pool = BlockingThreadPool(workers_count, results_queue_size)
    elif reader_pool_type == "process":
        # (sequence, payload) pairs need pickling; Arrow tables pickle as their buffers.
        pool = ProcessPool(workers_count, PickleSerializer(), zmq_copy_buffers=zmq_copy_buffers)
    elif reader_pool_type == "dummy":
        pool = DummyPool()
    else:
        raise InvalidValueError(f"reader_pool_type={reader_pool_type!r} is not one of 'thread', 'process', 'dummy'")
    unischema = plan.catalog.kind == "petastorm"
    # Petastorm's Reader unpickles any Unischema in _common_metadata (plain plans too, if one was added since):
    # our allow-list sees the bytes first, and harden_petastorm_unpickler() guards Petastorm's own load after it.
    load_unischema(plan.dataset_url)
    check_footers(plan, fragments)
    try:
        with quiet_legacy_pyarrow():
            reader = BalancedReader(fs, path, fragments=fragments, task=task,
                                  plan_files=[f.path for f in plan.catalog.files],
                                  dataset_url=plan.dataset_url, max_ahead=max_ahead, schema_fields=schema_fields,
                                  reader_pool=pool, cache=cache, transform_spec=transform_spec,
                                  worker_class=PlannedPyDictWorker if unischema else PlannedArrowWorker,
                                  is_batched_reader=not unischema)
    except (OSError, pa.ArrowException) as exc:  # Petastorm reads every footer first; pyarrow names no file
        raise fr.unreadable_dataset_error(plan, exc) from exc
    reader.plan = plan  # rearm checks the next epoch's files against it
    return reader


def check_footers(plan: ShardPlan, fragments: Sequence[Fragment]) -> None:
    """``StalePlanError`` naming a file of ``fragments`` whose footer digest or modification time differs from the
    plan's (G15), checked before Petastorm's workers, which open the files themselves, read a row of it: at every
    reader and every ``rearm`` (epoch), for a plan loaded or made in memory alike."""
    filesystem, root = plan.location.filesystem, plan.location.root
    planned = {f.path: f for f in plan.catalog.files}

    def check(name, footer):
        check_file(plan, planned[name], footer=footer.digest, mtime_ns=footer.mtime_ns, content=footer.content)
    contents = {fsutil.join(root, f.path): f.content for f in plan.catalog.files if f.content}
    try:
        CheckedFooters(filesystem, check, contents=contents).check_all(
            (f.path, fsutil.join(root, f.path)) for f in fragments if f.path in planned)
    except (OSError, pa.ArrowException) as exc:  # gone, resized or unreadable: name the file
        raise fr.unreadable_dataset_error(plan, exc) from exc


@contextlib.contextmanager
def quiet_legacy_pyarrow():
    """Petastorm 0.12.1 on pyarrow 14 uses legacy APIs that warn a dozen FutureWarnings per reader (every epoch);
    they say nothing the user can act on, so they are silenced while a reader is built."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"(petastorm|pyarrow)(\.|$)")
        # Petastorm's schema inference skips types it does not know (dictionaries, large_string); our workers read
        # and convert every column themselves (loader.schema), so its warning is about nothing that is lost.
        warnings.filterwarnings("ignore", message=r"Column .* has an unsupported field", category=UserWarning)
        yield


def make_reader(rank=None, world=None, *, plan, epoch: int = 0, batch_size: int | None = None,
                reshuffle: str = "epoch", **petastorm_kwargs) -> BalancedReader:
    """A Petastorm reader over exactly rank ``rank``'s planned rows of ``epoch``, in plan order.

    Petastorm (Unischema) datasets give decoded rows like ``petastorm.make_reader``; plain Parquet gives one batch
    of numpy arrays per fragment like ``petastorm.make_batch_reader``. The rows are the plan's for ``world`` ranks
    (any world size, G9) and ``batch_size`` (the plan's unless given), padding rows included; the order is the
    same for any pool type and worker count. ``shuffle_rows=True`` permutes rows inside each fragment, seeded by
    ``[seed (default: the plan's), epoch, rank]``. Use it as a context manager, or call ``stop()`` and ``join()``.
    """
    check_petastorm_kwargs(petastorm_kwargs)
    plan, frags, key = planned_rows(rank, world, plan, epoch=epoch, batch_size=batch_size, reshuffle=reshuffle,
                                    seed=petastorm_kwargs.pop("seed", None),
                                    shuffle_rows=petastorm_kwargs.pop("shuffle_rows", False),
                                    schema_fields=petastorm_kwargs.get("schema_fields"))
    task = ReadTask("rows" if plan.catalog.kind == "petastorm" else "batches",
                    partition_types=tuple(fr.partition_types([f.path for f in plan.catalog.files]).items()),
                    shuffle_key=key)
    return open_reader(plan, frags, task, **petastorm_kwargs)


def petastorm_chunks(plan: ShardPlan, columns: Columns, reader_options: dict,
                     slot: ReaderKeeper | None = None, transform: Any = None) -> stream.Chunks:
    """Read fragments through a ``BalancedReader`` (Petastorm thread or process pool), handed back in order;
    ``transform`` (a ``transform.Transform``) runs in Petastorm's workers."""
    if transform is not None and reader_options.get("reader_pool_type") == "process":
        import pickle
        try:
            pickle.dumps(transform)
        except Exception as exc:  # a lambda or a local function: the process pool cannot send it
            raise InvalidValueError(f"transform_spec.func={transform.spec.func!r} cannot be pickled ({exc}), and "
                                    "reader_pool_type='process' sends it to Petastorm's worker processes; define "
                                    "it at module level, or use reader_pool_type='thread'") from None
    def chunks(todo: Sequence[Fragment]):
        holder = slot or ReaderKeeper()
        if holder.reader is not None and holder.reader.idle:
            holder.reader.rearm(todo)
        else:
            holder.close()
            task = ReadTask("columns", columns=columns.names, partition_types=columns.partition_types,
                            target=columns.target, schemas=columns.schemas, transform=transform)
            holder.reader = open_reader(plan, todo, task, schema_fields=[re.escape(n) for n in columns.names],
                                        **reader_options)
        reader, finished = holder.reader, False
        recorder = stats.current()  # loader.stats(): the wait for Petastorm's workers counts to "read"
        cell = None if recorder is None else recorder.cell()
        try:
            results = iter(reader)
            while True:
                if cell is not None:
                    start, inner = perf_counter(), cell.inner
                try:
                    sequence, payload, part = next(results)
                except StopIteration:
                    break
                if cell is not None:
                    cell.since("read", start, inner)
                    start, inner = perf_counter(), cell.inner
                held = reader.bundles[sequence] if part is None else reader.bundles[sequence][part.start:part.stop]
                if not isinstance(payload, dict):
                    payload = fr.to_columns(payload, None, columns.schemas, held)
                if reader.sizes is not None:  # the next bundles are cut from what this one weighs
                    reader.sizes.measure(rows=sum(f.num_rows for f in held),
                                         nbytes=sum(nbytes(v) for v in payload.values()))
                if cell is not None:
                    cell.since("decode", start, inner)
                yield held, payload
            finished = True
        finally:
            if not finished or slot is None:
                holder.close()
    return chunks


__all__ = ["BalancedReader", "make_reader"]
