"""What a loader position needs for elastic resumes (G10) and sub-epochs, on top of ``(epoch, batches)``.

A state saved at world size W and loaded at W' becomes a ``Stage`` (W, workers, part, batches) appended to the
pass's stages, and the position restarts at batch 0 of what the pass has left (``core/elastic.py`` computes it
from the plan alone). Stages belong to a pass: they are carried from one sub-epoch to the next of the same pass and
dropped when a new pass starts, so the state stays a few ints per world change.
"""
from __future__ import annotations

from collections.abc import Callable

from ...core import balance
from ...core.elastic import Stage
from ...core.params import check_int
from ...core.shuffle import Windows, slot_key
from ...errors import InvalidValueError
from ...plan.model import ShardPlan
from ..state import (
    BALANCE,
    BATCH_SIZE,
    BATCHES,
    EPOCH,
    PARTITION_EPOCH,
    RESHUFFLE,
    SHUFFLE,
    SHUFFLE_WINDOW,
    STAGES,
    WORLD_SIZE,
)


class Layout:
    """What decides which rows each slot delivers in an epoch, and in what order: the plan, the world, the batch
    size, the window shuffle and the sub-epochs. The loaders' ``Settings`` hold one; the CLI builds one from a
    saved state (``Layout.of_state``) to show or check an elastic resume without a loader."""

    def __init__(self, plan: ShardPlan, world_size: int, rank: int = 0, *, batch_size: int | None, shuffle: bool,
                 shuffle_window: int, reshuffle: str, partition_epoch: int = 1, balance_by: str = "rows",
                 steps: int | None = None, epoch_steps: Callable[[int], int] | None = None):
        self.plan, self.world_size, self.rank = plan, world_size, rank
        self.batch_size: int | None = batch_size  # None: a token budget (max_batch_cost), rows assigned one by one
        self.shuffle, self.shuffle_window, self.reshuffle = shuffle, shuffle_window, reshuffle
        self.balance_by = balance_by  # "rows", or "cost" (the plan's cost order: ``plan.pieces``)
        # of a whole pass; ``steps`` when batches are not of fixed rows (a token budget counts its own)
        self.steps = plan.steps_per_epoch(world_size, batch_size) if steps is None else steps
        balance.check_params(partition_epoch=partition_epoch)
        balance.check_partition(self.steps, partition_epoch)  # every part of a pass needs a step
        self.partition_epoch = int(partition_epoch)
        # (epoch, stages, world) -> steps, for positions after an elastic resume
        self._stage_steps: dict[tuple, int] = {}
        self._epoch_steps = epoch_steps  # steps that differ by epoch (packing: from every rank's pieces)

    @classmethod
    def of_state(cls, plan: ShardPlan, state: dict, world_size: int) -> Layout:
        """The layout a saved loader state was made with, for ``world_size`` ranks."""
        try:
            return cls(plan, world_size, batch_size=state[BATCH_SIZE], shuffle=state[SHUFFLE],
                       shuffle_window=state[SHUFFLE_WINDOW], reshuffle=state[RESHUFFLE],
                       partition_epoch=state.get(PARTITION_EPOCH, 1),
                       balance_by="cost" if state.get(BALANCE) == "cost" else "rows")
        except KeyError as exc:
            raise InvalidValueError(f"the state has no {exc}; pass a dict saved by a loader's state_dict()") from None

    def moved(self, world_size: int, rank: int) -> Layout:
        """This layout for rank ``rank`` of ``world_size`` (a mixture's DataLoader worker slots, as ranks)."""
        return Layout(self.plan, world_size, rank, batch_size=self.batch_size, shuffle=self.shuffle,
                      shuffle_window=self.shuffle_window, reshuffle=self.reshuffle,
                      partition_epoch=self.partition_epoch, balance_by=self.balance_by)

    def key(self, epoch: int, slot: int = 0, stage: int = 0, rank: int | None = None):
        """Window shuffle key of a slot; a stage after an elastic resume gets its own (``shuffle.slot_key``)."""
        return slot_key(self.plan.seed, epoch, self.rank if rank is None else rank, slot, stage)

    @property
    def windows(self) -> Windows:
        """How this layout's slots shuffle (what ``plan.pieces`` needs to follow an elastic resume)."""
        return Windows.of(batch_size=self.batch_size or 1, shuffle_window=self.shuffle_window, shuffle=self.shuffle)

    def pieces_args(self, epoch: int, num_workers: int = 1, stages=()) -> dict:
        """Keyword arguments of ``plan.pieces`` / ``plan.assignment`` for this layout's ``epoch``."""
        return dict(epoch=epoch, world_size=self.world_size, num_workers=num_workers,
                    batch_size=self.batch_size or 1,  # None: a token budget, which assigns rows one by one
                    reshuffle=self.reshuffle, partition_epoch=self.partition_epoch, stages=stages,
                    windows=self.windows, balance_by=self.balance_by)

    def steps_of(self, epoch: int, stages=(), world_size: int | None = None) -> int:
        """Steps per rank of ``epoch`` (a part of a pass, or what is left of it after ``stages``)."""
        world = self.world_size if world_size is None else world_size
        if not stages and self._epoch_steps is not None and world == self.world_size:
            return self._epoch_steps(epoch)
        if not stages:
            steps = self.steps if world == self.world_size else self.plan.steps_per_epoch(world, self.batch_size)
            return int(balance.part_steps(steps, self.partition_epoch)[epoch % self.partition_epoch])
        key = (epoch, tuple(stages), world)
        if key not in self._stage_steps:
            args = {**self.pieces_args(epoch, 1, stages), "world_size": world}
            self._stage_steps[key] = self.plan.pieces(**args).steps_per_rank
        return self._stage_steps[key]


