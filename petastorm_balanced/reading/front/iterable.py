"""``BalancedIterableDataset`` for ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=K)``.

Each DataLoader worker is a slot of the plan (``plan.assignment(rank, num_workers=K)``): it reads only its own
fragments, in its own process, and yields whole batches. The DataLoader takes batches from its workers round
robin, worker 0 first, and a worker that runs out is skipped; the balancer gives the first ``steps % K`` slots one
batch more than the others, so the rank's batch ``j`` is always batch ``j // K`` of slot ``j % K`` and the total is
``steps_per_epoch`` for any ``K``.

Resuming after ``k`` batches: the DataLoader starts again with worker 0, so worker ``w`` plays slot ``(w + k) % K``
and skips that slot's first ``(k + w) // K`` batches; the round robin then continues exactly at batch ``k``.

With workers, the DataLoader's main process never sees the dataset iterate, so only it can count delivered
batches: ``ds.dataloader(num_workers=K)`` (a ``BalancedDataLoader``, a real ``DataLoader``) counts them and makes
``state_dict()`` exact; the epoch advances as in ``position.Position`` (a finished epoch or ``set_epoch``). With a
plain ``DataLoader`` call ``ds.set_epoch(e)`` before every epoch, as with ``DistributedSampler``; torchdata's
``StatefulDataLoader`` resumes exactly through the per-worker states (``state_dict`` inside a worker).
"""
from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator, Sequence
from multiprocessing.context import get_spawning_popen
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from ...errors import InvalidTypeError, InvalidValueError
from .. import state as loader_state
from .. import worker_stats
from ..backends import BACKENDS
from ..batches.batching import split_batches
from ..formats import worker_packets
from ..formats.device import check_feed, feed
from ..formats.tensors import TORCH, format_batches, require_torch, to_numpy, to_torch
from ..mixing.mixture import MixturePosition, MixtureRun, MixtureSettings
from ..mixing.mixture_workers import mixture_slot
from ..options import SHUFFLE_BUDGET, SPILL_BUDGET, LoaderOptions
from ..planned_view import EpochSampler, PlannedView
from ..source.position import Position, Run
from ..source.settings import Settings
from .pipeline import pipeline
from .request import resolve_request

try:
    torch: Any = importlib.import_module("torch")
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # no torch here: the classes refuse (require_torch)

if TYPE_CHECKING:  # the classes as torch defines them (the runtime bases are object where torch is missing)
    from os import PathLike

    from torch.utils.data import DataLoader as _Loader
    from torch.utils.data import IterableDataset as _Base
    from torch.utils.data.dataloader import _InfiniteConstantSampler as _ConstantSampler

    from ...plan.model import ShardPlan
else:
    _Base = torch.utils.data.IterableDataset if torch is not None else object
    _Loader = torch.utils.data.DataLoader if torch is not None else object
    _ConstantSampler = torch.utils.data.dataloader._InfiniteConstantSampler if torch is not None else object


