"""``PlannedView``: what both loaders say about themselves (plan, world, batch size, schema, ``len``), read from
their settings and position; ``PlannedLoader``: what both loaders do the same way (iterations, epochs, states,
closing); ``EpochSampler``: the ``loader.sampler`` frameworks tell the epoch."""
from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

from .stats import Recorder
from .worker_stats import drain

if TYPE_CHECKING:
    from .fields.schema import BatchSchema


class ViewSettings(Protocol):
    """What a loader's settings say about it (one plan's ``Settings``, a mixture's ``MixtureSettings``)."""

    plan: Any
    rank: int
    world_size: int
    batch_size: Any  # rows per batch; None: a token budget
    shuffle_window: Any
    shuffle_budget: int
    schema: BatchSchema


class ViewPosition(Protocol):
    """What a loader's position says (``Position``, ``MixturePosition``)."""

    def current(self) -> tuple[int, int]: ...
    def steps(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


S = TypeVar("S", bound=ViewSettings)
P = TypeVar("P", bound=ViewPosition)


class EpochSampler:
    """What frameworks that tell only samplers the epoch find at ``loader.sampler``: its ``set_epoch`` is the
    loader's. Lightning calls nothing but ``loader.sampler.set_epoch(e)`` at the start of every epoch."""

    def __init__(self, owner):
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


class PlannedView(Generic[S, P]):
    """What both loaders say about themselves, read from their settings and position."""

    _settings: S  # set by the loader's __init__
    _position: P

    plan = property(lambda self: self._settings.plan)
    rank = property(lambda self: self._settings.rank)
    world_size = property(lambda self: self._settings.world_size)
    batch_size = property(lambda self: self._settings.batch_size)
    shuffle_window = property(lambda self: self._settings.shuffle_window, doc="rows per shuffle window (resolved)")
    shuffle_budget = property(lambda self: self._settings.shuffle_budget, doc="bytes a rank's shuffle may hold")
    shuffle_spill_dir = property(lambda self: self._settings.options.shuffle_spill_dir,
                                 doc="local folder for windows beyond memory (None: the temp folder, overflow only)")
    shuffle_spill_budget = property(lambda self: self._settings.shuffle_spill_budget,
                                    doc="bytes of local disk a rank's windows may take")

    @property
    def schema(self) -> BatchSchema:
        """What every batch of every epoch holds, decided before the first one from the dataset's Arrow types and
        its footers' null counts: each key's tensor dtype and shape, or list of Python values, and how nulls are
        shown (docs/loader.md, "Batch schema")."""
        return self._settings.schema

    @property
    def sampler(self) -> EpochSampler:
        """``loader.sampler.set_epoch(e)`` is ``loader.set_epoch(e)`` (how Lightning tells the epoch)."""
        return EpochSampler(self)

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._position.current()[0]

    def __len__(self) -> int:
        """Steps of the epoch the next batch belongs to (after an elastic resume: the steps left in it)."""
        return self._position.steps()

    @property
    def recorder(self) -> Recorder:
        """The loader's figures (``reading/stats.py``), made on first use."""
        recorder = self.__dict__.get("_stats_recorder")
        if recorder is None:
            recorder = self.__dict__["_stats_recorder"] = Recorder()
        return recorder

    def stats(self) -> dict:
        """Where the input pipeline's time went, for the epoch so far (top level, and ``"epoch"``) and since the
        loader was made (``"total"``): ``wait_s`` (the training loop waited for batches), ``training_s`` (the loop's
        own time between batches), ``stages`` ({stage: seconds}), ``limit`` (the stage, or ``"training"``, that
        bounded throughput) with its ``evidence``, and rows, bytes, requests and retries read (docs/stats.md).
        DataLoader workers' figures are included (``ds.dataloader(num_workers=K)``); across ranks:
        ``petastorm_balanced.stats.gather(loader)``."""
        queue = self.__dict__.get("_stats_queue")
        if queue is not None:
            drain(queue, self.recorder)
        return self.recorder.stats({"rank": self.rank, "world_size": self.world_size})


class PlannedLoader(PlannedView[S, P]):
    """What one plan's loader and a mixture's do the same way; each gives its ``_run`` (one iteration's batches,
    taking the position at its first ``next()``) and ``_close_readers``."""

    _iterator: Any = None  # the iteration in progress (a generator, or a chain of lists: Recorder.grouped)

    def _run(self) -> Generator[Any, None, None]:
        raise NotImplementedError

    def _close_readers(self) -> None:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._iterator is not None:
            self._iterator.close()  # one reader pool at a time
        # starts (and takes the position) at its first next(): a probe consumes nothing
        iterator = self._iterator = self.recorder.measured(self._run())  # loader.stats(): the loop's waits
        return iterator

    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` next (like ``DistributedSampler.set_epoch``); a position loaded for that same epoch by
        ``load_state_dict`` is kept, so calling ``set_epoch`` at the top of every epoch is safe after resuming."""
        self._position.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The epoch and batch the next iteration serves (a mixture's: each source's ``[pass, row]`` and the
        schedule's phase, ``state["mixture"]``), and the settings they are valid for; the end of an epoch is saved
        as the start of the next one."""
        return self._position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """The next ``iter()`` continues exactly where ``state`` was saved; a state saved at another world size
        continues that epoch with the rows no rank had consumed, split evenly over this world (G10); a mixture's
        saved with other weights continues every source where it stood."""
        self._position.load_state_dict(state)

    def close(self) -> None:
        """Stop the readers' workers now (otherwise they wait for the next epoch, until the loader is collected)."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
        self._close_readers()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
