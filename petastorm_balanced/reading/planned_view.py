"""``PlannedView``: what ``BalancedLoader`` and ``BalancedIterableDataset`` say about themselves (plan, world, batch
size, schema, ``len``, figures), read from their settings and position; ``EpochSampler``: the ``loader.sampler``
frameworks tell the epoch."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

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
    """What both front doors say about themselves, read from their settings and position."""

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