class BalancedIterableDataset(PlannedView[Settings | MixtureSettings, Position | MixturePosition], _Base):
    """Batches of rank ``rank`` (default: ``World.detect()``), split over the DataLoader's workers.

    Pass it to ``DataLoader(ds, batch_size=None, num_workers=K)`` or use ``ds.dataloader(num_workers=K)``.
    Iterated directly (or with ``num_workers=0``) it is a single slot and gives the same batches as
    ``make_loader(...)`` with the same settings. Each worker is a slot with its own shuffle window; the rank's
    ``shuffle_budget`` is shared by its K workers (each holds a K-th in memory, the rest of its window on local
    disk: ``shuffle_spill_dir``, or the system temp folder). ``transform_spec`` (``TransformSpec``) runs
    in the DataLoader worker processes (its ``func`` must pickle for spawned workers: a module-level function).
    ``batch_format="numpy"`` yields numpy batches (``make_loader``'s), iterated directly or through
    ``ds.dataloader(num_workers=K)``: several reading processes for JAX or TensorFlow input pipelines (a plain
    ``DataLoader`` would turn the arrays into tensors with its default ``collate_fn``).
    """

    # state_dict keys
    EPOCH, BATCHES, IDENTITY_KEYS = Position.EPOCH, Position.BATCHES, Position.IDENTITY_KEYS
    NUM_WORKERS = loader_state.NUM_WORKERS
    # in states saved inside a DataLoader worker:
    WORKER, WORKER_BATCHES = loader_state.WORKER, loader_state.WORKER_BATCHES

    def __init__(self, plan: ShardPlan | str | PathLike[str] | Sequence[Any], rank: int | None = None,
                 world: int | None = None, *,
                 batch_size: int | None = None, epoch: int = 0,
                 shuffle: bool = True, reshuffle: str = "epoch", shuffle_window: int | None = None,
                 shuffle_budget: int | str = SHUFFLE_BUDGET, shuffle_spill_dir: Any = None,
                 shuffle_spill_budget: int | str = SPILL_BUDGET, schema_fields: Sequence[Any] | None = None,
                 padding_mask: bool = False, backend: str = "auto", partition_epoch: int = 1, balance: str = "auto",
                 cost_reduce: str = "sum", transform_spec: Any = None, weights: Sequence[float] | None = None,
                 epoch_steps: int | None = None, list_format: Any = "auto", list_shapes: Any = None,
                 batch_format: str = TORCH) -> None:
        require_torch()
        # Token budgets (max_batch_cost) are make_loader's: DataLoader workers would need equal budget steps each.
        options = LoaderOptions.of(locals())  # the options among the arguments, checked once (options.py)
        request = resolve_request(plan, rank, world, options, weights=weights, epoch_steps=epoch_steps,
                                  backend=backend)
        self.backend = request.backend
        # plan=[...]: a mixture (reading/mixing/mixture.py), its slots mixed by its workers
        stages = pipeline(request, epoch, reader_pool_type="dummy")
        self._settings, self._position = stages.settings, stages.position
        self._read_slot = self._mixture_slot if request.mixture else self._slot
        self._num_workers = 1  # slots of the tracked iteration (set by BalancedDataLoader)
        self._numpy_out = False  # yield numpy batches (BalancedDataLoader's workers; see there)
        self._in_worker: list[int] | None = None  # inside a DataLoader worker: [epoch, start, batches delivered]
        self._worker_resume: tuple[int, ...] | None = None  # the same, loaded (torchdata's per-worker state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This worker's batches, from the position at the first ``next()`` (a probe consumes nothing).

        Iterated in this process (directly, ``num_workers=0``) it counts what it delivers, so ``state_dict()`` is
        exact there; inside DataLoader workers it starts at the position copied when the workers started (or a
        worker state loaded by torchdata's ``StatefulDataLoader``), and counts its own batches for ``state_dict``.
        A position loaded from a state saved with another number of slots continues elastically.
        """
        info = torch.utils.data.get_worker_info()
        if info is None:
            wrapper = _rewrapper()
        else:
            # A wrapper around us (IterableDatasetShard), or one that iterates the DataLoader on one rank and hands
            # its batches to the others (accelerate's DataLoaderDispatcher): a forked worker still holds the stack
            # of the parent that forked it; a spawned one got what the parent's stack held when it pickled us.
            wrapper = (None if isinstance(info.dataset, BalancedIterableDataset) else _name(type(info.dataset))) \
                or self.__dict__.get("_pickled_under") or _rewrapper()
        if wrapper is not None:
            raise RuntimeError(rewrapped_message(wrapper))
        num_workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        batches = self._read_slot(num_workers, worker, self._numpy_out, info is not None)
        if info is not None and self._numpy_out:  # runs of batches, one message each (formats/worker_packets.py)
            batches = worker_packets.packets(batches, worker)
        return worker_stats.in_worker(self, batches) if info is not None else self.recorder.measured(batches)

    def __getstate__(self):
        """Pickled for spawned DataLoader workers: remember a re-sharding wrapper on the stack now, since the
        worker's fresh stack cannot show it."""
        state = self.__dict__.copy()
        state["_pickled_under"] = _rewrapper()
        if "_stats_queue" in state and get_spawning_popen() is None:  # a queue pickles only to start a process
            del state["_stats_queue"]
        return state

    def _mixture_slot(self, num_workers: int, worker: int, numpy_out: bool, in_worker: bool) -> Iterator[Any]:
        """A mixture's batches for this slot (``mixture_workers.mixture_slot``); in a worker sending numpy, as
        (columns, batches) pieces of one batch each, as ``_slot`` sends them."""
        progress: list[int] | None = [] if in_worker else None
        if progress is not None:
            self._in_worker = progress
        batches = mixture_slot(cast(MixturePosition, self._position), num_workers, worker, numpy_out, progress,
                               self._worker_resume is not None, self.recorder.begin)
        return ((batch, 1) for batch in batches) if in_worker and numpy_out else batches

    def _slot(self, num_workers, worker, numpy_out, in_worker):
        """One plan's batches for this slot (a mixture's: ``_mixture_slot``)."""
        settings, position = cast(Settings, self._settings), cast(Position, self._position)
        batch_size = settings.batch_size
        if batch_size is None:  # Settings leaves it None only for a token budget, which this dataset never asks for
            raise RuntimeError("BalancedIterableDataset has no batch size")
        if position.resumed and self._worker_resume is None and self._num_workers != num_workers:
            position.rebase(self._num_workers)  # saved with other slots (a plain DataLoader, or none)
            self._num_workers = num_workers
        stages = position.stages
        run: Run | None
        if in_worker:
            run = None
            progress = self._in_worker = list(self._worker_resume or (*position.current(), 0))
            self._worker_resume = None
            epoch, done, own = progress
        else:
            run = position.begin()
            epoch, done, own, stages = run.epoch, run.start, 0, run.stages
            self.recorder.begin(epoch)
        # read in this process ("dummy" pool): the DataLoader's workers are the parallelism
        chunks = BACKENDS[self.backend].run(settings.plan, settings.columns, {"reader_pool_type": "dummy"},
                                            transform=settings.transform)
        runs = settings.slot_runs(chunks, epoch, stages, batches_done=(done + worker) // num_workers + own,
                                  slot=(worker + done) % num_workers, num_workers=num_workers)
        for batch_run in runs:
            if numpy_out:  # BalancedDataLoader makes the tensors in the main process
                keep = worker_packets.picklable(batch_run, settings.padding_mask)
                if run is None:  # a worker: pieces of whole batches, packed by __iter__
                    for piece in worker_packets.pieces(keep, batch_size):
                        progress[2] += piece[1]
                        yield piece
                    continue
                batches = split_batches(keep, batch_size)
            else:
                batches = format_batches(settings.options.batch_format)(batch_run, batch_size, settings.padding_mask)
            for batch in batches:
                if run is None:
                    progress[2] += 1
                else:
                    run.delivered()
                yield batch

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` next; a position loaded for the same epoch is kept (see ``BalancedLoader.set_epoch``)."""
        self._position.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The position counted by ``BalancedDataLoader`` (or set by ``set_epoch``/``load_state_dict``).

        Inside a DataLoader worker (torchdata's ``StatefulDataLoader`` asks each worker): where this worker's
        iteration started, plus ``worker`` and ``worker_batches`` (batches it delivered since); the
        ``StatefulDataLoader`` hands it back to the same worker, which continues exactly.
        """
        info = torch.utils.data.get_worker_info()
        if info is None:
            return self._position.state_dict({self.NUM_WORKERS: self._num_workers})
        epoch, start, own = self._in_worker or (*self._position.current(), 0)
        return self._position.worker_state({self.NUM_WORKERS: info.num_workers}, epoch, start, info.id, own)

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state``. With another world size, or another number of DataLoader workers than the state
        was saved with, the epoch continues elastically: the rows no slot had consumed, split over the new slots."""
        if not isinstance(state, dict):
            raise InvalidTypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        state = loader_state.flat(state)  # every key at the top, unknown ones refused (reading/state.py)
        loader_state.require(state, (self.NUM_WORKERS,))
        workers = state[self.NUM_WORKERS]
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidValueError(f"state[{self.NUM_WORKERS!r}]={workers!r} must be an int >= 1")
        if self.WORKER in state:
            self._load_worker_state(state, workers)
            return
        self._position.load_state_dict(state, {self.NUM_WORKERS: workers}, workers=workers)
        self._num_workers = workers

    def _load_worker_state(self, state: dict, workers: int) -> None:
        info = torch.utils.data.get_worker_info()
        if info is None:
            raise InvalidValueError(f"state was saved inside DataLoader worker {state[self.WORKER]!r} (torchdata "
                                    "StatefulDataLoader's per-worker state); load the StatefulDataLoader's own "
                                    "state_dict() with StatefulDataLoader.load_state_dict, which gives each worker "
                                    "its part")
        if (state[self.WORKER], workers) != (info.id, info.num_workers):
            raise InvalidValueError(f"state of worker {state[self.WORKER]!r} of {workers} loaded into worker {info.id} "
                                    f"of {info.num_workers}; resume with the same num_workers")
        own = state.get(self.WORKER_BATCHES)
        if isinstance(own, bool) or not isinstance(own, int) or own < 0:
            raise InvalidValueError(f"state[{self.WORKER_BATCHES!r}]={own!r} must be an int >= 0")
        self._position.load_state_dict(state, {self.NUM_WORKERS: workers}, workers=workers)
        self._worker_resume = (*self._position.current(), own)

    @contextlib.contextmanager
    def starting(self, slots: int, numpy_out: bool) -> Iterator[None]:
        """While a DataLoader starts ``slots`` workers on this dataset (``BalancedDataLoader``): a pending position
        saved with other slots continues elastically, and the workers copy the dataset with ``numpy_out`` (their
        batches go to the main process as numpy, made tensors there)."""
        self._position.to_workers(slots, self._num_workers)  # (a mixture's workers each read their share)
        self._num_workers, self._numpy_out = slots, numpy_out
        try:
            yield
        finally:
            self._numpy_out = False

    def begin(self) -> Run | MixtureRun:
        """Take the position for an iteration counted in this process (the DataLoader's main process), and start
        the epoch's figures (``stats()``)."""
        run = self._position.begin()
        self.recorder.begin(run.epoch)
        return run

    @property
    def batch_format(self) -> str:
        return self._settings.options.batch_format

    def dataloader(self, num_workers: int = 0, **kwargs) -> BalancedDataLoader:
        """A ``BalancedDataLoader`` over this dataset: counts batches for ``state_dict``, one epoch per iter."""
        return BalancedDataLoader(self, num_workers=num_workers, **kwargs)


class BalancedDataLoader(_Loader):
    """A ``torch.utils.data.DataLoader`` that tracks its ``BalancedIterableDataset``'s position.

    Each ``iter()`` continues at the position (the next epoch after a finished one); ``state_dict()`` and
    ``load_state_dict()`` resume exactly (with another ``num_workers`` or world size: elastically, the rows not yet
    consumed). Batching, sampling and worker persistence belong to the dataset, so ``batch_size``, ``sampler``,
    ``shuffle``, ``persistent_workers`` and ``in_order=False`` are refused.

    ``device="cuda"`` (with ``num_workers >= 1``; ours, not the DataLoader's) copies the next batch to the device on
    a side CUDA stream while the current step runs (``reading/formats/device.py``); with the DataLoader's own
    ``pin_memory=True`` the copies come from pinned memory. The batch held ahead is not counted as delivered.
    """

    dataset: BalancedIterableDataset  # DataLoader keeps its dataset there; __init__ accepts only ours

    # accelerate's prepare() would rebuild this loader around the dataset and shard it a second time (half the rows
    # lost with 2 ranks); this flag makes prepare() hand it back untouched, as it does make_loader's loader.
    _is_accelerate_prepared = True

    def __init__(self, dataset: BalancedIterableDataset, num_workers: int = 0, device: Any = None, **kwargs: Any):
        if not isinstance(dataset, BalancedIterableDataset):
            raise InvalidTypeError(f"dataset must be a BalancedIterableDataset, got {type(dataset).__name__}")
        self._feed = check_feed(False, device)  # pinning is the DataLoader's own pin_memory (its pin thread)
        if self._feed.active and num_workers == 0:  # the dataset would count the batch held ahead as delivered
            raise InvalidValueError(f"device={device!r} needs num_workers >= 1 (got 0); in one process use "
                                    "make_loader(..., device=...), which reads in threads")
        for name, allowed in (("batch_size", None), ("sampler", None), ("batch_sampler", None),
                              ("shuffle", None), ("persistent_workers", False), ("in_order", True),
                              ("drop_last", False)):
            if name in kwargs and kwargs[name] != allowed:
                raise InvalidValueError(f"{name}={kwargs[name]!r} is not accepted: the dataset yields whole, planned "
                                        f"batches in a fixed order (leave {name} at {allowed!r})")
            kwargs.pop(name, None)
        # Tensors cross from DataLoader workers through one shared-memory segment each, which costs far more than
        # pickling a batch's small numpy arrays; so workers send numpy and tensors are made here (zero copy).
        self._tensors_here = kwargs.get("collate_fn") is None and not kwargs.get("pin_memory", False)
        if self._tensors_here:
            kwargs["collate_fn"] = _as_is
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        dataset._position.to_workers(max(1, num_workers))  # len(): a mixture's epoch is its workers' (mixture_workers)
        if num_workers > 0:
            _check_picklable_transform(dataset, self.multiprocessing_context)
        # The DataLoader's own sampler for iterable datasets, plus set_epoch (how Lightning tells the epoch).
        object.__setattr__(self, "sampler", _EpochSampler(dataset))  # DataLoader forbids setting it normally

    def __iter__(self):
        if self._tensors_here and self.num_workers > 0 and not self._feed.active:
            # lists of batches handed out in C, timed and counted per list (Recorder.grouped, Position.handing)
            return self.dataset.recorder.grouped(self._groups(), length=lambda: len(self))
        return _Counted(self)

    def _groups(self):
        """The workers' packets as lists of batches in the round robin's order, each counted as its batches leave
        it (started at the first ``next()``, like ``_Counted``)."""
        batches, run = self._start()
        cut = format_batches(self.dataset.batch_format)
        position = run.position
        for group in worker_packets.interleaved_groups(batches, self.num_workers,
                                                       lambda columns, size: cut(columns, size, True)):
            handed = iter(group)
            position.handing(run, handed, len(group))
            yield handed

    def _start(self):
        """Start the workers at the position now (the first ``next()``, after any ``set_epoch``)."""
        dataset = self.dataset
        with dataset.starting(max(1, self.num_workers), self._tensors_here):  # workers copy it while they start
            if self.num_workers > 0:  # the workers' stage figures come back through it (reading/stats.py)
                worker_stats.open_queue(dataset, self.multiprocessing_context)
            batches = super().__iter__()
        # With workers the main process counts; without, the dataset iterates (and counts) here.
        run = dataset.begin() if self.num_workers > 0 else None
        return batches, run

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)


class _EpochSampler(_ConstantSampler, EpochSampler):
    def __init__(self, dataset):
        _ConstantSampler.__init__(self)
        EpochSampler.__init__(self, dataset)


def _check_picklable_transform(dataset, context) -> None:
    """Refuse, when the DataLoader is made, a ``transform_spec.func`` that workers started by pickling (spawn,
    forkserver) cannot receive: otherwise the first batch fails with a bare ``PicklingError`` from inside the
    DataLoader."""
    import multiprocessing
    import pickle
    transform = dataset._settings.transform
    if transform is None:
        return
    method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
    if method == "fork":
        return
    try:
        pickle.dumps(transform)
    except Exception as exc:  # noqa: BLE001 - a lambda, a local function, an object holding a lock ...
        raise InvalidValueError(f"transform_spec.func={transform.spec.func!r} cannot be pickled ({exc}), and "
                                f"DataLoader workers started by {method!r} receive the dataset pickled; define "
                                "func at module level (importable by the workers), or use num_workers=0 or "
                                "multiprocessing_context='fork'") from None


def _as_is(batch):
    return batch


class _Counted:
    """One iteration of a BalancedDataLoader; nothing starts before the first ``next()``, so Lightning's ``iter()``
    before ``set_epoch`` (or any probe) shifts nothing."""

    def __init__(self, loader):
        self._loader, self._batches, self._run = loader, None, None

    def __iter__(self):
        return self

    def __next__(self):
        if self._batches is None:
            batches, self._run = self._loader._start()
            if self._loader._tensors_here and self._run is not None:  # the workers' packets, cut in their order
                cut = format_batches(self._loader.dataset.batch_format)
                batches = worker_packets.interleave(batches, self._loader.num_workers,
                                                    lambda columns, size: cut(columns, size, True))
            elif self._loader._tensors_here:  # the dataset's numpy batches (no workers) in its format
                convert = to_torch if self._loader.dataset.batch_format == TORCH else to_numpy
                batches = (convert(batch, True) for batch in batches)
            self._batches = feed(batches, self._loader._feed)  # device.py: one batch ahead, counted below
            if self._run is not None:  # with workers: the loop's waits are timed here (reading/stats.py)
                self._batches = self._loader.dataset.recorder.measured(self._batches)
        batch = next(self._batches)
        if self._run is not None:
            self._run.delivered()
        return batch

    def __len__(self):
        return len(self._loader)


# Modules whose loaders re-shard or re-batch what they iterate (only those: a training function started by
# accelerate's notebook_launcher runs under accelerate's launcher frames and must not be refused).
_REWRAPPERS = ("accelerate.data_loader",)


def _rewrapper():
    """The name of a known re-sharding wrapper iterating us in this process (its frame is on the stack), or None."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(_REWRAPPERS):
            owner = frame.f_locals.get("self")
            return f"{module}.{type(owner).__qualname__}" if owner is not None else module
        frame = frame.f_back
    return None


def _name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def rewrapped_message(wrapper: str) -> str:
    return (f"BalancedIterableDataset is iterated through {wrapper}: a wrapper "
            "that re-shards or re-batches it (accelerate's prepare() of a plain DataLoader does) would lose or "
            "repeat rows. Pass ds.dataloader(num_workers=K) (a BalancedDataLoader) or make_loader(...) to "
            "accelerator.prepare(): both pass through untouched; see docs/integrations.md")
