"""``make_loader`` / ``BalancedLoader``: equal steps on every rank, as batches of torch tensors.

Every rank yields exactly ``len(loader) == plan.steps_per_epoch(world, batch_size)`` batches of exactly
``batch_size`` rows (G1). The rows are the plan's assignment for the epoch (a fresh one per epoch, G5), read by a
Petastorm worker pool and put back in plan order, then shuffled in fixed windows seeded by ``[seed, epoch, rank,
slot, window]`` (G4: same plan, epoch, world, rank give the same batches for any pool and worker count). Resuming
(G6) needs only the epoch and the number of batches delivered: fragments before the current shuffle window are
skipped arithmetically, and only the window in progress is read again.
"""
from __future__ import annotations

import weakref
from typing import Optional

import numpy as np
import pyarrow as pa

from . import stream
from .fragments import as_list
from .plan import ShardPlan
from .reader import check_petastorm_kwargs, check_pool_options, resolve_plan
from .world import World, resolve_world

try:
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None

__all__ = ["BalancedDataLoader", "BalancedIterableDataset", "BalancedLoader", "make_loader"]

# What the loader owns on top of the reader's owned arguments, and what to do instead.
LOADER_REFUSED = {
    "seed": "rows are shuffled from the plan's seed (plan_shards(seed=...)), the epoch and the rank",
    "shuffle_rows": "use shuffle= and shuffle_window= of make_loader",
    "transform_spec": "transform the batches (dicts of tensors) in the training loop, or use make_reader",
}


def _require_torch():
    if torch is None:
        raise ImportError("make_loader needs torch; install it (pip install 'petastorm-balanced[torch]')")


def to_torch(batch: dict, padding_mask: bool) -> dict:
    """Numeric columns as tensors (sharing the batch's memory), strings and other objects as lists."""
    return next(torch_batches(batch, _rows(batch), padding_mask))


