"""What a loader position needs for elastic resumes (G10) and sub-epochs, on top of ``(epoch, batches)``.

A state saved at world size W and loaded at W' becomes a ``Stage`` (W, workers, part, batches) appended to the
pass's stages, and the position restarts at batch 0 of what the pass has left (``plan/elastic.py`` computes it
from the plan alone). Stages belong to a pass: they are carried from one sub-epoch to the next of the same pass and
dropped when a new pass starts, so the state stays a few ints per world change.
"""
from __future__ import annotations

from typing import Tuple

from ..plan import balance
from ..plan.elastic import Stage
from .batching import unread_rows, window_rows


def check_partition_epoch(partition_epoch, steps: int) -> int:
    """``partition_epoch`` checked against the pass's steps (every part needs one)."""
    balance.check_params(partition_epoch=partition_epoch)
    balance.check_partition(steps, partition_epoch)
    return int(partition_epoch)


def unread_rule(settings, epoch: int):
    """``elastic.Unread`` for ``settings``' loaders in ``epoch``: the window shuffle of ``WindowBatcher`` run
    backwards, with each old slot's own key."""
    size = window_rows(settings.batch_size, settings.shuffle_window, settings.shuffle)

    def unread(rows: int, batches: int, stage: int, rank: int, slot: int):
        key = settings.key(epoch, slot, stage, rank) if settings.shuffle else None
        return unread_rows(rows, batch_size=settings.batch_size, window_rows=size, batches_done=batches, key=key)
    return unread


def carry(stages: Tuple[Stage, ...], from_epoch: int, to_epoch: int, partition_epoch: int, *,
          strict: bool = False) -> Tuple[Stage, ...]:
    """The stages still valid when the position moves from ``from_epoch`` to ``to_epoch``: all of them inside the
    same pass (at or after the part where the last world stopped), none in another pass."""
    if not stages or from_epoch // partition_epoch != to_epoch // partition_epoch:
        return ()
    if to_epoch % partition_epoch >= stages[-1].part:
        return tuple(stages)
    if strict:
        raise ValueError(f"epoch={to_epoch} is part {to_epoch % partition_epoch} of a pass whose parts up to "
                         f"{stages[-1].part} a world before the elastic resume already served; set_epoch to epoch "
                         f">= {to_epoch - to_epoch % partition_epoch + stages[-1].part}, or to another pass")
    return ()


def loaded(position, state: dict, workers: int) -> Tuple[int, int, Tuple[Stage, ...]]:
    """(epoch, batches, stages) a checked ``state`` resumes at; a state from another world size adds a stage."""
    settings = position.settings
    parts = state.get(position.PARTITION_EPOCH, 1)
    if parts != settings.partition_epoch:
        raise ValueError(f"state[{position.PARTITION_EPOCH!r}]={parts!r} but this loader has "
                         f"partition_epoch={settings.partition_epoch}; resume with the same partition_epoch")
    saved_stages = state.get(position.STAGES, [])
    if not isinstance(saved_stages, (list, tuple)):
        raise ValueError(f"state[{position.STAGES!r}]={saved_stages!r} must be a list of saved stages")
    stages = tuple(Stage.from_list(s) for s in saved_stages)
    epoch, batches, world = state[position.EPOCH], state[position.BATCHES], state[position.WORLD_SIZE]
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"state[{position.WORLD_SIZE!r}]={world!r} must be an int >= 1")
    steps = settings.steps_of(epoch, stages, world_size=world)
    if isinstance(batches, bool) or not isinstance(batches, int) or not 0 <= batches <= steps:
        raise ValueError(f"state[{position.BATCHES!r}]={batches!r} must be an int in [0, {steps}]")
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
