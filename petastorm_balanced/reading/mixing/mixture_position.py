"""Where a mixture's next batch comes from (``MixturePosition``): the epoch and batch, a point of the mixture
(``core/mixture.Point``: the schedule's phase and each source's counter), each source's elastic rest, and the
DataLoader workers the rank's batches are laid out over (``MixtureSettings.slots``). Its state is
``state["mixture"]`` beside the epoch and batch; ``mixture_elastic.py`` resumes each source's pass.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ...core.mixture import Point
from ...core.params import check_int
from ...errors import InvalidTypeError, InvalidValueError
from .. import state as loader_state
from ..state import (
    BALANCE,
    BATCHES,
    EPOCH,
    EPOCH_STEPS,
    NUM_WORKERS,
    PHASE,
    PLAN_CHECKSUM,
    SOURCE_ORDER,
    SOURCES,
    WEIGHTS,
    WORLD_SIZE,
)
from . import mixture_elastic
from .mixture_elastic import Head

if TYPE_CHECKING:
    from .mixture_settings import MixtureSettings


class MixturePosition:
    """Where the next batch comes from: a point of the mixture (``core/mixture.Point``) in the current epoch, and
    batches delivered since. The epoch rules are ``position.Position``'s: only delivered batches and ``set_epoch``
    move it; ``set_epoch(e)`` keeps a position just loaded for epoch ``e``.

    With ``workers`` DataLoader workers (``MixtureSettings.slots``) the rank's batch ``b`` of an epoch is slot
    ``b % workers``'s batch ``b // workers``: ``anchor`` is where every slot stood at rank batch ``start`` (all
    slots alike), ``batches`` the rank's batches of the epoch; a state names the point of the slots behind."""

    def __init__(self, settings: MixtureSettings, epoch: int, workers: int = 1):
        self.base = settings  # the rank's settings (what a state is valid for)
        self.resumed = False
        self._owner: MixtureRun | None = None
        self._begin(check_int("epoch", epoch, minimum=0), workers)

    def _begin(self, epoch: int, workers: int) -> None:
        """The start of ``epoch`` on the timeline where every source starts its first pass at epoch 0."""
        self.settings = self.base.slots(workers)  # slot 0 of ``workers``: the mixture every slot follows
        self.workers = workers
        self.mixture = self.settings.mixture
        self.anchor = self.mixture.start(epoch)
        self.batches = self.start = 0  # the rank's batch of the epoch the next delivery is; where ``anchor`` is
        self._steps = self._rank_steps()
        self.fresh = True  # nothing delivered or loaded since: another slot layout starts its own timeline
        # each source's elastic rest after a resume at another world size (``mixture_elastic.py``), or None
        self.heads: tuple[Head | None, ...] = (None,) * len(self.base.plans)

    def _rank_steps(self) -> int:
        return self.start + self.workers * self.mixture.remaining(self.anchor)

    def point(self, slot: int | None = None) -> Point:
        """Where slot ``slot`` stands (None: the slots behind, which a state names)."""
        done = self.batches - self.start
        local = done // self.workers if slot is None else (done - slot + self.workers - 1) // self.workers
        return self.mixture.advance(self.anchor, local)

    def _roll(self) -> None:
        if self.batches >= self._steps:  # the epoch is over: its end is the next one's start
            end = self.point()
            self.anchor = replace(end, epoch=end.epoch + 1, batch=0)
            self.batches = self.start = 0
            self._steps = self._rank_steps()

    def begin(self) -> MixtureRun:
        self._roll()
        run = MixtureRun(self, self.point(), self._steps, self.heads)
        self._owner = run
        return run

    def delivered(self, run: MixtureRun) -> None:
        if self._owner is not run:
            return
        self.resumed = self.fresh = False
        self.batches += 1
        self._roll()

    def current(self) -> tuple[int, int]:
        self._roll()
        return self.anchor.epoch, self.batches

    def steps(self) -> int:
        """Steps of the epoch the next batch belongs to."""
        self._roll()
        return self._steps

    def to_workers(self, workers: int) -> None:
        """The position for ``workers`` DataLoader workers (slots): a fresh one starts their timeline at its
        epoch, else the position continues elastically (the slots are the ranks of a larger world)."""
        if workers == self.workers:
            return
        resumed = self.resumed
        if self.fresh:
            self._begin(self.anchor.epoch, workers)
        else:
            self.load_state_dict(self.values(), workers=self.workers, into=workers)
        self.resumed = resumed

    def set_epoch(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, minimum=0)
        current, batch = self.current()
        if not (self.resumed and epoch == current):
            if epoch == current and batch == 0:
                pass
            elif epoch > current:
                self.anchor = self.mixture.next_epoch(self.point(), epoch - current)
            else:  # a fresh timeline from the first pass: no elastic rest applies
                self._begin(epoch, self.workers)
            self.batches = self.start = 0
            self._steps, self.resumed = self._rank_steps(), False
        self._owner = None

    def values(self, extra: dict | None = None) -> dict:
        if extra and NUM_WORKERS in extra:  # the workers this position's slots are laid out for
            extra = {**extra, NUM_WORKERS: self.workers}
        epoch, batch = self.current()
        point = self.point()
        rows = self.mixture.rows_per_pass
        return {EPOCH: epoch, BATCHES: batch, **self.base.identity(), **(extra or {}),
                WEIGHTS: [str(w) for w in self.base.weights], EPOCH_STEPS: self.base.epoch_steps,
                PHASE: point.phase, SOURCES: [mixture_elastic.encode(c, h, r) for c, h, r in
                                              zip(point.counters, self.heads, rows, strict=True)],
                SOURCE_ORDER: mixture_elastic.ORDER_VERSION}

    def state_dict(self, extra: dict | None = None) -> dict:
        return loader_state.nest(self.values(extra))

    def load_state_dict(self, state: dict, extra: dict | None = None, *, workers: int | None = None,
                        into: int | None = None) -> None:
        """Strict about keys and settings, except the world size and the DataLoader workers: a state saved with
        others continues every source's pass elastically (``mixture_elastic.py``). The slots the state was saved
        with are its ``num_workers`` (else ``workers``, else 1); ``into``: this position's slots from now on
        (``workers`` unless given, else this position's)."""
        if not isinstance(state, dict):
            raise InvalidTypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        state = loader_state.flat(state)
        settings = self.base
        expected = {**settings.identity(), **(extra or {})}
        if isinstance(state.get(PLAN_CHECKSUM), str):
            raise InvalidValueError("state was saved by a loader of one plan; a mixture loader (plan=[...]) resumes "
                                    "only a mixture's state")
        saved_balance, balance_now = state.get(BALANCE, "rows"), expected.get(BALANCE, "rows")
        if saved_balance != balance_now:  # which rows a window delivered first depends on the arrangement
            raise InvalidValueError(f"state[{BALANCE!r}]={saved_balance!r} but this mixture balances "
                                    f"{balance_now!r} (sources with a cost balance it under balance='auto'); pass "
                                    f"balance={saved_balance!r} to resume that position")
        loader_state.require(state, (EPOCH, BATCHES, *expected, WEIGHTS, PHASE, SOURCES))
        updated = mixture_elastic.updated_plans(state[PLAN_CHECKSUM], state[SOURCES], settings.plans)
        for key, value in expected.items():
            if state[key] == value:
                continue
            if key in (WORLD_SIZE, NUM_WORKERS) or (key == PLAN_CHECKSUM and updated):
                continue  # another world or workers: an elastic resume, below; updated plans: checked in updated_plans
            raise InvalidValueError(f"state[{key!r}]={state[key]!r} but this loader has {key}={value!r}; a saved "
                                    "position only resumes a loader with the same plans and settings")
        sources = state[SOURCES]
        if not isinstance(sources, list) or len(sources) != len(settings.plans):
            raise InvalidValueError(f"state[{SOURCES!r}]={sources!r} must be [pass, row] for each of the "
                                    f"{len(settings.plans)} sources")
        order = state.get(SOURCE_ORDER, 1)
        mixture_elastic.check_order(order, sources)
        saved_world = check_int(f"state[{WORLD_SIZE!r}]", state[WORLD_SIZE], minimum=1)
        epoch = check_int(f"state[{EPOCH!r}]", state[EPOCH], minimum=0)
        batch = check_int(f"state[{BATCHES!r}]", state[BATCHES], minimum=0)
        into = into or workers or self.workers
        workers = check_int(f"state[{NUM_WORKERS!r}]", state.get(NUM_WORKERS, workers or 1), minimum=1)
        # the slots the sources were counted in: ranks x workers (before this release, ranks: every worker read
        # the rank's whole sequence, so all stood at one point)
        round_ = workers if order == mixture_elastic.ORDER_VERSION else 1
        now = settings.slots(into)
        if saved_world * round_ != now.world_size or round_ != into:
            _check_relayout(batch, saved_world, workers, round_, settings, into)
        counters, heads = [], []
        for i, entry in enumerate(sources):
            counter, head = mixture_elastic.resume(entry, i, SOURCES, now.layout(i), saved_world, len(sources),
                                                   round_)
            counters.append(counter)
            heads.append(head)
        same = [str(w) for w in settings.weights] == state[WEIGHTS]
        if not same and settings.balanced_cost:
            raise InvalidValueError(f"state[{WEIGHTS!r}]={state[WEIGHTS]!r} but this mixture has weights "
                                    f"{[str(w) for w in settings.weights]} and balances cost: a source's "
                                    "window is arranged into the pieces its batches take, which the weights decide, "
                                    "so a changed mixture would re-arrange the window in progress; resume with the "
                                    "saved weights and change them at a pass start, or pass balance='rows'")
        period = self.mixture.schedule.period
        # the same weights continue their schedule; other ones (a curriculum) start theirs here
        phase = check_int(f"state[{PHASE!r}]", state[PHASE], minimum=0,
                          maximum=period - 1) if same else 0
        self.settings, self.workers, self.mixture = now, into, now.mixture
        # the slots behind stood at the round's first batch; with the same slots the others are one batch ahead
        self.start = batch - batch % round_
        self.anchor = Point(epoch, self.start // into, phase, tuple(counters))
        self.heads = tuple(heads)
        self.batches = batch
        self._steps = self._rank_steps()
        self._owner, self.resumed, self.fresh = None, True, False


def _check_relayout(batch: int, world: int, workers: int, round_: int, settings: MixtureSettings,
                    into: int) -> None:
    """A state continues in another layout of slots (world size x DataLoader workers) only where every slot it
    was saved with stood at one point, and with ``epoch_steps`` where the epoch's rest splits evenly over the new
    slots; refused naming the fix."""
    fix = (f"resume at world_size={world} with num_workers={workers}, or from a state saved after a multiple of "
           f"{{}} batches of the epoch")
    if batch % round_:
        raise InvalidValueError(
            f"state[{BATCHES!r}]={batch} was saved inside a round of its num_workers={workers} DataLoader workers, "
            "each of which reads its own share of every source, so they did not all take the same batches and only "
            f"that layout continues them: {fix.format(workers)}")
    if settings.epoch_steps is not None and batch % into:
        raise InvalidValueError(
            f"state[{BATCHES!r}]={batch} with epoch_steps={settings.epoch_steps} and num_workers={into}: the rest "
            f"of the epoch does not split evenly over the workers (each takes epoch_steps / num_workers batches "
            f"of it): {fix.format(into)}")


class MixtureRun:
    """One iteration: where it started; ``delivered()`` counts its batches into the position."""

    __slots__ = ("position", "point", "steps", "heads")

    def __init__(self, position: MixturePosition, point: Point, steps: int, heads: tuple):
        self.position, self.point, self.steps, self.heads = position, point, steps, heads

    def delivered(self) -> None:
        self.position.delivered(self)