def torch_batches(run: dict, batch_size: int, padding_mask: bool):
    """Cut a run of whole batches into dicts of tensors (views of one tensor per column) and lists.

    Converting once per run and splitting there keeps the per-batch cost to a few views, whatever the column
    count; the batches of a run share its memory.
    """
    parts = {}
    for name, values in run.items():
        if name == stream.PADDING and not padding_mask:
            continue
        if isinstance(values, pa.Array) or values.dtype.kind in "OUS":
            items = as_list(values)
            parts[name] = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
            continue
        if values.dtype.kind in "mM":
            values = values.view(np.int64)
        if not values.flags.writeable:
            values = values.copy()  # Arrow buffers are read-only; tensors must be writable
        parts[name] = torch.from_numpy(values).split(batch_size)
    names, columns = list(parts), list(parts.values())
    for i in range(_rows(run) // batch_size):
        yield dict(zip(names, [column[i] for column in columns]))


def _rows(columns: dict) -> int:
    return len(next(iter(columns.values())))


class _Settings:
    """Checked loader settings shared by BalancedLoader and BalancedIterableDataset."""

    def __init__(self, plan, world: World, *, batch_size, shuffle, reshuffle, shuffle_window, schema_fields,
                 padding_mask):
        self.plan: ShardPlan = resolve_plan(plan)
        self.rank, self.world_size = world.rank, world.size
        self.batch_size = self.plan.batch_size if batch_size is None else batch_size
        if self.batch_size is None:
            raise ValueError("batch_size=None and the plan was made without one; pass batch_size=")
        if reshuffle not in ("epoch", "fixed"):
            raise ValueError(f"reshuffle={reshuffle!r} is not one of 'epoch' (new assignment every epoch) or "
                             "'fixed' (the epoch-0 assignment, for caching)")
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle={shuffle!r} must be True or False")
        if isinstance(shuffle_window, bool) or not isinstance(shuffle_window, int) or shuffle_window < 1:
            raise ValueError(f"shuffle_window={shuffle_window!r} must be an int >= 1 (rows per shuffle window)")
        self.steps = self.plan.steps_per_epoch(self.world_size, self.batch_size)  # checks batch_size too
        if self.plan.total_rows < self.world_size * self.batch_size:  # the balancer would refuse it at iteration
            raise ValueError(f"batch_size={self.batch_size} x world_size={self.world_size} rows per step exceed the "
                             f"plan's {self.plan.total_rows} matching rows; lower batch_size")
        self.shuffle, self.reshuffle, self.shuffle_window = shuffle, reshuffle, shuffle_window
        self.padding_mask = bool(padding_mask)
        self.columns = stream.dataset_columns(self.plan, schema_fields)
        self._checksum = None

    def fragments(self, epoch: int, num_workers: int = 1):
        return self.plan.assignment(self.rank, epoch=epoch, world_size=self.world_size, num_workers=num_workers,
                                    batch_size=self.batch_size, reshuffle=self.reshuffle)

    def key(self, epoch: int, slot: int = 0):
        return (self.plan.seed, epoch, self.rank, slot)

    def identity(self) -> dict:
        """What a saved position is only valid for."""
        if self._checksum is None:
            self._checksum = self.plan.checksum
        values = (self._checksum, self.world_size, self.batch_size, self.shuffle, self.shuffle_window, self.reshuffle)
        return dict(zip(Position.IDENTITY_KEYS, values))


class Position:
    """Where the next batch comes from: the epoch, and batches of it already delivered.

    Shared by both loaders: ``state_dict`` and ``load_state_dict`` are strict (every key must be there, and the
    settings a position depends on must match), ``set_epoch`` works like ``DistributedSampler.set_epoch``.
    """

    EPOCH = "epoch"
    BATCHES = "batches"
    PLAN_CHECKSUM, WORLD_SIZE, BATCH_SIZE = "plan_checksum", "world_size", "batch_size"
    SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE = "shuffle", "shuffle_window", "reshuffle"
    IDENTITY_KEYS = (PLAN_CHECKSUM, WORLD_SIZE, BATCH_SIZE, SHUFFLE, SHUFFLE_WINDOW, RESHUFFLE)

    def __init__(self, settings: _Settings, epoch: int):
        _check_epoch(epoch)
        self.settings = settings
        self.next_epoch, self.next_batches = epoch, 0
        self.resumed = False  # next_* came from load_state_dict and no iteration has started since
        self.live = None  # the running iteration, [epoch, batches delivered], until superseded

    def begin(self) -> list:
        """Start an iteration at the pending position; the one after it starts the next epoch."""
        run = [self.next_epoch, self.next_batches]
        self.live, self.resumed = run, False
        self.next_epoch, self.next_batches = run[0] + 1, 0
        return run

    def current(self):
        epoch, batches = self.live if self.live is not None else (self.next_epoch, self.next_batches)
        if batches >= self.settings.steps:
            return epoch + 1, 0
        return epoch, batches

    def set_epoch(self, epoch: int) -> None:
        _check_epoch(epoch)
        if not (self.resumed and epoch == self.next_epoch):
            self.next_epoch, self.next_batches, self.resumed = epoch, 0, False
        self.live = None

    def state_dict(self, extra: Optional[dict] = None) -> dict:
        epoch, batches = self.current()
        return {self.EPOCH: epoch, self.BATCHES: batches, **self.settings.identity(), **(extra or {})}

    def load_state_dict(self, state: dict, extra: Optional[dict] = None) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        expected = {**self.settings.identity(), **(extra or {})}
        missing = [k for k in (self.EPOCH, self.BATCHES, *expected) if k not in state]
        if missing:
            raise KeyError(f"state is missing {missing}; pass a dict saved by state_dict() of this loader type")
        for key, value in expected.items():
            if state[key] != value:
                raise ValueError(f"state[{key!r}]={state[key]!r} but this loader has {key}={value!r}; a saved "
                                 "position only resumes a loader with the same plan and settings")
        epoch, batches = state[self.EPOCH], state[self.BATCHES]
        _check_epoch(epoch)
        if isinstance(batches, bool) or not isinstance(batches, int) or not 0 <= batches <= self.settings.steps:
            raise ValueError(f"state[{self.BATCHES!r}]={batches!r} must be an int in [0, {self.settings.steps}]")
        self.next_epoch, self.next_batches = (epoch + 1, 0) if batches == self.settings.steps else (epoch, batches)
        self.live, self.resumed = None, True


def _check_epoch(epoch):
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch={epoch!r} must be an int >= 0")


class _PlannedView:
    """What both loaders say about themselves, read from their settings and position."""

    plan = property(lambda self: self._settings.plan)
    rank = property(lambda self: self._settings.rank)
    world_size = property(lambda self: self._settings.world_size)
    batch_size = property(lambda self: self._settings.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._position.current()[0]

    def __len__(self) -> int:
        return self._settings.steps


class BalancedLoader(_PlannedView):
    """Batches of one rank: ``for batch in loader`` is one epoch; each new ``iter()`` is the next epoch.

    Batches are dicts of column name to tensor (strings as lists of str), plus a boolean ``_padding`` tensor with
    ``padding_mask=True``. ``state_dict()`` is the same on every rank (all ranks take the same steps), so a
    checkpoint written by rank 0 resumes every rank.
    """

    # state_dict keys
    EPOCH, BATCHES, IDENTITY_KEYS = Position.EPOCH, Position.BATCHES, Position.IDENTITY_KEYS

    def __init__(self, plan, world: World, *, batch_size=None, epoch=0, shuffle=True, reshuffle="epoch",
                 shuffle_window=stream.SHUFFLE_WINDOW, schema_fields=None, padding_mask=False,
                 reader_options: Optional[dict] = None):
        _require_torch()
        self._settings = _Settings(plan, world, batch_size=batch_size, shuffle=shuffle, reshuffle=reshuffle,
                                   shuffle_window=shuffle_window, schema_fields=schema_fields,
                                   padding_mask=padding_mask)
        self._position = Position(self._settings, epoch)
        self._reader_options = dict(reader_options or {})
        self._iterator = None
        self._reader = stream.ReaderSlot()  # the pool lives from epoch to epoch; stopped when the loader goes
        self._finalizer = weakref.finalize(self, self._reader.close)

    def __iter__(self):
        if self._iterator is not None:
            self._iterator.close()  # one pool at a time
        run = self._position.begin()
        self._iterator = self._run(run)
        return self._iterator

    def _run(self, run):
        settings = self._settings
        epoch, done = run
        chunks = stream.petastorm_chunks(settings.plan, settings.columns, self._reader_options, self._reader)
        runs = stream.slot_runs(settings.fragments(epoch), chunks, batch_size=settings.batch_size,
                                shuffle=settings.shuffle, shuffle_window=settings.shuffle_window,
                                key=settings.key(epoch), batches_done=done)
        try:
            for batch_run in runs:
                for batch in torch_batches(batch_run, settings.batch_size, settings.padding_mask):
                    run[1] += 1
                    yield batch
        finally:
            runs.close()

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` next (like ``DistributedSampler.set_epoch``); a position loaded for that same epoch by
        ``load_state_dict`` is kept, so calling ``set_epoch`` at the top of every epoch is safe after resuming."""
        self._position.set_epoch(epoch)

    def state_dict(self) -> dict:
        """Epoch and batches delivered (plus the settings they are valid for); the end of an epoch is saved as the
        start of the next one."""
        return self._position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """The next ``iter()`` continues exactly where ``state`` was saved."""
        self._position.load_state_dict(state)

    def close(self) -> None:
        """Stop the reader's workers now (otherwise they wait for the next epoch, until the loader is collected)."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
        self._reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_loader(rank=None, world=None, *, plan, batch_size: Optional[int] = None, epoch: int = 0,
                shuffle: bool = True, reshuffle: str = "epoch", workers_count: int = 4,
                reader_pool_type: str = "thread", schema_fields=None, padding_mask: bool = False,
                shuffle_window: int = stream.SHUFFLE_WINDOW, **petastorm_kwargs) -> BalancedLoader:
    """A ``BalancedLoader`` for rank ``rank`` of ``world`` (both default to ``World.detect()``).

    ``plan`` is a ShardPlan or a plan URL (loaded and checked against its dataset). A plan made for W ranks
    serves any ``world`` (G9). ``batch_size`` defaults to the plan's. ``shuffle_window`` rows (rounded up to
    whole batches) are shuffled together; memory per rank is about ``shuffle_window + (workers_count + 2) x row
    group`` rows. Other Petastorm reader arguments (``results_queue_size``, ``cache_type``, ``storage_options``,
    ``filesystem``, ...) pass through; the ones the plan owns are refused with what to do instead.
    """
    check_petastorm_kwargs(petastorm_kwargs, LOADER_REFUSED)
    check_pool_options(reader_pool_type, workers_count)
    who = resolve_world(rank, world)
    options = {**petastorm_kwargs, "workers_count": workers_count, "reader_pool_type": reader_pool_type}
    return BalancedLoader(plan, who, batch_size=batch_size, epoch=epoch, shuffle=shuffle, reshuffle=reshuffle,
                          shuffle_window=shuffle_window, schema_fields=schema_fields, padding_mask=padding_mask,
                          reader_options=options)


from .iterable import BalancedDataLoader, BalancedIterableDataset  # noqa: E402  (needs the names above)
