"""What both loaders share: checked settings, the position of the next batch, and what they say about themselves.

The position is the whole resume state (G6): an epoch and a count of delivered batches; everything else is derived
from the plan. See ``Position`` for when an epoch advances.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import stream
from ..plan.model import ShardPlan
from ..world import World
from .cost_batching import resolve_cost
from .options import resolve_plan


class Settings:
    """Checked loader settings shared by BalancedLoader and BalancedIterableDataset."""

    def __init__(self, plan, world: World, *, batch_size, shuffle, reshuffle, shuffle_window, schema_fields,
                 padding_mask, balance="auto", cost_reduce="sum", max_batch_cost=None):
        self.plan: ShardPlan = resolve_plan(plan)
        self.rank, self.world_size = world.rank, world.size
        # cost balancing (None: rows only); with a token budget batches have no fixed size
        self.cost = resolve_cost(self.plan, balance=balance, cost_reduce=cost_reduce, max_batch_cost=max_batch_cost,
                                 batch_size=batch_size, shuffle=shuffle)
        budget = self.cost is not None and self.cost.budget is not None
        self.batch_size = None if budget else self.plan.batch_size if batch_size is None else batch_size
        if self.batch_size is None and not budget:
            raise ValueError("batch_size=None and the plan was made without one; pass batch_size=")
        if reshuffle not in ("epoch", "fixed"):
            raise ValueError(f"reshuffle={reshuffle!r} is not one of 'epoch' (new assignment every epoch) or "
                             "'fixed' (the epoch-0 assignment, for caching)")
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle={shuffle!r} must be True or False")
        if isinstance(shuffle_window, bool) or not isinstance(shuffle_window, int) or shuffle_window < 1:
            raise ValueError(f"shuffle_window={shuffle_window!r} must be an int >= 1 (rows per shuffle window)")
        rows_batch = 1 if budget else self.batch_size  # a token budget assigns rows one by one, then packs them
        self.steps = self.plan.steps_per_epoch(self.world_size, rows_batch)  # checks batch_size too
        if self.plan.total_rows < self.world_size * rows_batch:  # the balancer would refuse it at iteration
            raise ValueError(f"batch_size={self.batch_size} x world_size={self.world_size} rows per step exceed the "
                             f"plan's {self.plan.total_rows} matching rows; lower batch_size")
        if budget:
            self.steps = self.cost.budget_steps(self.plan.rows_per_rank(self.world_size, 1), shuffle_window)
        self.shuffle, self.reshuffle, self.shuffle_window = shuffle, reshuffle, shuffle_window
        self.padding_mask = bool(padding_mask)
        # columns read: the requested ones, plus the cost's source column (dropped after use: ``self.drop``)
        self.columns, self.drop = stream.with_cost_source(stream.dataset_columns(self.plan, schema_fields),
                                                          self.plan, self.cost)
        self._checksum = None

    def fragments(self, epoch: int, num_workers: int = 1):
        return self.plan.assignment(self.rank, epoch=epoch, world_size=self.world_size, num_workers=num_workers,
                                    batch_size=self.batch_size or 1, reshuffle=self.reshuffle,
                                    balance_by="rows" if self.cost is None else "cost")

    def key(self, epoch: int, slot: int = 0):
        return (self.plan.seed, epoch, self.rank, slot)

    def identity(self) -> dict:
        """What a saved position is only valid for."""
        if self._checksum is None:
            self._checksum = self.plan.checksum
        values = (self._checksum, self.world_size, self.batch_size, self.shuffle, self.shuffle_window, self.reshuffle)
        return {**dict(zip(Position.IDENTITY_KEYS, values)), **({} if self.cost is None else self.cost.identity())}


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

    def __init__(self, settings: Settings, epoch: int):
        check_epoch(epoch)
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
        check_epoch(epoch)
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
        check_epoch(epoch)
        if isinstance(batches, bool) or not isinstance(batches, int) or not 0 <= batches <= self.settings.steps:
            raise ValueError(f"state[{self.BATCHES!r}]={batches!r} must be an int in [0, {self.settings.steps}]")
        self.next_epoch, self.next_batches = (epoch + 1, 0) if batches == self.settings.steps else (epoch, batches)
        self.live, self.resumed = None, True


def check_epoch(epoch):
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch={epoch!r} must be an int >= 0")


class PlannedView:
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