def carry(stages: tuple[Stage, ...], from_epoch: int, to_epoch: int, partition_epoch: int, *,
          strict: bool = False) -> tuple[Stage, ...]:
    """The stages still valid when the position moves from ``from_epoch`` to ``to_epoch``: all of them inside the
    same pass (at or after the part where the last world stopped), none in another pass."""
    if not stages or from_epoch // partition_epoch != to_epoch // partition_epoch:
        return ()
    if to_epoch % partition_epoch >= stages[-1].part:
        return tuple(stages)
    if strict:
        raise InvalidValueError(f"epoch={to_epoch} is part {to_epoch % partition_epoch} of a pass whose parts up to "
                                f"{stages[-1].part} a world before the elastic resume already served; set_epoch to "
                                f"epoch >= {to_epoch - to_epoch % partition_epoch + stages[-1].part}, or to another "
                                "pass")
    return ()


def loaded(settings: Layout, state: dict, workers: int) -> tuple[int, int, tuple[Stage, ...]]:
    """(epoch, batches, stages) a ``state`` (its settings already checked) resumes at in ``settings``' world; a
    state from another world size adds a stage. ``workers``: slots per rank the state was saved with."""
    parts = state.get(PARTITION_EPOCH, 1)
    if parts != settings.partition_epoch:
        raise InvalidValueError(f"state[{PARTITION_EPOCH!r}]={parts!r} but this loader has "
                                f"partition_epoch={settings.partition_epoch}; resume with the same partition_epoch")
    saved_stages = state.get(STAGES, [])
    if not isinstance(saved_stages, (list, tuple)):
        raise InvalidValueError(f"state[{STAGES!r}]={saved_stages!r} must be a list of saved stages")
    stages = tuple(Stage.from_list(s) for s in saved_stages)
    epoch = check_int(f"state[{EPOCH!r}]", state[EPOCH], minimum=0)
    world = check_int(f"state[{WORLD_SIZE!r}]", state[WORLD_SIZE], minimum=1)
    return resumed(settings, epoch, state[BATCHES], stages, world, workers, f"state[{BATCHES!r}]")


def resumed(settings: Layout, epoch: int, batches, stages: tuple[Stage, ...], world: int, workers: int,
            name: str) -> tuple[int, int, tuple[Stage, ...]]:
    """(epoch, batches, stages) that ``batches`` (called ``name``) of ``epoch`` after ``stages``, saved at ``world``
    x ``workers`` slots, resume at in ``settings``' world: the elastic arithmetic of every saved position (a
    mixture's sources too, each a layout at one row per batch)."""
    steps = settings.steps_of(epoch, stages, world_size=world)
    batches = check_int(name, batches, minimum=0, maximum=steps)
    if batches == steps:  # an ended epoch is the start of the next one
        epoch, batches, stages = epoch + 1, 0, carry(stages, epoch, epoch + 1, settings.partition_epoch)
    if world != settings.world_size:
        return restage(epoch, batches, stages, world, workers, settings.partition_epoch)
    return epoch, batches, stages


def restage(epoch: int, batches: int, stages, world: int, workers: int, partition_epoch: int):
    """The position in a new world (or worker count) of one saved at ``world`` x ``workers``: nothing to record at
    the very start of a pass, else a stage for the old world and batch 0 of what is left."""
    if not stages and batches == 0 and epoch % partition_epoch == 0:
        return epoch, 0, ()
    return epoch, 0, tuple(stages) + (Stage(world, workers, epoch % partition_epoch, batches),)
